#include "ops/compression/memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

float* DeviceSlots::Get(const std::string& name, size_t k, size_t n, Stream& stream) {
  Slot& s = slots_[name];
  if (s.buffers.empty() || s.n != n) {
    s.buffers.resize(per_name_);
    for (auto& b : s.buffers) {
      if (!b) b = std::make_unique<Scratch>();
      device_.Fill(b->Reserve(device_, n * sizeof(float)), 0, n * sizeof(float), stream);
    }
    s.n = n;
  }
  return static_cast<float*>(s.buffers[k]->data());
}

const float* DeviceSlots::Find(const std::string& name, size_t k, size_t* n) const {
  auto it = slots_.find(name);
  if (it == slots_.end() || it->second.buffers.empty()) return nullptr;
  *n = it->second.n;
  return static_cast<const float*>(it->second.buffers[k]->data());
}

std::vector<float> DeviceSlots::Read(const std::string& name, size_t k, Stream& stream) const {
  size_t n = 0;
  const float* p = Find(name, k, &n);
  std::vector<float> out(p != nullptr ? n : 0);
  if (p != nullptr) device_.CopyToHost(out.data(), p, n * sizeof(float), stream);
  stream.Synchronize();
  return out;
}

ErrorFeedback::ErrorFeedback(Device& device, Stream* stream)
    : own_stream_(stream ? nullptr : device.NewStream()), stream_(stream ? stream : own_stream_.get()),
      slots_(device, 1) {}

void ErrorFeedback::Compensate(const std::string& name, float* values, size_t n) {
  const float* r = Slot(name, n);
  slots_.device().Reduce(values, values, r, n, DataType::kFloat32, ReduceOp::kSum, *stream_);
}

bool ErrorFeedback::Update(const std::string& name, const float* compensated, const float* decoded, size_t n) {
  auto* next = static_cast<float*>(next_.Reserve(slots_.device(), n * sizeof(float)));
  slots_.device().Subtract(next, compensated, decoded, n, *stream_);
  return Store(name, next, n);
}

bool ErrorFeedback::Store(const std::string& name, const float* residual, size_t n) {
  Device& d = slots_.device();
  if (!d.AllFinite(residual, n, *stream_)) return false;
  d.Copy(Slot(name, n), residual, n * sizeof(float), *stream_);
  return true;
}

std::vector<float> ErrorFeedback::Residual(const std::string& name) const { return slots_.Read(name, 0, *stream_); }

DgcMemory::DgcMemory(Device& device, Stream* stream)
    : own_stream_(stream ? nullptr : device.NewStream()), stream_(stream ? stream : own_stream_.get()),
      slots_(device, 2) {}

bool DgcMemory::Compensate(const std::string& name, float* grad, size_t n, float momentum, bool nesterov) {
  Device& d = slots_.device();
  Stream& s = *stream_;
  float* u = slots_.Get(name, 0, n, s);
  float* v = slots_.Get(name, 1, n, s);
  if (d.AllFinite(grad, n, s)) {
    d.DgcAccumulate(u, v, grad, n, momentum, nesterov, s);
    return true;
  }
  // A non-finite step (rare): the caller gets this step's velocity, computed on copies, and
  // the state keeps what it had.
  auto* cu = static_cast<float*>(u_.Reserve(d, n * sizeof(float)));
  auto* cv = static_cast<float*>(v_.Reserve(d, n * sizeof(float)));
  d.Copy(cu, u, n * sizeof(float), s);
  d.Copy(cv, v, n * sizeof(float), s);
  d.DgcAccumulate(cu, cv, grad, n, momentum, nesterov, s);
  return false;
}

void DgcMemory::Update(const std::string& name, const uint32_t* sent, size_t count) {
  size_t n = 0;
  GC_ENFORCE(slots_.Find(name, 0, &n) != nullptr, "DGC memory has no state for tensor '", name, "'");
  for (size_t j = 0; j < count; ++j) GC_ENFORCE(sent[j] < n, "sent index ", sent[j], " outside tensor '", name, "'");
  for (size_t k = 0; k < 2; ++k) slots_.device().ZeroAt(slots_.Get(name, k, n, *stream_), n, sent, count, *stream_);
}

std::vector<float> DgcMemory::Momentum(const std::string& name) const { return slots_.Read(name, 0, *stream_); }
std::vector<float> DgcMemory::Velocity(const std::string& name) const { return slots_.Read(name, 1, *stream_); }

double DgcWarmupRatio(double final_ratio, int warmup_epochs, double epoch) {
  if (!(final_ratio > 0.0 && final_ratio <= 1.0)) {
    throw InvalidArgument("DGC warm-up: final ratio " + std::to_string(final_ratio) + " is outside (0, 1]");
  }
  if (warmup_epochs <= 0 || epoch + 1 >= warmup_epochs) return final_ratio;
  const double progress = std::max(0.0, std::floor(epoch) + 1) / warmup_epochs;
  return std::pow(final_ratio, progress);
}

}  // namespace gradcomp
