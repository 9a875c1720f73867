#include "ops/compression/spec.h"

#include <cstring>
#include <sstream>
#include <type_traits>

#include "ops/compression/codec.h"

namespace gradcomp {

namespace {

// A field the codec reads that this spec's other fields make moot: auto's critical_change
// without relaxed bits.
bool Moot(const SpecField& f, const CompressionSpec& s) {
  return s.auto_relaxed_bits == 0 && std::strcmp(f.key, "critical_change") == 0;
}

}  // namespace

uint32_t CompressionSpec::UsedFields() const {
  if (is_auto()) return MaxMinCodec().fields() | kFieldAuto;
  const Codec* c = LookupCodec(codec);
  return c != nullptr ? c->fields() : ~0u;
}

bool CompressionSpec::operator==(const CompressionSpec& o) const {
  if (codec != o.codec) return false;
  const uint32_t used = UsedFields();
  bool equal = true;
  CompressionOptions::ForEach(
      [&](const SpecField& f, const auto& mine, const auto& theirs) {
        if ((f.bit == 0 || (used & f.bit) != 0) && !Moot(f, *this) && mine != theirs) equal = false;
      },
      *this, o);
  return equal;
}

std::string CompressionSpec::Describe() const {
  // The fields the codec reads: numbers when set (momentum 0 means off), flags when on.
  const uint32_t used = UsedFields();
  std::ostringstream os, args;
  CompressionOptions::ForEach(
      [&](const SpecField& f, const auto& v) {
        if (f.bit == 0 || (used & f.bit) == 0 || Moot(f, *this)) return;
        const char* sep = args.tellp() > 0 ? ", " : "";
        if constexpr (std::is_same_v<std::decay_t<decltype(v)>, bool>) {
          if (v) args << sep << f.label;
        } else if constexpr (std::is_same_v<std::decay_t<decltype(v)>, std::string>) {
          if (!v.empty()) args << sep << f.label << "=" << v;
        } else if (v != 0) {
          args << sep << f.label << "=" << v;
        }
      },
      *this);
  os << codec;
  if (args.tellp() > 0) os << "(" << args.str() << ")";
  if (error_feedback) os << "+ef";
  return os.str();
}

}  // namespace gradcomp
