// The data plane side of the runtime: executes one negotiated response on this rank by
// calling the collectives of ops/ (fusion buffer in, collective, copy out) and completes
// the handles. Every rank executes the same responses in the same order.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "core/auto_compression.h"
#include "core/compression_memory.h"
#include "core/message.h"
#include "core/settings.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "ops/comm/topology.h"
#include "ops/collectives/allreduce.h"
#include "ops/collectives/uncompressed_algorithms.h"
#include "ops/collectives/allreduce_algorithms.h"
#include "ops/collectives/shard_algorithms.h"

namespace gradcomp {

/// Which communicator of the topology a device communicator stands in for.
enum class CommLevel { kWorld, kLocal, kCross };
/// Makes a communicator over `host`'s ranks that takes `device`'s memory (NCCL; collective over
/// `host`), or returns null where that level stays on the host communicator with staging. Its
/// answer for a level must be the same on every rank.
using DeviceCommunicatorFactory =
    std::function<std::unique_ptr<Communicator>(Communicator& host, Device& device, CommLevel level)>;

/// This rank's entries for a response's names (nullptr where this rank joined and
/// contributes zeros).
using EntryList = std::vector<std::unique_ptr<TensorEntry>>;

class Executor {
 public:
  /// `device_comms` (may be empty) makes the communicators that take device memory, used for
  /// responses whose tensors are in device memory on every rank (Response::on_device).
  Executor(const Topology& topo, const Settings& settings, Timeline& timeline,
           DeviceCommunicatorFactory device_comms = {})
      : topo_(topo),
        settings_(settings),
        timeline_(timeline),
        device_comms_(std::move(device_comms)),
        planner_(PlannerSettings(settings)) {
    if (settings.auto_cost_model) {
      auto_ = std::make_unique<AutoCompression>(timeline_, [this](size_t bytes) { return TimeUncompressed(bytes); });
    }
  }

  /// Local preparation that may fail (allocations); runs before the ranks agree to go on.
  void Prepare(const Response& response, EntryList& entries);
  /// Runs the collective and completes the entries' handles.
  void Run(const Response& response, EntryList& entries);
  /// Drops the error-feedback residuals and DGC momentum kept for `name`.
  void ForgetCompressionState(const std::string& name) { memory_.Forget(name); }
  /// Where the choices of auto compression are logged (rank 0).
  void SetLogger(spdlog::logger* log) { auto_->SetLogger(log); }
  /// Adaptive compression's choices (thread-safe).
  const AutoCompression& auto_compression() const { return *auto_; }

 private:
  void RunAllreduce(const Response& r, EntryList& entries);
  void RunCompressedAllreduce(const Response& r, EntryList& entries, size_t total);
  /// An allreduce of an auto spec: auto's stage (AutoCompression::Resolve: choose, measure)
  /// gives the settings its tensors run with, then one allreduce per setting.
  void RunAutoAllreduce(const Response& r, EntryList& entries);
  class AutoView;
  /// One setting's tensors of an auto response, as a response of their own.
  void RunAutoGroup(const Response& r, EntryList& entries, const AutoGroup& g);
  /// Collective: the seconds an uncompressed float32 sum of `bytes` on the host takes this rank
  /// (after a barrier), through the path a tensor's would take (auto compression's probe).
  double TimeUncompressed(size_t bytes);
  /// n values of `dtype` of an entry's input as float32 on the host (a view when they are).
  const float* HostFloats(const TensorEntry& e, DataType dtype, size_t n, std::vector<float>* keep);
  /// The values of `e` at `ranges` (offset, count), in order, as float32 on the host (copied
  /// range by range from a device).
  const float* SampleFloats(const TensorEntry& e, DataType dtype, const std::vector<std::pair<size_t, size_t>>& ranges,
                            std::vector<float>* keep);
  /// What the executor keeps on each device it has met: the compressed path's workspace
  /// (whose stream all the device's work goes on), its fusion buffer and DGC velocities, the
  /// residuals of a step, and the host staging of uncompressed allreduces.
  struct OnDevice {
    explicit OnDevice(Device& d) : workspace(d) {}
    Device& device() { return workspace.device; }
    Stream& stream() { return *workspace.stream; }
    CompressionWorkspace workspace;
    Scratch fusion, velocities, residual, reduced, bounce;
    Scratch host_stage;
    /// The topology's communicators on this device's memory where the factory makes them
    /// (the others: copies of the host ones); null when it makes none.
    std::unique_ptr<Topology> comms;
    bool comms_made = false;
  };
  OnDevice& On(Device& device);
  /// The device of a response's buffers on this rank: its first present entry's (host if none).
  static Device& DeviceOf(const EntryList& entries);
  Stream& StreamOf(Device& device) { return On(device).stream(); }
  /// Makes each entry's device stream wait until its input is ready on the framework's stream.
  void WaitReady(const EntryList& entries);
  /// dst (memory of `to`) = src (memory of `from`), on their streams.
  void Transfer(Device& to, void* dst, Device& from, const void* src, size_t bytes);
  /// Waits for the streams of the entries' devices.
  void SynchronizeAll(const EntryList& entries);
  /// The device communicators for a response, or null (host communicators, staging). Made at
  /// the first response in device memory on every rank (collective).
  const Topology* DeviceComms(const Response& r, const EntryList& entries);
  /// A collective whose output the runtime allocates (allgather, alltoall, reducescatter) of a
  /// tensor on a device, `in_bytes` in, `out_bytes` out into the handle's device memory: `run`
  /// gets the communicator and its input and output, over a communicator that takes device
  /// memory where there is one and `direct` allows it (it can do what `run` needs), else
  /// through host staging.
  void RunIntoDeviceOutput(const Response& r, EntryList& entries, size_t in_bytes, size_t out_bytes, bool direct,
                           const std::function<void(Communicator&, const void*, void*)>& run);
  /// Whether an uncompressed allreduce runs as the "none" codec's scatter-reduce-allgather
  /// (GRADCOMP_UNCOMPRESSED_ALGORITHM) instead of the communicator's allreduce: across nodes,
  /// MPI's own allreduce over TCP reaches from 60% to 90% of the link from one run to the next.
  /// From 256 KB, where MpiCommunicator stops polling MPI's allreduce with naps: above, MPI's
  /// blocking allreduce spins on a core while the link carries the data, where the SRA's waits
  /// nap (docs/benchmarks.md, "Uncompressed allreduces from 256 KB across nodes").
  bool OwnUncompressedAllreduce(const Response& r, size_t total) const;
  /// Codec none with error feedback: the tensors' residuals are sent with them, exactly, and dropped.
  static bool DeliversResiduals(const Response& r);
  static constexpr size_t kOwnUncompressedMinBytes = size_t{256} << 10;
  /// Uncompressed allreduce of entries on a device: through host staging. Returns the row that ran.
  const UncompressedAllreduceAlgorithm& RunStagedAllreduce(const Response& r, EntryList& entries,
                                                           const AllreduceOptions& o);
  /// Uncompressed allreduce of entries on a device over a communicator that takes its memory.
  void RunDeviceAllreduce(const Response& r, EntryList& entries, const AllreduceOptions& o, Communicator& comm);
  /// A compressed allreduce's buffer: where the tensors are packed (or the one tensor in place).
  struct Staged {
    OnDevice* on = nullptr;               ///< the device the buffer is on
    DataType dtype = DataType::kFloat32;  ///< float32 for DGC's velocities
    const void* input = nullptr;
    void* output = nullptr;
    char* packed = nullptr;           ///< the packed tensors (device memory); null: the one tensor in place
    std::vector<size_t> segments;     ///< element count of each tensor, in buffer order
    std::vector<bool> skip_masking;   ///< DGC: tensors whose momentum this step leaves alone
  };
  Staged StageCompressed(const Response& r, EntryList& entries, size_t total, bool dgc);
  void UnstageCompressed(const Response& r, EntryList& entries, const Staged& staged);
  CompressedAllreduceOptions CompressedOptions(const Response& r, const Codec& codec, const Staged& staged);
  /// The settings of the allreduce algorithms' table (ops/collectives/allreduce_algorithms.h).
  static AlgorithmSettings PlannerSettings(const Settings& s);
  /// The compressed allreduce `o` of `r` over `topo` as the table's choice sees it.
  AllreduceCase CaseOf(const Response& r, const CompressedAllreduceOptions& o, const Topology& topo);
  /// Hierarchical uncompressed allreduces: asked for, and a topology of equal nodes, several
  /// ranks per node and several nodes (the compressed ones: the table's hierarchical row).
  bool UseHierarchy() const;
  /// Whether FusedAllreduce runs `r` hierarchically: UseHierarchy(), except for Adasum,
  /// which combines the nodes' averages when the tensors are on a device on every rank (Horovod's
  /// Adasum of GPU tensors), whatever the settings, and whole ranks' tensors otherwise.
  bool FusedHierarchy(const Response& r) const;
  void RunAllgather(const Response& r, EntryList& entries);
  void RunBroadcast(const Response& r, EntryList& entries);
  void RunAlltoall(const Response& r, EntryList& entries);
  /// `through_codec`: the compressed form even for codec none (auto's flush of a residual).
  void RunReducescatter(const Response& r, EntryList& entries, bool through_codec = false);
  /// A reduce-scatter of an auto spec (an FSDP2 module's gradients): its setting chosen by
  /// auto's stage as an allreduce's tensor's, by name.
  void RunAutoReducescatter(const Response& r, EntryList& entries);
  // The compressed forms (executor_sharded.cc) of `input` (a joined rank's: the caller's zeros,
  // or null for an allgather): `counts` values of each rank's shard, `out_bytes` of this rank's output.
  void RunCompressedReducescatter(const Response& r, EntryList& entries, const void* input,
                                  const std::vector<size_t>& counts, size_t out_bytes);
  void RunCompressedAllgather(const Response& r, EntryList& entries, const void* input,
                              const std::vector<size_t>& counts, size_t out_bytes);
  /// Their options: input, output (the handle's, or `local` on a joined rank), the response's
  /// codec, scale factors and rounding stream, on its device (ready).
  CompressedAllreduceOptions ShardedOptions(const Response& r, EntryList& entries, const void* input,
                                            const std::vector<size_t>& counts, size_t out_bytes,
                                            std::vector<char>& local);
  /// Their case for the table of sharded algorithms (ops/collectives/shard_algorithms.h): the
  /// flat forms over the device's world where there is one; `compressed` picks the setting that
  /// keeps them flat.
  ShardCase ShardCaseOf(const Response& r, const EntryList& entries, bool compressed);

  const Topology& topo_;
  const Settings& settings_;
  Timeline& timeline_;
  const DeviceCommunicatorFactory device_comms_;
  std::vector<char> fusion_;   // fusion buffer of host allreduces, grown as needed
  std::vector<char> scratch_;  // zeros / receive space of joined ranks
  CompressionMemory memory_;         // kept per tensor name across steps
  std::unique_ptr<AutoCompression> auto_ = std::make_unique<AutoCompression>(timeline_);
  uint64_t compressed_steps_ = 0;    // keys stochastic rounding; identical on every rank
  std::map<Device*, std::unique_ptr<OnDevice>> devices_;
  AllreducePlanner planner_;  // the compressed allreduce's algorithm, and the grids it keeps
  std::atomic<uint64_t> bytes_in_{0}, bytes_on_wire_{0};  // read by other threads (stats)
  std::atomic<uint64_t> uncompressed_sra_{0}, uncompressed_sra_bytes_{0};

 public:
  /// Payload bytes of compressed allreduces and the bytes this rank sent for them.
  uint64_t compressed_bytes_in() const { return bytes_in_; }
  uint64_t compressed_bytes_on_wire() const { return bytes_on_wire_; }
  uint64_t uncompressed_sra_responses() const { return uncompressed_sra_; }
  uint64_t uncompressed_sra_bytes_on_wire() const { return uncompressed_sra_bytes_; }
  /// Error-feedback residuals and DGC memories (one per tensor and memory) that kept their
  /// previous values because a step carried non-finite values (ops/compression/memory.h).
  uint64_t nonfinite_memory_skips() const { return memory_.nonfinite_skips(); }
  /// Tensors with compression state kept across steps (background thread only).
  size_t compression_memories() const { return memory_.size(); }
};

}  // namespace gradcomp
