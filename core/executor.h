// The data plane side of the runtime: executes one negotiated response on this rank by
// calling the collectives of ops/ (fusion buffer in, collective, copy out) and completes
// the handles. Every rank executes the same responses in the same order.
#pragma once

#include <atomic>
#include <memory>
#include <vector>

#include "core/message.h"
#include "core/settings.h"
#include "core/tensor_queue.h"
#include "core/timeline.h"
#include "ops/comm/topology.h"
#include "ops/collectives/compressed_allreduce.h"
#include "ops/compression/memory.h"

namespace gradcomp {

/// This rank's entries for a response's names (nullptr where this rank joined and
/// contributes zeros).
using EntryList = std::vector<std::unique_ptr<TensorEntry>>;

class Executor {
 public:
  Executor(const Topology& topo, const Settings& settings, Timeline& timeline)
      : topo_(topo), settings_(settings), timeline_(timeline) {}

  /// Local preparation that may fail (allocations); runs before the ranks agree to go on.
  void Prepare(const Response& response, EntryList& entries);
  /// Runs the collective and completes the entries' handles.
  void Run(const Response& response, EntryList& entries);
  /// Drops the error-feedback residuals and DGC momentum kept for `name`.
  void ForgetCompressionState(const std::string& name) {
    residuals_.Forget(name);
    reduced_residuals_.Forget(name);
    dgc_.Forget(name);
  }

 private:
  void RunAllreduce(const Response& r, EntryList& entries);
  void RunCompressedAllreduce(const Response& r, EntryList& entries, size_t total);
  void RunAllgather(const Response& r, EntryList& entries);
  void RunBroadcast(const Response& r, EntryList& entries);
  void RunAlltoall(const Response& r, EntryList& entries);
  void RunReducescatter(const Response& r, EntryList& entries);

  const Topology& topo_;
  const Settings& settings_;
  Timeline& timeline_;
  std::vector<char> fusion_;   // fusion buffer, grown as needed
  std::vector<char> scratch_;  // zeros / receive space of joined ranks
  // Compression state kept per tensor name across steps.
  ErrorFeedback residuals_;          // of this rank's own compression
  ErrorFeedback reduced_residuals_;  // of the reduced chunks this rank owns
  DgcMemory dgc_;
  uint64_t compressed_steps_ = 0;    // keys stochastic rounding; identical on every rank
  CompressionWorkspace workspace_;
  std::atomic<uint64_t> bytes_in_{0}, bytes_on_wire_{0};  // read by other threads (stats)
  std::atomic<uint64_t> memories_kept_{0};  // memory updates skipped for non-finite values

 public:
  /// Payload bytes of compressed allreduces and the bytes this rank sent for them.
  uint64_t compressed_bytes_in() const { return bytes_in_; }
  uint64_t compressed_bytes_on_wire() const { return bytes_on_wire_; }
  /// Error-feedback residuals and DGC memories (one per tensor and memory) that kept their
  /// previous values because a step carried non-finite values (ops/compression/memory.h).
  uint64_t nonfinite_memory_skips() const { return memories_kept_; }
  /// Tensors with compression state kept across steps (background thread only).
  size_t compression_memories() const { return residuals_.size() + dgc_.size(); }
};

}  // namespace gradcomp
