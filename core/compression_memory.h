// The compression memories the runtime keeps per tensor name across steps (error-feedback
// residuals, DGC momentum and velocity; ops/compression/memory.h), gathered into a fused
// allreduce's buffer order and scattered back tensor by tensor. Background thread only,
// except the counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "ops/compression/memory.h"
#include "ops/compression/spec.h"

namespace gradcomp {

class CompressionMemory {
 public:
  /// The residuals of the tensors `names` (element counts `segments`, in buffer order)
  /// concatenated: `own` of this rank's compression, `reduced` of the chunks it reduces.
  void GatherResiduals(const std::vector<std::string>& names, const std::vector<size_t>& segments,
                       std::vector<float>* own, std::vector<float>* reduced);
  /// Stores the step's residuals back per tensor; one that a non-finite step would poison
  /// keeps its value from before the step (counted in nonfinite_skips).
  void ScatterResiduals(const std::vector<std::string>& names, const std::vector<size_t>& segments,
                        const std::vector<float>& own, const std::vector<float>& reduced);
  /// DGC: replaces the float32 gradient of `name` by the velocity to sparsify. False (and
  /// counted) when the gradient is not finite: MaskSent must then skip this tensor.
  bool Compensate(const std::string& name, float* grad, size_t n, const CompressionSpec& spec);
  /// DGC momentum factor masking of the indices sent (in buffer order), tensor by tensor,
  /// except the tensors with skip[i].
  void MaskSent(const std::vector<std::string>& names, const std::vector<size_t>& segments,
                const std::vector<uint32_t>& sent, const std::vector<bool>& skip);
  /// Drops every memory of `name`.
  void Forget(const std::string& name);
  /// Tensors with error-feedback or DGC state.
  size_t size() const { return own_.size() + dgc_.size(); }
  /// Memories (one per tensor and memory) that kept their values over a non-finite step.
  uint64_t nonfinite_skips() const { return kept_; }

 private:
  ErrorFeedback own_;      // of this rank's own compression
  ErrorFeedback reduced_;  // of the reduced chunks this rank owns
  DgcMemory dgc_;
  std::atomic<uint64_t> kept_{0};  // read by other threads (stats)
};

}  // namespace gradcomp
