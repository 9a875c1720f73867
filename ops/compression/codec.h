// Gradient codecs: a small interface registered by name in a table (UCC style). Each codec
// lives in its own file: none.cc, fp16.cc, bf16.cc, maxmin.cc, topk.cc. Codecs are pure
// and thread-safe; their wire formats are fixed by docs/design.md so every implementation (CPU
// scalar, AVX2, CUDA) produces the same bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "ops/common/cpu.h"
#include "ops/common/dtype.h"
#include "ops/compression/spec.h"

namespace gradcomp {

/// Parameters of an encode/decode: the options users chose (spec.h) and what the runtime
/// supplies per call. Only the fields a codec uses (its fields()) matter to it.
struct CodecParams : CompressionOptions {
  /// Stochastic rounding and topk sampling are keyed by (seed, step, element index).
  uint64_t seed = 0;
  uint64_t step = 0;
  /// topk: fraction of values sampled to estimate the threshold.
  double topk_sample_ratio = 0.01;
  /// topk: dtype of the values on the wire (float32 or float16).
  DataType topk_value_dtype = DataType::kFloat32;
  /// Instruction set of the kernels (tests force kScalar to compare).
  Isa isa = BestIsa();
};

/// The codec parameters of `options`, with the per-call fields at their defaults.
inline CodecParams ParamsOf(const CompressionOptions& options) {
  CodecParams p;
  static_cast<CompressionOptions&>(p) = options;
  return p;
}

/// A compression codec. Inputs and outputs are float32, float16 or bfloat16; `n` counts
/// values. One call encodes one *segment*: buckets restart at its first value, so callers
/// encode each tensor (and each chunk of a collective) as a segment of its own.
class Codec {
 public:
  virtual ~Codec() = default;
  /// Registry name ("maxmin").
  virtual const char* name() const = 0;
  /// One line for users.
  virtual const char* description() const = 0;
  /// The CodecField bits of the options this codec reads (they describe and distinguish
  /// its specs; spec.h).
  virtual uint32_t fields() const { return 0; }
  /// Sparse codecs encode a data-dependent selection (variable size): they are allreduced by
  /// an allgather of every rank's encoding and a scatter-add, not by SRA.
  virtual bool sparse() const { return false; }
  /// Throws InvalidArgument naming the field, the value and the allowed range when `p` holds
  /// a value this codec cannot use.
  virtual void Validate(const CodecParams& p) const { (void)p; }
  /// Bytes an encoded segment of n values can take (exact for every codec but topk, whose
  /// size depends on the data; Encode returns the real size).
  virtual size_t MaxWireSize(size_t n, const CodecParams& p) const = 0;
  /// Encodes n values of `dtype` from `in` into `out` (MaxWireSize bytes available).
  /// `first_index` is the index of in[0] within its tensor (keys stochastic rounding, so a
  /// value's rounding does not depend on how the tensor was cut). Returns bytes written.
  virtual size_t Encode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index,
                        void* out) const = 0;
  /// out[i] = decoded value i, for a segment of n values encoded in `wire_bytes` bytes.
  virtual void Decode(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                      void* out) const = 0;
  /// out[i] += decoded value i (the hot path of a compressed reduction).
  virtual void DecodeAccumulate(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p,
                                DataType out_dtype, void* out) const = 0;
};

/// The codec registered as `name`, or null.
const Codec* LookupCodec(std::string_view name);
/// The codec registered as `name`; throws InvalidArgument listing the known names. (A view, not a
/// string reference: the codecs live for the program, whatever the argument's lifetime.)
const Codec& FindCodec(std::string_view name);
/// Every codec, in registry order.
const std::vector<const Codec*>& AllCodecs();

/// True for the dtypes codecs accept (float32, float16, bfloat16).
bool IsCodecDataType(DataType dtype);
/// Throws InvalidArgument unless `dtype` is a codec dtype; `what` names the argument.
void CheckCodecDataType(DataType dtype, const char* codec, const char* what);


// Registration hooks, one per codec file.
const Codec& NoneCodec();
const Codec& Fp16Codec();
const Codec& Bf16Codec();
const Codec& MaxMinCodec();
const Codec& TopKCodec();

}  // namespace gradcomp
