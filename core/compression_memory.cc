#include "core/compression_memory.h"

#include <algorithm>

namespace gradcomp {

CompressionMemory::OnDevice& CompressionMemory::On(Device& device, Stream& stream) {
  std::unique_ptr<OnDevice>& m = devices_[&device];
  if (!m) m = std::make_unique<OnDevice>(device, stream);
  return *m;
}

void CompressionMemory::GatherResiduals(Device& device, Stream& stream, const std::vector<std::string>& names,
                                        const std::vector<size_t>& segments, float* own, float* reduced) {
  OnDevice& m = On(device, stream);
  for (size_t i = 0, at = 0; i < names.size(); at += segments[i], ++i) {
    const size_t bytes = segments[i] * sizeof(float);
    device.Copy(own + at, m.own.Slot(names[i], segments[i]), bytes, stream);
    if (reduced != nullptr) device.Copy(reduced + at, m.reduced.Slot(names[i], segments[i]), bytes, stream);
  }
}

void CompressionMemory::ScatterResiduals(Device& device, Stream& stream, const std::vector<std::string>& names,
                                         const std::vector<size_t>& segments, const float* own, const float* reduced) {
  OnDevice& m = On(device, stream);
  for (size_t i = 0, at = 0; i < names.size(); at += segments[i], ++i) {
    if (!m.own.Store(names[i], own + at, segments[i])) ++kept_;
    if (reduced != nullptr && !m.reduced.Store(names[i], reduced + at, segments[i])) ++kept_;
  }
}

bool CompressionMemory::Compensate(Device& device, Stream& stream, const std::string& name, float* grad, size_t n,
                                   const CompressionSpec& spec) {
  if (On(device, stream).dgc.Compensate(name, grad, n, static_cast<float>(spec.topk_momentum), spec.topk_nesterov)) {
    return true;
  }
  ++kept_;  // a non-finite step: the momentum and velocity stay as they were
  return false;
}

void CompressionMemory::MaskSent(Device& device, Stream& stream, const std::vector<std::string>& names,
                                 const std::vector<size_t>& segments, const std::vector<uint32_t>& sent,
                                 const std::vector<bool>& skip) {
  std::vector<std::vector<uint32_t>> per_tensor(names.size());
  std::vector<size_t> bounds{0};
  for (size_t seg : segments) bounds.push_back(bounds.back() + seg);
  for (uint32_t idx : sent) {
    const size_t t = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), idx) - bounds.begin()) - 1;
    per_tensor[t].push_back(idx - static_cast<uint32_t>(bounds[t]));
  }
  DgcMemory& dgc = On(device, stream).dgc;
  for (size_t i = 0; i < names.size(); ++i) {
    if (!skip[i]) dgc.Update(names[i], per_tensor[i].data(), per_tensor[i].size());
  }
}

void CompressionMemory::Forget(const std::string& name) {
  for (auto& [device, m] : devices_) {
    m->own.Forget(name);
    m->reduced.Forget(name);
    m->dgc.Forget(name);
  }
}

size_t CompressionMemory::size() const {
  size_t n = 0;
  for (const auto& [device, m] : devices_) n += m->own.size() + m->dgc.size();
  return n;
}

}  // namespace gradcomp
