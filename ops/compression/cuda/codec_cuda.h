// Device versions of the codec kernels: max-min encode / decode / decode-accumulate and topk,
// for buffers in CUDA device memory, enqueued on a caller's stream (the casts are the CUDA
// device's, ops/device/cuda_device.h). They compute
// exactly the bytes and values of the CPU kernels (ops/compression/kernels.h) for the same
// arguments: the per-element arithmetic is maxmin_math.h's and half.h's, compiled with
// --fmad=false. Built only when CMake finds CUDA (GRADCOMP_HAVE_CUDA_KERNELS in config.h);
// no CUDA header leaks out of this file (streams are passed as void*).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "ops/common/dtype.h"
#include "ops/compression/codec.h"
#include "ops/compression/kernels.h"

namespace gradcomp {
/// The max-min kernels' arguments for a segment encoded with `p` whose first value is buffer
/// element `first_index` (maxmin.cc; the CPU codec uses the same).
codec_kernels::MaxMinArgs MaxMinArgsOf(const CodecParams& p, uint64_t first_index);
}  // namespace gradcomp

namespace gradcomp::cuda {

/// Encodes n values of `in` (float32, float16 or bfloat16, on the device) into `out` (device
/// memory of maxmin::WireBytes(n, ...) bytes). Returns the bytes written. Asynchronous on
/// `stream` (a cudaStream_t; nullptr = the legacy default stream).
size_t MaxMinEncode(const void* in, DataType dtype, size_t n, const codec_kernels::MaxMinArgs& a, uint8_t* out,
                    void* stream);

/// Decodes one segment from device `wire` into device `out` (assign, or add when `accumulate`).
void MaxMinDecode(const uint8_t* wire, size_t n, const codec_kernels::MaxMinArgs& a, DataType out_dtype, void* out,
                  bool accumulate, void* stream);


/// topk's encoding of n values of device `in` into device `out` (MaxWireSize bytes): the CPU
/// codec's selection and bytes. Returns the bytes written; waits for `stream` (the size depends
/// on the data).
size_t TopKEncode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index, uint8_t* out,
                  void* stream);
/// Decodes one topk segment of `wire_bytes` bytes (assign, or add when `accumulate`), after
/// checking its header and indices as the CPU codec does.
void TopKDecode(const uint8_t* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype, void* out,
                bool accumulate, void* stream);


}  // namespace gradcomp::cuda
