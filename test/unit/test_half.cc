// float16 / bfloat16 conversions: exact round trips, round-to-nearest-even, and agreement
// with the F16C hardware instructions bit for bit.
#include <gtest/gtest.h>
#include <immintrin.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>

#include "ops/common/cpu.h"
#include "ops/common/half.h"

namespace gradcomp {
namespace {

bool IsHalfNan(uint16_t h) { return (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0; }

TEST(Half, EveryHalfRoundTripsThroughFloat) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = HalfBitsToFloat(bits);
    if (IsHalfNan(bits)) {
      EXPECT_TRUE(std::isnan(f)) << std::hex << h;
      EXPECT_TRUE(IsHalfNan(FloatToHalfBits(f))) << std::hex << h;
    } else {
      EXPECT_EQ(FloatToHalfBits(f), bits) << std::hex << h;
    }
  }
}

TEST(Half, KnownValues) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);  // halfway to 65536 rounds up to infinity
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -24)), 0x0001);  // smallest subnormal
  EXPECT_EQ(FloatToHalfBits(std::ldexp(1.0f, -26)), 0x0000);  // below half of it: zero
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to even (1.0).
  EXPECT_EQ(FloatToHalfBits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);
  EXPECT_EQ(FloatToHalfBits(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(IsHalfNan(FloatToHalfBits(std::nanf(""))));
}

__attribute__((target("f16c"))) uint16_t HardwareHalf(float f) {
  // _mm_cvtps_ph, not _cvtss_sh: clang's _cvtss_sh is a macro built on a C99 compound literal.
  return static_cast<uint16_t>(_mm_extract_epi16(_mm_cvtps_ph(_mm_set_ss(f), _MM_FROUND_TO_NEAREST_INT), 0));
}

TEST(Half, MatchesF16cOnRandomFloats) {
  if (BestIsa() != Isa::kAvx2) GTEST_SKIP() << "this CPU has no F16C; the scalar path is checked above";
  std::mt19937 rng(7);
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 2000000; ++i) {
    const uint32_t b = bits(rng);
    float f;
    std::memcpy(&f, &b, 4);
    ASSERT_EQ(FloatToHalfBits(f), HardwareHalf(f)) << std::hex << b;
  }
}

TEST(BFloat16, RoundsToNearestEven) {
  EXPECT_EQ(FloatToBFloat16Bits(1.0f), 0x3f80);
  // 1 + 2^-8 is halfway between bf16 neighbours 1 and 1 + 2^-7: ties to even.
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + std::ldexp(1.0f, -8)), 0x3f80);
  EXPECT_EQ(FloatToBFloat16Bits(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3f82);
  EXPECT_EQ(BFloat16BitsToFloat(0x3f80), 1.0f);
  EXPECT_TRUE(std::isnan(BFloat16BitsToFloat(FloatToBFloat16Bits(std::nanf("")))));
  EXPECT_EQ(FloatToBFloat16Bits(std::numeric_limits<float>::infinity()), 0x7f80);
}

TEST(BFloat16, EveryBFloat16RoundTrips) {
  for (uint32_t h = 0; h <= 0xffffu; ++h) {
    const uint16_t bits = static_cast<uint16_t>(h);
    const float f = BFloat16BitsToFloat(bits);
    if (std::isnan(f)) continue;
    EXPECT_EQ(FloatToBFloat16Bits(f), bits) << std::hex << h;
  }
}

}  // namespace
}  // namespace gradcomp
