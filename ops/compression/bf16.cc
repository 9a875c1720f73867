// bf16: values travel as bfloat16, rounded to nearest even (float32's range, 8-bit mantissa).
#include "ops/compression/cast_codec.h"

namespace gradcomp {

const Codec& Bf16Codec() {
  static const CastCodec codec("bf16", "bfloat16 on the wire (round to nearest even)", DataType::kBFloat16);
  return codec;
}

}  // namespace gradcomp
