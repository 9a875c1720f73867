#include "ops/compression/codec.h"

#include "ops/common/enforce.h"

namespace gradcomp {

std::vector<const Codec*> AllCodecs() {
  return {&NoneCodec(), &Fp16Codec(), &Bf16Codec(), &MaxMinCodec(), &TopKCodec()};
}

const Codec& FindCodec(const std::string& name) {
  std::string known;
  for (const Codec* c : AllCodecs()) {
    if (name == c->name()) return *c;
    known += (known.empty() ? "" : ", ") + std::string(c->name());
  }
  throw InvalidArgument("unknown codec '" + name + "' (known: " + known + ")");
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

void ValidateCodecParams(const std::string& codec, const CodecParams& p) {
  if (codec == "maxmin") {
    if (p.bits < 1 || p.bits > 8) {
      throw InvalidArgument("maxmin: bits=" + std::to_string(p.bits) + " is outside 1..8");
    }
    if (p.bucket_size < 1) throw InvalidArgument("maxmin: bucket_size must be >= 1, got 0");
  }
  if (codec == "topk") {
    if (!(p.topk_ratio > 0.0 && p.topk_ratio <= 1.0)) {
      throw InvalidArgument("topk: ratio=" + std::to_string(p.topk_ratio) + " is outside (0, 1]");
    }
    if (!(p.topk_sample_ratio > 0.0 && p.topk_sample_ratio <= 1.0)) {
      throw InvalidArgument("topk: sample_ratio=" + std::to_string(p.topk_sample_ratio) + " is outside (0, 1]");
    }
    if (p.topk_value_dtype != DataType::kFloat32 && p.topk_value_dtype != DataType::kFloat16) {
      throw InvalidArgument(std::string("topk: value dtype ") + DataTypeName(p.topk_value_dtype) +
                            " is not supported (float32 or float16)");
    }
  }
}

}  // namespace gradcomp
