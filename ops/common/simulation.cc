#include "ops/common/simulation.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#if defined(GRADCOMP_SIMULATION)
#include <mpi.h>

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Host.hpp>
#include <xbt/config.hpp>
#endif

namespace gradcomp {
namespace sim {

const char* WorkName(Work work) {
  switch (work) {
    case Work::kEncode: return "encode";
    case Work::kDecode: return "decode";
    case Work::kDecodeAccumulate: return "decode_acc";
    case Work::kCopy: return "copy";
    case Work::kElementwise: return "elementwise";
    case Work::kToHost: return "to_host";
    case Work::kFromHost: return "from_host";
  }
  return "?";
}

double RealNow() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

#if defined(GRADCOMP_SIMULATION)

double Now() { return MPI_Wtime(); }

void Sleep(double seconds) {
  if (seconds <= 0) return;
  // Outside SMPI's measurement: other ranks run meanwhile, and their real time must not be
  // counted as this rank's computation.
  smpi_bench_end();
  simgrid::s4u::this_actor::sleep_for(seconds);
  smpi_bench_begin();
}

// SMPI measures a rank's CPU time from the end of one MPI call to the start of the next
// (a "benchmark" phase); ending it injects what was measured so far, beginning it restarts.
void Compute(double seconds) {
  if (seconds <= 0) return;
  smpi_bench_end();  // SMPI injects computation only outside its own measurement
  smpi_execute(seconds);
  smpi_bench_begin();
}

namespace {

// GRADCOMP_SIM_CODEC_PROFILE's curves: per "OP CODEC", (values, seconds a call) by size.
class Profile {
 public:
  explicit Profile(const std::string& path) : path_(path) {
    std::ifstream in(path);
    if (!in) Fail("cannot be read");
    std::string line;
    for (int number = 1; std::getline(in, line); ++number) {
      std::istringstream words(line);
      std::string op, codec;
      double values = 0, seconds = 0;
      if (!(words >> op) || op[0] == '#' || op == "device") continue;
      if (!(words >> codec >> values >> seconds) || values <= 0 || seconds < 0) {
        Fail("line " + std::to_string(number) + " is not 'OP CODEC VALUES SECONDS': '" + line + "'");
      }
      curves_[op + " " + codec].emplace_back(values, seconds);
    }
    if (curves_.empty()) Fail("has no 'OP CODEC VALUES SECONDS' line");
    for (auto& kv : curves_) std::sort(kv.second.begin(), kv.second.end());
  }

  // Seconds of one call on `values` values: linear between the measured sizes, the smallest's
  // time below them (a call's fixed cost), the largest's rate above.
  double Seconds(Work work, const char* codec, double values) const {
    const std::string key = std::string(WorkName(work)) + " " + (codec ? codec : "-");
    const auto it = curves_.find(key);
    if (it == curves_.end()) Fail("has no '" + key + "' line (codec_profile --codecs names the codecs measured)");
    const std::vector<std::pair<double, double>>& c = it->second;
    if (values <= c.front().first) return c.front().second;
    if (values >= c.back().first) return c.back().second * values / c.back().first;
    const auto hi = std::lower_bound(c.begin(), c.end(), std::make_pair(values, 0.0));
    const auto lo = hi - 1;
    return lo->second + (hi->second - lo->second) * (values - lo->first) / (hi->first - lo->first);
  }

 private:
  [[noreturn]] void Fail(const std::string& what) const {
    std::fprintf(stderr, "gradcomp simulation: GRADCOMP_SIM_CODEC_PROFILE %s %s\n", path_.c_str(), what.c_str());
    std::abort();  // every rank is an actor of this process: the run stops here
  }

  std::string path_;
  std::map<std::string, std::vector<std::pair<double, double>>> curves_;
};

const Profile* LoadedProfile() {
  static const Profile* profile = [] {
    const char* v = std::getenv("GRADCOMP_SIM_CODEC_PROFILE");
    return v && *v ? new Profile(v) : nullptr;
  }();
  return profile;
}

// Ranks are actors that take turns on one thread, and a task (where work is counted) never yields.
bool in_task = false;
double priced = 0;  // by the running task
std::map<long, double> charged;  // by actor

}  // namespace

void CountWork(Work work, const char* codec, double values) {
  const Profile* profile = LoadedProfile();
  if (profile == nullptr) return;
  const double seconds = profile->Seconds(work, codec, values);
  if (in_task) {
    priced += seconds;
  } else {
    Compute(CodecCost(0, seconds));
  }
}

double TaskCost(const std::function<void()>& task) {
  struct InTask {
    InTask() { in_task = true; }
    ~InTask() { in_task = false; }
  };
  priced = 0;
  double real = 0;
  {
    const InTask scope;
    real = TimeUnaccounted(task);
  }
  return CodecCost(real, priced);
}

double CodecCost(double real_seconds, double priced_seconds) {
  static const double scale = [] {
    const char* v = std::getenv("GRADCOMP_SIM_CODEC_SCALE");
    return v && *v ? std::atof(v) : 1.0;
  }();
  static const double reference =
      simgrid::s4u::Host::convert_pstate_speed_vector({simgrid::config::get_value<std::string>("smpi/host-speed")})[0];
  const double cost = LoadedProfile() != nullptr
                          ? priced_seconds * scale
                          : real_seconds * scale * reference / simgrid::s4u::this_actor::get_host()->get_speed();
  charged[simgrid::s4u::this_actor::get_pid()] += cost;
  return cost;
}

double CodecCharged() { return charged[simgrid::s4u::this_actor::get_pid()]; }

namespace {
// Ranks are actors that take turns on one thread, and an Unaccounted section never yields.
bool paused = false;
}  // namespace

Unaccounted::Unaccounted() {
  smpi_bench_end();
  paused = true;
}
Unaccounted::~Unaccounted() {
  paused = false;
  smpi_bench_begin();
}

double WorkNow() { return paused ? TaskNow() : Now(); }

double TaskNow() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

namespace {
std::mutex shared_mu;
std::set<void*> shared_blocks;
}  // namespace

void* SharedAllocate(size_t bytes) {
  static const double threshold_mb = [] {
    const char* v = std::getenv("GRADCOMP_SIM_SHARED_MB");
    return v && *v ? std::atof(v) : 0.0;
  }();
  if (threshold_mb <= 0 || static_cast<double>(bytes) < threshold_mb * 1048576.0) return nullptr;
  void* p = smpi_shared_malloc(bytes, __FILE__, __LINE__);
  std::lock_guard<std::mutex> lock(shared_mu);
  shared_blocks.insert(p);
  return p;
}

bool SharedFree(void* ptr) {
  {
    std::lock_guard<std::mutex> lock(shared_mu);
    if (shared_blocks.erase(ptr) == 0) return false;
  }
  smpi_shared_free(ptr);
  return true;
}

#else

double Now() { return RealNow(); }

void Sleep(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

Unaccounted::Unaccounted() = default;
Unaccounted::~Unaccounted() = default;

double WorkNow() { return RealNow(); }
double TaskNow() { return RealNow(); }

void Compute(double) {}
double CodecCost(double real_seconds, double) { return real_seconds; }
double CodecCharged() { return 0; }
double TaskCost(const std::function<void()>& task) {
  const double t0 = RealNow();
  task();
  return RealNow() - t0;
}

void* SharedAllocate(size_t) { return nullptr; }
bool SharedFree(void*) { return false; }

#endif

}  // namespace sim
}  // namespace gradcomp
