// Body of the reduction kernels. Included once per instruction set by kernels_scalar.cc and
// kernels_avx2.cc (the latter compiled with -mavx2 -mf16c) inside a namespace of its own, so
// the two instantiations never collide. The generic loops are written for the compiler's
// auto-vectorizer; 16-bit floats use F16C intrinsics explicitly where available. Nothing here
// may instantiate a shared template or inline function with external linkage (the linker
// could merge an AVX2 copy into scalar callers): all helpers live in an unnamed namespace,
// and arguments are validated by the dispatcher in reduce.cc before entering.
// (No include guard: this file is meant to be included once per kernel translation unit.)

#include <cstdint>
#include <type_traits>

#if defined(__AVX2__) && defined(__F16C__)
#include <immintrin.h>
#define GC_KERNELS_SIMD 1
#else
#define GC_KERNELS_SIMD 0
#endif

#include "ops/common/dtype.h"
#include "ops/common/half.h"

namespace gradcomp {
namespace GC_KERNEL_NAMESPACE {
namespace {

// Integer arithmetic is done in the unsigned type of the same width: wrap-around instead of UB.
template <typename T, bool = std::is_integral_v<T>>
struct WideOf {
  using type = T;
};
template <typename T>
struct WideOf<T, true> {
  using type = std::make_unsigned_t<T>;
};
template <typename T>
using Wide = typename WideOf<T>::type;

template <typename T>
struct SumOp {
  T operator()(T a, T b) const { return static_cast<T>(static_cast<Wide<T>>(a) + static_cast<Wide<T>>(b)); }
};
template <typename T>
struct ProdOp {
  T operator()(T a, T b) const { return static_cast<T>(static_cast<Wide<T>>(a) * static_cast<Wide<T>>(b)); }
};
template <typename T>
struct MinOp {
  T operator()(T a, T b) const { return b < a ? b : a; }
};
template <typename T>
struct MaxOp {
  T operator()(T a, T b) const { return a < b ? b : a; }
};

template <typename T>
struct AndOp {
  T operator()(T a, T b) const { return static_cast<T>(a & b); }
};

// dst may equal a (an in-place reduction); the compiler checks the overlap at run time.
template <typename T, typename Op>
void Loop(T* dst, const T* a, const T* b, size_t n, Op op) {
  for (size_t i = 0; i < n; ++i) dst[i] = op(a[i], b[i]);
}

template <typename T>
void ReduceTyped(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  T* d = static_cast<T*>(dst);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  switch (op) {
    case ReduceOp::kSum: Loop(d, x, y, n, SumOp<T>()); return;
    case ReduceOp::kProduct: Loop(d, x, y, n, ProdOp<T>()); return;
    case ReduceOp::kMin: Loop(d, x, y, n, MinOp<T>()); return;
    case ReduceOp::kMax: Loop(d, x, y, n, MaxOp<T>()); return;
    case ReduceOp::kBitwiseAnd:
      if constexpr (std::is_integral_v<T>) Loop(d, x, y, n, AndOp<T>());
      return;  // floats are rejected by the dispatcher in reduce.cc
    case ReduceOp::kAverage:  // lowered by the caller (reduce.cc), never reaches here
    case ReduceOp::kAdasum: return;  // rejected by the dispatcher in reduce.cc
  }
}

void ReduceBool(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  uint8_t* d = static_cast<uint8_t*>(dst);
  const uint8_t* x = static_cast<const uint8_t*>(a);
  const uint8_t* y = static_cast<const uint8_t*>(b);
  const bool is_or = (op == ReduceOp::kSum || op == ReduceOp::kMax);  // AND for Product, Min, BitwiseAnd
  if (is_or) {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>((x[i] | y[i]) != 0);
  } else {
    for (size_t i = 0; i < n; ++i) d[i] = static_cast<uint8_t>((x[i] != 0) & (y[i] != 0));
  }
}

// 16-bit floats: widen to float32, apply the op, round back to nearest even.
#include "ops/common/simd_impl.h"

#if GC_KERNELS_SIMD
inline __m256 ApplySimd(__m256 a, __m256 b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return _mm256_add_ps(a, b);
    case ReduceOp::kProduct: return _mm256_mul_ps(a, b);
    case ReduceOp::kMin: return _mm256_blendv_ps(a, b, _mm256_cmp_ps(b, a, _CMP_LT_OQ));
    case ReduceOp::kMax: return _mm256_blendv_ps(a, b, _mm256_cmp_ps(a, b, _CMP_LT_OQ));
    case ReduceOp::kAverage:
    case ReduceOp::kBitwiseAnd:
    case ReduceOp::kAdasum: break;
  }
  return a;
}
#endif

inline float ApplyScalar(float a, float b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return b < a ? b : a;
    case ReduceOp::kMax: return a < b ? b : a;
    case ReduceOp::kAverage:
    case ReduceOp::kBitwiseAnd:
    case ReduceOp::kAdasum: break;
  }
  return a;
}

template <typename Elem>
void Reduce16(void* dst, const void* a, const void* b, size_t n, ReduceOp op) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  const uint16_t* x = static_cast<const uint16_t*>(a);
  const uint16_t* y = static_cast<const uint16_t*>(b);
  size_t i = 0;
#if GC_KERNELS_SIMD
  for (; i + 8 <= n; i += 8) {
    Elem::Store8(d + i, ApplySimd(Elem::Load8(x + i), Elem::Load8(y + i), op));
  }
#endif
  for (; i < n; ++i) Elem::Store1(d + i, ApplyScalar(Elem::Load1(x + i), Elem::Load1(y + i), op));
}

// buf[i] *= factor, or /= factor with kDivide, for 16-bit floats computed in float32.
template <typename Elem, bool kDivide = false>
void Scale16(void* buf, size_t n, float factor) {
  uint16_t* b = static_cast<uint16_t*>(buf);
  size_t i = 0;
#if GC_KERNELS_SIMD
  const __m256 f = _mm256_set1_ps(factor);
  for (; i + 8 <= n; i += 8) {
    const __m256 v = Elem::Load8(b + i);
    Elem::Store8(b + i, kDivide ? _mm256_div_ps(v, f) : _mm256_mul_ps(v, f));
  }
#endif
  for (; i < n; ++i) Elem::Store1(b + i, kDivide ? Elem::Load1(b + i) / factor : Elem::Load1(b + i) * factor);
}

template <typename T>
void ScaleFloat(void* buf, size_t n, T factor) {
  T* b = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) b[i] *= factor;
}

template <typename T>
void DivideFloat(void* buf, size_t n, T divisor) {
  T* b = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) b[i] /= divisor;
}

template <typename T>
void ScaleInt(void* buf, size_t n, double factor) {
  T* b = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<T>(static_cast<double>(b[i]) * factor);
}

// out = in converted between float32 / float16 / bfloat16 (or out += in), through float32.
template <typename Src, typename Dst>
void CastT(const typename Src::T* in, size_t n, typename Dst::T* out, bool accumulate) {
  size_t i = 0;
#if GC_KERNELS_SIMD
  for (; i + 8 <= n; i += 8) {
    __m256 v = Src::Load8(in + i);
    if (accumulate) v = _mm256_add_ps(Dst::Load8(out + i), v);
    Dst::Store8(out + i, v);
  }
#endif
  for (; i < n; ++i) {
    float v = Src::Load1(in + i);
    if (accumulate) v = Dst::Load1(out + i) + v;
    Dst::Store1(out + i, v);
  }
}

template <typename Src>
void CastFrom(const void* in, size_t n, void* out, DataType out_dt, bool acc) {
  const auto* src = static_cast<const typename Src::T*>(in);
  switch (out_dt) {
    case DataType::kFloat16: return CastT<Src, F16>(src, n, static_cast<uint16_t*>(out), acc);
    case DataType::kBFloat16: return CastT<Src, BF16>(src, n, static_cast<uint16_t*>(out), acc);
    default: return CastT<Src, F32>(src, n, static_cast<float*>(out), acc);
  }
}

}  // namespace

void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate) {
  switch (in_dtype) {
    case DataType::kFloat16: return CastFrom<F16>(in, n, out, out_dtype, accumulate);
    case DataType::kBFloat16: return CastFrom<BF16>(in, n, out, out_dtype, accumulate);
    default: return CastFrom<F32>(in, n, out, out_dtype, accumulate);
  }
}

void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op) {
  switch (dtype) {
    case DataType::kUInt8: return ReduceTyped<uint8_t>(dst, a, b, n, op);
    case DataType::kInt8: return ReduceTyped<int8_t>(dst, a, b, n, op);
    case DataType::kInt16: return ReduceTyped<int16_t>(dst, a, b, n, op);
    case DataType::kInt32: return ReduceTyped<int32_t>(dst, a, b, n, op);
    case DataType::kInt64: return ReduceTyped<int64_t>(dst, a, b, n, op);
    case DataType::kFloat32: return ReduceTyped<float>(dst, a, b, n, op);
    case DataType::kFloat64: return ReduceTyped<double>(dst, a, b, n, op);
    case DataType::kFloat16: return Reduce16<F16>(dst, a, b, n, op);
    case DataType::kBFloat16: return Reduce16<BF16>(dst, a, b, n, op);
    case DataType::kBool: return ReduceBool(dst, a, b, n, op);
  }
}

void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor) {
  switch (dtype) {
    case DataType::kUInt8: return ScaleInt<uint8_t>(buf, n, factor);
    case DataType::kInt8: return ScaleInt<int8_t>(buf, n, factor);
    case DataType::kInt16: return ScaleInt<int16_t>(buf, n, factor);
    case DataType::kInt32: return ScaleInt<int32_t>(buf, n, factor);
    case DataType::kInt64: return ScaleInt<int64_t>(buf, n, factor);
    case DataType::kFloat32: return ScaleFloat<float>(buf, n, static_cast<float>(factor));
    case DataType::kFloat64: return ScaleFloat<double>(buf, n, factor);
    case DataType::kFloat16: return Scale16<F16>(buf, n, static_cast<float>(factor));
    case DataType::kBFloat16: return Scale16<BF16>(buf, n, static_cast<float>(factor));
    case DataType::kBool:
      if (factor == 0.0) ScaleInt<uint8_t>(buf, n, 0.0);
      return;
  }
}

void DivideFloatsInPlace(void* buf, size_t n, DataType dtype, double divisor) {
  switch (dtype) {
    case DataType::kFloat32: return DivideFloat<float>(buf, n, static_cast<float>(divisor));
    case DataType::kFloat64: return DivideFloat<double>(buf, n, divisor);
    case DataType::kFloat16: return Scale16<F16, true>(buf, n, static_cast<float>(divisor));
    case DataType::kBFloat16: return Scale16<BF16, true>(buf, n, static_cast<float>(divisor));
    default: return;  // callers pass floating types only
  }
}

}  // namespace GC_KERNEL_NAMESPACE
}  // namespace gradcomp

#undef GC_KERNELS_SIMD
