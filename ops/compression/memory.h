// State codecs keep per tensor name across steps: error feedback (the residual of the last
// compression is added to the next input) and DGC's momentum correction with momentum
// factor masking and its sparsity warm-up schedule.
//
// Non-finite steps. Mixed-precision training overflows now and then: a step carries an inf
// or NaN gradient, the loss scaler sees it in the result, skips the step and lowers its scale.
// Such a step must not enter the memories, or every later step would be NaN where they are
// (inf - inf) and the scaler would skip every step from then on. So a memory is never made
// non-finite: a tensor whose update would put a non-finite value in its residual, momentum or
// velocity keeps, whole, what it had before that step (the step itself still shows the
// non-finite values to the caller).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "ops/device/device.h"
#include "ops/device/staging.h"

namespace gradcomp {

/// The float32 buffers a memory keeps per tensor name, in one device's memory: a tensor whose
/// length changes starts again from zeros.
class DeviceSlots {
 public:
  DeviceSlots(Device& device, size_t per_name) : device_(device), per_name_(per_name) {}
  /// The `k`-th buffer of `name` (k < per_name), (re)made as n zeros if its length differs.
  float* Get(const std::string& name, size_t k, size_t n, Stream& stream);
  /// The `k`-th buffer of `name`, or null.
  const float* Find(const std::string& name, size_t k, size_t* n) const;
  /// Copies buffer k of `name` to the host (empty if none).
  std::vector<float> Read(const std::string& name, size_t k, Stream& stream) const;
  void Forget(const std::string& name) { slots_.erase(name); }
  void Clear() { slots_.clear(); }
  size_t size() const { return slots_.size(); }
  Device& device() const { return device_; }

 private:
  struct Slot {
    size_t n = 0;
    std::vector<std::unique_ptr<Scratch>> buffers;
  };
  Device& device_;
  const size_t per_name_;
  std::unordered_map<std::string, Slot> slots_;
};

/// Error feedback (EF-SGD): before compressing, input += residual; after, residual =
/// compensated input - decode(encode(compensated input)). Keyed by tensor name; a tensor
/// whose length changes starts again from a zero residual. The residuals live in the memory of
/// the device given at construction, and every pointer argument is that device's memory.
class ErrorFeedback {
 public:
  /// Work goes on `stream` (a stream of `device` that outlives this), or on a stream of its own.
  explicit ErrorFeedback(Device& device = HostDevice(), Stream* stream = nullptr);
  /// values[i] += residual[name][i].
  void Compensate(const std::string& name, float* values, size_t n);
  /// residual[name] = compensated - decoded, unless a value of it is not finite: then the
  /// residual stays as it was and this returns false.
  bool Update(const std::string& name, const float* compensated, const float* decoded, size_t n);
  /// residual[name] = residual, unless a value of it is not finite: then the residual stays
  /// as it was and this returns false.
  bool Store(const std::string& name, const float* residual, size_t n);
  /// A host copy of the current residual of `name` (empty if none).
  std::vector<float> Residual(const std::string& name) const;
  /// Forgets every residual.
  void Clear() { slots_.Clear(); }
  void Forget(const std::string& name) { slots_.Forget(name); }
  /// Tensors with a residual.
  size_t size() const { return slots_.size(); }
  /// The residual buffer of `name`, (re)made as n zeros if its length differs.
  float* Slot(const std::string& name, size_t n) { return slots_.Get(name, 0, n, *stream_); }

 private:
  std::unique_ptr<Stream> own_stream_;
  Stream* stream_;
  DeviceSlots slots_;
  Scratch next_;  // Update's residual before it is checked
};

/// DGC momentum correction (Lin et al. 2018): the momentum u and the accumulated velocity v
/// are kept locally per tensor and v is what gets sparsified; the values sent are cleared
/// from both (momentum factor masking). With this the wrapped optimizer must run without
/// momentum of its own. u and v live in the memory of the device given at construction.
class DgcMemory {
 public:
  /// Work goes on `stream` (a stream of `device` that outlives this), or on a stream of its own.
  explicit DgcMemory(Device& device = HostDevice(), Stream* stream = nullptr);
  /// Accumulates `grad` (n values) and overwrites it with the velocity to sparsify
  /// (m = momentum; each tensor's momentum comes with its compression spec):
  ///   plain:    u = m*u + g;      v = v + u
  ///   nesterov: u = (u + g) * m;  v = (v + u) + g
  /// If a gradient value is not finite, `grad` gets the velocity this step would have had
  /// but u and v stay as they were, and this returns false: skip Update for this step.
  bool Compensate(const std::string& name, float* grad, size_t n, float momentum, bool nesterov);
  /// Momentum factor masking: u[i] = v[i] = 0 for every sent index (host memory).
  void Update(const std::string& name, const uint32_t* sent, size_t count);
  /// Host copies of the (u, v) state of `name`, for inspection; empty vectors if none.
  std::vector<float> Momentum(const std::string& name) const;
  std::vector<float> Velocity(const std::string& name) const;
  void Clear() { slots_.Clear(); }
  void Forget(const std::string& name) { slots_.Forget(name); }
  /// Tensors with momentum and velocity.
  size_t size() const { return slots_.size(); }

 private:
  std::unique_ptr<Stream> own_stream_;
  Stream* stream_;
  DeviceSlots slots_;  // per name: u, v
  Scratch u_, v_;      // copies for a non-finite step
};

/// DGC's sparsity warm-up: the kept ratio in `epoch` (0-based, fractional allowed) falls
/// exponentially from final_ratio^(1/warmup_epochs) to final_ratio over warmup_epochs
/// epochs (0.25, 0.063, 0.015, 0.004, 0.001 for 0.001 over 5), then stays at final_ratio.
double DgcWarmupRatio(double final_ratio, int warmup_epochs, double epoch);

}  // namespace gradcomp
