#include "test/support/sra_reference.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "ops/comm/communicator.h"
#include "ops/compression/codec.h"

namespace gradcomp::testing {

CompressedAllreduceOptions AverageWith(const std::vector<float>& in, std::vector<float>& out, const char* codec,
                                       int bits, size_t bucket) {
  CompressedAllreduceOptions o;
  o.input = in.data();
  o.output = out.data();
  o.count = in.size();
  o.op = ReduceOp::kAverage;
  o.codec = &FindCodec(codec);
  o.params.bits = bits;
  o.params.bucket_size = static_cast<int64_t>(bucket);
  o.name = "grad";
  return o;
}

std::vector<double> ExactSum(const std::vector<std::vector<float>>& parts, double scale) {
  std::vector<double> out(parts.empty() ? 0 : parts[0].size(), 0.0);
  for (const auto& p : parts) {
    for (size_t i = 0; i < out.size(); ++i) out[i] += p[i];
  }
  for (double& v : out) v *= scale;
  return out;
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
double MaxAbsOf(const std::vector<double>& v, size_t lo, size_t hi) {
  const auto mm = std::minmax_element(v.begin() + static_cast<long>(lo), v.begin() + static_cast<long>(hi));
  return std::max(std::fabs(*mm.first), std::fabs(*mm.second));
}
// f(lo, hi) for every bucket of [begin, begin + len), buckets starting at `begin`.
template <typename F>
void ForBuckets(size_t begin, size_t len, size_t bucket, F&& f) {
  for (size_t b0 = 0; b0 < len; b0 += bucket) f(begin + b0, begin + std::min(len, b0 + bucket));
}

struct BoundContext {
  std::vector<double> exact;  // scale * the exact sum
  double scale, levels, k;    // k: 2 for stochastic rounding
  size_t bucket, world;
  std::vector<double>* bound;
};

// The bound over [c0, c0 + len) of an allreduce among participants holding `value` (what they
// reduce: a row sum at an inner level), of which `err` (unscaled) was already lost, on the grid
// levels `columns` (row lengths, outermost first; none left: flat SRA).
void LevelBound(const BoundContext& c, const std::vector<std::vector<double>>& value,
                const std::vector<std::vector<double>>& err, const std::vector<int>& columns, size_t c0, size_t len) {
  const size_t n = value.size();
  if (columns.empty()) {
    // Flat SRA: sub-chunk o owned by participant o; the others' units and what every
    // participant already lost, then the reduced bucket's range widened by that.
    const std::vector<size_t> subs = EvenSplit(len, static_cast<int>(n)), soff = Offsets(subs);
    for (size_t o = 0; o < n; ++o) {
      ForBuckets(c0 + soff[o], subs[o], c.bucket, [&](size_t lo, size_t hi) {
        double e = 0, mag = 0;
        for (size_t r = 0; r < n; ++r) {
          e += c.scale * MaxOf(err[r], lo, hi);
          mag += c.scale * MaxAbsOf(value[r], lo, hi);
          if (r != o) e += c.k * c.scale * (RangeOf(value[r], lo, hi) + 2 * MaxOf(err[r], lo, hi)) / c.levels / 2;
        }
        const double final_term = c.k * (RangeOf(c.exact, lo, hi) + 2 * e) / c.levels / 2;
        // float32 arithmetic of encode, decode and the float32 sums: a few ulps per term.
        const double slack = 1e-6 * (mag + e * c.levels) * static_cast<double>(c.world);
        for (size_t i = lo; i < hi; ++i) (*c.bound)[i] = e + final_term + slack;
      });
    }
    return;
  }
  // A grid of rows of b: the row scatter of row chunk j, then the rows' sums reduced by the
  // columns' allreduce (the levels left).
  const size_t b = static_cast<size_t>(columns[0]), a = n / b;
  const std::vector<int> inner(columns.begin() + 1, columns.end());
  const std::vector<size_t> chunks = EvenSplit(len, static_cast<int>(b)), coff = Offsets(chunks);
  const size_t count = value.empty() ? 0 : value[0].size();
  for (size_t j = 0; j < b; ++j) {
    const size_t cj = c0 + coff[j], lj = chunks[j];
    std::vector<std::vector<double>> row_sum(a, std::vector<double>(count, 0.0)), row_err = row_sum;
    for (size_t r = 0; r < a; ++r) {
      for (size_t col = 0; col < b; ++col) {
        const std::vector<double>& v = value[r * b + col];
        const std::vector<double>& e = err[r * b + col];
        for (size_t i = cj; i < cj + lj; ++i) {
          row_sum[r][i] += v[i];
          row_err[r][i] += e[i];
        }
        if (col == j) continue;
        ForBuckets(cj, lj, c.bucket, [&](size_t lo, size_t hi) {
          const double u = (RangeOf(v, lo, hi) + 2 * MaxOf(e, lo, hi)) / c.levels;
          for (size_t i = lo; i < hi; ++i) row_err[r][i] += c.k * u / 2;
        });
      }
    }
    LevelBound(c, row_sum, row_err, inner, cj, lj);
  }
}
}  // namespace

std::vector<double> NestedSraBound(const std::vector<std::vector<float>>& parts, double scale, int bits,
                                   size_t bucket, bool stochastic, const std::vector<int>& columns) {
  const size_t count = parts.empty() ? 0 : parts[0].size();
  std::vector<double> bound(count, 0.0);
  if (parts.size() <= 1) return bound;  // a single participant is exact
  BoundContext c{ExactSum(parts, scale), scale, std::ldexp(1.0, bits) - 1, stochastic ? 2.0 : 1.0,
                 bucket, parts.size(), &bound};
  std::vector<std::vector<double>> value, err(parts.size(), std::vector<double>(count, 0.0));
  for (const auto& p : parts) value.emplace_back(p.begin(), p.end());
  LevelBound(c, value, err, columns, 0, count);
  return bound;
}

std::vector<double> SraBound(const std::vector<std::vector<float>>& parts, double scale, int bits, size_t bucket,
                             bool stochastic) {
  return NestedSraBound(parts, scale, bits, bucket, stochastic, {});
}

std::vector<double> Sra2dBound(const std::vector<std::vector<float>>& parts, double scale, int bits, size_t bucket,
                               bool stochastic, int columns) {
  return NestedSraBound(parts, scale, bits, bucket, stochastic, {columns});
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
