// CUDA kernels of the codecs (see codec_cuda.h). Layout of one max-min segment, as the CPU
// writes it: 8-byte metas (min, unit) per bucket, then the codes of the quantized values packed
// little-endian `bits` bytes per group of 8 (the last group only ceil(m * bits / 8) bytes),
// then the raw float32 tail (skip-incomplete buckets). Each thread owns one group of 8 codes,
// so every output byte has exactly one writer and the packing is PackGroup's.
#include "ops/compression/cuda/codec_cuda.h"

#include <cuda_runtime.h>

#include "ops/common/enforce.h"
#include "ops/common/half.h"
#include "ops/compression/codec_on_device.h"
#include "ops/compression/maxmin_math.h"
#include "ops/device/cuda_device.h"
#include "ops/device/cuda_elements.cuh"

namespace gradcomp::cuda {
namespace {

using codec_kernels::MaxMinArgs;
using maxmin::Meta;

constexpr int kThreads = 256;

cudaStream_t S(void* stream) { return static_cast<cudaStream_t>(stream); }

unsigned Blocks(size_t work, int per_block) {
  return static_cast<unsigned>((work + static_cast<size_t>(per_block) - 1) / static_cast<size_t>(per_block));
}

__device__ inline size_t Smaller(size_t a, size_t b) { return a < b ? a : b; }

__device__ inline Meta LoadMeta(const uint8_t* wire, size_t b) {
  const float* m = reinterpret_cast<const float*>(wire + 8 * b);
  return Meta{m[0], m[1]};
}

// ---- encode ----------------------------------------------------------------------------------

// One warp per bucket: min, max and finiteness (x - x is NaN once x is NaN or infinite), then
// the bucket's meta. Min and max are exact in any order; MakeMeta canonicalizes -0.0.
template <typename Src>
__global__ void MetaKernel(const typename Src::T* in, size_t nq, size_t bucket, size_t buckets, int bits,
                           uint8_t* out) {
  const size_t warp = (static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x) / 32;
  const unsigned lane = threadIdx.x % 32;
  if (warp >= buckets) return;
  const size_t start = warp * bucket;
  const size_t len = Smaller(bucket, nq - start);
  float lo = Src::Load(in + start), hi = lo, probe = 0.0f;
  for (size_t i = lane; i < len; i += 32) {
    const float x = Src::Load(in + start + i);
    lo = x < lo ? x : lo;
    hi = x > hi ? x : hi;
    probe = __fadd_rn(probe, __fsub_rn(x, x));
  }
  for (int off = 16; off > 0; off /= 2) {
    const float l = __shfl_xor_sync(0xffffffffu, lo, off);
    const float h = __shfl_xor_sync(0xffffffffu, hi, off);
    const float p = __shfl_xor_sync(0xffffffffu, probe, off);
    lo = l < lo ? l : lo;
    hi = h > hi ? h : hi;
    probe = __fadd_rn(probe, p);
  }
  if (lane == 0) {
    const Meta m = maxmin::MakeMeta(lo, hi, probe == 0.0f, bits);
    float* dst = reinterpret_cast<float*>(out + 8 * warp);
    dst[0] = m.min;
    dst[1] = m.unit;
  }
}

// One thread per group of 8 quantized values: codes (0 in a non-finite bucket), packed.
template <typename Src>
__global__ void CodesKernel(const typename Src::T* in, size_t nq, MaxMinArgs a, const uint8_t* metas,
                            uint8_t* codes_out) {
  const size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t first = g * 8;
  if (first >= nq) return;
  const uint32_t levels = maxmin::Levels(a.bits);
  uint64_t group = 0;
  const size_t count = Smaller(8, nq - first);
  for (size_t j = 0; j < count; ++j) {
    const size_t i = first + j;
    const Meta m = LoadMeta(metas, i / a.bucket_size);
    uint32_t q = 0;
    if (m.min == m.min) {  // finite bucket
      const uint64_t index = a.first_index + i;
      const float r = a.stochastic ? maxmin::Uniform(maxmin::StreamKey(a.seed, a.step, static_cast<uint32_t>(index >> 32)),
                                                     static_cast<uint32_t>(index))
                                   : 0.5f;
      q = maxmin::Quantize(Src::Load(in + i), m.min, maxmin::Inverse(m.unit), r, levels);
    }
    group |= static_cast<uint64_t>(q) << (8 * j);
  }
  const uint64_t packed = maxmin::PackGroup(group, a.bits);
  const size_t bytes = count == 8 ? static_cast<size_t>(a.bits) : (count * a.bits + 7) / 8;
  uint8_t* dst = codes_out + g * static_cast<size_t>(a.bits);
  for (size_t k = 0; k < bytes; ++k) dst[k] = static_cast<uint8_t>(packed >> (8 * k));
}

// The raw float32 tail of a segment with skipped incomplete buckets.
template <typename Src>
__global__ void RawTailKernel(const typename Src::T* in, size_t nq, size_t n, uint8_t* raw) {
  const size_t i = nq + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const float v = Src::Load(in + i);
  const uint32_t bits = __float_as_uint(v);
  uint8_t* dst = raw + 4 * (i - nq);
  for (int k = 0; k < 4; ++k) dst[k] = static_cast<uint8_t>(bits >> (8 * k));
}

template <typename Src>
size_t EncodeT(const typename Src::T* in, size_t n, const MaxMinArgs& a, uint8_t* out, cudaStream_t s) {
  const size_t nb = maxmin::MetaBuckets(n, a.bucket_size, a.skip_incomplete);
  const size_t nq = maxmin::QuantizedValues(n, a.bucket_size, a.skip_incomplete);
  uint8_t* codes = out + 8 * nb;
  uint8_t* raw = codes + (nq * static_cast<size_t>(a.bits) + 7) / 8;
  if (nb > 0) MetaKernel<Src><<<Blocks(nb * 32, kThreads), kThreads, 0, s>>>(in, nq, a.bucket_size, nb, a.bits, out);
  if (nq > 0) CodesKernel<Src><<<Blocks((nq + 7) / 8, kThreads), kThreads, 0, s>>>(in, nq, a, out, codes);
  if (n > nq) RawTailKernel<Src><<<Blocks(n - nq, kThreads), kThreads, 0, s>>>(in, nq, n, raw);
  CheckLaunch("max-min encode");
  return maxmin::WireBytes(n, a.bits, a.bucket_size, a.skip_incomplete);
}

// ---- decode ----------------------------------------------------------------------------------

template <typename Dst>
__global__ void DecodeKernel(const uint8_t* wire, size_t nq, MaxMinArgs a, const uint8_t* codes,
                             typename Dst::T* out, bool accumulate) {
  const size_t g = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const size_t first = g * 8;
  if (first >= nq) return;
  const size_t count = Smaller(8, nq - first);
  const size_t bytes = count == 8 ? static_cast<size_t>(a.bits) : (count * a.bits + 7) / 8;
  const uint8_t* src = codes + g * static_cast<size_t>(a.bits);
  uint64_t packed = 0;
  for (size_t k = 0; k < bytes; ++k) packed |= static_cast<uint64_t>(src[k]) << (8 * k);
  const uint64_t group = maxmin::UnpackGroup(packed, a.bits);
  for (size_t j = 0; j < count; ++j) {
    const size_t i = first + j;
    const Meta m = LoadMeta(wire, i / a.bucket_size);
    float y = maxmin::Dequantize(static_cast<uint32_t>((group >> (8 * j)) & 0xffu), m.min, m.unit);
    if (accumulate) y = __fadd_rn(Dst::Load(out + i), y);
    Dst::Store(out + i, y);
  }
}

template <typename Dst>
__global__ void RawDecodeKernel(const uint8_t* raw, size_t nq, size_t n, typename Dst::T* out, bool accumulate) {
  const size_t i = nq + static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const uint8_t* src = raw + 4 * (i - nq);
  uint32_t bits = 0;
  for (int k = 0; k < 4; ++k) bits |= static_cast<uint32_t>(src[k]) << (8 * k);
  float v = __uint_as_float(bits);
  if (accumulate) v = __fadd_rn(Dst::Load(out + i), v);
  Dst::Store(out + i, v);
}

template <typename Dst>
void DecodeT(const uint8_t* wire, size_t n, const MaxMinArgs& a, typename Dst::T* out, bool accumulate,
             cudaStream_t s) {
  const size_t nb = maxmin::MetaBuckets(n, a.bucket_size, a.skip_incomplete);
  const size_t nq = maxmin::QuantizedValues(n, a.bucket_size, a.skip_incomplete);
  const uint8_t* codes = wire + 8 * nb;
  const uint8_t* raw = codes + (nq * static_cast<size_t>(a.bits) + 7) / 8;
  if (nq > 0) DecodeKernel<Dst><<<Blocks((nq + 7) / 8, kThreads), kThreads, 0, s>>>(wire, nq, a, codes, out, accumulate);
  if (n > nq) RawDecodeKernel<Dst><<<Blocks(n - nq, kThreads), kThreads, 0, s>>>(raw, nq, n, out, accumulate);
  CheckLaunch("max-min decode");
}

}  // namespace

size_t MaxMinEncode(const void* in, DataType dtype, size_t n, const MaxMinArgs& a, uint8_t* out, void* stream) {
  RequireFloat(dtype, "max-min encode");
  switch (dtype) {
    case DataType::kFloat16: return EncodeT<F16>(static_cast<const uint16_t*>(in), n, a, out, S(stream));
    case DataType::kBFloat16: return EncodeT<BF16>(static_cast<const uint16_t*>(in), n, a, out, S(stream));
    default: return EncodeT<F32>(static_cast<const float*>(in), n, a, out, S(stream));
  }
}

void MaxMinDecode(const uint8_t* wire, size_t n, const MaxMinArgs& a, DataType out_dtype, void* out, bool accumulate,
                  void* stream) {
  RequireFloat(out_dtype, "max-min decode");
  switch (out_dtype) {
    case DataType::kFloat16: return DecodeT<F16>(wire, n, a, static_cast<uint16_t*>(out), accumulate, S(stream));
    case DataType::kBFloat16: return DecodeT<BF16>(wire, n, a, static_cast<uint16_t*>(out), accumulate, S(stream));
    default: return DecodeT<F32>(wire, n, a, static_cast<float*>(out), accumulate, S(stream));
  }
}

}  // namespace gradcomp::cuda

namespace gradcomp {

namespace {

size_t MaxMinEncodeOn(Device&, const Codec&, const void* in, DataType dtype, size_t n, const CodecParams& p,
                      uint64_t first_index, void* out, Stream& stream) {
  return cuda::MaxMinEncode(in, dtype, n, MaxMinArgsOf(p, first_index), static_cast<uint8_t*>(out), stream.native());
}

void MaxMinDecodeOn(Device&, const Codec&, const void* wire, size_t, size_t n, const CodecParams& p, DataType out_dtype,
                    void* out, bool accumulate, Stream& stream) {
  cuda::MaxMinDecode(static_cast<const uint8_t*>(wire), n, MaxMinArgsOf(p, 0), out_dtype, out, accumulate,
                     stream.native());
}

}  // namespace

const DeviceCodecKernels* MaxMinCudaKernels() {
  static const DeviceCodecKernels kernels{MaxMinEncodeOn, MaxMinDecodeOn};
  return &kernels;
}

}  // namespace gradcomp
