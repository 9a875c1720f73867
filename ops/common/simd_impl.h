// Element loaders and storers shared by the kernel translation units (reduction kernels,
// codecs). Meant to be included inside an unnamed namespace of a kernel TU that is compiled
// once per instruction set, after GC_KERNELS_SIMD is defined (1 when AVX2 + F16C code may be
// emitted); deliberately without include guard or linkage of its own.
//
// Each element type has a struct with `Load1/Store1` (scalar) and, with SIMD, `Load8/Store8`
// (eight values as one __m256), all converting through float32 exactly like half.h.

struct F32 {
  using T = float;
  static float Load1(const float* p) { return *p; }
  static void Store1(float* p, float v) { *p = v; }
#if GC_KERNELS_SIMD
  static __m256 Load8(const float* p) { return _mm256_loadu_ps(p); }
  static void Store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
#endif
};

struct F16 {
  using T = uint16_t;
  static float Load1(const uint16_t* p) { return HalfBitsToFloat(*p); }
  static void Store1(uint16_t* p, float v) { *p = FloatToHalfBits(v); }
#if GC_KERNELS_SIMD
  static __m256 Load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static void Store8(uint16_t* p, __m256 v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT));
  }
#endif
};

struct BF16 {
  using T = uint16_t;
  static float Load1(const uint16_t* p) { return BFloat16BitsToFloat(*p); }
  static void Store1(uint16_t* p, float v) { *p = FloatToBFloat16Bits(v); }
#if GC_KERNELS_SIMD
  static __m256 Load8(const uint16_t* p) {
    const __m256i w = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(w, 16));
  }
  static void Store8(uint16_t* p, __m256 v) {
    // Round to nearest even exactly as FloatToBFloat16Bits; NaN lanes become quiet NaNs.
    const __m256i bits = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(1));
    __m256i rounded = _mm256_add_epi32(bits, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb));
    rounded = _mm256_srli_epi32(rounded, 16);
    const __m256i nan_bits = _mm256_or_si256(_mm256_srli_epi32(bits, 16), _mm256_set1_epi32(0x40));
    const __m256 is_nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
    rounded = _mm256_blendv_epi8(rounded, nan_bits, _mm256_castps_si256(is_nan));
    // Pack the eight 32-bit lanes (each < 2^16) into eight 16-bit values, in order.
    const __m256i packed = _mm256_packus_epi32(rounded, rounded);
    const __m256i ordered = _mm256_permute4x64_epi64(packed, 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(ordered));
  }
#endif
};
