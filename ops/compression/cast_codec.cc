#include "ops/compression/cast_codec.h"

#include "ops/common/enforce.h"
#include "ops/compression/kernels.h"

namespace gradcomp {

void CastBuffer(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype, bool accumulate, Isa isa) {
  CheckCodecDataType(in_dtype, "cast", "input");
  CheckCodecDataType(out_dtype, "cast", "output");
  if (isa == Isa::kAvx2) {
    codec_kernels::avx2::Cast(in, in_dtype, n, out, out_dtype, accumulate);
  } else {
    codec_kernels::scalar::Cast(in, in_dtype, n, out, out_dtype, accumulate);
  }
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
  if (wire_bytes != n * DataTypeSize(wire_dtype_)) {
    throw InvalidArgument(std::string(name_) + ": " + std::to_string(n) + " values take " +
                          std::to_string(n * DataTypeSize(wire_dtype_)) + " bytes, got " + std::to_string(wire_bytes));
  }
  CastBuffer(wire, wire_dtype_, n, out, out_dtype, accumulate, p.isa);
}

}  // namespace gradcomp
