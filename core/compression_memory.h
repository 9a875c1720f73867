// The compression memories the runtime keeps per tensor name across steps (error-feedback
// residuals, DGC momentum and velocity; ops/compression/memory.h), in the memory of the device
// each tensor lives on, gathered into a fused allreduce's buffer order and scattered back
// tensor by tensor. Background thread only, except the counters.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ops/compression/memory.h"
#include "ops/compression/spec.h"

namespace gradcomp {

/// Every call names the device of its buffers and the stream to work on (one per device, the
/// same every call: the memories of a device keep using the first one).
class CompressionMemory {
 public:
  /// The residuals of the tensors `names` (element counts `segments`, in buffer order)
  /// concatenated into `own` (of this rank's compression) and `reduced` (of the chunks it
  /// reduces; null where the collective has no such stage, the reduce-scatter): `device`
  /// memory of the total count each.
  void GatherResiduals(Device& device, Stream& stream, const std::vector<std::string>& names,
                       const std::vector<size_t>& segments, float* own, float* reduced);
  /// Stores the step's residuals back per tensor; one that a non-finite step would poison
  /// keeps its value from before the step (counted in nonfinite_skips).
  void ScatterResiduals(Device& device, Stream& stream, const std::vector<std::string>& names,
                        const std::vector<size_t>& segments, const float* own, const float* reduced);
  /// DGC: replaces the float32 gradient of `name` (device memory) by the velocity to sparsify.
  /// False (and counted) when the gradient is not finite: MaskSent must then skip this tensor.
  bool Compensate(Device& device, Stream& stream, const std::string& name, float* grad, size_t n,
                  const CompressionSpec& spec);
  /// DGC momentum factor masking of the indices sent (in buffer order), tensor by tensor,
  /// except the tensors with skip[i].
  void MaskSent(Device& device, Stream& stream, const std::vector<std::string>& names,
                const std::vector<size_t>& segments, const std::vector<uint32_t>& sent, const std::vector<bool>& skip);
  /// A host copy of the residual of this rank's own compression of `name` (empty if none).
  std::vector<float> OwnResidual(Device& device, Stream& stream, const std::string& name) {
    return On(device, stream).own.Residual(name);
  }
  /// Drops every memory of `name`, on every device.
  void Forget(const std::string& name);
  /// Tensors with error-feedback or DGC state (per device).
  size_t size() const;
  /// Memories (one per tensor and memory) that kept their values over a non-finite step.
  uint64_t nonfinite_skips() const { return kept_; }

 private:
  struct OnDevice {
    OnDevice(Device& d, Stream& s) : own(d, &s), reduced(d, &s), dgc(d, &s) {}
    ErrorFeedback own;      // of this rank's own compression
    ErrorFeedback reduced;  // of the reduced chunks this rank owns
    DgcMemory dgc;
  };
  OnDevice& On(Device& device, Stream& stream);

  std::map<Device*, std::unique_ptr<OnDevice>> devices_;
  std::atomic<uint64_t> kept_{0};  // read by other threads (stats)
};

}  // namespace gradcomp
