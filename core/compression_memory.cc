#include "core/compression_memory.h"

#include <algorithm>

namespace gradcomp {

void CompressionMemory::GatherResiduals(const std::vector<std::string>& names, const std::vector<size_t>& segments,
                                        std::vector<float>* own, std::vector<float>* reduced) {
  size_t total = 0;
  for (size_t n : segments) total += n;
  own->resize(total);
  reduced->resize(total);
  for (size_t i = 0, at = 0; i < names.size(); at += segments[i], ++i) {
    const std::vector<float>& a = own_.Slot(names[i], segments[i]);
    const std::vector<float>& b = reduced_.Slot(names[i], segments[i]);
    std::copy(a.begin(), a.end(), own->begin() + static_cast<long>(at));
    std::copy(b.begin(), b.end(), reduced->begin() + static_cast<long>(at));
  }
}

void CompressionMemory::ScatterResiduals(const std::vector<std::string>& names, const std::vector<size_t>& segments,
                                         const std::vector<float>& own, const std::vector<float>& reduced) {
  for (size_t i = 0, at = 0; i < names.size(); at += segments[i], ++i) {
    if (!own_.Store(names[i], own.data() + at, segments[i])) ++kept_;
    if (!reduced_.Store(names[i], reduced.data() + at, segments[i])) ++kept_;
  }
}

bool CompressionMemory::Compensate(const std::string& name, float* grad, size_t n, const CompressionSpec& spec) {
  if (dgc_.Compensate(name, grad, n, static_cast<float>(spec.topk_momentum), spec.topk_nesterov)) return true;
  ++kept_;  // a non-finite step: the momentum and velocity stay as they were
  return false;
}

void CompressionMemory::MaskSent(const std::vector<std::string>& names, const std::vector<size_t>& segments,
                                 const std::vector<uint32_t>& sent, const std::vector<bool>& skip) {
  std::vector<std::vector<uint32_t>> per_tensor(names.size());
  std::vector<size_t> bounds{0};
  for (size_t seg : segments) bounds.push_back(bounds.back() + seg);
  for (uint32_t idx : sent) {
    const size_t t = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), idx) - bounds.begin()) - 1;
    per_tensor[t].push_back(idx - static_cast<uint32_t>(bounds[t]));
  }
  for (size_t i = 0; i < names.size(); ++i) {
    if (!skip[i]) dgc_.Update(names[i], per_tensor[i].data(), per_tensor[i].size());
  }
}

void CompressionMemory::Forget(const std::string& name) {
  own_.Forget(name);
  reduced_.Forget(name);
  dgc_.Forget(name);
}

}  // namespace gradcomp
