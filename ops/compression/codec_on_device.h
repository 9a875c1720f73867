// A codec on a device: encoding and decoding buffers in a device's memory, on its stream, with
// the kernels the codec's registry entry (codec.cc) names for the device's kind. Every codec
// runs on the CPU devices (its own Encode and Decode, on host addresses); on CUDA the cast
// codecs (none, fp16, bf16) run the device's Cast, and max-min and topk the kernels of
// ops/compression/cuda/ where the build has them.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/compression/codec.h"
#include "ops/device/device.h"

namespace gradcomp {

/// What one codec runs on one kind of device. Buffers are the device's memory and the work
/// goes on `stream`. `encode` returns the bytes written (a sparse codec's size depends on the
/// data, so its encode waits for the stream).
struct DeviceCodecKernels {
  size_t (*encode)(Device& device, const Codec& codec, const void* in, DataType dtype, size_t n, const CodecParams& p,
                   uint64_t first_index, void* out, Stream& stream);
  void (*decode)(Device& device, const Codec& codec, const void* wire, size_t wire_bytes, size_t n,
                 const CodecParams& p, DataType out_dtype, void* out, bool accumulate, Stream& stream);
};

/// codec.Encode of device memory `in` into `out` (MaxWireSize bytes) on `device`; returns the
/// bytes written. InvalidArgument when the codec has no kernels for the device's kind.
size_t EncodeOn(Device& device, const Codec& codec, const void* in, DataType dtype, size_t n, const CodecParams& p,
                uint64_t first_index, void* out, Stream& stream);
/// codec.Decode (or DecodeAccumulate with `accumulate`) of device memory on `device`.
void DecodeOn(Device& device, const Codec& codec, const void* wire, size_t wire_bytes, size_t n, const CodecParams& p,
              DataType out_dtype, void* out, bool accumulate, Stream& stream);

/// The kernels of `codec` on devices of `kind`, or null (its registry entry's).
const DeviceCodecKernels* CodecKernelsOn(const Codec& codec, DeviceKind kind);

// The implementations registry entries name (codec.cc).
/// Every codec on the CPU devices: its own Encode and Decode on the buffers' host addresses.
const DeviceCodecKernels* HostCodecKernels();
/// The cast codecs (cast_codec.h) on any device: the device's Cast to and from the wire's dtype.
const DeviceCodecKernels* CastCodecKernels();
/// Max-min's and topk's CUDA kernels (ops/compression/cuda/), defined only where the build has
/// CUDA (the registry refers to them weakly).
const DeviceCodecKernels* MaxMinCudaKernels();
const DeviceCodecKernels* TopKCudaKernels();

}  // namespace gradcomp
