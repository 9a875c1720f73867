// The codec registry, the cast codecs (none, fp16, bf16), topk (DGC) and the memories
// (error feedback, DGC momentum correction, warm-up).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <limits>
#include <string>
#include <vector>

#include "ops/common/enforce.h"
#include "ops/common/half.h"
#include "ops/compression/codec.h"
#include "ops/compression/memory.h"
#include "ops/compression/topk.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {
namespace {

std::vector<float> Gaussian(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = g(rng);
  return v;
}

std::vector<uint8_t> Encode(const Codec& c, const std::vector<float>& x, const CodecParams& p) {
  std::vector<uint8_t> wire(c.MaxWireSize(x.size(), p));
  wire.resize(c.Encode(x.data(), DataType::kFloat32, x.size(), p, 0, wire.data()));
  return wire;
}

std::vector<float> Decode(const Codec& c, const std::vector<uint8_t>& wire, size_t n, const CodecParams& p) {
  std::vector<float> y(n, -99.0f);
  c.Decode(wire.data(), wire.size(), n, p, DataType::kFloat32, y.data());
  return y;
}

TEST(CodecRegistry, EveryCodecHasANameAndADescription) {
  std::vector<std::string> names;
  for (const Codec* c : AllCodecs()) {
    names.push_back(c->name());
    EXPECT_GT(std::strlen(c->description()), 20u) << c->name();
    EXPECT_EQ(&FindCodec(c->name()), c);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"none", "fp16", "bf16", "maxmin", "topk"}));
  try {
    FindCodec("zip");
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("unknown codec 'zip' (known: none, fp16, bf16, maxmin, topk)"),
              std::string::npos);
  }
}

TEST(CastCodecs, RoundTripAndAccumulateExactlyAsTheConversions) {
  std::vector<float> x = Gaussian(10001, 3, 100.0f);
  x[5] = NAN;
  x[6] = INFINITY;
  x[7] = 1e-30f;
  for (const char* name : {"none", "fp16", "bf16"}) {
    for (Isa isa : {Isa::kScalar, BestIsa()}) {
      const Codec& c = FindCodec(name);
      CodecParams p;
      p.isa = isa;
      const std::vector<uint8_t> wire = Encode(c, x, p);
      const size_t width = std::string(name) == "none" ? 4 : 2;
      ASSERT_EQ(wire.size(), x.size() * width);
      const std::vector<float> y = Decode(c, wire, x.size(), p);
      std::vector<float> acc(x.size(), 1.0f);
      c.DecodeAccumulate(wire.data(), wire.size(), x.size(), p, DataType::kFloat32, acc.data());
      for (size_t i = 0; i < x.size(); ++i) {
        float want = x[i];
        if (width == 2) {
          want = std::string(name) == "fp16" ? HalfBitsToFloat(FloatToHalfBits(x[i]))
                                             : BFloat16BitsToFloat(FloatToBFloat16Bits(x[i]));
        }
        if (std::isnan(want)) {
          ASSERT_TRUE(std::isnan(y[i]));
          continue;
        }
        ASSERT_EQ(y[i], want) << name << " " << i;
        ASSERT_EQ(acc[i], 1.0f + want) << name << " " << i;
      }
    }
  }
}

TEST(TopK, KeepsBetweenPointEightAndOnePointThreeKAboveTheThreshold) {
  for (size_t n : {size_t{1000}, size_t{100000}, size_t{1000000}}) {
    for (double ratio : {0.1, 0.01, 0.001}) {
      for (uint64_t step = 0; step < 3; ++step) {
        const std::vector<float> x = Gaussian(n, static_cast<uint32_t>(n + step));
        CodecParams p;
        p.topk_ratio = ratio;
        p.step = step;
        const TopKSelection sel = SelectTopK(x.data(), DataType::kFloat32, n, p, 0);
        const size_t k = TopKTarget(n, ratio);
        EXPECT_GE(sel.indices.size() * 10, k * 8) << "n " << n << " ratio " << ratio;
        EXPECT_LE(sel.indices.size() * 10, k * 13) << "n " << n << " ratio " << ratio;
        for (size_t j = 0; j < sel.indices.size(); ++j) {
          ASSERT_GE(std::fabs(x[sel.indices[j]]), sel.threshold);
          if (j > 0) {
            ASSERT_LT(sel.indices[j - 1], sel.indices[j]) << "indices ascending";
          }
        }
        // Nothing left behind is larger than the threshold unless exact top-k cut ties.
        size_t above = 0;
        for (float v : x) above += std::fabs(v) > sel.threshold;
        EXPECT_LE(above, sel.indices.size());
      }
    }
  }
}

TEST(TopK, AdjustsTowardKAndFallsBackToExactSelection) {
  // All-equal magnitudes: no threshold separates them, so exact top-k picks the first k.
  std::vector<float> same(1000, 0.5f);
  CodecParams p;
  p.topk_ratio = 0.01;
  TopKSelection sel = SelectTopK(same.data(), DataType::kFloat32, same.size(), p, 0);
  EXPECT_TRUE(sel.exact);
  ASSERT_EQ(sel.indices.size(), 10u);
  for (uint32_t j = 0; j < 10; ++j) EXPECT_EQ(sel.indices[j], j);
  // A sample that misses a cluster of large values forces threshold adjustments.
  std::vector<float> x = Gaussian(100000, 4, 1e-3f);
  for (size_t i = 0; i < 1500; ++i) x[i * 13 + 1] = 10.0f + static_cast<float>(i) * 1e-3f;
  p.topk_sample_ratio = 0.001;
  sel = SelectTopK(x.data(), DataType::kFloat32, x.size(), p, 0);
  EXPECT_GE(sel.indices.size(), 800u);
  EXPECT_LE(sel.indices.size(), 1300u);
}

TEST(TopK, RatioOneEqualsUncompressedAndDecodeIsAScatter) {
  const std::vector<float> x = Gaussian(4097, 8);
  const Codec& c = FindCodec("topk");
  CodecParams p;
  p.topk_ratio = 1.0;
  const std::vector<uint8_t> wire = Encode(c, x, p);
  EXPECT_EQ(Decode(c, wire, x.size(), p), x);
  // At 1% the decode holds the kept values at their indices and zeros elsewhere; accumulate adds.
  p.topk_ratio = 0.01;
  const std::vector<uint8_t> sparse = Encode(c, x, p);
  const TopKSelection sel = SelectTopK(x.data(), DataType::kFloat32, x.size(), p, 0);
  EXPECT_EQ(sparse.size(), 4 + sel.indices.size() * 8);
  EXPECT_LE(sparse.size(), c.MaxWireSize(x.size(), p));
  const std::vector<float> y = Decode(c, sparse, x.size(), p);
  std::vector<float> acc(x.size(), 2.0f);
  c.DecodeAccumulate(sparse.data(), sparse.size(), x.size(), p, DataType::kFloat32, acc.data());
  size_t kept = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const bool is_kept = kept < sel.indices.size() && sel.indices[kept] == i;
    ASSERT_EQ(y[i], is_kept ? x[i] : 0.0f);
    ASSERT_EQ(acc[i], 2.0f + y[i]);
    kept += is_kept;
  }
}

TEST(TopK, Float16ValuesNaNAndMalformedInput) {
  std::vector<float> x = Gaussian(2000, 9);
  x[77] = NAN;
  const Codec& c = FindCodec("topk");
  CodecParams p;
  p.topk_ratio = 0.01;
  p.topk_value_dtype = DataType::kFloat16;
  const std::vector<uint8_t> wire = Encode(c, x, p);
  const std::vector<float> y = Decode(c, wire, x.size(), p);
  EXPECT_TRUE(std::isnan(y[77])) << "NaN is always kept";
  for (size_t i = 0; i < x.size(); ++i) {
    if (i != 77 && y[i] != 0.0f) {
      ASSERT_EQ(y[i], HalfBitsToFloat(FloatToHalfBits(x[i])));
    }
  }
  ASSERT_GE(wire.size(), 8u);
  std::vector<uint8_t> bad(wire.begin(), wire.end());
  const uint32_t out_of_range = 5000;
  for (size_t b = 0; b < 4; ++b) bad.at(4 + b) = static_cast<uint8_t>(out_of_range >> (8 * b));
  std::vector<float> out(x.size());
  try {
    c.Decode(bad.data(), bad.size(), x.size(), p, DataType::kFloat32, out.data());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("index 5000 is outside a 2000-value tensor"), std::string::npos);
  }
  EXPECT_THROW(c.Decode(wire.data(), wire.size() - 1, x.size(), p, DataType::kFloat32, out.data()), InvalidArgument);
  p.topk_ratio = 0.0;
  try {
    c.MaxWireSize(10, p);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("topk: ratio=0.000000 is outside (0, 1]"), std::string::npos) << e.what();
  }
}

// 2-bit max-min in buckets of 64: coarse enough that error feedback carries a lot.
CodecParams TwoBitParams() {
  CodecParams p;
  p.bits = 2;
  p.bucket_size = 64;
  return p;
}

TEST(ErrorFeedback, TelescopesToTheSumOfInputs) {
  const Codec& c = FindCodec("maxmin");
  CodecParams p = TwoBitParams();
  ErrorFeedback ef;
  const size_t n = 5000;
  std::vector<double> sum_in(n, 0.0), sum_out(n, 0.0);
  for (int step = 0; step < 50; ++step) {
    std::vector<float> g = Gaussian(n, static_cast<uint32_t>(step), 0.1f);
    for (size_t i = 0; i < n; ++i) sum_in[i] += g[i];
    ef.Compensate("w", g.data(), n);
    p.step = static_cast<uint64_t>(step);
    const std::vector<float> decoded = Decode(c, Encode(c, g, p), n, p);
    ef.Update("w", g.data(), decoded.data(), n);
    for (size_t i = 0; i < n; ++i) sum_out[i] += decoded[i];
  }
  const std::vector<float>& residual = ef.Residual("w");
  ASSERT_EQ(residual.size(), n);
  for (size_t i = 0; i < n; ++i) {
    ASSERT_NEAR(sum_out[i] + residual[i], sum_in[i], 1e-4) << i;
  }
  EXPECT_TRUE(ef.Residual("other").empty());
}

// The seed's DGC reference, written as plainly as possible.
struct ReferenceDgc {
  float momentum;
  bool nesterov;
  std::vector<float> mmt, vec;
  std::vector<float> Compensate(const std::vector<float>& grad) {
    if (mmt.empty()) mmt.assign(grad.size(), 0.0f), vec.assign(grad.size(), 0.0f);
    for (size_t i = 0; i < grad.size(); ++i) {
      if (nesterov) {
        mmt[i] = (mmt[i] + grad[i]) * momentum;  // mmt.add_(grad).mul_(momentum)
        vec[i] = (vec[i] + mmt[i]) + grad[i];    // vec.add_(mmt).add_(grad)
      } else {
        mmt[i] = mmt[i] * momentum + grad[i];    // mmt.mul_(momentum).add_(grad)
        vec[i] = vec[i] + mmt[i];                // vec.add_(mmt)
      }
    }
    return vec;
  }
  void Mask(const std::vector<uint32_t>& sent) {
    for (uint32_t i : sent) mmt[i] = vec[i] = 0.0f;
  }
};

TEST(DgcMemory, MatchesTheReferenceStepByStep) {
  for (bool nesterov : {false, true}) {
    DgcMemory mem;
    ReferenceDgc ref{0.9f, nesterov, {}, {}};
    CodecParams p;
    p.topk_ratio = 0.05;
    for (int step = 0; step < 20; ++step) {
      std::vector<float> g = Gaussian(3000, static_cast<uint32_t>(100 + step));
      const std::vector<float> want = ref.Compensate(g);
      mem.Compensate("fc", g.data(), g.size(), 0.9f, nesterov);
      ASSERT_EQ(g, want) << "step " << step;
      p.step = static_cast<uint64_t>(step);
      const TopKSelection sel = SelectTopK(g.data(), DataType::kFloat32, g.size(), p, 0);
      mem.Update("fc", sel.indices.data(), sel.indices.size());
      ref.Mask(sel.indices);
      ASSERT_EQ(mem.Momentum("fc"), ref.mmt) << "step " << step;
      ASSERT_EQ(mem.Velocity("fc"), ref.vec) << "step " << step;
    }
  }
}

TEST(AllFinite, FindsEveryInfAndNaN) {
  std::vector<float> v(1027, 1.5f);
  EXPECT_TRUE(AllFinite(v.data(), v.size()));
  v[3] = std::numeric_limits<float>::max();
  v[4] = -std::numeric_limits<float>::denorm_min();
  EXPECT_TRUE(AllFinite(v.data(), v.size()));
  for (float bad : {std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                    std::numeric_limits<float>::quiet_NaN()}) {
    for (size_t at : {size_t{0}, size_t{517}, v.size() - 1}) {
      std::vector<float> w = v;
      w[at] = bad;
      EXPECT_FALSE(AllFinite(w.data(), w.size())) << bad << " at " << at;
    }
  }
}

// A mixed-precision overflow step: the residual keeps what it had, later steps are finite.
TEST(ErrorFeedback, ANonFiniteStepKeepsThePreviousResidual) {
  const Codec& c = FindCodec("maxmin");
  const CodecParams p = TwoBitParams();
  ErrorFeedback ef;
  const size_t n = 1000;
  auto step = [&](std::vector<float> g) {
    ef.Compensate("w", g.data(), n);
    const std::vector<float> decoded = Decode(c, Encode(c, g, p), n, p);
    return std::make_pair(ef.Update("w", g.data(), decoded.data(), n), decoded);
  };
  ASSERT_TRUE(step(Gaussian(n, 1, 0.1f)).first);
  const std::vector<float> before = ef.Residual("w");
  std::vector<float> overflow = Gaussian(n, 2, 0.1f);
  overflow[70] = std::numeric_limits<float>::infinity();
  const auto [kept, shown] = step(overflow);
  EXPECT_FALSE(kept);
  EXPECT_TRUE(std::isnan(shown[70]));  // the caller sees the overflow
  EXPECT_EQ(ef.Residual("w"), before);
  for (uint32_t s = 3; s < 6; ++s) {
    const auto [ok, decoded] = step(Gaussian(n, s, 0.1f));
    EXPECT_TRUE(ok);
    EXPECT_TRUE(AllFinite(decoded.data(), n)) << "step " << s;
  }
  std::vector<float> nan_residual(n, 0.0f);
  nan_residual[0] = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> last = ef.Residual("w");
  EXPECT_FALSE(ef.Store("w", nan_residual.data(), n));
  EXPECT_EQ(ef.Residual("w"), last);
}

TEST(DgcMemory, ANonFiniteStepLeavesMomentumAndVelocityAlone) {
  for (bool nesterov : {false, true}) {
    DgcMemory mem;
    ReferenceDgc ref{0.9f, nesterov, {}, {}};
    std::vector<float> g = Gaussian(500, 7);
    ref.Compensate(g);
    ASSERT_TRUE(mem.Compensate("fc", g.data(), g.size(), 0.9f, nesterov));
    const std::vector<float> u = mem.Momentum("fc"), v = mem.Velocity("fc");
    std::vector<float> bad = Gaussian(500, 8);
    bad[11] = -std::numeric_limits<float>::infinity();
    std::vector<float> shown = bad;
    EXPECT_FALSE(mem.Compensate("fc", shown.data(), shown.size(), 0.9f, nesterov));
    EXPECT_TRUE(std::isinf(shown[11]));
    // The other values are the velocity this step would have had.
    ReferenceDgc probe = ref;
    const std::vector<float> would = probe.Compensate(bad);
    for (size_t i = 0; i < shown.size(); ++i) {
      if (i != 11) {
        EXPECT_FLOAT_EQ(shown[i], would[i]) << i;
      }
    }
    EXPECT_EQ(mem.Momentum("fc"), u);
    EXPECT_EQ(mem.Velocity("fc"), v);
    std::vector<float> next = Gaussian(500, 9);
    const std::vector<float> want = ref.Compensate(next);
    ASSERT_TRUE(mem.Compensate("fc", next.data(), next.size(), 0.9f, nesterov));
    EXPECT_EQ(next, want) << "the step after the overflow continues from the state before it";
  }
}

TEST(DgcMemory, WarmupFollowsTheExponentialSchedule) {
  const double expected[] = {0.251, 0.0631, 0.0158, 0.00398, 0.001};
  for (int epoch = 0; epoch < 5; ++epoch) {
    EXPECT_NEAR(DgcWarmupRatio(0.001, 5, epoch), expected[epoch], expected[epoch] * 0.01) << epoch;
  }
  EXPECT_DOUBLE_EQ(DgcWarmupRatio(0.001, 5, 12), 0.001);
  EXPECT_DOUBLE_EQ(DgcWarmupRatio(0.01, 0, 0), 0.01);
  EXPECT_THROW(DgcWarmupRatio(0.0, 5, 0), InvalidArgument);
}

}  // namespace
}  // namespace gradcomp
