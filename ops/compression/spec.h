// What users choose about gradient compression, declared once. CompressionOptions is the one
// list of compression fields; CodecParams (codec.h) extends it with what the runtime supplies
// per call, CompressionSpec adds the codec's name, and Settings (core/settings.h) holds the
// default spec. ForEachField visits the fields in wire order, so the negotiation encoding,
// equality, Describe and the Python dicts are all written against the list, not the names.
//
// Adding a field: declare it here, add it to ForEach (its key, its label, the CodecField bit
// codecs declare in fields()), give it a GRADCOMP_* row in core/settings.cc if it has a
// process-wide default, and document it in docs/settings.md (generated) and docs/design.md.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace gradcomp {

/// The fields a codec may read; Codec::fields() is a set of these. A field whose bit is 0
/// matters to every codec but none.
enum CodecField : uint32_t {
  kFieldBits = 1u << 0,
  kFieldBucketSize = 1u << 1,
  kFieldStochastic = 1u << 2,
  kFieldSkipIncomplete = 1u << 3,
  kFieldRatio = 1u << 4,
  kFieldMomentum = 1u << 5,
  kFieldNesterov = 1u << 6,
  kFieldAuto = 1u << 7,  ///< the adaptive policy "auto" (not a codec; core/auto_compression.h)
};

/// How one field is named: `key` in Python dicts, `label` in Describe(), `bit` in a codec's
/// fields() (0: every codec).
struct SpecField {
  const char* key;
  const char* label;
  uint32_t bit;
};

/// The compression fields users choose (defaults: CGX's).
struct CompressionOptions {
  int32_t bits = 4;                      ///< maxmin: bits per value, 1..8
  int64_t bucket_size = 512;             ///< maxmin: values per bucket (own min and unit)
  bool stochastic = false;               ///< maxmin: stochastic instead of nearest rounding
  bool skip_incomplete_buckets = false;  ///< maxmin: the last partial bucket travels as float32
  bool error_feedback = false;           ///< carry each tensor's compression error into its next step
  double topk_ratio = 0.01;              ///< topk: fraction of values kept, in (0, 1]
  double topk_momentum = 0.0;            ///< topk: DGC momentum correction when > 0
  bool topk_nesterov = false;            ///< topk: Nesterov variant of the momentum correction
  /// auto: the settings it chooses from per tensor, comma-separated (ops/compression/auto_select.h).
  std::string auto_candidates = "none,fp16,maxmin8,maxmin6,maxmin5,maxmin4,maxmin3,maxmin2,maxmin1";
  int64_t auto_interval = 25;  ///< auto: steps between two choices (error measured on the last)
  /// auto: outside critical regimes the error budget is that of maxmin at these bits (0: the
  /// reference's budget always; core/auto_compression.h).
  int32_t auto_relaxed_bits = 2;
  /// auto: a tensor is in a critical regime while its gradient norm changed by at least this
  /// fraction between two choices (Accordion's eta).
  double auto_critical_change = 0.5;
  /// auto: errors weighed per value, each tensor's over its mean square (the error of an update
  /// normalized per coordinate, as Adam's), instead of absolute (L-GreCo's, SGD's).
  bool auto_normalized = true;

  /// Calls f(SpecField, member of each of `self`...) for every field, in wire order:
  /// ForEach(f, a) visits one options, ForEach(f, a, b) two side by side.
  template <typename F, typename... Self>
  static void ForEach(F&& f, Self&... self) {
    f(SpecField{"bits", "bits", kFieldBits}, self.bits...);
    f(SpecField{"bucket_size", "bucket", kFieldBucketSize}, self.bucket_size...);
    f(SpecField{"stochastic", "stochastic", kFieldStochastic}, self.stochastic...);
    f(SpecField{"skip_incomplete_buckets", "skip_incomplete", kFieldSkipIncomplete}, self.skip_incomplete_buckets...);
    f(SpecField{"error_feedback", "ef", 0}, self.error_feedback...);
    f(SpecField{"ratio", "ratio", kFieldRatio}, self.topk_ratio...);
    f(SpecField{"momentum", "momentum", kFieldMomentum}, self.topk_momentum...);
    f(SpecField{"nesterov", "nesterov", kFieldNesterov}, self.topk_nesterov...);
    f(SpecField{"candidates", "candidates", kFieldAuto}, self.auto_candidates...);
    f(SpecField{"interval", "interval", kFieldAuto}, self.auto_interval...);
    f(SpecField{"relaxed_bits", "relaxed_bits", kFieldAuto}, self.auto_relaxed_bits...);
    f(SpecField{"critical_change", "critical_change", kFieldAuto}, self.auto_critical_change...);
    f(SpecField{"normalized", "normalized", kFieldAuto}, self.auto_normalized...);
  }
};

/// Whether `codec` names the exact codec, none (no compression).
inline bool IsExactCodec(std::string_view codec) { return codec == "none"; }

/// How a float allreduce is compressed: a codec and its options. Part of a tensor's identity
/// for validation, caching and fusion (only tensors with equal specs are fused).
struct CompressionSpec : CompressionOptions {
  /// A registered codec name (codec.h AllCodecs), or "auto": a setting chosen per tensor
  /// among auto_candidates, none of them losing more than the reference (this spec's maxmin
  /// options) in total (core/auto_compression.h).
  std::string codec = "none";

  /// ForEach with the codec's name first: the whole spec, in wire order.
  template <typename F, typename... Self>
  static void ForEachField(F&& f, Self&... self) {
    f(SpecField{"codec", "codec", 0}, self.codec...);
    CompressionOptions::ForEach(f, self...);
  }

  /// Equal codec, error feedback and every field the codec reads.
  bool operator==(const CompressionSpec& o) const;
  bool operator!=(const CompressionSpec& o) const { return !(*this == o); }
  /// "maxmin(bits=4, bucket=512)", "topk(ratio=0.01, momentum=0.9)+ef", "none", ...
  std::string Describe() const;
  /// The adaptive policy rather than one codec.
  bool is_auto() const { return codec == "auto"; }
  /// The exact codec (none): the values as they are.
  bool exact() const { return IsExactCodec(codec); }
  /// The fields the codec reads (its fields()); auto: maxmin's and its own; every bit for a
  /// name no codec has.
  uint32_t UsedFields() const;
};

}  // namespace gradcomp
