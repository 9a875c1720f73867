// Fuzzes one codec (GRADCOMP_FUZZ_CODEC: maxmin, topk, fp16 or bf16) with the bytes a peer
// could send: Decode and DecodeAccumulate of arbitrary wire bytes must either work or throw
// gradcomp::Error, never read or write outside their buffers; and Encode of arbitrary floats
// (NaN, inf, huge, denormal) must stay in MaxWireSize and decode again.
//
// Input: flags (1 byte), bits (1), bucket size (2), n (4), then the wire bytes / values.
#include <algorithm>
#include <vector>

#include "ops/common/cpu.h"
#include "ops/common/dtype.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "test/fuzz/fuzz.h"

#ifndef GRADCOMP_FUZZ_CODEC
#error "define GRADCOMP_FUZZ_CODEC"
#endif

namespace gradcomp::fuzz {
namespace {

constexpr size_t kMaxValues = 1 << 16;

struct Case {
  CodecParams params;
  DataType out_dtype = DataType::kFloat32;
  bool accumulate = false;
  size_t n = 0;
};

Case ReadCase(Reader& in) {
  Case c;
  const auto flags = in.Take<uint8_t>();
  const auto bits = in.Take<uint8_t>();
  const auto bucket = in.Take<uint16_t>();
  const auto n = in.Take<uint32_t>();
  c.accumulate = flags & 1;
  c.params.skip_incomplete_buckets = flags & 2;
  c.params.isa = (flags & 4) ? BestIsa() : Isa::kScalar;
  c.params.stochastic = flags & 8;
  static const DataType kOut[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat32};
  c.out_dtype = kOut[(flags >> 4) & 3];
  c.params.topk_value_dtype = (flags & 64) ? DataType::kFloat16 : DataType::kFloat32;
  c.params.bits = 1 + bits % 8;
  c.params.bucket_size = 1 + bucket % 4096;
  c.params.seed = bits;
  c.params.step = bucket;
  c.n = n % (kMaxValues + 1);
  return c;
}

void DecodeBytes(const Codec& codec, const Case& c, const uint8_t* wire, size_t bytes, size_t n) {
  std::vector<uint8_t> out(n * DataTypeSize(c.out_dtype) + 1, 0);
  try {
    if (c.accumulate) {
      codec.DecodeAccumulate(wire, bytes, n, c.params, c.out_dtype, out.data());
    } else {
      codec.Decode(wire, bytes, n, c.params, c.out_dtype, out.data());
    }
  } catch (const Error&) {
    // A malformed segment is rejected with a message: what a receiver must do.
  }
  if (out.back() != 0) Fail("decode wrote past its output");
}

// The largest n whose encoding fits in `bytes` (MaxWireSize grows with n), for decoding
// arbitrary bytes of the right size, which is what reaches the kernels.
size_t FittingCount(const Codec& codec, const CodecParams& p, size_t bytes) {
  size_t lo = 0, hi = std::min(kMaxValues, bytes * 8 + 8);
  while (lo < hi) {
    const size_t mid = (lo + hi + 1) / 2;
    if (codec.MaxWireSize(mid, p) <= bytes) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

}  // namespace

std::vector<std::string> Seeds() {
  const Codec& codec = FindCodec(GRADCOMP_FUZZ_CODEC);
  std::vector<std::string> seeds;
  for (uint8_t flags : {0, 1, 4, 8, 16, 64 | 4}) {
    for (uint32_t n : {0u, 1u, 7u, 512u, 1000u}) {
      CodecParams p;
      p.bits = 1 + (n % 8);
      p.bucket_size = 64;
      p.stochastic = flags & 8;
      p.topk_value_dtype = (flags & 64) ? DataType::kFloat16 : DataType::kFloat32;
      p.topk_ratio = 0.1;
      std::vector<float> values(n);
      for (uint32_t i = 0; i < n; ++i) values[i] = static_cast<float>((i * 37) % 101) - 50.0f;
      std::vector<uint8_t> wire(codec.MaxWireSize(n, p));
      wire.resize(codec.Encode(values.data(), DataType::kFloat32, n, p, 0, wire.data()));
      std::string s(8, '\0');
      s[0] = static_cast<char>(flags);
      s[1] = static_cast<char>(p.bits - 1);
      const uint16_t bucket = 63;
      std::memcpy(&s[2], &bucket, 2);
      std::memcpy(&s[4], &n, 4);
      s.append(reinterpret_cast<const char*>(wire.data()), wire.size());
      seeds.push_back(s);
    }
  }
  return seeds;
}

}  // namespace gradcomp::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gradcomp;
  using namespace gradcomp::fuzz;
  const Codec& codec = FindCodec(GRADCOMP_FUZZ_CODEC);
  Reader in(data, size);
  Case c = ReadCase(in);
  // The bytes as a peer's segment of the header's n values, then cut to a fitting size.
  DecodeBytes(codec, c, in.rest(), in.rest_size(), c.n);
  const size_t fit = FittingCount(codec, c.params, in.rest_size());
  if (codec.MaxWireSize(fit, c.params) <= in.rest_size()) {  // not so for topk's header alone
    DecodeBytes(codec, c, in.rest(), codec.MaxWireSize(fit, c.params), fit);
  }
  // The bytes as float32 values to encode: the size stays within MaxWireSize, and the
  // encoding decodes (its bytes are well-formed by construction).
  const size_t n = std::min(in.rest_size() / 4, kMaxValues);
  std::vector<float> values(n);
  if (n > 0) std::memcpy(values.data(), in.rest(), n * 4);
  c.params.topk_ratio = 0.01 + (c.params.bucket_size % 100) / 100.0;
  std::vector<uint8_t> wire(codec.MaxWireSize(n, c.params) + 1, 0xA5);
  size_t written = 0;
  try {
    written = codec.Encode(values.data(), DataType::kFloat32, n, c.params, c.n, wire.data());
  } catch (const Error& e) {
    Fail(std::string("encode of ") + std::to_string(n) + " values threw: " + e.what());
  }
  if (written > wire.size() - 1 || wire.back() != 0xA5) Fail("encode wrote past MaxWireSize");
  std::vector<float> back(n + 1, 0.0f);
  try {
    codec.Decode(wire.data(), written, n, c.params, DataType::kFloat32, back.data());
  } catch (const Error& e) {
    Fail(std::string("decode of a fresh encoding threw: ") + e.what());
  }
  return 0;
}
