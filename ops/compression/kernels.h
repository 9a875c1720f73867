// Entry points of the codec kernels, compiled once per instruction set (kernels_scalar.cc,
// kernels_avx2.cc); the codecs pick one through CodecParams::isa. Internal to ops/compression.
#pragma once

#include <cstddef>
#include <cstdint>

#include "ops/common/dtype.h"

namespace gradcomp::codec_kernels {

/// What a max-min kernel needs of CodecParams, already validated.
struct MaxMinArgs {
  int bits;
  size_t bucket_size;
  bool stochastic;
  bool skip_incomplete;
  uint64_t seed;
  uint64_t step;
  uint64_t first_index;
};

#define GC_CODEC_KERNEL_DECLS                                                                       \
  /* Encodes one segment of n values; returns the bytes written (maxmin::WireBytes). */             \
  size_t MaxMinEncode(const void* in, DataType dtype, size_t n, const MaxMinArgs& a, uint8_t* out); \
  /* Decodes one segment into `out` (assign, or add when `accumulate`). */                          \
  void MaxMinDecode(const uint8_t* wire, size_t n, const MaxMinArgs& a, DataType out_dtype, void* out, bool accumulate);

namespace scalar {
GC_CODEC_KERNEL_DECLS
}  // namespace scalar
namespace avx2 {
GC_CODEC_KERNEL_DECLS
}  // namespace avx2

#undef GC_CODEC_KERNEL_DECLS

}  // namespace gradcomp::codec_kernels
