#include "ops/reduce/reduce.h"

#include <cstring>
#include <string>
#include <utility>

#include "ops/common/enforce.h"

namespace gradcomp {

void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op, Isa isa) {
  GC_ENFORCE(op != ReduceOp::kAverage, "Average must be lowered to Sum + ScaleInPlace");
  GC_ENFORCE(op != ReduceOp::kAdasum, "Adasum is not element-wise (ops/collectives/adasum.h)");
  GC_ENFORCE(op != ReduceOp::kBitwiseAnd || !IsFloatingPoint(dtype), "bitwise AND of ", DataTypeName(dtype));
  (void)DataTypeSize(dtype);  // throws for an unknown dtype code before entering a kernel
  if (n == 0) return;
  if (isa == Isa::kAvx2) {
    kernels_avx2::ReduceTwo(dst, a, b, n, dtype, op);
  } else {
    kernels_scalar::ReduceTwo(dst, a, b, n, dtype, op);
  }
}

void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op) {
  ReduceTwo(dst, a, b, n, dtype, op, BestIsa());
}

void ReduceInto(void* dst, const void* src, size_t n, DataType dtype, ReduceOp op, Isa isa) {
  ReduceTwo(dst, dst, src, n, dtype, op, isa);
}

void ReduceInto(void* dst, const void* src, size_t n, DataType dtype, ReduceOp op) {
  ReduceTwo(dst, dst, src, n, dtype, op, BestIsa());
}

void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor, Isa isa) {
  (void)DataTypeSize(dtype);
  if (n == 0 || factor == 1.0) return;
  if (isa == Isa::kAvx2) {
    kernels_avx2::ScaleInPlace(buf, n, dtype, factor);
  } else {
    kernels_scalar::ScaleInPlace(buf, n, dtype, factor);
  }
}

void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor) {
  ScaleInPlace(buf, n, dtype, factor, BestIsa());
}

void DivideFloatsInPlace(void* buf, size_t n, DataType dtype, double divisor) {
  GC_ENFORCE(IsFloatingPoint(dtype), "DivideFloatsInPlace on non-floating type ", DataTypeName(dtype));
  if (n == 0 || divisor == 1.0) return;
  if (BestIsa() == Isa::kAvx2) {
    kernels_avx2::DivideFloatsInPlace(buf, n, dtype, divisor);
  } else {
    kernels_scalar::DivideFloatsInPlace(buf, n, dtype, divisor);
  }
}

void ReduceMany(void* dst, const std::vector<const void*>& srcs, size_t offset_bytes, size_t n,
                DataType dtype, ReduceOp op) {
  GC_ENFORCE(!srcs.empty(), "ReduceMany needs at least one source");
  if (n == 0) return;
  const char* first = static_cast<const char*>(srcs[0]) + offset_bytes;
  if (srcs.size() == 1) {
    if (dst != first) std::memcpy(dst, first, n * DataTypeSize(dtype));
    return;
  }
  ReduceTwo(dst, first, static_cast<const char*>(srcs[1]) + offset_bytes, n, dtype, op);
  for (size_t r = 2; r < srcs.size(); ++r) {
    ReduceInto(dst, static_cast<const char*>(srcs[r]) + offset_bytes, n, dtype, op);
  }
}

namespace {
template <typename T>
void DivideTyped(void* buf, size_t n, int64_t divisor) {
  T* b = static_cast<T*>(buf);
  for (size_t i = 0; i < n; ++i) b[i] = static_cast<T>(static_cast<int64_t>(b[i]) / divisor);
}
}  // namespace

void DivideIntegersInPlace(void* buf, size_t n, DataType dtype, int64_t divisor) {
  GC_ENFORCE(divisor > 0, "divisor must be positive, got ", divisor);
  switch (dtype) {
    case DataType::kUInt8: return DivideTyped<uint8_t>(buf, n, divisor);
    case DataType::kInt8: return DivideTyped<int8_t>(buf, n, divisor);
    case DataType::kInt16: return DivideTyped<int16_t>(buf, n, divisor);
    case DataType::kInt32: return DivideTyped<int32_t>(buf, n, divisor);
    case DataType::kInt64: return DivideTyped<int64_t>(buf, n, divisor);
    default: GC_ENFORCE(false, "DivideIntegersInPlace on non-integer type ", DataTypeName(dtype));
  }
}

void ScaleCopy(void* dst, const void* src, size_t n, DataType dtype, double factor) {
  if (dtype == DataType::kFloat32 && factor != 1.0) {
    float* d = static_cast<float*>(dst);
    const float* s = static_cast<const float*>(src);
    const float f = static_cast<float>(factor);
    for (size_t i = 0; i < n; ++i) d[i] = s[i] * f;
    return;
  }
  if (dtype == DataType::kFloat64 && factor != 1.0) {
    double* d = static_cast<double*>(dst);
    const double* s = static_cast<const double*>(src);
    for (size_t i = 0; i < n; ++i) d[i] = s[i] * factor;
    return;
  }
  if (n > 0 && dst != src) std::memcpy(dst, src, n * DataTypeSize(dtype));
  ScaleInPlace(dst, n, dtype, factor);
}

void FinishReduction(void* buf, size_t n, DataType dtype, ReduceOp op, double postscale, int num_ranks) {
  if (op == ReduceOp::kAverage) {
    if (IsFloatingPoint(dtype)) {
      DivideFloatsInPlace(buf, n, dtype, num_ranks);
    } else {
      DivideIntegersInPlace(buf, n, dtype, num_ranks);
    }
  }
  ScaleInPlace(buf, n, dtype, postscale);
}

void CastBuffer(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate, Isa isa) {
  for (const auto& [dtype, what] : {std::pair{in_dtype, "input"}, std::pair{out_dtype, "output"}}) {
    if (!IsFloat32Or16(dtype)) {
      throw InvalidArgument(std::string("cast: ") + what + " dtype " + DataTypeName(dtype) +
                            " is not supported (float32, float16 or bfloat16)");
    }
  }
  if (isa == Isa::kAvx2) {
    kernels_avx2::Cast(in, in_dtype, n, out, out_dtype, accumulate);
  } else {
    kernels_scalar::Cast(in, in_dtype, n, out, out_dtype, accumulate);
  }
}

void DgcAccumulate(float* u, float* v, float* grad, size_t n, float m, bool nesterov) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      u[i] = (u[i] + grad[i]) * m;
      v[i] = (v[i] + u[i]) + grad[i];
      grad[i] = v[i];
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      u[i] = m * u[i] + grad[i];
      v[i] = v[i] + u[i];
      grad[i] = v[i];
    }
  }
}

bool AllFinite(const float* values, size_t n) {
  // Exponent bits all ones is inf or NaN; OR-ing the masked words lets the loop vectorize.
  uint32_t any = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, values + i, sizeof bits);
    any |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  return any == 0;
}

}  // namespace gradcomp
