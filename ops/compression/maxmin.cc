// maxmin: CGX/QSGD max-min quantization to 1-8 bits per value with a (min, unit) pair per
// bucket. Wire format and arithmetic: docs/design.md "Compression"; per-element math in
// maxmin_math.h; kernels in kernels_impl.h.
//
// Non-finite input: a bucket holding a NaN or an infinity (or whose max - min overflows
// float32) is sent with meta (NaN, NaN) and all-zero codes, so every value of that bucket
// decodes to NaN. The other buckets are unaffected. This keeps overflow visible to loss
// scalers that look for non-finite gradients after the allreduce, and never crashes.
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "ops/compression/cuda/codec_cuda.h"
#include "ops/compression/kernels.h"
#include "ops/compression/maxmin_math.h"

namespace gradcomp {

codec_kernels::MaxMinArgs MaxMinArgsOf(const CodecParams& p, uint64_t first_index) {
  return {p.bits, static_cast<size_t>(p.bucket_size), p.stochastic, p.skip_incomplete_buckets, p.seed, p.step, first_index};
}

namespace {

codec_kernels::MaxMinArgs Args(const CodecParams& p, uint64_t first_index) { return MaxMinArgsOf(p, first_index); }

class MaxMin final : public Codec {
 public:
  const char* name() const override { return "maxmin"; }
  const char* description() const override {
    return "max-min quantization (CGX/QSGD): 1-8 bits per value, a float32 min and unit per bucket";
  }
  uint32_t fields() const override {
    return kFieldBits | kFieldBucketSize | kFieldStochastic | kFieldSkipIncomplete;
  }
  void Validate(const CodecParams& p) const override {
    if (p.bits < 1 || p.bits > 8) {
      throw InvalidArgument("maxmin: bits=" + std::to_string(p.bits) + " is outside 1..8");
    }
    if (p.bucket_size < 1) throw InvalidArgument("maxmin: bucket_size must be >= 1, got " + std::to_string(p.bucket_size));
  }

  size_t MaxWireSize(size_t n, const CodecParams& p) const override {
    Validate(p);
    return maxmin::WireBytes(n, p.bits, p.bucket_size, p.skip_incomplete_buckets);
  }

  size_t Encode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index,
                void* out) const override {
    Validate(p);
    CheckCodecDataType(dtype, "maxmin", "input");
    auto* wire = static_cast<uint8_t*>(out);
    const size_t written = p.isa == Isa::kAvx2
                               ? codec_kernels::avx2::MaxMinEncode(in, dtype, n, Args(p, first_index), wire)
                               : codec_kernels::scalar::MaxMinEncode(in, dtype, n, Args(p, first_index), wire);
    GC_ENFORCE(written == MaxWireSize(n, p), "maxmin wrote ", written, " bytes, expected ", MaxWireSize(n, p));
    return written;
  }

  void Decode(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
              void* out) const override {
    Run(wire, wire_bytes, n, p, out_dtype, out, false);
  }

  void DecodeAccumulate(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                        void* out) const override {
    Run(wire, wire_bytes, n, p, out_dtype, out, true);
  }

 private:
  void Run(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype, void* out,
           bool accumulate) const {
    CheckCodecDataType(out_dtype, "maxmin", "output");
    const size_t expected = MaxWireSize(n, p);
    if (wire_bytes != expected) {
      throw InvalidArgument("maxmin: " + std::to_string(n) + " values at " + std::to_string(p.bits) +
                            " bits, bucket " + std::to_string(p.bucket_size) + " take " + std::to_string(expected) +
                            " bytes, got " + std::to_string(wire_bytes));
    }
    const auto* bytes = static_cast<const uint8_t*>(wire);
    if (p.isa == Isa::kAvx2) {
      codec_kernels::avx2::MaxMinDecode(bytes, n, Args(p, 0), out_dtype, out, accumulate);
    } else {
      codec_kernels::scalar::MaxMinDecode(bytes, n, Args(p, 0), out_dtype, out, accumulate);
    }
  }
};

}  // namespace

const Codec& MaxMinCodec() {
  static const MaxMin codec;
  return codec;
}

}  // namespace gradcomp
