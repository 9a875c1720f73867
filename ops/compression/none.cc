// none: values travel as raw float32 (the reference every other codec is compared with).
#include "ops/compression/cast_codec.h"

namespace gradcomp {

const Codec& NoneCodec() {
  static const CastCodec codec("none", "no compression: raw float32 values", DataType::kFloat32);
  return codec;
}

}  // namespace gradcomp
