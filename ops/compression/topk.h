// topk (Deep Gradient Compression): keeps the values of largest magnitude. Exposed beyond the
// codec so tests and the runtime can inspect the selection.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "ops/compression/codec.h"

namespace gradcomp {

/// The values topk keeps of one segment: ascending indices and the magnitude threshold
/// every kept value reaches.
struct TopKSelection {
  std::vector<uint32_t> indices;
  float threshold = 0.0f;
  /// Number of threshold adjustments made (0..10) and whether exact top-k was used.
  int adjustments = 0;
  bool exact = false;
};

/// One encoded topk segment read in place: a uint32 count, the count uint32 indices, then
/// the count values (float32 or float16).
class TopKWire {
 public:
  TopKWire(const uint8_t* wire, DataType value_dtype);
  /// Values kept, and the bytes of the whole segment.
  uint32_t kept() const { return kept_; }
  size_t bytes() const { return 4 + size_t{kept_} * (4 + value_size_); }
  /// The j-th kept index and its value, as float32.
  uint32_t index(uint32_t j) const;
  float value(uint32_t j) const;

 private:
  const uint8_t* wire_;
  DataType value_dtype_;
  size_t value_size_;
  uint32_t kept_;
};

/// Target count k for n values: ceil(n * ratio), at least 1 (0 for n = 0), at most n.
size_t TopKTarget(size_t n, double ratio);
/// Most values a selection can hold: floor(1.3 k), at least k, at most n.
size_t TopKMaxCount(size_t n, double ratio);

/// DGC's selection: estimate the threshold from a strided sample (sample_ratio of the values,
/// random start keyed by (seed, step, first_index)), then adjust it up to 10 times until the
/// count lies in [0.8k, 1.3k]; if it still does not, select exactly the k largest. NaN counts
/// as the largest magnitude (it is always kept, so it stays visible after the reduction).
TopKSelection SelectTopK(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index);

/// SelectTopK's threshold search over values kept anywhere (host or device memory): `sample`
/// returns the importance (|x|, NaN as infinity) of values start, start + stride, ... up to n,
/// in order; `count_at_least(t)` counts the values whose importance is >= t. Returns the
/// threshold, the adjustments made and whether exact top-k is needed (then the caller selects
/// the k largest, ties in index order, as SelectTopK does); `indices` stays empty.
TopKSelection SearchTopKThreshold(size_t n, const CodecParams& p, uint64_t first_index,
                                  const std::function<std::vector<float>(size_t start, size_t stride)>& sample,
                                  const std::function<size_t(float threshold)>& count_at_least);

}  // namespace gradcomp
