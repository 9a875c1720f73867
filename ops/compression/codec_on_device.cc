#include "ops/compression/codec_on_device.h"

#include <string>

#include "ops/common/enforce.h"
#include "ops/common/simulation.h"
#include "ops/compression/auto_select.h"

namespace gradcomp {

namespace {

const DeviceCodecKernels& KernelsOrThrow(Device& device, const Codec& codec) {
  const DeviceCodecKernels* k = CodecKernelsOn(codec, device.kind());
  if (k == nullptr) {
    throw InvalidArgument(std::string(device.name()) + ": codec " + codec.name() +
                          " has no kernels for this device in this build");
  }
  return *k;
}

size_t ElementBytes(DataType dtype, size_t n) { return n * DataTypeSize(dtype); }

// A codec's work, counted for a simulation's profile (simulation.h) by the codec's candidate
// token ("maxmin4"); nothing outside a simulation.
void CountCodecWork(sim::Work work, const Codec& codec, const CodecParams& p, size_t n) {
  if (!sim::kSimulated) return;
  CompressionSpec spec;
  static_cast<CompressionOptions&>(spec) = p;
  spec.codec = codec.name();
  sim::CountWork(work, CandidateToken(spec).c_str(), static_cast<double>(n));
}

size_t HostEncode(Device& device, const Codec& codec, const void* in, DataType dtype, size_t n, const CodecParams& p,
                  uint64_t first_index, void* out, Stream&) {
  const size_t max_bytes = codec.MaxWireSize(n, p);
  CountCodecWork(sim::Work::kEncode, codec, p, n);
  return codec.Encode(device.HostAddress(in, ElementBytes(dtype, n), "Encode input"), dtype, n, p, first_index,
                      device.HostAddress(out, max_bytes, "Encode output"));
}

void HostDecode(Device& device, const Codec& codec, const void* wire, size_t wire_bytes, size_t n,
                const CodecParams& p, DataType out_dtype, void* out, bool accumulate, Stream&) {
  const void* w = device.HostAddress(wire, wire_bytes, "Decode input");
  void* o = device.HostAddress(out, ElementBytes(out_dtype, n), "Decode output");
  CountCodecWork(accumulate ? sim::Work::kDecodeAccumulate : sim::Work::kDecode, codec, p, n);
  if (accumulate) {
    codec.DecodeAccumulate(w, wire_bytes, n, p, out_dtype, o);
  } else {
    codec.Decode(w, wire_bytes, n, p, out_dtype, o);
  }
}

}  // namespace

const DeviceCodecKernels* HostCodecKernels() {
  static const DeviceCodecKernels kernels{HostEncode, HostDecode};
  return &kernels;
}

size_t EncodeOn(Device& device, const Codec& codec, const void* in, DataType dtype, size_t n, const CodecParams& p,
                uint64_t first_index, void* out, Stream& stream) {
  return KernelsOrThrow(device, codec).encode(device, codec, in, dtype, n, p, first_index, out, stream);
}

void DecodeOn(Device& device, const Codec& codec, const void* wire, size_t wire_bytes, size_t n, const CodecParams& p,
              DataType out_dtype, void* out, bool accumulate, Stream& stream) {
  KernelsOrThrow(device, codec).decode(device, codec, wire, wire_bytes, n, p, out_dtype, out, accumulate, stream);
}

}  // namespace gradcomp
