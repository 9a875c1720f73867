// Element-wise reduction and scaling kernels for every gradcomp data type.
// Vectorized for AVX2/F16C with a scalar fallback; the variant is chosen at run time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "ops/common/cpu.h"
#include "ops/common/dtype.h"

namespace gradcomp {

/// dst[i] = dst[i] (op) src[i] for i < n. `op` is Sum, Min, Max or Product (Average is
/// Sum followed by ScaleInPlace). Integer arithmetic wraps; bool Sum/Max is OR and
/// Product/Min is AND; float16/bfloat16 compute in float32 and round to nearest even.
void ReduceInto(void* dst, const void* src, size_t n, DataType dtype, ReduceOp op);
/// Same, with an explicit instruction set (tests compare the variants).
void ReduceInto(void* dst, const void* src, size_t n, DataType dtype, ReduceOp op, Isa isa);
/// dst[i] = a[i] (op) b[i] for i < n, in one pass; `dst` may equal `a`.
void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op);
void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op, Isa isa);

/// dst = srcs[0] (op) srcs[1] (op) ... in that order, each source holding n elements at the
/// given byte offset. The fixed order makes every rank that computes a slice get the same bits.
/// `dst` may equal srcs[0] + offset but no other source.
void ReduceMany(void* dst, const std::vector<const void*>& srcs, size_t offset_bytes, size_t n,
                DataType dtype, ReduceOp op);

/// buf[i] /= divisor for integer types, truncating toward zero (Average of integers).
void DivideIntegersInPlace(void* buf, size_t n, DataType dtype, int64_t divisor);

/// buf[i] /= divisor for floating types, divided in their compute precision (float32 for
/// 16-bit floats): correctly rounded, as torch's div_ (Horovod's Average) is.
void DivideFloatsInPlace(void* buf, size_t n, DataType dtype, double divisor);

/// Finishes a reduction of `n` elements on `buf`: for Average divides by `num_ranks`
/// (floats with a true division, integers truncating toward zero), then applies `postscale`.
void FinishReduction(void* buf, size_t n, DataType dtype, ReduceOp op, double postscale, int num_ranks);

/// dst[i] = src[i] * factor (one pass for float32 and float64; a copy and ScaleInPlace for
/// the other types). Used to unfuse and scale in the same pass.
void ScaleCopy(void* dst, const void* src, size_t n, DataType dtype, double factor);

/// buf[i] *= factor. Floating types multiply in their compute precision (float32 for
/// 16-bit floats, float64 for float64); integers multiply in float64 and truncate toward
/// zero; bool is left unchanged unless factor is 0.
void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor);
/// Same, with an explicit instruction set.
void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor, Isa isa);

/// out = in converted between float32 / float16 / bfloat16 (or out += in when `accumulate`),
/// through float32 (what a cast codec sends, and a device's Cast on the CPU); InvalidArgument
/// for any other dtype.
void CastBuffer(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate,
                Isa isa = BestIsa());

/// DGC's momentum correction (Lin et al.), element-wise: u = m u + g, v += u, g = v; with
/// Nesterov u = (u + g) m, v += u + g, g = v.
void DgcAccumulate(float* u, float* v, float* grad, size_t n, float momentum, bool nesterov);

/// True if none of the n values is an inf or a NaN.
bool AllFinite(const float* values, size_t n);

namespace kernels_scalar {
void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate);
void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op);
void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor);
void DivideFloatsInPlace(void* buf, size_t n, DataType dtype, double divisor);
}  // namespace kernels_scalar
namespace kernels_avx2 {
void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate);
void ReduceTwo(void* dst, const void* a, const void* b, size_t n, DataType dtype, ReduceOp op);
void ScaleInPlace(void* buf, size_t n, DataType dtype, double factor);
void DivideFloatsInPlace(void* buf, size_t n, DataType dtype, double divisor);
}  // namespace kernels_avx2

}  // namespace gradcomp
