// Body of the codec kernels (max-min quantization; the float casts are ops/reduce's). Included once per
// instruction set by kernels_scalar.cc and kernels_avx2.cc (-mavx2 -mf16c) inside a
// namespace of its own; as in ops/reduce/kernels_impl.h, every helper has internal linkage
// so the linker cannot mix instruction sets. The per-element arithmetic is maxmin_math.h's,
// identical in both paths, so both produce the same bytes.
// (No include guard: included once per kernel translation unit.)

#include <algorithm>
#include <cstdint>
#include <cstring>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define GC_KERNELS_SIMD 1
#else
#define GC_KERNELS_SIMD 0
#endif

#include "ops/common/half.h"
#include "ops/compression/kernels.h"
#include "ops/compression/maxmin_math.h"

namespace gradcomp::codec_kernels {
namespace GC_KERNEL_NAMESPACE {
namespace {

#include "ops/common/simd_impl.h"

using maxmin::Meta;

// Codes are quantized into (and unpacked from) a small byte buffer, one code per byte,
// kChunk at a time: a multiple of 8 so packing only ever sees whole groups until the end.
constexpr size_t kChunk = 4096;

// ---- pass 1: min, max and finiteness of a bucket ----------------------------------------

template <typename Src>
void MinMax(const typename Src::T* in, size_t n, float* lo, float* hi, bool* finite) {
  float mn = Src::Load1(in), mx = mn, nan_probe = 0.0f;
  size_t i = 0;
#if GC_KERNELS_SIMD
  if (n >= 8) {
    __m256 vmn = Src::Load8(in), vmx = vmn, probe = _mm256_setzero_ps();
    for (; i + 8 <= n; i += 8) {
      const __m256 x = Src::Load8(in + i);
      vmn = _mm256_min_ps(vmn, x);
      vmx = _mm256_max_ps(vmx, x);
      probe = _mm256_add_ps(probe, _mm256_sub_ps(x, x));  // NaN once any value is NaN or infinite
    }
    alignas(32) float a[8], b[8], c[8];
    _mm256_store_ps(a, vmn);
    _mm256_store_ps(b, vmx);
    _mm256_store_ps(c, probe);
    for (int k = 0; k < 8; ++k) {
      mn = std::min(mn, a[k]);
      mx = std::max(mx, b[k]);
      nan_probe += c[k];
    }
  }
#endif
  for (; i < n; ++i) {
    const float x = Src::Load1(in + i);
    mn = std::min(mn, x);
    mx = std::max(mx, x);
    nan_probe += x - x;
  }
  *lo = mn;
  *hi = mx;
  *finite = (nan_probe == 0.0f);
}

// ---- pass 2: codes of a run of values within one bucket ---------------------------------

template <typename Src>
void QuantizeRun(const typename Src::T* in, size_t n, const Meta& m, const MaxMinArgs& a, uint64_t first_index,
                 uint8_t* codes) {
  const float inv = maxmin::Inverse(m.unit);
  const uint32_t levels = maxmin::Levels(a.bits);
  const uint32_t lo_index = static_cast<uint32_t>(first_index);
  // The generator key depends on the high half of the index: runs crossing a 2^32 boundary
  // are split so every value sees its own key.
  if (a.stochastic && n > 0 && static_cast<uint64_t>(lo_index) + n > (uint64_t{1} << 32)) {
    const size_t head = static_cast<size_t>((uint64_t{1} << 32) - lo_index);
    QuantizeRun<Src>(in, head, m, a, first_index, codes);
    QuantizeRun<Src>(in + head, n - head, m, a, first_index + head, codes + head);
    return;
  }
  const uint32_t key = maxmin::StreamKey(a.seed, a.step, static_cast<uint32_t>(first_index >> 32));
  size_t i = 0;
#if GC_KERNELS_SIMD
  const __m256 vmin = _mm256_set1_ps(m.min), vinv = _mm256_set1_ps(inv), half = _mm256_set1_ps(0.5f);
  const __m256 top = _mm256_set1_ps(static_cast<float>(levels)), zero = _mm256_setzero_ps();
  const __m256i vkey = _mm256_set1_epi32(static_cast<int>(key));
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (; i + 8 <= n; i += 8) {
    const __m256 t = _mm256_mul_ps(_mm256_sub_ps(Src::Load8(in + i), vmin), vinv);
    __m256 r = half;
    if (a.stochastic) {
      __m256i h = _mm256_xor_si256(
          _mm256_add_epi32(_mm256_set1_epi32(static_cast<int>(lo_index + static_cast<uint32_t>(i))), lane), vkey);
      h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
      h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0x85ebca6bu)));
      h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 13));
      h = _mm256_mullo_epi32(h, _mm256_set1_epi32(static_cast<int>(0xc2b2ae35u)));
      h = _mm256_xor_si256(h, _mm256_srli_epi32(h, 16));
      r = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(h, 8)), _mm256_set1_ps(1.0f / 16777216.0f));
    }
    __m256 f = _mm256_floor_ps(_mm256_add_ps(t, r));
    f = _mm256_min_ps(_mm256_max_ps(f, zero), top);  // max(NaN, 0) = 0, as Quantize
    const __m256i q = _mm256_cvttps_epi32(f);
    const __m256i w = _mm256_packus_epi32(q, q);                        // 16-bit lanes
    const __m256i b = _mm256_packus_epi16(w, w);                        // 8-bit lanes
    const __m256i ordered = _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 0, 4, 0, 4, 0, 4));
    _mm_storel_epi64(reinterpret_cast<__m128i*>(codes + i), _mm256_castsi256_si128(ordered));
  }
#endif
  for (; i < n; ++i) {
    const float r = a.stochastic ? maxmin::Uniform(key, lo_index + static_cast<uint32_t>(i)) : 0.5f;
    codes[i] = static_cast<uint8_t>(maxmin::Quantize(Src::Load1(in + i), m.min, inv, r, levels));
  }
}

// ---- packing of the code stream ---------------------------------------------------------

template <int BITS>
struct CodeWriter {
  uint8_t* out;
  // Packs `count` codes (a multiple of 8) from `codes`.
  void Groups(const uint8_t* codes, size_t count) {
    for (size_t g = 0; g < count; g += 8) {
      uint64_t x;
      std::memcpy(&x, codes + g, 8);
      x = maxmin::PackGroup(x, BITS);
      std::memcpy(out, &x, BITS);  // little-endian: the low BITS bytes
      out += BITS;
    }
  }
  // Packs the final partial group of m < 8 codes, zero-padded, into ceil(m * BITS / 8) bytes.
  void Tail(const uint8_t* codes, size_t m) {
    if (m == 0) return;
    uint64_t x = 0;
    std::memcpy(&x, codes, m);
    x = maxmin::PackGroup(x, BITS);
    const size_t bytes = (m * BITS + 7) / 8;
    std::memcpy(out, &x, bytes);
    out += bytes;
  }
};

template <typename Src, int BITS>
size_t EncodeT(const typename Src::T* in, size_t n, const MaxMinArgs& a, uint8_t* out) {
  const size_t B = a.bucket_size;
  const size_t nb = maxmin::MetaBuckets(n, B, a.skip_incomplete);
  const size_t nq = maxmin::QuantizedValues(n, B, a.skip_incomplete);
  CodeWriter<BITS> writer{out + 8 * nb};
  alignas(32) uint8_t codes[kChunk + 8];
  size_t fill = 0;
  for (size_t b = 0; b < nb; ++b) {
    const size_t start = b * B, len = std::min(B, nq - start);
    float lo, hi;
    bool finite;
    MinMax<Src>(in + start, len, &lo, &hi, &finite);
    const Meta m = maxmin::MakeMeta(lo, hi, finite, BITS);
    std::memcpy(out + 8 * b, &m.min, 4);
    std::memcpy(out + 8 * b + 4, &m.unit, 4);
    for (size_t done = 0; done < len;) {
      const size_t take = std::min(len - done, kChunk - fill);
      if (finite) {
        QuantizeRun<Src>(in + start + done, take, m, a, a.first_index + start + done, codes + fill);
      } else {
        std::memset(codes + fill, 0, take);  // a NaN bucket's codes are all 0
      }
      fill += take;
      done += take;
      if (fill == kChunk) {
        writer.Groups(codes, kChunk);
        fill = 0;
      }
    }
  }
  const size_t whole = fill / 8 * 8;
  writer.Groups(codes, whole);
  writer.Tail(codes + whole, fill - whole);
  uint8_t* raw = writer.out;
  for (size_t i = nq; i < n; ++i, raw += 4) {
    const float v = Src::Load1(in + i);
    std::memcpy(raw, &v, 4);
  }
  return static_cast<size_t>(raw - out);
}

// ---- decode -----------------------------------------------------------------------------

template <int BITS>
void UnpackCodes(const uint8_t* packed, size_t first, size_t count, size_t total, uint8_t* codes) {
  // `first` is a multiple of 8: group g = first / 8 starts at byte g * BITS.
  const uint8_t* p = packed + first / 8 * BITS;
  size_t i = 0;
  for (; i + 8 <= count; i += 8, p += BITS) {
    uint64_t x = 0;
    std::memcpy(&x, p, BITS);
    x = maxmin::UnpackGroup(x, BITS);
    std::memcpy(codes + i, &x, 8);
  }
  if (i < count) {  // final partial group: only its ceil(m * BITS / 8) bytes exist
    const size_t m = std::min<size_t>(8, total - (first + i));
    uint64_t x = 0;
    std::memcpy(&x, p, (m * BITS + 7) / 8);
    x = maxmin::UnpackGroup(x, BITS);
    std::memcpy(codes + i, &x, 8);
  }
}

template <typename Dst>
void DequantizeRun(const uint8_t* codes, size_t n, const Meta& m, typename Dst::T* out, bool accumulate) {
  size_t i = 0;
#if GC_KERNELS_SIMD
  const __m256 vmin = _mm256_set1_ps(m.min), vunit = _mm256_set1_ps(m.unit);
  for (; i + 8 <= n; i += 8) {
    const __m128i c8 = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + i));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(c8));
    __m256 y = _mm256_add_ps(vmin, _mm256_mul_ps(vunit, q));
    if (accumulate) y = _mm256_add_ps(Dst::Load8(out + i), y);
    Dst::Store8(out + i, y);
  }
#endif
  for (; i < n; ++i) {
    float y = maxmin::Dequantize(codes[i], m.min, m.unit);
    if (accumulate) y = Dst::Load1(out + i) + y;
    Dst::Store1(out + i, y);
  }
}

template <typename Dst, int BITS>
void DecodeT(const uint8_t* wire, size_t n, const MaxMinArgs& a, typename Dst::T* out, bool accumulate) {
  const size_t B = a.bucket_size;
  const size_t nb = maxmin::MetaBuckets(n, B, a.skip_incomplete);
  const size_t nq = maxmin::QuantizedValues(n, B, a.skip_incomplete);
  const uint8_t* packed = wire + 8 * nb;
  alignas(32) uint8_t codes[kChunk + 8];
  for (size_t first = 0; first < nq; first += kChunk) {
    const size_t count = std::min(kChunk, nq - first);
    UnpackCodes<BITS>(packed, first, count, nq, codes);
    // Walk the buckets this chunk overlaps.
    for (size_t i = first; i < first + count;) {
      const size_t b = i / B;
      const size_t end = std::min(first + count, (b + 1) * B);
      Meta m;
      std::memcpy(&m.min, wire + 8 * b, 4);
      std::memcpy(&m.unit, wire + 8 * b + 4, 4);
      DequantizeRun<Dst>(codes + (i - first), end - i, m, out + i, accumulate);
      i = end;
    }
  }
  const uint8_t* raw = packed + (nq * BITS + 7) / 8;
  for (size_t i = nq; i < n; ++i, raw += 4) {
    float v;
    std::memcpy(&v, raw, 4);
    if (accumulate) v = Dst::Load1(out + i) + v;
    Dst::Store1(out + i, v);
  }
}

// ---- dispatch on bits and dtypes --------------------------------------------------------

template <int BITS>
size_t EncodeBits(const void* in, DataType dt, size_t n, const MaxMinArgs& a, uint8_t* out) {
  switch (dt) {
    case DataType::kFloat16: return EncodeT<F16, BITS>(static_cast<const uint16_t*>(in), n, a, out);
    case DataType::kBFloat16: return EncodeT<BF16, BITS>(static_cast<const uint16_t*>(in), n, a, out);
    default: return EncodeT<F32, BITS>(static_cast<const float*>(in), n, a, out);
  }
}

template <int BITS>
void DecodeBits(const uint8_t* wire, size_t n, const MaxMinArgs& a, DataType dt, void* out, bool acc) {
  switch (dt) {
    case DataType::kFloat16: return DecodeT<F16, BITS>(wire, n, a, static_cast<uint16_t*>(out), acc);
    case DataType::kBFloat16: return DecodeT<BF16, BITS>(wire, n, a, static_cast<uint16_t*>(out), acc);
    default: return DecodeT<F32, BITS>(wire, n, a, static_cast<float*>(out), acc);
  }
}

}  // namespace

size_t MaxMinEncode(const void* in, DataType dtype, size_t n, const MaxMinArgs& a, uint8_t* out) {
  switch (a.bits) {
    case 1: return EncodeBits<1>(in, dtype, n, a, out);
    case 2: return EncodeBits<2>(in, dtype, n, a, out);
    case 3: return EncodeBits<3>(in, dtype, n, a, out);
    case 4: return EncodeBits<4>(in, dtype, n, a, out);
    case 5: return EncodeBits<5>(in, dtype, n, a, out);
    case 6: return EncodeBits<6>(in, dtype, n, a, out);
    case 7: return EncodeBits<7>(in, dtype, n, a, out);
    default: return EncodeBits<8>(in, dtype, n, a, out);
  }
}

void MaxMinDecode(const uint8_t* wire, size_t n, const MaxMinArgs& a, DataType out_dtype, void* out,
                  bool accumulate) {
  switch (a.bits) {
    case 1: return DecodeBits<1>(wire, n, a, out_dtype, out, accumulate);
    case 2: return DecodeBits<2>(wire, n, a, out_dtype, out, accumulate);
    case 3: return DecodeBits<3>(wire, n, a, out_dtype, out, accumulate);
    case 4: return DecodeBits<4>(wire, n, a, out_dtype, out, accumulate);
    case 5: return DecodeBits<5>(wire, n, a, out_dtype, out, accumulate);
    case 6: return DecodeBits<6>(wire, n, a, out_dtype, out, accumulate);
    case 7: return DecodeBits<7>(wire, n, a, out_dtype, out, accumulate);
    default: return DecodeBits<8>(wire, n, a, out_dtype, out, accumulate);
  }
}

}  // namespace GC_KERNEL_NAMESPACE
}  // namespace gradcomp::codec_kernels

#undef GC_KERNELS_SIMD
