#include "ops/compression/memory.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {
const std::vector<float>& Empty() {
  static const std::vector<float> empty;
  return empty;
}
}  // namespace

std::vector<float>& ErrorFeedback::Slot(const std::string& name, size_t n) {
  std::vector<float>& r = residuals_[name];
  if (r.size() != n) r.assign(n, 0.0f);
  return r;
}

void ErrorFeedback::Compensate(const std::string& name, float* values, size_t n) {
  const std::vector<float>& r = Slot(name, n);
  for (size_t i = 0; i < n; ++i) values[i] += r[i];
}

bool ErrorFeedback::Update(const std::string& name, const float* compensated, const float* decoded, size_t n) {
  std::vector<float> next(n);
  for (size_t i = 0; i < n; ++i) next[i] = compensated[i] - decoded[i];
  return Store(name, next.data(), n);
}

bool ErrorFeedback::Store(const std::string& name, const float* residual, size_t n) {
  if (!AllFinite(residual, n)) return false;
  std::vector<float>& r = Slot(name, n);
  std::copy(residual, residual + n, r.begin());
  return true;
}

const std::vector<float>& ErrorFeedback::Residual(const std::string& name) const {
  auto it = residuals_.find(name);
  return it == residuals_.end() ? Empty() : it->second;
}

DgcMemory::State& DgcMemory::Slot(const std::string& name, size_t n) {
  State& s = state_[name];
  if (s.momentum.size() != n) {
    s.momentum.assign(n, 0.0f);
    s.velocity.assign(n, 0.0f);
  }
  return s;
}

namespace {
// DGC's accumulation on arrays u and v; grad becomes the velocity (see DgcMemory::Compensate).
void Accumulate(float* u, float* v, float* grad, size_t n, float m, bool nesterov) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      u[i] = (u[i] + grad[i]) * m;
      v[i] = (v[i] + u[i]) + grad[i];
      grad[i] = v[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + grad[i];
      v[i] = v[i] + u[i];
      grad[i] = v[i];
    }
  }
}
}  // namespace

bool DgcMemory::Compensate(const std::string& name, float* grad, size_t n, float momentum, bool nesterov) {
  State& s = Slot(name, n);
  if (AllFinite(grad, n)) {
    Accumulate(s.momentum.data(), s.velocity.data(), grad, n, momentum, nesterov);
    return true;
  }
  // A non-finite step (rare): the caller gets this step's velocity, computed on copies, and
  // the state keeps what it had.
  std::vector<float> u = s.momentum, v = s.velocity;
  Accumulate(u.data(), v.data(), grad, n, momentum, nesterov);
  return false;
}

void DgcMemory::Update(const std::string& name, const uint32_t* sent, size_t count) {
  auto it = state_.find(name);
  GC_ENFORCE(it != state_.end(), "DGC memory has no state for tensor '", name, "'");
  State& s = it->second;
  for (size_t j = 0; j < count; ++j) {
    GC_ENFORCE(sent[j] < s.momentum.size(), "sent index ", sent[j], " outside tensor '", name, "'");
    s.momentum[sent[j]] = 0.0f;
    s.velocity[sent[j]] = 0.0f;
  }
}

const std::vector<float>& DgcMemory::Momentum(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? Empty() : it->second.momentum;
}

const std::vector<float>& DgcMemory::Velocity(const std::string& name) const {
  auto it = state_.find(name);
  return it == state_.end() ? Empty() : it->second.velocity;
}

bool AllFinite(const float* values, size_t n) {
  // Exponent bits all ones is inf or NaN; OR-ing the masked words lets the loop vectorize.
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}

double DgcWarmupRatio(double final_ratio, int warmup_epochs, double epoch) {
  if (!(final_ratio > 0.0 && final_ratio <= 1.0)) {
    throw InvalidArgument("DGC warm-up: final ratio " + std::to_string(final_ratio) + " is outside (0, 1]");
  }
  if (warmup_epochs <= 0 || epoch + 1 >= warmup_epochs) return final_ratio;
  const double progress = std::max(0.0, std::floor(epoch) + 1) / warmup_epochs;
  return std::pow(final_ratio, progress);
}

}  // namespace gradcomp
