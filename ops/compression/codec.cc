#include "ops/compression/codec.h"

#include "ops/common/enforce.h"
#include "ops/compression/codec_on_device.h"

namespace gradcomp {

// A build without CUDA does not define these (codec_on_device.h): weak references, null there.
[[gnu::weak]] const DeviceCodecKernels* MaxMinCudaKernels();
[[gnu::weak]] const DeviceCodecKernels* TopKCudaKernels();

namespace {

// The registry: each codec, one file each, with its kernels on each kind of device
// (codec_on_device.h). A new codec is a file and a row here (docs/design.md, "Adding a codec").
struct CodecEntry {
  const Codec& (*codec)();
  const DeviceCodecKernels* (*cpu)();
  const DeviceCodecKernels* (*cuda)();  // null: no CUDA kernels in this build
};
const CodecEntry kRegistry[] = {
    {NoneCodec, HostCodecKernels, CastCodecKernels},
    {Fp16Codec, HostCodecKernels, CastCodecKernels},
    {Bf16Codec, HostCodecKernels, CastCodecKernels},
    {MaxMinCodec, HostCodecKernels, MaxMinCudaKernels},
    {TopKCodec, HostCodecKernels, TopKCudaKernels},
};

}  // namespace

const std::vector<const Codec*>& AllCodecs() {
  // Built once: LookupCodec runs whenever two specs are compared (cache and fusion).
  static const std::vector<const Codec*> codecs = [] {
    std::vector<const Codec*> out;
    for (const CodecEntry& e : kRegistry) out.push_back(&e.codec());
    return out;
  }();
  return codecs;
}

const DeviceCodecKernels* CodecKernelsOn(const Codec& codec, DeviceKind kind) {
  for (const CodecEntry& e : kRegistry) {
    if (&e.codec() != &codec) continue;
    const auto implementation = kind == DeviceKind::kCpu ? e.cpu : e.cuda;
    return implementation != nullptr ? implementation() : nullptr;
  }
  return nullptr;
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

bool IsCodecDataType(DataType dtype) { return IsFloat32Or16(dtype); }

void CheckCodecDataType(DataType dtype, const char* codec, const char* what) {
  if (!IsCodecDataType(dtype)) {
    throw InvalidArgument(std::string(codec) + ": " + what + " dtype " + DataTypeName(dtype) +
                          " is not supported (float32, float16 or bfloat16)");
  }
}

}  // namespace gradcomp
