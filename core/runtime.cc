#include "core/runtime.h"

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <cstdio>

#include <unistd.h>

#include "core/logging.h"
#include "gradcomp/config.h"
#include "ops/comm/mpi_environment.h"
#include "ops/comm/tcp_communicator.h"
#include "ops/common/cpu.h"
#include "ops/common/enforce.h"
#if GRADCOMP_HAVE_NCCL_COMMUNICATOR
#include "ops/comm/nccl_communicator.h"
#endif
#if GRADCOMP_HAVE_CUDA_KERNELS
#include "ops/device/cuda_device.h"
#endif

namespace gradcomp {

namespace {

// Cycle times between two rounds while the ready tensors wait for a larger batch.
constexpr double kBatchPacing = 4;
// The longest an idle rank sleeps between heartbeat cycles: it bounds the wait of a rank
// that gets work while its peers are idle, and keeps stall detection alive.
constexpr double kMaxIdleWaitSeconds = 0.05;

// The handles of the entries present (a joined rank has none for some tensors), added to `out`.
void AddHandles(const EntryList& entries, std::vector<std::shared_ptr<Handle>>& out) {
  for (const auto& e : entries) {
    if (e) out.push_back(e->handle);
  }
}

// "the allreduce of 'a' and 3 more tensors": what the watchdog reports.
std::string Describe(const Response& first, size_t tensors) {
  if (tensors == 0) return "no collective";
  std::string out = std::string("the ") + RequestTypeName(first.type) + " of '" + first.names.front() + "'";
  if (tensors > 1) out += " and " + std::to_string(tensors - 1) + " more tensor" + (tensors > 2 ? "s" : "");
  return out;
}

// nccl for GRADCOMP_INNER_COMMUNICATOR / _CROSS_ is for tensors in GPU memory; the node's
// host tensors keep the shared-memory window.
LocalTransport TransportFrom(const Settings& s) {
#if !GRADCOMP_HAVE_NCCL_COMMUNICATOR
  for (const auto& [value, name] : {std::make_pair(s.inner_communicator, "GRADCOMP_INNER_COMMUNICATOR (CGX_INNER_COMMUNICATOR_TYPE)"),
                                    std::make_pair(s.cross_communicator, "GRADCOMP_CROSS_COMMUNICATOR (CGX_CROSS_COMMUNICATOR_TYPE)")}) {
    if (value == "nccl") {
      throw InvalidArgument(std::string(name) + "=nccl needs a build with CUDA and NCCL, and this one has none; "
                            "use shm or mpi");
    }
  }
#endif
  return s.inner_communicator == "mpi" ? LocalTransport::kMessages : LocalTransport::kSharedMemory;
}

// The communicators for tensors in device memory: the options' (tests), else, on the tensors'
// GPU, NCCL at the levels the settings ask it for and CUDA-aware MPI at the others when the MPI
// library is (Open MPI built with CUDA).
DeviceCommunicatorFactory DeviceCommunicatorsFrom(const RuntimeOptions& options) {
  if (options.device_communicators) return options.device_communicators;
#if GRADCOMP_HAVE_CUDA_KERNELS
#if GRADCOMP_HAVE_NCCL_COMMUNICATOR
  const bool inner = options.settings.inner_communicator == "nccl";
  const bool cross = options.settings.cross_communicator == "nccl";
#endif
  return [=](Communicator& host, Device& device, CommLevel level) -> std::unique_ptr<Communicator> {
    const int ordinal = CudaOrdinal(device);
    if (ordinal < 0) return nullptr;
#if GRADCOMP_HAVE_NCCL_COMMUNICATOR
    const bool nccl = level == CommLevel::kLocal ? inner : level == CommLevel::kCross ? cross : inner && cross;
    if (nccl) return CreateNcclCommunicator(host, ordinal);
#else
    (void)level;
#endif
    return CudaAwareMpiCommunicator(host, device);  // null unless MPI takes GPU memory
  };
#else
  return {};
#endif
}

Topology MakeTopology(RuntimeOptions& options, Watchdog& watchdog) {
  watchdog.Begin(options.world ? "init (waiting for every rank's part of the world's topology)"
                                : "init (starting MPI, then waiting for every rank to call init())");
  std::unique_ptr<Communicator> world = options.world ? std::move(options.world) : CreateMpiWorld();
  return BuildTopology(std::move(world), static_cast<int>(options.settings.local_size),
                       TransportFrom(options.settings), static_cast<size_t>(options.settings.shm_buffer_mb) << 20);
}

}  // namespace

Runtime::Runtime(RuntimeOptions options)
    : settings_(options.settings),
      mpi_world_(options.world == nullptr || options.world_is_mpi),
      rank_names_(options.rank_names),
      watchdog_(settings_.collective_timeout_seconds, [this](Watchdog::Expired e) { OnCollectiveTimeout(std::move(e)); }),
      topo_(MakeTopology(options, watchdog_)),
      log_(MakeRankLogger(topo_.rank(), settings_.log_level, options.log_sink)),
      tcp_(ConnectTcp()),
      controller_(ControlCommunicator(), settings_, *log_, timeline_),
      executor_(topo_, settings_, timeline_, DeviceCommunicatorsFrom(options)),
      fault_injector_(std::move(options.fault_injector)) {
  executor_.SetLogger(log_.get());
  controller_.SetRankNames(rank_names_);
  for (const std::string& note : settings_.notes) log_->warn("{}", note);
  WarnIfPinnedToOneCore();
  if (!settings_.timeline.empty() && topo_.rank() == 0) timeline_.Start(settings_.timeline, 0);
  watchdog_.End();
  started_.store(true);
  log_->info("gradcomp up: {} ranks ({} per node x {} nodes), fusion {} MB, cache {}, negotiating over {}, "
             "between nodes over {}{}",
             topo_.size(), topo_.local_size(), topo_.cross_size(), settings_.fusion_threshold_mb,
             settings_.cache_capacity, ControlCommunicator().kind(), topo_.cross->kind(),
             tcp_interfaces_.empty() ? "" : "; TCP to other hosts on " + tcp_interfaces_);
  background_ = std::thread([this] {
    NameThisThread("gc-background");
    BackgroundLoop();
  });
}

Runtime::~Runtime() {
  try {
    Shutdown();
    MeetBeforeMpiTeardown();
  } catch (const std::exception& e) {
    log_->error("shutdown failed: {}", e.what());
  }
}

void Runtime::WarnIfPinnedToOneCore() {
  int cpus = 0;
  const std::string which = AllowedCpus(&cpus);
  if (cpus != 1 || std::thread::hardware_concurrency() <= 1) return;
  // mpirun binds each rank to one core by default for jobs of up to two ranks (to sockets
  // above that), so plain `mpirun -np 2 python train.py` puts the training thread, gradcomp's
  // background thread and its stripe helper on one core (docs/benchmarks.md measures it).
  log_->warn("rank {} may only run on CPU {} (its affinity is one core of {}): gradcomp's background thread "
             "competes there with the training thread for every step. Launch with gcrun, or `mpirun --bind-to "
             "none`, or give each rank several cores (`mpirun --map-by slot:PE=4`)",
             topo_.rank(), which, std::thread::hardware_concurrency());
}

void Runtime::CheckSettingsAgree() {
  const std::vector<std::string> all = AllgatherStrings(*topo_.world, AgreedSettingsText(settings_));
  const auto lines = [](const std::string& text) {
    std::vector<std::string> out;
    for (size_t p = 0, q; (q = text.find('\n', p)) != std::string::npos; p = q + 1) out.push_back(text.substr(p, q - p));
    return out;
  };
  const std::vector<std::string> first = lines(all[0]);
  std::string differences;
  for (size_t r = 1; r < all.size(); ++r) {
    const std::vector<std::string> theirs = lines(all[r]);
    for (size_t i = 0; i < std::min(first.size(), theirs.size()); ++i) {
      if (first[i] != theirs[i]) {
        differences += " rank 0 has " + first[i] + " but rank " + std::to_string(r) + " has " + theirs[i] + ";";
      }
    }
  }
  if (!differences.empty()) {
    throw InvalidArgument("gradcomp settings must be the same on every rank:" + differences);
  }
}

std::unique_ptr<Communicator> Runtime::ConnectTcp() {
  // Before anything else collective depends on a setting: a rank alone connecting over TCP
  // would wait for the others forever.
  CheckSettingsAgree();
  Communicator& world = *topo_.world;
  const std::string& choice = settings_.controller;
  const bool tcp_control = choice == "tcp" || choice == "gloo";
  const bool tcp_data = settings_.cross_communicator == "tcp";  // asked for: failing to connect is an error
  // A world without MPI (an env:// launch, ops/comm/store_communicator.h) is the TCP mesh already.
  if (std::string(world.kind()) == "tcp") {
    for (const auto& [value, name] : {std::make_pair(choice, "GRADCOMP_CONTROLLER"),
                                      std::make_pair(settings_.cross_communicator, "GRADCOMP_CROSS_COMMUNICATOR")}) {
      if (value == "mpi") {
        throw InvalidArgument(std::string(name) + "=mpi needs an MPI world, and this one was started without MPI (an "
                              "env:// launcher: RANK, WORLD_SIZE, MASTER_ADDR); use auto or tcp, or launch with "
                              "gcrun or mpirun");
      }
    }
    return nullptr;
  }
  if (world.size() == 1) return nullptr;
  if (!tcp_data && (choice == "mpi" || (choice == "auto" && !mpi_world_))) return nullptr;
  // The same on every rank: several nodes (size > local_size holds on every rank or on none),
  // and the same MPI library (a CUDA-aware one takes GPU tensors straight from device memory).
  const bool auto_data = settings_.cross_communicator == "auto" && topo_.size() > topo_.local_size() &&
                         !(mpi_world_ && MpiIsCudaAware());
  TcpOptions options;
  options.iface = settings_.controller_iface;
  options.unreachable_seconds = UnreachableSeconds(settings_);
  std::unique_ptr<Communicator> mesh;
  TcpReport report;
  try {
    mesh = ConnectTcpWorld(world, options, &report);  // fails on every rank alike
  } catch (const Error& e) {
    if (tcp_data) throw Error(std::string("GRADCOMP_CROSS_COMMUNICATOR=tcp: ") + e.what());
    if (tcp_control) throw Error(std::string("GRADCOMP_CONTROLLER=") + choice + ": " + e.what());
    log_->warn("GRADCOMP_CONTROLLER=auto: negotiating over MPI, since {} (GRADCOMP_CONTROLLER=mpi skips the attempt)",
               e.what());
    return nullptr;
  }
  // One line per peer, the first few of them (a large job's every rank could name every peer).
  constexpr size_t kDetoursShown = 3;
  for (size_t i = 0; i < std::min(report.detours.size(), kDetoursShown); ++i) {
    log_->warn("tcp communicator: {}{} (GRADCOMP_CONTROLLER_IFACE, gcrun --network-interface, names the interfaces "
               "to use)",
               report.detours[i],
               i + 1 == kDetoursShown && report.detours.size() > kDetoursShown
                   ? "; and " + std::to_string(report.detours.size() - kDetoursShown) + " more peers like it"
                   : std::string());
  }
  if (!report.open_file_limit.empty()) log_->info("tcp communicator: {}", report.open_file_limit);
  tcp_interfaces_ = report.interfaces;
  if (tcp_data || auto_data) MoveCrossTrafficOnto(*mesh);
  return mesh;
}

void Runtime::MoveCrossTrafficOnto(Communicator& mesh) {
  // The same on every rank: true only when every node holds one rank.
  const bool one_rank_per_node = topo_.cross_size() == topo_.size();
  auto cross = mesh.Split(topo_.local_rank(), topo_.cross_rank());
  replaced_cross_ = std::move(topo_.cross);
  topo_.cross = std::move(cross);
  if (one_rank_per_node) {
    auto world = mesh.Split(0, topo_.rank());
    replaced_world_ = std::move(topo_.world);
    topo_.world = std::move(world);
  }
}

Communicator& Runtime::ControlCommunicator() {
  if (settings_.controller != "mpi" && tcp_) return *tcp_;
  return replaced_world_ ? *replaced_world_ : *topo_.world;
}

void Runtime::CheckRunning() const {
  if (running_.load()) return;
  std::lock_guard<std::mutex> lock(state_mu_);
  throw Error("gradcomp is not running: " + stopped_reason_);
}

void Runtime::StartTimeline(const std::string& path) {
  CheckRunning();
  if (topo_.rank() == 0) timeline_.Start(path, 0);
}

void Runtime::StopTimeline() { timeline_.Stop(); }

RuntimeStats Runtime::stats() const {
  std::lock_guard<std::mutex> lock(state_mu_);
  RuntimeStats s = stats_;
  s.cache_hits = controller_.cache_hits();
  s.scheduling_deferrals = controller_.deferred();
  s.batch_waits = controller_.batch_waits();
  s.compressed_bytes_in = executor_.compressed_bytes_in();
  s.compressed_bytes_on_wire = executor_.compressed_bytes_on_wire();
  s.uncompressed_sra_responses = executor_.uncompressed_sra_responses();
  s.uncompressed_sra_bytes_on_wire = executor_.uncompressed_sra_bytes_on_wire();
  s.nonfinite_memory_skips = executor_.nonfinite_memory_skips();
  s.auto_choices = executor_.auto_compression().choices_made();
  s.fusion_threshold_mb = controller_.fusion_threshold_mb();
  s.cycle_time_ms = controller_.cycle_time_ms();
  s.autotune_done = controller_.autotuner() != nullptr && controller_.autotuner()->done();
  s.coordinator_responses = controller_.coordinator_responses();
  s.queued_operations = queue_->size();
  timeline_.Sizes(&s.timeline_rows, &s.timeline_queued);
  return s;
}

double Runtime::BackgroundCpuSeconds() const {
  clockid_t cid;
  timespec ts{};
  if (!background_.joinable()) return 0.0;
  if (pthread_getcpuclockid(const_cast<std::thread&>(background_).native_handle(), &cid) != 0) return 0.0;
  if (clock_gettime(cid, &ts) != 0) return 0.0;
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

void Runtime::Shutdown() {
  // The background thread is blocked inside MPI for good: joining it would hang.
  if (watchdog_.expired()) ExitProcess("shutdown after a collective timeout");
  stop_requested_.store(true);
  queue_->Wake();
  if (background_.joinable()) background_.join();
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    if (stopped_reason_.empty()) stopped_reason_ = "shutdown() was called";
  }
  running_.store(false);
  timeline_.Stop();
}

void Runtime::BackgroundLoop() {
  using namespace std::chrono;
  int idle_cycles = 0;
  std::string reason;
  try {
    while (true) {
      const duration<double> cycle(controller_.cycle_time_ms() / 1000.0);  // autotune may change it
      Controller::CycleInput in;
      in.fresh = queue_->TakeNewRequests();
      in.shutdown = stop_requested_.load();
      in.caller_waiting = queue_->CallerWaiting();
      Controller::CycleOutput out;
      {
        Watchdog::Step step(watchdog_, in.shutdown ? "the shutdown round of the negotiation"
                                                   : "a negotiation round (exchanging which tensors are ready)");
        out = controller_.RunCycle(std::move(in));
      }
      // The cycle is timed from the end of its negotiation round, which every rank leaves at
      // about the same moment, not from this rank's entry: timed from the entry, a rank that
      // entered a round late would enter every later timed round late by as much, and the
      // others would poll for it in each.
      const auto start = steady_clock::now();
      {
        std::lock_guard<std::mutex> lock(state_mu_);
        ++stats_.cycles;
        // Before the handles complete: a caller reading stats() as soon as its operations
        // complete must not see them still in negotiation.
        stats_.negotiating_tensors = controller_.open_tensors();
      }
      if (out.shutdown) {
        reason = out.fatal.empty() ? ShutDownBy(out.stopped_by) : AgreedStop(out.fatal);
        break;
      }
      // Ready tensors waiting for a larger batch are not urgent: cycle less often, and only
      // when enough new bytes come or a caller blocks (pushes of single small gradients
      // would otherwise start a round each).
      const bool batching = controller_.batching();
      queue_->WaitForBatch(controller_.batch_missing_bytes());
      ExecuteAll(out.responses, out.from_cache);
      {
        // The gauges of what the background thread holds, read here where it owns them.
        std::lock_guard<std::mutex> lock(state_mu_);
        stats_.cache_entries = controller_.cache().size();
        stats_.compression_memories = executor_.compression_memories();
        stats_.auto_tensors = executor_.auto_compression().tracked();
      }
      if (out.busy || !out.responses.empty()) {
        // Some rank has work: cycle again at once if tensors are already waiting, else as
        // soon as this rank gets one.
        idle_cycles = 0;
        const duration<double> left = (start + (batching ? kBatchPacing * cycle : cycle)) - steady_clock::now();
        if (!queue_->WaitForNew(std::max(left, duration<double>(0)))) continue;
      } else {
        // Every rank is idle: back off (alone, sleep until work arrives).
        ++idle_cycles;
        const double wait = topo_.size() == 1 ? 3600.0
                                              : std::min(kMaxIdleWaitSeconds,
                                                         cycle.count() * double(1 << std::min(idle_cycles, 16)));
        if (!queue_->WaitForNew(duration<double>(wait))) continue;
      }
      GatherBurst(cycle);
    }
  } catch (const std::exception& e) {
    reason = BackgroundFailed(e);
  }
  {
    std::lock_guard<std::mutex> lock(state_mu_);
    stopped_reason_ = reason;
  }
  running_.store(false);
  queue_->FailAll(reason);
}

void Runtime::GatherBurst(std::chrono::duration<double> cycle) {
  // Tensors arrive in bursts (a backward pass, a loop of enqueues). Negotiate once the burst
  // is over: its producer blocks on a handle, or no tensor came for a fraction of the cycle
  // time; never later than one cycle time. So the tensors of a step are negotiated, and
  // fused, together.
  const std::chrono::duration<double> quiet = std::min(cycle / 10, std::chrono::duration<double>(5e-5));
  queue_->WaitForBurstEnd(quiet, cycle);
}

void Runtime::ForgetCompressionState(const std::vector<std::string>& names) {
  std::lock_guard<std::mutex> lock(state_mu_);
  forget_.insert(forget_.end(), names.begin(), names.end());
}

void Runtime::ExecuteAll(const std::vector<Response>& responses, size_t from_cache) {
  {
    std::vector<std::string> forget;
    {
      std::lock_guard<std::mutex> lock(state_mu_);
      forget.swap(forget_);
    }
    for (const std::string& name : forget) executor_.ForgetCompressionState(name);
  }
  std::vector<Work> work = PrepareAll(responses);
  // Agree that every rank is ready to run its collectives; if a rank failed locally, every
  // rank fails those tensors with that rank's message instead of waiting for it forever.
  size_t tensors = 0;
  bool any_collective = false;
  for (const Response& r : responses) {
    tensors += r.names.size();
    any_collective = any_collective || r.error.empty();
  }
  try {
    if (any_collective) {
      std::vector<std::string> failures;
      // Their entries have left the queue: if the agreement times out, the watchdog fails these
      // handles, so the callers waiting for them hear it (queue_->FailAll no longer reaches them).
      std::vector<std::shared_ptr<Handle>> handles;
      for (const Work& w : work) {
        failures.push_back(w.failure);
        AddHandles(w.entries, handles);
      }
      Watchdog::Step step(watchdog_,
                          "the agreement that every rank is ready to run " + Describe(responses.front(), tensors),
                          std::move(handles));
      controller_.AgreeOnFailures(&failures);
      for (size_t i = 0; i < work.size(); ++i) work[i].failure = std::move(failures[i]);
    }
    for (size_t i = 0; i < work.size(); ++i) RunPrepared(work[i], i < from_cache);
  } catch (const std::exception& e) {
    // The agreement or a collective failed for good (over TCP at once, when a peer is lost):
    // these entries have left the queue, so the background thread's FailAll does not reach
    // them. Fail them here (completed ones stay as they are), or their callers wait forever.
    const std::string message = BackgroundFailure(e);
    for (const Work& w : work) {
      for (const auto& entry : w.entries) {
        if (entry) entry->handle->Fail(message);
      }
    }
    throw;
  }
}

std::vector<Runtime::Work> Runtime::PrepareAll(const std::vector<Response>& responses) {
  std::vector<Work> work;
  for (const Response& r : responses) {
    Work w{&r, {}, {}};
    for (const std::string& name : r.names) w.entries.push_back(queue_->Take(name));
    if (r.error.empty()) {
      try {
        if (fault_injector_) {
          for (const std::string& name : r.names) fault_injector_(name);
        }
        executor_.Prepare(r, w.entries);
      } catch (const std::exception& e) {
        w.failure = e.what();
      }
    }
    work.push_back(std::move(w));
  }
  return work;
}

void Runtime::RunPrepared(Work& w, bool from_cache) {
  const Response& r = *w.response;
  std::string failure = !r.error.empty() ? r.error : w.failure;
  {
    // Counted before the handles complete, so a caller that waited sees them.
    std::lock_guard<std::mutex> lock(state_mu_);
    ++stats_.executed_responses;
    stats_.executed_tensors += r.names.size();
  }
  if (failure.empty()) {
    std::vector<std::shared_ptr<Handle>> handles;
    AddHandles(w.entries, handles);
    Watchdog::Step step(watchdog_, Describe(r, r.names.size()), std::move(handles));
    try {
      executor_.Run(r, w.entries);
    } catch (const InvalidArgument& e) {
      for (auto& e2 : w.entries) {
        if (e2) e2->handle->Fail(e.what(), true);
      }
    } catch (const std::exception& e) {
      failure = e.what();
    }
  }
  if (!failure.empty()) {
    for (auto& e : w.entries) {
      if (e) e->handle->Fail(failure);
    }
  }
  // Tell the controller about each tensor, unfused, in order (keeps caches identical).
  for (size_t k = 0; k < r.names.size(); ++k) {
    Response single = r.Single(k);
    if (!failure.empty() && single.error.empty()) single.error = failure;
    controller_.Executed(single, from_cache);
  }
}

}  // namespace gradcomp
