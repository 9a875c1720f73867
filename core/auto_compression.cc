#include "core/auto_compression.h"

#include <cmath>
#include <sstream>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

std::string Key(const CompressionSpec& auto_spec) { return auto_spec.Describe(); }

uint64_t Interval(const CompressionSpec& auto_spec) {
  return static_cast<uint64_t>(std::max<int64_t>(1, auto_spec.auto_interval));
}

double Relative(double err2, double norm2) { return norm2 > 0 ? std::sqrt(err2 / norm2) : 0.0; }

}  // namespace

const std::vector<CompressionSpec>& AutoCompression::Measured(const CompressionSpec& auto_spec) {
  const std::string key = Key(auto_spec);
  auto it = measured_.find(key);
  if (it == measured_.end()) {
    std::vector<CompressionSpec> list = AutoCandidates(auto_spec);
    list.push_back(AutoReference(auto_spec));
    it = measured_.emplace(key, std::move(list)).first;
  }
  return it->second;
}

void AutoCompression::BeforeResponse(const Response& r, Communicator& world) {
  bool due = false;
  for (const std::string& name : r.names) {
    Tensor& t = tensors_[name];
    if (t.steps == 0 || t.auto_spec != r.compression) {
      t = Tensor{};
      t.auto_spec = r.compression;
    }
    Measured(r.compression);  // parsed (and validated) once per spec
    ++t.steps;
    const uint64_t k = Interval(t.auto_spec);
    due = due || (t.steps > 1 && (t.steps - 1) % k == 0);
  }
  if (!due) return;
  for (const auto& kv : tensors_) {
    if (kv.second.measured) return Choose(world);
  }
}

bool AutoCompression::Measuring(const std::string& name) const {
  auto it = tensors_.find(name);
  return it != tensors_.end() && it->second.steps % Interval(it->second.auto_spec) == 0;
}

void AutoCompression::Record(const std::string& name, const CompressionSpec& auto_spec, DataType dtype, size_t n,
                             const CandidateErrors& errors) {
  Tensor& t = tensors_.at(name);
  GC_ENFORCE(errors.err2.size() == Measured(auto_spec).size(), "auto compression of '", name, "': ",
             errors.err2.size(), " errors measured for ", Measured(auto_spec).size(), " settings");
  t.measured = true;
  t.measured_at = t.steps;
  t.dtype = dtype;
  t.n = n;
  t.errors = errors;
}

CompressionSpec AutoCompression::SettingFor(const std::string& name, const CompressionSpec& auto_spec) const {
  auto it = tensors_.find(name);
  const auto& list = measured_.at(Key(auto_spec));
  if (it == tensors_.end() || it->second.choice < 0) return list.back();
  return list[static_cast<size_t>(it->second.choice)];
}

bool AutoCompression::TakeFlush(const std::string& name) {
  auto it = tensors_.find(name);
  if (it == tensors_.end() || !it->second.flush) return false;
  it->second.flush = false;
  return true;
}

void AutoCompression::Choose(Communicator& world) {
  // Every measurement waiting, in name order (the same on every rank): ||x||^2, then each
  // candidate's error and the reference's, summed over ranks.
  std::vector<std::string> names;
  std::vector<double> mine;
  for (const auto& [name, t] : tensors_) {
    if (!t.measured) continue;
    names.push_back(name);
    mine.push_back(t.errors.norm2);
    mine.insert(mine.end(), t.errors.err2.begin(), t.errors.err2.end());
  }
  std::vector<double> sums(mine.size());
  world.Allreduce(mine.data(), sums.data(), mine.size(), DataType::kFloat64, ReduceOp::kSum);

  // Rank 0 solves one program per auto spec and broadcasts the choices (identical inputs
  // everywhere, but one decider keeps replicas identical whatever the floating point).
  std::vector<int32_t> choice(names.size(), -1);
  std::map<std::string, std::vector<size_t>> groups;  // auto spec -> positions in names
  std::vector<size_t> offset(names.size());
  for (size_t i = 0, at = 0; i < names.size(); ++i) {
    offset[i] = at;
    const Tensor& t = tensors_.at(names[i]);
    at += 1 + t.errors.err2.size();
    groups[Key(t.auto_spec)].push_back(i);
  }
  std::ostringstream summary;
  if (world.rank() == 0) {
    for (const auto& [key, members] : groups) {
      const auto& list = measured_.at(key);
      const size_t candidates = list.size() - 1;
      std::vector<std::vector<double>> err2, bytes;
      std::vector<double> ref_err2, ref_bytes;
      for (size_t i : members) {
        const Tensor& t = tensors_.at(names[i]);
        const double* s = &sums[offset[i] + 1];
        err2.emplace_back(s, s + candidates);
        std::vector<double> b;
        for (size_t c = 0; c < candidates; ++c) b.push_back(WireBytes(list[c], t.n, t.dtype));
        bytes.push_back(std::move(b));
        ref_err2.push_back(s[candidates]);
        ref_bytes.push_back(WireBytes(list.back(), t.n, t.dtype));
      }
      const AutoChoice chosen = ChooseCandidates(err2, bytes, ref_err2, ref_bytes);
      std::map<std::string, int> counts;
      for (size_t j = 0; j < members.size(); ++j) {
        choice[members[j]] = static_cast<int32_t>(chosen.index[j]);
        ++counts[CandidateToken(list[chosen.index[j]])];
      }
      summary << " " << key << ": " << members.size() << " tensors, "
              << (chosen.ref_bytes > 0 ? chosen.bytes / chosen.ref_bytes : 1.0) << "x the reference's bytes at "
              << (chosen.ref_err2 > 0 ? std::sqrt(chosen.err2 / chosen.ref_err2) : 1.0) << "x its error (";
      for (auto c = counts.begin(); c != counts.end(); ++c) {
        summary << (c == counts.begin() ? "" : ", ") << c->first << " x" << c->second;
      }
      summary << ");";
    }
  }
  world.Broadcast(choice.data(), choice.size() * sizeof(int32_t), 0);

  std::lock_guard<std::mutex> lock(mu_);
  ++choices_;
  for (size_t i = 0; i < names.size(); ++i) {
    Tensor& t = tensors_.at(names[i]);
    const auto& list = measured_.at(Key(t.auto_spec));
    GC_ENFORCE(choice[i] >= 0 && static_cast<size_t>(choice[i]) + 1 < list.size(), "auto compression of '",
               names[i], "': rank 0 chose setting ", choice[i], " of ", list.size() - 1);
    const CompressionSpec& before = t.choice < 0 ? list.back() : list[static_cast<size_t>(t.choice)];
    const CompressionSpec& after = list[static_cast<size_t>(choice[i])];
    t.flush = t.flush || (before.codec != "none" && after.codec == "none" && t.auto_spec.error_feedback);
    t.choice = choice[i];
    t.measured = false;
    AutoTensorReport& rep = report_[names[i]];
    rep.setting = after.Describe();
    rep.choice = choices_;
    rep.measured_at = t.measured_at;
    const double norm2 = sums[offset[i]];
    for (size_t c = 0; c < list.size(); ++c) {
      const std::string token = c + 1 == list.size() ? "reference" : CandidateToken(list[c]);
      rep.relative_error[token] = Relative(sums[offset[i] + 1 + c], norm2);
    }
    if (timeline_.active()) {
      timeline_.Instant(names[i], "AUTO_CHOICE",
                        "\"setting\": \"" + JsonEscape(rep.setting) + "\", \"relative_error\": " +
                            std::to_string(rep.relative_error[CandidateToken(after)]) +
                            ", \"reference_error\": " + std::to_string(rep.relative_error["reference"]));
    }
  }
  if (log_ != nullptr && world.rank() == 0) {
    log_->info("auto compression chose settings for {} tensors at their step {}:{}", names.size(),
               tensors_.at(names[0]).steps, summary.str());
  }
}

std::map<std::string, AutoTensorReport> AutoCompression::Report() const {
  std::lock_guard<std::mutex> lock(mu_);
  auto out = report_;
  return out;
}

uint64_t AutoCompression::choices_made() const {
  std::lock_guard<std::mutex> lock(mu_);
  return choices_;
}

}  // namespace gradcomp
