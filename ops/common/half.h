// Scalar float16 / bfloat16 <-> float32 conversions with round-to-nearest-even.
// Plain inline functions with no dependencies, so vectorized loops and the CUDA kernels
// (ops/compression/cuda) reproduce exactly the same bits. NaN keeps its sign and the top payload bits
// and is made quiet, exactly like the F16C instructions, so scalar and SIMD paths agree.
// The functions are `static inline`: translation units compiled for different instruction
// sets (kernels_avx2.cc vs the rest) each keep their own copy, so the linker can never hand
// an AVX2-compiled copy to code running on a CPU without AVX2.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/common/hd.h"

namespace gradcomp {

/// Bit-casts between same-sized trivially copyable types (std::bit_cast is C++20).
template <typename To, typename From>
GC_HD static inline To BitCast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "BitCast needs equal sizes");
  To to;
  std::memcpy(&to, &from, sizeof(To));
  return to;
}

/// float32 -> IEEE binary16 bits, round to nearest even; overflow gives infinity.
GC_HD static inline uint16_t FloatToHalfBits(float value) {
  uint32_t bits = BitCast<uint32_t>(value);
  const uint32_t sign = (bits >> 16) & 0x8000u;
  bits &= 0x7fffffffu;
  uint16_t out;
  if (bits >= (143u << 23)) {  // >= 65536 or Inf/NaN: not representable as finite half
    if (bits > 0x7f800000u) {
      out = static_cast<uint16_t>(0x7e00u | ((bits >> 13) & 0x3ffu));  // quiet NaN, payload kept
    } else {
      out = 0x7c00u;
    }
  } else if (bits < (113u << 23)) {  // result is subnormal or zero: let the FPU round
    const float magic = BitCast<float>(126u << 23);  // 0.5f
    const float shifted = BitCast<float>(bits) + magic;
    out = static_cast<uint16_t>(BitCast<uint32_t>(shifted) - (126u << 23));
  } else {
    const uint32_t mant_odd = (bits >> 13) & 1u;
    bits += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu + mant_odd;
    out = static_cast<uint16_t>(bits >> 13);
  }
  return static_cast<uint16_t>(out | sign);
}

/// IEEE binary16 bits -> float32 (exact).
GC_HD static inline float HalfBitsToFloat(uint16_t half) {
  const uint32_t shifted_exp = 0x7c00u << 13;
  uint32_t bits = (static_cast<uint32_t>(half) & 0x7fffu) << 13;
  const uint32_t exp = shifted_exp & bits;
  bits += static_cast<uint32_t>(127 - 15) << 23;
  if (exp == shifted_exp) {
    bits += static_cast<uint32_t>(128 - 16) << 23;  // Inf / NaN
  } else if (exp == 0) {
    bits += 1u << 23;  // zero / subnormal: renormalize through the FPU
    bits = BitCast<uint32_t>(BitCast<float>(bits) - BitCast<float>(113u << 23));
  }
  bits |= (static_cast<uint32_t>(half) & 0x8000u) << 16;
  return BitCast<float>(bits);
}

/// float32 -> bfloat16 bits, round to nearest even; NaN stays a quiet NaN.
GC_HD static inline uint16_t FloatToBFloat16Bits(float value) {
  uint32_t bits = BitCast<uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) {
    return static_cast<uint16_t>((bits >> 16) | 0x40u);
  }
  bits += 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(bits >> 16);
}

/// bfloat16 bits -> float32 (exact).
GC_HD static inline float BFloat16BitsToFloat(uint16_t bf16) {
  return BitCast<float>(static_cast<uint32_t>(bf16) << 16);
}

}  // namespace gradcomp
