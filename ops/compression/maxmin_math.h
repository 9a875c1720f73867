// Per-element arithmetic of max-min quantization, exactly as docs/design.md "Compression" fixes it. Plain
// `static inline` functions with no dependencies so the scalar codec, the AVX2 codec and the
// CUDA kernels (ops/compression/cuda) compute the same bits. Compile users with
// -ffp-contract=off (nvcc: --fmad=false): no multiply-add may be fused.
#pragma once

#include <cstdint>
#include <cstring>

#include "ops/common/hd.h"

namespace gradcomp::maxmin {

/// Largest code for `bits` bits per value: 2^bits - 1.
GC_HD static inline uint32_t Levels(int bits) { return (1u << bits) - 1u; }

/// Number of buckets that carry a (min, unit) meta for a segment of n values.
GC_HD static inline size_t MetaBuckets(size_t n, size_t bucket_size, bool skip_incomplete) {
  return skip_incomplete ? n / bucket_size : (n + bucket_size - 1) / bucket_size;
}

/// Number of values of a segment that are quantized (the rest travel as raw float32).
GC_HD static inline size_t QuantizedValues(size_t n, size_t bucket_size, bool skip_incomplete) {
  return skip_incomplete ? (n / bucket_size) * bucket_size : n;
}

/// Encoded size of one segment: metas, packed codes, raw tail.
GC_HD static inline size_t WireBytes(size_t n, int bits, size_t bucket_size, bool skip_incomplete) {
  const size_t nq = QuantizedValues(n, bucket_size, skip_incomplete);
  return 8 * MetaBuckets(n, bucket_size, skip_incomplete) + (nq * static_cast<size_t>(bits) + 7) / 8 +
         4 * (n - nq);
}

/// The (min, unit) meta of a bucket from its min and max. Non-finite buckets (a NaN or an
/// infinity among the values, or a range that overflows float32) get (NaN, NaN): every value
/// of the bucket then decodes to NaN. -0.0 is canonicalized to +0.0 so meta bytes do not
/// depend on the order values were compared in. A range too small for 1/unit to be finite
/// gets unit 0 (every value decodes to min; the error is below 15 * 2^-149).
struct Meta {
  float min;
  float unit;
};
GC_HD static inline Meta MakeMeta(float lo, float hi, bool finite, int bits) {
  Meta m;
  const float range = hi - lo;
  if (!finite || !(range - range == 0.0f)) {
    const uint32_t nan_bits = 0x7fc00000u;
    std::memcpy(&m.min, &nan_bits, 4);
    m.unit = m.min;
    return m;
  }
  m.min = lo + 0.0f;
  m.unit = range / static_cast<float>(Levels(bits));
  const float inv = 1.0f / m.unit;
  if (!(inv - inv == 0.0f)) m.unit = 0.0f;  // unit 0 (constant bucket) or too small to invert
  return m;
}

/// 1 / unit, or 0 for a unit of 0 (all codes are then 0).
GC_HD static inline float Inverse(float unit) { return unit == 0.0f ? 0.0f : 1.0f / unit; }

/// Code of one value: floor((x - min) * inv + r) clamped to [0, levels]; r = 0.5 for
/// round-to-nearest, a uniform [0, 1) draw for stochastic rounding.
GC_HD static inline uint32_t Quantize(float x, float min, float inv, float r, uint32_t levels) {
  const float t = (x - min) * inv;
#if defined(__CUDA_ARCH__)
  const float f = floorf(t + r);
#else
  const float f = __builtin_floorf(t + r);
#endif
  if (!(f > 0.0f)) return 0;  // also maps NaN (impossible in a finite bucket) to 0
  const float top = static_cast<float>(levels);
  return f >= top ? levels : static_cast<uint32_t>(f);
}

/// Value of a code: min + unit * q.
GC_HD static inline float Dequantize(uint32_t q, float min, float unit) {
  const float scaled = unit * static_cast<float>(q);
  return min + scaled;
}

/// murmur3's 32-bit finalizer: a bijection with good avalanche.
GC_HD static inline uint32_t Mix32(uint32_t h) {
  h ^= h >> 16;
  h *= 0x85ebca6bu;
  h ^= h >> 13;
  h *= 0xc2b2ae35u;
  h ^= h >> 16;
  return h;
}

/// Key of the stochastic-rounding generator for (seed, step, high 32 bits of the index).
GC_HD static inline uint32_t StreamKey(uint64_t seed, uint64_t step, uint32_t index_hi) {
  uint32_t k = Mix32(static_cast<uint32_t>(step >> 32) ^ 0x9e3779b9u);
  k = Mix32(k ^ static_cast<uint32_t>(step));
  k = Mix32(k ^ static_cast<uint32_t>(seed >> 32));
  k = Mix32(k ^ static_cast<uint32_t>(seed));
  return Mix32(k ^ index_hi);
}

/// The counter-based uniform draw in [0, 1) for element `index_lo` under `key`: 24 random
/// bits, exact in float32.
GC_HD static inline float Uniform(uint32_t key, uint32_t index_lo) {
  const uint32_t h = Mix32(index_lo ^ key);
  return static_cast<float>(h >> 8) * (1.0f / 16777216.0f);
}

/// Packs 8 codes held one per byte of `codes` (byte j = code j < 2^bits) so that code j
/// occupies bits [j*bits, (j+1)*bits) of the result.
GC_HD static inline uint64_t PackGroup(uint64_t codes, int bits) {
  const unsigned b = static_cast<unsigned>(bits);
  codes = (codes & 0x00ff00ff00ff00ffull) | ((codes & 0xff00ff00ff00ff00ull) >> (8 - b));
  codes = (codes & 0x0000ffff0000ffffull) | ((codes & 0xffff0000ffff0000ull) >> (16 - 2 * b));
  codes = (codes & 0x00000000ffffffffull) | ((codes & 0xffffffff00000000ull) >> (32 - 4 * b));
  return codes;
}

/// Inverse of PackGroup: spreads 8 packed codes back to one per byte.
GC_HD static inline uint64_t UnpackGroup(uint64_t packed, int bits) {
  const unsigned b = static_cast<unsigned>(bits);
  const uint64_t m4 = (1ull << (4 * b)) - 1;
  uint64_t x = (packed & m4) | (((packed >> (4 * b)) & m4) << 32);
  const uint64_t m2 = ((1ull << (2 * b)) - 1) * 0x0000000100000001ull;
  x = (x & m2) | (((x >> (2 * b)) & m2) << 16);
  const uint64_t m1 = ((1ull << b) - 1) * 0x0001000100010001ull;
  x = (x & m1) | (((x >> b) & m1) << 8);
  return x;
}

}  // namespace gradcomp::maxmin
