// The CUDA device (cuda_device.cu), built when CMake finds CUDA (GRADCOMP_HAVE_CUDA_KERNELS in
// gradcomp/config.h). It has device kernels for every codec (max-min, the casts, topk with the
// CPU's selection). Its reduce, scale and average kernels take float32, float16 and bfloat16 (computed
// in float32 and rounded back, as the CPU's); other dtypes are an InvalidArgument.
#pragma once

#include <memory>

#include "ops/device/device.h"

namespace gradcomp {

/// GPUs this process sees (0 without a driver).
int CudaDeviceCount();
/// The device for GPU `ordinal` (one per process and GPU); InvalidArgument if there is none.
Device& CudaDevice(int ordinal);
/// The GPU ordinal of a CUDA device, or -1 for any other device.
int CudaOrdinal(const Device& device);
/// A framework's cudaStream_t as a Stream of a CUDA device (not owned).
std::unique_ptr<Stream> WrapCudaStream(void* stream);

}  // namespace gradcomp
