// The CUDA device (cuda_device.cu), built when CMake finds CUDA (GRADCOMP_HAVE_CUDA_KERNELS in
// gradcomp/config.h). The codecs' kernels are theirs (ops/compression/cuda/, named by their
// registry entries); the float casts the cast codecs send are the device's. Its cast, reduce,
// scale and average kernels take float32, float16 and bfloat16 (computed in float32 and rounded
// back, as the CPU's); other dtypes are an InvalidArgument.
#pragma once

#include <memory>
#include <string>

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

namespace gradcomp::cuda {

/// out = in converted between float32 / float16 / bfloat16 (or out += in), on the device,
/// asynchronous on `stream` (a cudaStream_t).
void Cast(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate, void* stream);
/// InvalidArgument naming `what` unless `dtype` is float32, float16 or bfloat16.
void RequireFloat(DataType dtype, const char* what);
/// Throws gradcomp::Error naming `what` and CUDA's message if the last launch failed.
void CheckLaunch(const std::string& what);

}  // namespace gradcomp::cuda
