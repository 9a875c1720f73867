#include "test/support/sra_reference.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/comm/communicator.h"

namespace gradcomp::testing {

std::vector<double> ExactSum(const std::vector<std::vector<float>>& parts, double scale) {
  std::vector<double> out(parts.empty() ? 0 : parts[0].size(), 0.0);
  for (const auto& p : parts) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += p[i];
  }
  for (double& v : out) v *= scale;
  return out;
}

std::vector<double> SraBound(const std::vector<std::vector<float>>& parts, double scale, int bits, size_t bucket,
                             bool stochastic) {
  const int n = static_cast<int>(parts.size());
  const size_t count = parts.empty() ? 0 : parts[0].size();
  std::vector<double> bound(count, 0.0);
  if (n <= 1) return bound;  // a single participant is exact
  const double levels = std::ldexp(1.0, bits) - 1;
  const double k = stochastic ? 2.0 : 1.0;  // stochastic: strictly below twice the nearest bound
  const std::vector<double> exact = ExactSum(parts, scale);
  const std::vector<size_t> chunks = EvenSplit(count, n), coff = Offsets(chunks);
  for (int o = 0; o < n; ++o) {
    const size_t c0 = coff[static_cast<size_t>(o)], clen = chunks[static_cast<size_t>(o)];
    for (size_t b0 = 0; b0 < clen; b0 += bucket) {
      const size_t lo = c0 + b0, hi = c0 + std::min(clen, b0 + bucket);
      // Stage 1: every other participant's bucket unit over [lo, hi).
      double e1 = 0, mag = 0;
      for (int r = 0; r < n; ++r) {
        const auto mm = std::minmax_element(parts[static_cast<size_t>(r)].begin() + static_cast<long>(lo),
                                            parts[static_cast<size_t>(r)].begin() + static_cast<long>(hi));
        mag += std::max(std::fabs(*mm.first), std::fabs(*mm.second)) * scale;
        if (r != o) e1 += k * scale * (double(*mm.second) - double(*mm.first)) / levels / 2;
      }
      // Stage 2: the reduced bucket's range, widened by stage 1's error.
      const auto mm = std::minmax_element(exact.begin() + static_cast<long>(lo), exact.begin() + static_cast<long>(hi));
      const double e2 = k * (*mm.second - *mm.first + 2 * e1) / levels / 2;
      // float32 arithmetic of encode, decode and the float32 sums: a few ulps per term.
      const double slack = 1e-6 * (mag + e1 * levels) * n;
      for (size_t i = lo; i < hi; ++i) bound[i] = e1 + e2 + slack;
    }
  }
  return bound;
}

namespace {
// Range of v over [lo, hi).
double RangeOf(const std::vector<double>& v, size_t lo, size_t hi) {
  const auto mm = std::minmax_element(v.begin() + static_cast<long>(lo), v.begin() + static_cast<long>(hi));
  return *mm.second - *mm.first;
}
double MaxOf(const std::vector<double>& v, size_t lo, size_t hi) {
  return *std::max_element(v.begin() + static_cast<long>(lo), v.begin() + static_cast<long>(hi));
}
// f(lo, hi) for every bucket of [begin, begin + len), buckets starting at `begin`.
template <typename F>
void ForBuckets(size_t begin, size_t len, size_t bucket, F&& f) {
  for (size_t b0 = 0; b0 < len; b0 += bucket) f(begin + b0, begin + std::min(len, b0 + bucket));
}
}  // namespace

std::vector<double> Sra2dBound(const std::vector<std::vector<float>>& parts, double scale, int bits, size_t bucket,
                               bool stochastic, int columns) {
  const size_t n = parts.size(), b = static_cast<size_t>(columns), a = n / b;
  const size_t count = parts.empty() ? 0 : parts[0].size();
  std::vector<double> bound(count, 0.0);
  if (n <= 1) return bound;
  const double levels = std::ldexp(1.0, bits) - 1;
  const double k = stochastic ? 2.0 : 1.0;
  std::vector<std::vector<double>> value(n);
  for (size_t w = 0; w < n; ++w) value[w].assign(parts[w].begin(), parts[w].end());
  const std::vector<double> exact = ExactSum(parts, scale);
  const std::vector<size_t> chunks = EvenSplit(count, static_cast<int>(b)), coff = Offsets(chunks);
  for (size_t j = 0; j < b; ++j) {
    const size_t c0 = coff[j], clen = chunks[j];
    // Row scatter: e1[r][i] = what row r's sum of chunk j lost (its other ranks' units / 2).
    std::vector<std::vector<double>> e1(a, std::vector<double>(count, 0.0)), rowsum(a, std::vector<double>(count, 0.0));
    for (size_t r = 0; r < a; ++r) {
      for (size_t col = 0; col < b; ++col) {
        const std::vector<double>& v = value[r * b + col];
        for (size_t i = c0; i < c0 + clen; ++i) rowsum[r][i] += v[i];
        if (col == j) continue;
        ForBuckets(c0, clen, bucket, [&](size_t lo, size_t hi) {
          const double u = RangeOf(v, lo, hi) / levels;
          for (size_t i = lo; i < hi; ++i) e1[r][i] += k * u / 2;
        });
      }
    }
    // Column SRA of the row sums: sub-chunk o of chunk j owned by row o.
    const std::vector<size_t> subs = EvenSplit(clen, static_cast<int>(a)), soff = Offsets(subs);
    for (size_t o = 0; o < a; ++o) {
      ForBuckets(c0 + soff[o], subs[o], bucket, [&](size_t lo, size_t hi) {
        double e = 0, mag = 0;
        for (size_t r = 0; r < a; ++r) {
          e += scale * MaxOf(e1[r], lo, hi);
          mag += scale * std::max(std::fabs(rowsum[r][lo]), RangeOf(rowsum[r], lo, hi));
          // A row sum's bucket range, widened by what the row scatter lost in it.
          if (r != o) e += k * scale * (RangeOf(rowsum[r], lo, hi) + 2 * MaxOf(e1[r], lo, hi)) / levels / 2;
        }
        const double final_term = k * (RangeOf(exact, lo, hi) + 2 * e) / levels / 2;
        const double slack = 1e-6 * (mag + e * levels) * static_cast<double>(n);
        for (size_t i = lo; i < hi; ++i) bound[i] = e + final_term + slack;
      });
    }
  }
  return bound;
}

double RelativeL2(const std::vector<float>& got, const std::vector<double>& exact) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    num += (got[i] - exact[i]) * (got[i] - exact[i]);
    den += exact[i] * exact[i];
  }
  return std::sqrt(num / den);
}

std::vector<float> Gradient(size_t count, int rank, double noise, unsigned seed) {
  std::mt19937 shared(seed), own(seed * 7919u + static_cast<unsigned>(rank) * 104729u + 1);
  // One distribution per engine: normal_distribution caches the second value of each pair.
  std::normal_distribution<float> g_shared(0.0f, 1.0f), g_own(0.0f, 1.0f);
  std::vector<float> v(count);
  const bool independent = noise >= 1e3;
  for (size_t i = 0; i < count; ++i) {
    const float s = g_shared(shared), e = g_own(own);
    v[i] = independent ? e : s + static_cast<float>(noise) * e;
  }
  return v;
}

}  // namespace gradcomp::testing
