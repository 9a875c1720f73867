// The Runtime: all of gradcomp's state for one process (or one thread rank in tests) —
// no process globals. Framework adapters enqueue named tensors and get a Handle back at
// once; a background thread negotiates them across ranks (controller.h) and executes them
// (executor.h). Several Runtime objects can live in one process.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/controller.h"
#include "core/executor.h"
#include "core/handle.h"
#include "core/message.h"
#include "core/settings.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "core/watchdog.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// How a Runtime is built. Defaults: settings from the environment, MPI's world.
struct RuntimeOptions {
  Settings settings = Settings::FromEnvironment();
  /// The world to run on; nullptr initializes MPI and uses MPI_COMM_WORLD.
  std::unique_ptr<Communicator> world;
  /// `world` is MPI's, a part of MPI_COMM_WORLD (a process set's): treated as MPI's world
  /// (TCP connections of its own by default, MPI's CUDA awareness, leaving MPI after a failure).
  bool world_is_mpi = false;
  /// How messages name the world's ranks: rank r as rank_names[r] (a process set's ranks in
  /// MPI's world). Empty: r.
  std::vector<int> rank_names;
  /// Where log lines go (stderr when null).
  spdlog::sink_ptr log_sink;
  /// Test seam: called on the background thread before a tensor executes on this rank;
  /// an exception it throws must reach every rank with its message.
  std::function<void(const std::string& name)> fault_injector;
  /// Communicators that take device memory (executor.h). Empty: NCCL for CUDA tensors where
  /// GRADCOMP_INNER_COMMUNICATOR / _CROSS_ say nccl (and it is built), else host staging.
  DeviceCommunicatorFactory device_communicators;
};

/// Where an operation's buffers live: a device (null: the host) and the stream of that device on
/// which the framework produced the input (null: the input is ready when enqueued). The runtime
/// waits for what the stream has queued at enqueue time before it reads the input, and the
/// output is complete when the handle completes.
struct Placement {
  Device* device = nullptr;
  Stream* stream = nullptr;
};

/// A caller's host buffer for the result of an allgather or reducescatter, `bytes` long: the
/// result is written there (decoded there, when compressed) instead of into memory the handle
/// allocates, which the caller would copy out. Where the negotiated result has another size,
/// the buffer is left as it was and the operation fails on this rank, after the exchange (the
/// other ranks go on). Host tensors only.
struct OutputBuffer {
  void* data = nullptr;
  size_t bytes = 0;
};

/// Counters for tests and diagnostics.
struct RuntimeStats {
  uint64_t cycles = 0;
  uint64_t cache_hits = 0;
  uint64_t scheduling_deferrals = 0;  ///< ready tensors left for a later cycle by the credit
  uint64_t batch_waits = 0;           ///< cycles whose ready tensors waited for a larger batch
  uint64_t coordinator_responses = 0;
  uint64_t executed_responses = 0;  ///< fused responses count once
  uint64_t executed_tensors = 0;
  uint64_t compressed_bytes_in = 0;       ///< payload of compressed allreduces on this rank
  uint64_t compressed_bytes_on_wire = 0;  ///< bytes this rank sent for them
  uint64_t uncompressed_sra_responses = 0;  ///< uncompressed allreduces run as scatter-reduce-allgather
  uint64_t uncompressed_sra_bytes_on_wire = 0;  ///< their SRA's bytes sent (across nodes when hierarchical)
  uint64_t nonfinite_memory_skips = 0;    ///< memories kept unchanged over a non-finite step
  uint64_t auto_choices = 0;  ///< times auto compression chose settings (core/auto_compression.h)
  double fusion_threshold_mb = 0;  ///< in force now (GRADCOMP_AUTOTUNE changes it)
  double cycle_time_ms = 0;        ///< in force now
  bool autotune_done = false;      ///< GRADCOMP_AUTOTUNE's search ended (rank 0's view)
  // Gauges (what is held now), for soak tests: in steady state none of them grows.
  uint64_t queued_operations = 0;    ///< enqueued on this rank and not completed
  uint64_t negotiating_tensors = 0;  ///< known to the negotiation and not answered yet
  uint64_t cache_entries = 0;        ///< response cache entries
  uint64_t compression_memories = 0; ///< tensors with error-feedback or DGC state
  uint64_t auto_tensors = 0;         ///< tensor names auto compression keeps counts for
  uint64_t timeline_rows = 0;        ///< tensors the timeline has a row for (while recording)
  uint64_t timeline_queued = 0;      ///< events waiting for the timeline's writer
};

class Runtime {
 public:
  /// Collective over the world: builds the topology, checks that every rank uses the same
  /// settings, starts the background thread.
  explicit Runtime(RuntimeOptions options);
  /// Shuts down (see Shutdown), then meets the other ranks before MPI's teardown
  /// (MeetBeforeMpiTeardown).
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  /// Stops the background thread; pending operations fail. Stops every rank's runtime (a
  /// rank that shuts down ends the negotiation for all). Idempotent.
  void Shutdown();
  /// False after Shutdown, or once any rank shut down or a stall stopped gradcomp.
  bool running() const { return running_.load(); }

  int rank() const { return topo_.rank(); }
  int size() const { return topo_.size(); }
  int local_rank() const { return topo_.local_rank(); }
  int local_size() const { return topo_.local_size(); }
  int cross_rank() const { return topo_.cross_rank(); }
  int cross_size() const { return topo_.cross_size(); }
  /// Whether every node holds the same number of ranks (Horovod's is_homogeneous).
  bool homogeneous() const { return topo_.homogeneous; }
  /// What the host tensors' traffic between nodes travels on: "tcp" (GRADCOMP_CROSS_COMMUNICATOR
  /// auto or tcp), "mpi", or a test world's kind.
  const char* cross_communicator_kind() const { return topo_.cross->kind(); }
  const Settings& settings() const { return settings_; }

  // ---- enqueue: each returns at once ---------------------------------------------------
  // Buffers must stay valid (and inputs unchanged) until the handle completes. `name` must
  // be the same on every rank and unique among this rank's pending operations.

  /// output = op over ranks of input (output may equal input). Compression follows the
  /// settings and the layer filter (CompressionFor) unless `compression` overrides it.
  /// `priority`: among tensors ready at once, lower runs first, and with priorities in use a
  /// cycle runs only GRADCOMP_SCHEDULING_CREDIT_MB of them (Request::priority); the same on
  /// every rank.
  std::shared_ptr<Handle> Allreduce(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                    const void* input, void* output, ReduceOp op, double prescale = 1.0,
                                    double postscale = 1.0, const CompressionSpec* compression = nullptr,
                                    Placement placement = {}, int32_t priority = 0);
  /// Several allreduces negotiated in the same cycle (and fused where they fit). `placements`:
  /// none (all on the host), one for all, or one per tensor.
  std::vector<std::shared_ptr<Handle>> GroupedAllreduce(const std::vector<std::string>& names, DataType dtype,
                                                        const std::vector<std::vector<int64_t>>& shapes,
                                                        const std::vector<const void*>& inputs,
                                                        const std::vector<void*>& outputs, ReduceOp op,
                                                        double prescale = 1.0, double postscale = 1.0,
                                                        const CompressionSpec* compression = nullptr,
                                                        const std::vector<Placement>& placements = {},
                                                        int32_t priority = 0);
  /// The compression an allreduce of this tensor gets from the settings: none for non-float
  /// dtypes, ops other than sum/average, tensors with fewer than GRADCOMP_MIN_SIZE elements
  /// and one-dimensional tensors (biases, norms); the configured codec otherwise.
  CompressionSpec CompressionFor(DataType dtype, const std::vector<int64_t>& shape, ReduceOp op) const;
  /// The compression an allgather of this tensor gets from the settings: GRADCOMP_ALLGATHER_COMPRESSION
  /// for float tensors whose rows (the elements after the first dimension) number at least
  /// GRADCOMP_MIN_SIZE, none otherwise.
  CompressionSpec AllgatherCompressionFor(DataType dtype, const std::vector<int64_t>& shape) const;
  /// Concatenation along the first dimension, which may differ per rank (output in the handle,
  /// or in `into`). With `placement` on a device the output is in that device's memory
  /// (Handle::device_output). `compression` (dense codecs; null: AllgatherCompressionFor)
  /// quantizes every rank's rows once, and every rank decodes them all: the same output on
  /// every rank.
  std::shared_ptr<Handle> Allgather(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                    const void* input, const CompressionSpec* compression = nullptr,
                                    Placement placement = {}, OutputBuffer into = {});
  /// root's buffer into every rank's buffer.
  std::shared_ptr<Handle> Broadcast(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                    void* buffer, int root, Placement placement = {});
  /// Rows splits[p] of input go to rank p (output and received rows in the handle). Without
  /// splits the first dimension is split evenly; it must then be a multiple of the ranks.
  std::shared_ptr<Handle> Alltoall(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                   const void* input, const std::vector<int64_t>& splits,
                                   Placement placement = {});
  /// Reduction whose first dimension is split evenly across ranks (output in the handle, or in
  /// `into`).
  /// `compression` (dense codecs; null: CompressionFor's, none for topk and auto) quantizes each
  /// rank's pieces of its peers' slices; each slice is summed in float32 by its owner.
  std::shared_ptr<Handle> Reducescatter(const std::string& name, DataType dtype, const std::vector<int64_t>& shape,
                                        const void* input, ReduceOp op, double prescale = 1.0,
                                        double postscale = 1.0, const CompressionSpec* compression = nullptr,
                                        Placement placement = {}, OutputBuffer into = {});
  /// Completes once every rank has reached it.
  std::shared_ptr<Handle> Barrier();
  /// This rank has no more data: it contributes zeros to other ranks' allreduces until every
  /// rank has joined. The handle's aux() holds the last rank to join.
  std::shared_ptr<Handle> Join();

  /// Starts / stops the timeline (recorded by rank 0, as in Horovod).
  void StartTimeline(const std::string& path);
  void StopTimeline();

  RuntimeStats stats() const;
  /// Auto compression: each tensor's current setting and the errors measured for its last
  /// choice (empty until a choice was made).
  std::map<std::string, AutoTensorReport> CompressionChoices() const { return executor_.auto_compression().Report(); }
  /// Auto compression's cost model: the link as last probed (unknown before the first choice
  /// or with GRADCOMP_AUTO_COST_MODEL=0).
  LinkCost AutoLink() const { return executor_.auto_compression().link(); }
  /// Local, not collective: the compression state kept for these tensor names (error-feedback
  /// residuals, DGC momentum and velocity) is dropped before the next operation runs, so a new
  /// model or optimizer reusing the names starts fresh. Call it with no operation on those
  /// names pending.
  void ForgetCompressionState(const std::vector<std::string>& names);
  /// CPU seconds the background thread has used.
  double BackgroundCpuSeconds() const;

 private:
  std::shared_ptr<Handle> Submit(Request request, const void* input, void* output, Placement placement = {},
                                 size_t output_bytes = 0);
  /// Submits an allgather or reducescatter whose result goes to the handle or to `into`.
  std::shared_ptr<Handle> SubmitShards(Request request, const void* input, Placement placement, OutputBuffer into);
  /// An entry for these buffers with a new handle.
  TensorEntry NewEntry(const void* input, void* output, Placement placement);
  /// Validates one allreduce and builds its request (shared by Allreduce and GroupedAllreduce).
  Request AllreduceRequest(const std::string& name, DataType dtype, const std::vector<int64_t>& shape, ReduceOp op,
                           double prescale, double postscale, const CompressionSpec* compression);
  Request NewRequest(RequestType type, const std::string& name, DataType dtype, const std::vector<int64_t>& shape);
  void CheckRunning() const;
  void BackgroundLoop();
  void GatherBurst(std::chrono::duration<double> cycle);
  void ExecuteAll(const std::vector<Response>& responses, size_t from_cache);
  // One response on its way through ExecuteAll: this rank's entries and its local failure.
  struct Work {
    const Response* response;
    EntryList entries;
    std::string failure;
  };
  // Takes each response's entries and prepares it (local steps that may fail).
  std::vector<Work> PrepareAll(const std::vector<Response>& responses);
  // Runs one prepared response (or fails it) and tells the controller.
  void RunPrepared(Work& w, bool from_cache);
  void CheckSettingsAgree();
  /// Collective, in init: checks that the ranks' settings agree, then connects gradcomp's TCP
  /// mesh when the controller (GRADCOMP_CONTROLLER) or the data between nodes
  /// (GRADCOMP_CROSS_COMMUNICATOR, see MoveCrossTrafficOnto) travels on it; null: none.
  std::unique_ptr<Communicator> ConnectTcp();
  /// Collective: the topology's cross-node communicator (and the world, when every node has one
  /// rank: all of its traffic crosses nodes) become splits of `mesh`.
  void MoveCrossTrafficOnto(Communicator& mesh);
  /// What the controller negotiates over.
  Communicator& ControlCommunicator();
  /// The watchdog's verdict: fails every pending operation with what waited, then ends the
  /// process (at once when shutting down or still in init, else after a grace period).
  void OnCollectiveTimeout(Watchdog::Expired expired);
  /// After a stop every rank agreed on (`fatal`: the stall inspector's verdict): MPI's teardown
  /// at exit stays, bounded by the collective timeout (ops/comm/mpi_exit.h). Logs and returns
  /// the reason pending and later operations fail with, which says how the job will end.
  std::string AgreedStop(const std::string& fatal);
  /// The background thread's failure `e`: tells the TCP peers, leaves MPI unfinalized, logs and
  /// returns the reason, which says how the job will end.
  std::string BackgroundFailed(const std::exception& e);
  /// What every caller hears after a shutdown round: the ranks (`stopped_by`) that asked for it.
  std::string ShutDownBy(const std::vector<int>& stopped_by) const;
  /// What every caller hears when the background thread fails.
  static std::string BackgroundFailure(const std::exception& e);
  [[noreturn]] void ExitProcess(const std::string& why);
  /// Before this runtime's MPI teardown (the shared-memory window's MPI_Win_free, then
  /// MPI_Finalize at exit), which waits for every rank: a barrier on the TCP mesh, which fails at
  /// once, naming it, when a rank died after the shutdown round. MPI's teardown is then skipped.
  void MeetBeforeMpiTeardown();
  /// Warns once when this rank's CPU affinity is a single core (mpirun's default binding).
  void WarnIfPinnedToOneCore();

  Settings settings_;
  bool mpi_world_;  // the world is MPI's (not a test's in-process one)
  std::vector<int> rank_names_;  // RuntimeOptions::rank_names
  std::atomic<bool> started_{false};
  Watchdog watchdog_;
  // The MPI communicators that MoveCrossTrafficOnto replaced, or null (declared before topo_:
  // destroyed after it, as the shared-memory window built from them may still use them).
  std::unique_ptr<Communicator> replaced_world_, replaced_cross_;
  Topology topo_;
  std::shared_ptr<spdlog::logger> log_;
  Timeline timeline_;
  std::shared_ptr<TensorQueue> queue_ = std::make_shared<TensorQueue>();  // handles observe it weakly
  std::string tcp_interfaces_;  // this rank's interfaces towards other hosts (ConnectTcp; before tcp_)
  std::unique_ptr<Communicator> tcp_;  // gradcomp's TCP mesh (ConnectTcp), or null
  Controller controller_;
  Executor executor_;
  std::function<void(const std::string&)> fault_injector_;
  std::atomic<bool> running_{true};
  std::atomic<bool> stop_requested_{false};
  mutable std::mutex state_mu_;
  std::string stopped_reason_;
  RuntimeStats stats_;
  uint64_t barrier_count_ = 0;
  std::vector<std::string> forget_;  // names whose compression state to drop (under state_mu_)
  std::thread background_;
};

}  // namespace gradcomp
