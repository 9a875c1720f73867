#include "ops/compression/codec.h"

#include "ops/common/enforce.h"

namespace gradcomp {

const std::vector<const Codec*>& AllCodecs() {
  // Built once: LookupCodec runs whenever two specs are compared (cache and fusion).
  static const std::vector<const Codec*> codecs = {&NoneCodec(), &Fp16Codec(), &Bf16Codec(), &MaxMinCodec(),
                                                   &TopKCodec()};
  return codecs;
}

const Codec* LookupCodec(std::string_view name) {
  for (const Codec* c : AllCodecs()) {
    if (name == c->name()) return c;
  }
  return nullptr;
}

const Codec& FindCodec(std::string_view name) {
  if (const Codec* c = LookupCodec(name)) return *c;
  std::string known;
  for (const Codec* c : AllCodecs()) known += (known.empty() ? "" : ", ") + std::string(c->name());
  throw InvalidArgument("unknown codec '" + std::string(name) + "' (known: " + known + ")");
}

bool IsCodecDataType(DataType dtype) {
  return dtype == DataType::kFloat32 || dtype == DataType::kFloat16 || dtype == DataType::kBFloat16;
}

void CheckCodecDataType(DataType dtype, const char* codec, const char* what) {
  if (!IsCodecDataType(dtype)) {
    throw InvalidArgument(std::string(codec) + ": " + what + " dtype " + DataTypeName(dtype) +
                          " is not supported (float32, float16 or bfloat16)");
  }
}

}  // namespace gradcomp
