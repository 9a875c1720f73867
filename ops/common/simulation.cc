#include "ops/common/simulation.h"

#include <chrono>
#include <ctime>
#include <cstdlib>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#if defined(GRADCOMP_SIMULATION)
#include <mpi.h>

#include <simgrid/s4u/Actor.hpp>
#include <simgrid/s4u/Host.hpp>
#include <xbt/config.hpp>
#endif

namespace gradcomp {
namespace sim {

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

double CodecCost(double real_seconds) {
  static const double scale = [] {
    const char* v = std::getenv("GRADCOMP_SIM_CODEC_SCALE");
    return v && *v ? std::atof(v) : 1.0;
  }();
  static const double reference =
      simgrid::s4u::Host::convert_pstate_speed_vector({simgrid::config::get_value<std::string>("smpi/host-speed")})[0];
  return real_seconds * scale * reference / simgrid::s4u::this_actor::get_host()->get_speed();
}

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
double CodecCost(double real_seconds) { return real_seconds; }

void* SharedAllocate(size_t) { return nullptr; }
bool SharedFree(void*) { return false; }

#endif

}  // namespace sim
}  // namespace gradcomp
