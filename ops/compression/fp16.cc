// fp16: values travel as IEEE float16, rounded to nearest even (2x smaller than float32).
#include "ops/compression/cast_codec.h"

namespace gradcomp {

const Codec& Fp16Codec() {
  static const CastCodec codec("fp16", "IEEE half precision on the wire (round to nearest even)",
                               DataType::kFloat16);
  return codec;
}

}  // namespace gradcomp
