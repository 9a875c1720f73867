// maxmin: error bounds, exact wire size and layout, determinism of stochastic rounding,
// unbiasedness, scalar == AVX2 bytes, 16-bit inputs == float32 path, non-finite rule.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/common/enforce.h"
#include "ops/common/half.h"
#include "ops/compression/codec.h"
#include "ops/compression/maxmin_math.h"
#include "test/support/reference.h"

namespace gradcomp {
namespace {

enum class Dist { kGaussian, kUniform, kConstant, kOutliers, kMixedSign };
const Dist kDists[] = {Dist::kGaussian, Dist::kUniform, Dist::kConstant, Dist::kOutliers, Dist::kMixedSign};
const char* DistName(Dist d) {
  switch (d) {
    case Dist::kGaussian: return "gaussian";
    case Dist::kUniform: return "uniform";
    case Dist::kConstant: return "constant";
    case Dist::kOutliers: return "outliers";
    case Dist::kMixedSign: return "mixed-sign";
  }
  return "?";
}

std::vector<float> MakeData(Dist d, size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> gauss(0.0f, 1.0f);
  std::uniform_real_distribution<float> uni(-0.5f, 2.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    switch (d) {
      case Dist::kGaussian: v[i] = gauss(rng) * 1e-3f; break;
      case Dist::kUniform: v[i] = uni(rng); break;
      case Dist::kConstant: v[i] = -0.375f; break;
      case Dist::kOutliers: v[i] = (i % 97 == 3) ? gauss(rng) * 1e4f : gauss(rng) * 1e-2f; break;
      case Dist::kMixedSign: v[i] = (i % 2 ? 1.0f : -1.0f) * std::fabs(gauss(rng)) * 50.0f; break;
    }
  }
  return v;
}

CodecParams Params(int bits, size_t bucket, bool stochastic, bool skip = false, Isa isa = BestIsa()) {
  CodecParams p;
  p.bits = bits;
  p.bucket_size = bucket;
  p.stochastic = stochastic;
  p.skip_incomplete_buckets = skip;
  p.seed = 42;
  p.step = 7;
  p.isa = isa;
  return p;
}

std::vector<uint8_t> Encode(const std::vector<float>& x, const CodecParams& p, uint64_t first_index = 0) {
  const Codec& c = FindCodec("maxmin");
  std::vector<uint8_t> wire(c.MaxWireSize(x.size(), p));
  const size_t written = c.Encode(x.data(), DataType::kFloat32, x.size(), p, first_index, wire.data());
  EXPECT_EQ(written, wire.size());
  return wire;
}

std::vector<float> Decode(const std::vector<uint8_t>& wire, size_t n, const CodecParams& p) {
  std::vector<float> y(n, 123.0f);
  FindCodec("maxmin").Decode(wire.data(), wire.size(), n, p, DataType::kFloat32, y.data());
  return y;
}

maxmin::Meta MetaOf(const std::vector<uint8_t>& wire, size_t bucket) {
  maxmin::Meta m;
  std::memcpy(&m.min, wire.data() + 8 * bucket, 4);
  std::memcpy(&m.unit, wire.data() + 8 * bucket + 4, 4);
  return m;
}

// Checks the error of every value against its bucket's unit; returns "" or the first violation.
std::string CheckBounds(const std::vector<float>& x, const std::vector<float>& y, const std::vector<uint8_t>& wire,
                        const CodecParams& p) {
  const size_t n = x.size(), B = p.bucket_size;
  const size_t nq = maxmin::QuantizedValues(n, B, p.skip_incomplete_buckets);
  for (size_t i = 0; i < n; ++i) {
    if (i >= nq) {
      if (y[i] != x[i]) return "raw tail value " + std::to_string(i) + " changed";
      continue;
    }
    const maxmin::Meta m = MetaOf(wire, i / B);
    const float err = std::fabs(y[i] - x[i]);
    // Float rounding of t = (x - min) * inv and of min + unit * q adds a few ulps of the
    // bucket's magnitude on top of the analytic bound.
    const float mag = std::fabs(m.min) + m.unit * static_cast<float>(maxmin::Levels(p.bits));
    const float slack = 4.0f * 1.2e-7f * (mag + static_cast<float>(maxmin::Levels(p.bits)) * m.unit);
    const bool ok = p.stochastic ? err < m.unit + slack : err <= 0.5f * m.unit + slack;
    if (m.unit == 0.0f && y[i] != m.min) return "constant bucket not exact at " + std::to_string(i);
    if (!ok) {
      return "value " + std::to_string(i) + " = " + std::to_string(x[i]) + " decoded to " + std::to_string(y[i]) +
             " (unit " + std::to_string(m.unit) + ")";
    }
  }
  return "";
}

TEST(MaxMin, ErrorWithinBoundForEveryDistributionSizeBitsAndBucket) {
  for (Dist d : kDists) {
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{8}, size_t{511}, size_t{512}, size_t{513}, size_t{1000000}}) {
      const std::vector<float> x = MakeData(d, n, static_cast<uint32_t>(n));
      for (size_t bucket : {size_t{1}, size_t{7}, size_t{64}, size_t{512}, size_t{2048}}) {
        for (int bits = 1; bits <= 8; ++bits) {
          for (bool stochastic : {false, true}) {
            const CodecParams p = Params(bits, bucket, stochastic);
            const std::vector<uint8_t> wire = Encode(x, p);
            const size_t nb = (n + bucket - 1) / bucket;
            ASSERT_EQ(wire.size(), 8 * nb + (n * static_cast<size_t>(bits) + 7) / 8) << "wire size formula";
            const std::vector<float> y = Decode(wire, n, p);
            ASSERT_EQ(CheckBounds(x, y, wire, p), "")
                << DistName(d) << " n=" << n << " bucket=" << bucket << " bits=" << bits << " stochastic=" << stochastic;
          }
        }
      }
    }
  }
}

TEST(MaxMin, SkipIncompleteBucketsSendsTheTailRaw) {
  const std::vector<float> x = MakeData(Dist::kGaussian, 1000, 1);
  const CodecParams p = Params(3, 64, false, true);
  const std::vector<uint8_t> wire = Encode(x, p);
  // 15 full buckets of 64 carry metas and codes, the last 40 values travel as float32.
  EXPECT_EQ(wire.size(), 8 * 15 + (960 * 3 + 7) / 8 + 4 * 40);
  const std::vector<float> y = Decode(wire, x.size(), p);
  EXPECT_EQ(CheckBounds(x, y, wire, p), "");
  for (size_t i = 960; i < 1000; ++i) EXPECT_EQ(y[i], x[i]);
}

TEST(MaxMin, LayoutIsMetasThenLittleEndianCodes) {
  // Bucket of 8 values 0..7 at 3 bits: min 0, unit 1, codes 0..7 exactly.
  std::vector<float> x = {0, 1, 2, 3, 4, 5, 6, 7, 7, 0};
  const CodecParams p = Params(3, 8, false);
  const std::vector<uint8_t> wire = Encode(x, p);
  ASSERT_EQ(wire.size(), 2 * 8 + (10 * 3 + 7) / 8);
  EXPECT_EQ(MetaOf(wire, 0).min, 0.0f);
  EXPECT_EQ(MetaOf(wire, 0).unit, 1.0f);
  EXPECT_EQ(MetaOf(wire, 1).min, 0.0f);
  EXPECT_EQ(MetaOf(wire, 1).unit, 1.0f);
  // Codes 0..7 packed 3 bits each: value j at bits [3j, 3j+3) of the 3-byte little-endian group.
  uint32_t group = 0;
  for (uint32_t j = 0; j < 8; ++j) group |= j << (3 * j);
  EXPECT_EQ(wire[16], group & 0xff);
  EXPECT_EQ(wire[17], (group >> 8) & 0xff);
  EXPECT_EQ(wire[18], (group >> 16) & 0xff);
  // The last partial group (codes 7 and 0) is zero-padded into ceil(2 * 3 / 8) = 1 byte.
  EXPECT_EQ(wire[19], 7);
}

TEST(MaxMin, ScalarAndAvx2ProduceIdenticalBytesAndValues) {
  if (BestIsa() != Isa::kAvx2) GTEST_SKIP() << "no AVX2 on this CPU: only the scalar path exists";
  for (Dist d : kDists) {
    std::vector<float> x = MakeData(d, 70001, 5);
    x[100] = -0.0f;
    for (int bits = 1; bits <= 8; ++bits) {
      for (size_t bucket : {size_t{7}, size_t{512}}) {
        for (bool stochastic : {false, true}) {
          const CodecParams scalar = Params(bits, bucket, stochastic, false, Isa::kScalar);
          const CodecParams simd = Params(bits, bucket, stochastic, false, Isa::kAvx2);
          const std::vector<uint8_t> ws = Encode(x, scalar, 1234), wv = Encode(x, simd, 1234);
          ASSERT_EQ(ws, wv) << DistName(d) << " bits " << bits << " bucket " << bucket;
          std::vector<float> ys = Decode(ws, x.size(), scalar), yv = Decode(ws, x.size(), simd);
          ASSERT_TRUE(testing::SameBytes(ys.data(), yv.data(), ys.size() * 4));
          // Decode-accumulate adds exactly the decoded values.
          std::vector<float> acc_s(x.size(), 0.25f), acc_v(x.size(), 0.25f);
          FindCodec("maxmin").DecodeAccumulate(ws.data(), ws.size(), x.size(), scalar, DataType::kFloat32, acc_s.data());
          FindCodec("maxmin").DecodeAccumulate(ws.data(), ws.size(), x.size(), simd, DataType::kFloat32, acc_v.data());
          ASSERT_TRUE(testing::SameBytes(acc_s.data(), acc_v.data(), acc_s.size() * 4));
          for (size_t i = 0; i < x.size(); i += 997) ASSERT_EQ(acc_s[i], 0.25f + ys[i]);
        }
      }
    }
  }
}

TEST(MaxMin, SameSeedSameBytesOtherStepOtherBytes) {
  const std::vector<float> x = MakeData(Dist::kGaussian, 5000, 3);
  CodecParams p = Params(2, 512, true);
  const std::vector<uint8_t> a = Encode(x, p), b = Encode(x, p);
  EXPECT_EQ(a, b);
  p.step += 1;
  EXPECT_NE(Encode(x, p), a);
  p.step -= 1;
  p.seed += 1;
  EXPECT_NE(Encode(x, p), a);
}

TEST(MaxMin, StochasticRoundingIsUnbiased) {
  const size_t n = 512;
  const std::vector<float> x = MakeData(Dist::kUniform, n, 11);
  const int samples = 2000;
  std::vector<double> mean_err(n, 0.0);
  float unit = 0;
  for (int s = 0; s < samples; ++s) {
    CodecParams p = Params(2, n, true);
    p.step = static_cast<uint64_t>(s);
    const std::vector<uint8_t> wire = Encode(x, p);
    unit = MetaOf(wire, 0).unit;
    const std::vector<float> y = Decode(wire, n, p);
    for (size_t i = 0; i < n; ++i) mean_err[i] += (static_cast<double>(y[i]) - x[i]) / samples;
  }
  // Each draw's error has |e| < unit and variance <= unit^2 / 4: the mean over S draws has a
  // standard deviation <= unit / (2 sqrt(S)). Allow 5 of them per value, and the average of
  // all values (n * S draws) must be much tighter still.
  const double per_value = 5.0 * unit / (2.0 * std::sqrt(static_cast<double>(samples)));
  double overall = 0;
  for (size_t i = 0; i < n; ++i) {
    EXPECT_LE(std::fabs(mean_err[i]), per_value) << "value " << i;
    overall += mean_err[i] / n;
  }
  EXPECT_LE(std::fabs(overall), 5.0 * unit / (2.0 * std::sqrt(static_cast<double>(samples) * n)));
  // Nearest rounding is biased on the same data (so the check above has teeth).
  const std::vector<float> y = Decode(Encode(x, Params(2, n, false)), n, Params(2, n, false));
  size_t biased = 0;
  for (size_t i = 0; i < n; ++i) biased += std::fabs(static_cast<double>(y[i]) - x[i]) > per_value;
  EXPECT_GT(biased, n / 2);
}

TEST(MaxMin, SixteenBitInputsMatchTheFloat32Path) {
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<float> x = MakeData(Dist::kMixedSign, 3001, 9);
    std::vector<uint16_t> h(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      h[i] = dt == DataType::kFloat16 ? FloatToHalfBits(x[i] * 0.01f) : FloatToBFloat16Bits(x[i]);
      x[i] = dt == DataType::kFloat16 ? HalfBitsToFloat(h[i]) : BFloat16BitsToFloat(h[i]);
    }
    for (bool stochastic : {false, true}) {
      for (Isa isa : {Isa::kScalar, BestIsa()}) {
        const CodecParams p = Params(4, 64, stochastic, false, isa);
        const Codec& c = FindCodec("maxmin");
        std::vector<uint8_t> wire(c.MaxWireSize(x.size(), p));
        c.Encode(h.data(), dt, h.size(), p, 0, wire.data());
        EXPECT_EQ(wire, Encode(x, p)) << DataTypeName(dt);
        // Decoding into the 16-bit type rounds the float32 decode once.
        std::vector<uint16_t> out(x.size());
        c.Decode(wire.data(), wire.size(), x.size(), p, dt, out.data());
        const std::vector<float> y = Decode(wire, x.size(), p);
        for (size_t i = 0; i < x.size(); ++i) {
          const uint16_t want = dt == DataType::kFloat16 ? FloatToHalfBits(y[i]) : FloatToBFloat16Bits(y[i]);
          ASSERT_EQ(out[i], want) << DataTypeName(dt) << " " << i;
        }
      }
    }
  }
}

TEST(MaxMin, NonFiniteValuesPoisonOnlyTheirBucket) {
  for (float bad : {NAN, INFINITY, -INFINITY}) {
    for (Isa isa : {Isa::kScalar, BestIsa()}) {
      std::vector<float> x = MakeData(Dist::kUniform, 300, 2);
      x[150] = bad;
      const CodecParams p = Params(4, 100, false, false, isa);
      const std::vector<uint8_t> wire = Encode(x, p);
      const std::vector<float> y = Decode(wire, x.size(), p);
      for (size_t i = 0; i < x.size(); ++i) {
        if (i / 100 == 1) {
          ASSERT_TRUE(std::isnan(y[i])) << "value " << i << " of the poisoned bucket";
        } else {
          ASSERT_TRUE(std::isfinite(y[i])) << "value " << i;
          ASSERT_LE(std::fabs(y[i] - x[i]), 0.5f * MetaOf(wire, i / 100).unit * 1.0001f);
        }
      }
    }
  }
  // A range that overflows float32 is treated as non-finite too.
  std::vector<float> x = {-3e38f, 3e38f, 1.0f};
  const std::vector<float> y = Decode(Encode(x, Params(8, 512, false)), 3, Params(8, 512, false));
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

TEST(MaxMin, BadParametersAndSizesNameTheValue) {
  const Codec& c = FindCodec("maxmin");
  CodecParams p = Params(9, 512, false);
  try {
    c.MaxWireSize(10, p);
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("maxmin: bits=9 is outside 1..8"), std::string::npos) << e.what();
  }
  p = Params(4, 512, false);
  std::vector<float> y(10);
  std::vector<uint8_t> wire(3);
  try {
    c.Decode(wire.data(), wire.size(), 10, p, DataType::kFloat32, y.data());
    FAIL();
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("take 13 bytes, got 3"), std::string::npos) << e.what();
  }
  int32_t ints[4] = {1, 2, 3, 4};
  EXPECT_THROW(c.Encode(ints, DataType::kInt32, 4, p, 0, wire.data()), InvalidArgument);
}

TEST(MaxMin, PackAndUnpackAreInverse) {
  std::mt19937 rng(1);
  for (int bits = 1; bits <= 8; ++bits) {
    for (int t = 0; t < 1000; ++t) {
      uint64_t codes = 0;
      for (int j = 0; j < 8; ++j) codes |= static_cast<uint64_t>(rng() & maxmin::Levels(bits)) << (8 * j);
      const uint64_t packed = maxmin::PackGroup(codes, bits);
      ASSERT_EQ(packed >> (8 * bits - 1) >> 1, 0u) << "packed group wider than " << bits << " bytes";
      ASSERT_EQ(maxmin::UnpackGroup(packed, bits), codes);
      for (int j = 0; j < 8; ++j) {
        ASSERT_EQ((packed >> (j * bits)) & maxmin::Levels(bits), (codes >> (8 * j)) & 0xff);
      }
    }
  }
}

}  // namespace
}  // namespace gradcomp
