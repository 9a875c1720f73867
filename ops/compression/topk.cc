// topk: DGC sparsification. Wire of one segment: uint32 count, then `count` int32 indices
// (ascending, relative to the segment), then `count` values as float32 or float16. Decoding
// is a scatter (assign) or scatter-add (accumulate) into a dense output.
#include "ops/compression/topk.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "ops/common/enforce.h"
#include "ops/common/half.h"
#include "ops/compression/maxmin_math.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

float LoadFloat(const void* in, DataType dt, size_t i) {
  switch (dt) {
    case DataType::kFloat16: return HalfBitsToFloat(static_cast<const uint16_t*>(in)[i]);
    case DataType::kBFloat16: return BFloat16BitsToFloat(static_cast<const uint16_t*>(in)[i]);
    default: return static_cast<const float*>(in)[i];
  }
}

void StoreFloat(void* out, DataType dt, size_t i, float v) {
  switch (dt) {
    case DataType::kFloat16: static_cast<uint16_t*>(out)[i] = FloatToHalfBits(v); return;
    case DataType::kBFloat16: static_cast<uint16_t*>(out)[i] = FloatToBFloat16Bits(v); return;
    default: static_cast<float*>(out)[i] = v; return;
  }
}

float Importance(float x) { return std::isnan(x) ? INFINITY : std::fabs(x); }

size_t CountAtLeast(const std::vector<float>& importance, float threshold) {
  size_t c = 0;
  for (float v : importance) c += (v >= threshold);
  return c;
}

// The k-th largest of `values` (k >= 1), leaving `values` reordered.
float KthLargest(std::vector<float>& values, size_t k) {
  std::nth_element(values.begin(), values.begin() + static_cast<long>(k - 1), values.end(), std::greater<float>());
  return values[k - 1];
}

class TopK final : public Codec {
 public:
  const char* name() const override { return "topk"; }
  const char* description() const override {
    return "DGC top-k sparsification: the largest values with int32 indices, float32 or float16 values";
  }
  uint32_t fields() const override { return kFieldRatio | kFieldMomentum | kFieldNesterov; }
  bool sparse() const override { return true; }
  void Validate(const CodecParams& p) const override {
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

  size_t MaxWireSize(size_t n, const CodecParams& p) const override {
    Validate(p);
    return 4 + TopKMaxCount(n, p.topk_ratio) * (4 + DataTypeSize(p.topk_value_dtype));
  }

  size_t Encode(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index,
                void* out) const override {
    Validate(p);
    CheckCodecDataType(dtype, "topk", "input");
    const TopKSelection sel = SelectTopK(in, dtype, n, p, first_index);
    const uint32_t count = static_cast<uint32_t>(sel.indices.size());
    auto* bytes = static_cast<uint8_t*>(out);
    std::memcpy(bytes, &count, 4);
    if (count > 0) std::memcpy(bytes + 4, sel.indices.data(), 4 * size_t{count});  // none: data() may be null
    uint8_t* values = bytes + 4 + 4 * size_t{count};
    for (uint32_t j = 0; j < count; ++j) StoreFloat(values, p.topk_value_dtype, j, LoadFloat(in, dtype, sel.indices[j]));
    return 4 + size_t{count} * (4 + DataTypeSize(p.topk_value_dtype));
  }

  void Decode(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
              void* out) const override {
    CheckCodecDataType(out_dtype, "topk", "output");
    for (size_t i = 0; i < n; ++i) StoreFloat(out, out_dtype, i, 0.0f);
    Scatter(wire, wire_bytes, n, p, out_dtype, out);
  }

  void DecodeAccumulate(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                        void* out) const override {
    CheckCodecDataType(out_dtype, "topk", "output");
    Scatter(wire, wire_bytes, n, p, out_dtype, out);
  }

 private:
  // out[index] += value for every (index, value) of the wire, after checking it is well formed.
  static void Scatter(const void* wire, size_t wire_bytes, size_t n, const CodecParams& p, DataType out_dtype,
                      void* out) {
    const auto* bytes = static_cast<const uint8_t*>(wire);
    if (wire_bytes < 4) throw InvalidArgument("topk: encoded segment of " + std::to_string(wire_bytes) + " bytes has no header");
    uint32_t count;
    std::memcpy(&count, bytes, 4);
    const size_t vsize = DataTypeSize(p.topk_value_dtype);
    if (wire_bytes != 4 + size_t{count} * (4 + vsize) || count > n) {
      throw InvalidArgument("topk: encoded segment of " + std::to_string(wire_bytes) + " bytes does not hold " +
                            std::to_string(count) + " values of a " + std::to_string(n) + "-value tensor");
    }
    const uint8_t* values = bytes + 4 + 4 * size_t{count};
    for (uint32_t j = 0; j < count; ++j) {
      uint32_t index;
      std::memcpy(&index, bytes + 4 + 4 * size_t{j}, 4);
      if (index >= n) {
        throw InvalidArgument("topk: index " + std::to_string(index) + " is outside a " + std::to_string(n) +
                              "-value tensor");
      }
      StoreFloat(out, out_dtype, index, LoadFloat(out, out_dtype, index) + LoadFloat(values, p.topk_value_dtype, j));
    }
  }
};

}  // namespace

TopKWire::TopKWire(const uint8_t* wire, DataType value_dtype)
    : wire_(wire), value_dtype_(value_dtype), value_size_(DataTypeSize(value_dtype)) {
  std::memcpy(&kept_, wire, 4);
}

uint32_t TopKWire::index(uint32_t j) const {
  uint32_t idx;
  std::memcpy(&idx, wire_ + 4 + 4 * size_t{j}, 4);
  return idx;
}

float TopKWire::value(uint32_t j) const {
  float v;
  CastBuffer(wire_ + 4 + 4 * size_t{kept_} + j * value_size_, value_dtype_, 1, &v, DataType::kFloat32, false,
             Isa::kScalar);
  return v;
}

size_t TopKTarget(size_t n, double ratio) {
  if (n == 0) return 0;
  const size_t k = static_cast<size_t>(std::ceil(static_cast<double>(n) * ratio));
  return std::min(n, std::max<size_t>(1, k));
}

size_t TopKMaxCount(size_t n, double ratio) {
  const size_t k = TopKTarget(n, ratio);
  return std::min(n, std::max(k, k * 13 / 10));
}

TopKSelection SearchTopKThreshold(size_t n, const CodecParams& p, uint64_t first_index,
                                  const std::function<std::vector<float>(size_t start, size_t stride)>& sample,
                                  const std::function<size_t(float threshold)>& count_at_least) {
  TopKSelection sel;
  const size_t k = TopKTarget(n, p.topk_ratio);
  if (k == 0) return sel;
  if (k >= n) {
    sel.exact = true;
    return sel;
  }
  const size_t lower = (k * 8 + 9) / 10, upper = TopKMaxCount(n, p.topk_ratio);
  // Strided sample from a random start, keyed like stochastic rounding.
  const size_t wanted = std::max<size_t>(1, static_cast<size_t>(std::ceil(static_cast<double>(n) * p.topk_sample_ratio)));
  const size_t stride = std::max<size_t>(1, n / wanted);
  const uint32_t key = maxmin::StreamKey(p.seed, p.step, static_cast<uint32_t>(first_index >> 32));
  const size_t start = maxmin::Mix32(key ^ static_cast<uint32_t>(first_index) ^ 0x5bd1e995u) % stride;
  std::vector<float> samples = sample(start, stride);
  const size_t sample_k = std::max<size_t>(
      1, std::min(samples.size(), static_cast<size_t>(std::ceil(static_cast<double>(samples.size()) * p.topk_ratio))));
  sel.threshold = KthLargest(samples, sample_k);
  size_t count = count_at_least(sel.threshold);
  for (; sel.adjustments < 10 && (count > upper || count < lower); ++sel.adjustments) {
    sel.threshold *= count > upper ? 1.3f : 0.7f;
    count = count_at_least(sel.threshold);
  }
  sel.exact = count > upper || count < lower;
  return sel;
}

TopKSelection SelectTopK(const void* in, DataType dtype, size_t n, const CodecParams& p, uint64_t first_index) {
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw InvalidArgument("topk: a segment of " + std::to_string(n) + " values exceeds int32 indices");
  }
  const size_t k = TopKTarget(n, p.topk_ratio);
  if (k == 0) return TopKSelection{};
  std::vector<float> importance(n);
  for (size_t i = 0; i < n; ++i) importance[i] = Importance(LoadFloat(in, dtype, i));
  TopKSelection sel = SearchTopKThreshold(
      n, p, first_index,
      [&](size_t start, size_t stride) {
        std::vector<float> samples;
        for (size_t i = start; i < n; i += stride) samples.push_back(importance[i]);
        return samples;
      },
      [&](float threshold) { return CountAtLeast(importance, threshold); });
  if (sel.exact) {
    std::vector<float> copy = importance;
    sel.threshold = KthLargest(copy, k);
    // Everything above the threshold, then values equal to it in index order until k.
    size_t above = 0;
    for (float v : importance) above += (v > sel.threshold);
    size_t ties = k - above;
    for (size_t i = 0; i < n; ++i) {
      if (importance[i] > sel.threshold || (importance[i] == sel.threshold && ties > 0 && ties--)) {
        sel.indices.push_back(static_cast<uint32_t>(i));
      }
    }
    return sel;
  }
  for (size_t i = 0; i < n; ++i) {
    if (importance[i] >= sel.threshold) sel.indices.push_back(static_cast<uint32_t>(i));
  }
  return sel;
}

const Codec& TopKCodec() {
  static const TopK codec;
  return codec;
}

}  // namespace gradcomp
