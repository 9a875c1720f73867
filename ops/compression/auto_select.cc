#include "ops/compression/auto_select.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <set>
#include <sstream>

#include "ops/common/enforce.h"
#include "ops/compression/codec.h"

namespace gradcomp {

namespace {

// "topk0.01" -> 0.01; false unless the whole rest is a number.
bool ParseNumber(const std::string& s, double* out) {
  if (s.empty()) return false;
  char* end = nullptr;
  *out = std::strtod(s.c_str(), &end);
  return *end == '\0' && std::isfinite(*out);
}

}  // namespace

std::vector<CompressionSpec> AutoCandidates(const CompressionSpec& auto_spec, const std::string& what) {
  std::vector<CompressionSpec> out;
  std::set<std::string> seen;
  std::stringstream list(auto_spec.auto_candidates);
  const std::string expected = "expected a comma-separated list of none, fp16, bf16, maxminB (B in 1..8), topkR (R in (0, 1])";
  for (std::string raw; std::getline(list, raw, ',');) {
    std::string token;
    for (char ch : raw) {
      if (ch != ' ' && ch != '\t') token += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    }
    if (token.empty()) continue;
    CompressionSpec c;
    static_cast<CompressionOptions&>(c) = auto_spec;
    c.topk_momentum = 0;
    c.topk_nesterov = false;
    double x = 0;
    if (token == "none" || token == "fp16" || token == "bf16") {
      c.codec = token;
    } else if (token.rfind("maxmin", 0) == 0 && ParseNumber(token.substr(6), &x) && x == std::floor(x) && x >= 1 &&
               x <= 8) {
      c.codec = "maxmin";
      c.bits = static_cast<int32_t>(x);
    } else if (token.rfind("topk", 0) == 0 && ParseNumber(token.substr(4), &x) && x > 0 && x <= 1) {
      c.codec = "topk";
      c.topk_ratio = x;
    } else {
      throw InvalidArgument(what + ": '" + raw + "' is not a candidate; " + expected + " (got '" +
                            auto_spec.auto_candidates + "')");
    }
    if (seen.insert(CandidateToken(c)).second) out.push_back(c);
  }
  if (out.empty()) {
    throw InvalidArgument(what + " is empty; " + expected + " (got '" + auto_spec.auto_candidates + "')");
  }
  return out;
}

void ValidateSpec(const CompressionSpec& spec, const std::string& what) {
  if (spec.is_auto()) {
    if (spec.auto_interval < 1) {
      throw InvalidArgument(what + ": interval must be at least 1 step, got " + std::to_string(spec.auto_interval));
    }
    if (spec.auto_relaxed_bits != 0 && !(spec.auto_relaxed_bits >= 1 && spec.auto_relaxed_bits < spec.bits)) {
      throw InvalidArgument(what + ": relaxed_bits must be 0 (off) or from 1 to fewer than the reference's " +
                            std::to_string(spec.bits) + " bits, got " + std::to_string(spec.auto_relaxed_bits));
    }
    if (!(spec.auto_critical_change > 0 && std::isfinite(spec.auto_critical_change))) {
      throw InvalidArgument(what + ": critical_change must be a positive fraction, got " +
                            std::to_string(spec.auto_critical_change));
    }
    for (const CompressionSpec& c : AutoCandidates(spec, what + ": candidates")) ValidateSpec(c, what);
    return ValidateSpec(AutoReference(spec), what + ": the reference");
  }
  const Codec& codec = FindCodec(spec.codec);
  try {
    codec.Validate(ParamsOf(spec));
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(what + ": " + e.what());
  }
  if (!(spec.topk_momentum >= 0 && spec.topk_momentum < 1)) {
    throw InvalidArgument(what + ": momentum must be in [0, 1), got " + std::to_string(spec.topk_momentum));
  }
}

CompressionSpec AutoReference(const CompressionSpec& auto_spec) {
  CompressionSpec ref;
  static_cast<CompressionOptions&>(ref) = auto_spec;
  ref.codec = "maxmin";
  return ref;
}

std::vector<CompressionSpec> AutoRelaxedLadder(const CompressionSpec& auto_spec) {
  std::vector<CompressionSpec> ladder;
  const CompressionSpec reference = AutoReference(auto_spec);
  for (int bits = auto_spec.auto_relaxed_bits; bits > 0 && bits < reference.bits; ++bits) {
    ladder.push_back(reference);
    ladder.back().bits = bits;
  }
  return ladder;
}

std::string CandidateToken(const CompressionSpec& spec) {
  if (spec.codec == "maxmin") return "maxmin" + std::to_string(spec.bits);
  if (spec.codec == "topk") {
    std::ostringstream os;
    os << "topk" << spec.topk_ratio;
    return os.str();
  }
  return spec.codec;
}

CandidateErrors MeasureCandidates(const float* x, size_t n, const std::vector<CompressionSpec>& candidates,
                                  int ranks, size_t sample_values, const float* residual) {
  CandidateErrors out;
  out.err2.assign(candidates.size(), 0.0);
  out.codec_seconds.assign(candidates.size(), 0.0);
  if (residual != nullptr) out.err2_ef.assign(candidates.size(), 0.0);
  if (n == 0 || candidates.empty()) return out;
  // The sample: whole buckets (every candidate's buckets start where the tensor's do).
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(1, candidates[0].bucket_size));
  const size_t block = (1024 + bucket - 1) / bucket * bucket;
  const size_t blocks = std::max<size_t>(2, sample_values / block);
  size_t stride = 0;  // 0: the whole tensor
  if (blocks * block < n) {
    const size_t s = (n - block) / (blocks - 1) / bucket * bucket;
    if (s >= block) stride = s;
  }
  const size_t m = stride > 0 ? blocks * block : n;
  // The sampled values of x (plus the residual's, with `add`).
  const auto draw = [&](const float* add, std::vector<float>* into) -> const float* {
    if (stride == 0 && add == nullptr) return x;
    into->resize(m);
    for (size_t b = 0, at = 0; at < m; ++b, at += block) {
      const size_t from = stride > 0 ? b * stride : at, len = std::min(block, m - at);
      for (size_t i = 0; i < len; ++i) (*into)[at + i] = x[from + i] + (add != nullptr ? add[from + i] : 0.0f);
    }
    return into->data();
  };
  std::vector<float> sample, compensated;
  const float* values = draw(nullptr, &sample);
  const double scale = static_cast<double>(n) / static_cast<double>(m);
  double norm2 = 0;
  for (size_t i = 0; i < m; ++i) norm2 += static_cast<double>(values[i]) * values[i];
  out.norm2 = norm2 * scale;
  // The stand-ins for the other ranks: rotations of the sample by whole buckets.
  const size_t copies = static_cast<size_t>(std::clamp(ranks, 1, 4));
  const size_t shift = m / copies / bucket * bucket;
  std::vector<char> wire;
  std::vector<float> decoded(m), rotated(m), sum(m);
  // Encodes and decodes `in` (adding the seconds that took to *seconds), returns the error.
  const auto squared_error = [&](const Codec& codec, const CodecParams& p, const float* in, double* seconds) {
    wire.resize(codec.MaxWireSize(m, p));
    const auto start = std::chrono::steady_clock::now();
    const size_t bytes = codec.Encode(in, DataType::kFloat32, m, p, 0, wire.data());
    codec.Decode(wire.data(), bytes, m, p, DataType::kFloat32, decoded.data());
    if (seconds != nullptr) *seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    double e = 0;
    for (size_t i = 0; i < m; ++i) {
      const double d = static_cast<double>(decoded[i]) - in[i];
      e += d * d;
    }
    return e;
  };
  // Every candidate's error on `in` (m values) into err2, timed into codec_seconds if given.
  const auto measure = [&](const float* in, std::vector<double>& err2, std::vector<double>* codec_seconds) {
    for (size_t c = 0; c < candidates.size(); ++c) {
      if (candidates[c].codec == "none") continue;  // exact
      const Codec& codec = FindCodec(candidates[c].codec);
      const CodecParams p = ParamsOf(candidates[c]);
      double seconds = 0;
      double e = squared_error(codec, p, in, &seconds);
      if (codec_seconds != nullptr) (*codec_seconds)[c] = seconds * scale;
      if (copies > 1 && shift > 0 && !codec.sparse()) {
        std::copy(decoded.begin(), decoded.end(), sum.begin());
        for (size_t k = 1; k < copies; ++k) {
          std::rotate_copy(in, in + k * shift, in + m, rotated.begin());
          squared_error(codec, p, rotated.data(), nullptr);
          for (size_t i = 0; i < m; ++i) sum[i] += decoded[i];
        }
        e += squared_error(codec, p, sum.data(), nullptr) / static_cast<double>(copies);
      }
      err2[c] = e * scale;
    }
  };
  measure(values, out.err2, &out.codec_seconds);
  if (residual != nullptr) measure(draw(residual, &compensated), out.err2_ef, nullptr);
  return out;
}

LinkCost LinkCost::Fit(double small_bytes, double small_seconds, double large_bytes, double large_seconds,
                       double least_latency) {
  LinkCost c;
  if (large_bytes > small_bytes) c.per_byte = std::max(0.0, (large_seconds - small_seconds) / (large_bytes - small_bytes));
  c.latency = std::max({0.0, least_latency, small_seconds - small_bytes * c.per_byte});
  return c;
}

double WireBytes(const CompressionSpec& spec, size_t n, DataType dtype) {
  if (spec.codec == "none") return static_cast<double>(n) * static_cast<double>(DataTypeSize(dtype));
  return static_cast<double>(FindCodec(spec.codec).MaxWireSize(n, ParamsOf(spec)));
}

AutoChoice ChooseCandidates(const std::vector<std::vector<double>>& err2, const std::vector<std::vector<double>>& bytes,
                            const std::vector<double>& ref_err2, const std::vector<double>& ref_bytes, size_t levels) {
  const size_t tensors = err2.size();
  GC_ENFORCE(bytes.size() == tensors && ref_err2.size() == tensors && ref_bytes.size() == tensors,
             "ChooseCandidates: ", tensors, " tensors' errors but ", bytes.size(), " sizes, ", ref_err2.size(),
             " reference errors and ", ref_bytes.size(), " reference sizes");
  AutoChoice out;
  out.index.assign(tensors, 0);
  for (size_t t = 0; t < tensors; ++t) {
    GC_ENFORCE(!err2[t].empty() && err2[t].size() == bytes[t].size(), "ChooseCandidates: tensor ", t, " has ",
               err2[t].size(), " errors and ", bytes[t].size(), " sizes");
    out.ref_err2 += ref_err2[t];
    out.ref_bytes += ref_bytes[t];
  }
  if (levels == 0) levels = std::max<size_t>(1000, 100 * tensors);
  const double budget = out.ref_err2;
  // Steps of error a candidate costs; a candidate of no error costs none. With no budget
  // (every reference error 0), only error-free candidates fit.
  const double step = budget > 0 ? budget / static_cast<double>(levels) : 0;
  const auto cost = [&](double e) -> size_t {
    if (!(e > 0)) return 0;
    if (step == 0) return std::numeric_limits<size_t>::max();
    const double s = std::ceil(e / step);
    return s > static_cast<double>(levels) * 4 ? std::numeric_limits<size_t>::max() : static_cast<size_t>(s);
  };
  size_t limit = 0;  // the reference's own discretized total: it stays feasible
  for (size_t t = 0; t < tensors; ++t) {
    const size_t c = cost(ref_err2[t]);
    limit += c == std::numeric_limits<size_t>::max() ? 0 : c;
  }
  limit = std::min(limit, levels * 2);
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[b]: least bytes of the tensors so far using at most b steps; pick[t][b] the choice.
  std::vector<double> best(limit + 1, 0.0), next(limit + 1);
  std::vector<std::vector<uint16_t>> pick(tensors, std::vector<uint16_t>(limit + 1, 0));
  for (size_t t = 0; t < tensors; ++t) {
    std::fill(next.begin(), next.end(), kInf);
    for (size_t c = 0; c < err2[t].size(); ++c) {
      const size_t w = cost(err2[t][c]);
      if (w > limit) continue;
      for (size_t b = w; b <= limit; ++b) {
        const double v = best[b - w] + bytes[t][c];
        if (v < next[b]) {
          next[b] = v;
          pick[t][b] = static_cast<uint16_t>(c);
        }
      }
    }
    best.swap(next);
  }
  if (!(best[limit] < kInf)) {
    // Nothing fits (no candidate as good as the reference somewhere): each tensor's least error.
    for (size_t t = 0; t < tensors; ++t) {
      out.index[t] = static_cast<size_t>(std::min_element(err2[t].begin(), err2[t].end()) - err2[t].begin());
    }
  } else {
    size_t b = limit;
    for (size_t t = tensors; t-- > 0;) {
      out.index[t] = pick[t][b];
      b -= cost(err2[t][out.index[t]]);
    }
  }
  for (size_t t = 0; t < tensors; ++t) {
    out.bytes += bytes[t][out.index[t]];
    out.err2 += err2[t][out.index[t]];
  }
  return out;
}

}  // namespace gradcomp
