// Codecs that only change the element type on the wire (none: float32, fp16, bf16).
// Internal to ops/compression.
#pragma once

#include "ops/compression/codec.h"

namespace gradcomp {

/// A codec whose wire is every value converted to `wire_dtype`, decoded back exactly.
class CastCodec final : public Codec {
 public:
  CastCodec(const char* name, const char* description, DataType wire_dtype)
      : name_(name), description_(description), wire_dtype_(wire_dtype) {}

  const char* name() const override { return name_; }
  const char* description() const override { return description_; }
  DataType wire_dtype() const { return wire_dtype_; }
  size_t MaxWireSize(size_t n, const CodecParams& p) const override;
  size_t Encode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index,
                void* out) const override;
  void Decode(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
              void* out) const override;
  void DecodeAccumulate(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                        void* out) const override;

 private:
  void Run(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype, void* out,
           bool accumulate) const;

  const char* name_;
  const char* description_;
  DataType wire_dtype_;
};

}  // namespace gradcomp
