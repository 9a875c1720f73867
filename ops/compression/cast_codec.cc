#include "ops/compression/cast_codec.h"

#include <string>

#include "ops/common/enforce.h"
#include "ops/compression/codec_on_device.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

void CheckWireBytes(const char* name, DataType wire_dtype, size_t n, size_t wire_bytes) {
  if (wire_bytes != n * DataTypeSize(wire_dtype)) {
    throw InvalidArgument(std::string(name) + ": " + std::to_string(n) + " values take " +
                          std::to_string(n * DataTypeSize(wire_dtype)) + " bytes, got " + std::to_string(wire_bytes));
  }
}

// The cast codecs on any device: the device's Cast to the wire's dtype and back.
DataType WireOf(const Codec& codec) { return static_cast<const CastCodec&>(codec).wire_dtype(); }

size_t CastEncode(Device& device, const Codec& codec, const void* in, DataType dtype, size_t n, const CodecParams&,
                  uint64_t, void* out, Stream& stream) {
  device.Cast(in, dtype, n, out, WireOf(codec), false, stream);
  return n * DataTypeSize(WireOf(codec));
}

void CastDecode(Device& device, const Codec& codec, const void* wire, size_t wire_bytes, size_t n, const CodecParams&,
                DataType out_dtype, void* out, bool accumulate, Stream& stream) {
  CheckWireBytes(codec.name(), WireOf(codec), n, wire_bytes);
  device.Cast(wire, WireOf(codec), n, out, out_dtype, accumulate, stream);
}

}  // namespace

const DeviceCodecKernels* CastCodecKernels() {
  static const DeviceCodecKernels kernels{CastEncode, CastDecode};
  return &kernels;
}

size_t CastCodec::MaxWireSize(size_t n, const CodecParams&) const { return n * DataTypeSize(wire_dtype_); }

size_t CastCodec::Encode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t,
                         void* out) const {
  CheckCodecDataType(dtype, name_, "input");
  CastBuffer(in, dtype, n, out, wire_dtype_, false, p.isa);
  return n * DataTypeSize(wire_dtype_);
}

void CastCodec::Decode(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                       void* out) const {
  Run(wire, wire_bytes, n, p, out_dtype, out, false);
}

void CastCodec::DecodeAccumulate(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p,
                                 DataType out_dtype, void* out) const {
  Run(wire, wire_bytes, n, p, out_dtype, out, true);
}

void CastCodec::Run(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                    void* out, bool accumulate) const {
  CheckCodecDataType(out_dtype, name_, "output");
  CheckWireBytes(name_, wire_dtype_, n, wire_bytes);
  CastBuffer(wire, wire_dtype_, n, out, out_dtype, accumulate, p.isa);
}

}  // namespace gradcomp
