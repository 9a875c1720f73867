#include "core/auto_compression.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "ops/common/enforce.h"
#include "ops/common/shape.h"

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
    for (CompressionSpec& step : AutoRelaxedLadder(auto_spec)) list.push_back(std::move(step));
    list.push_back(AutoReference(auto_spec));
    it = measured_.emplace(key, std::move(list)).first;
  }
  return it->second;
}

std::vector<AutoGroup> AutoCompression::Resolve(const Response& r, AutoTensors& tensors, Communicator& world) {
  BeforeResponse(r, world);
  if (r.compression.auto_relaxed_bits > 0) AccumulateTrends(r, tensors);
  MeasureDue(r, tensors, world.size());
  std::vector<AutoGroup> groups;
  for (size_t i = 0; i < r.names.size(); ++i) {
    AutoGroup g{SettingFor(r.names[i], r.compression), TakeFlush(r.names[i]), {}};
    auto it = std::find_if(groups.begin(), groups.end(),
                           [&](const AutoGroup& o) { return o.flush == g.flush && o.spec == g.spec; });
    if (it == groups.end()) it = groups.insert(groups.end(), std::move(g));
    it->members.push_back(i);
  }
  return groups;
}

void AutoCompression::AccumulateTrends(const Response& r, AutoTensors& tensors) {
  std::vector<float> keep;
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (!tensors.Has(i)) continue;
    const std::vector<std::pair<size_t, size_t>> ranges = TrendRanges(static_cast<size_t>(NumElements(r.shapes[i])));
    const float* sample = tensors.Values(i, ranges, &keep);
    size_t m = 0;
    for (const auto& range : ranges) m += range.second;
    Tensor& t = tensors_.at(r.names[i]);
    if (t.trend.size() != m) t.trend.assign(m, 0.0f);
    for (size_t j = 0; j < m; ++j) t.trend[j] += sample[j];
  }
}

void AutoCompression::MeasureDue(const Response& r, AutoTensors& tensors, int ranks) {
  const std::vector<CompressionSpec>& measured = Measured(r.compression);
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (!Measuring(r.names[i])) continue;
    const auto n = static_cast<size_t>(NumElements(r.shapes[i]));
    CandidateErrors errors;  // a rank that joined contributes zeros, and so no error
    errors.err2.assign(measured.size(), 0.0);
    errors.codec_seconds.assign(measured.size(), 0.0);
    if (r.compression.error_feedback) errors.err2_ef.assign(measured.size(), 0.0);
    if (tensors.Has(i)) {
      std::vector<float> keep;
      const float* x = tensors.Values(i, {{0, n}}, &keep);
      // With error feedback the step compresses the gradient plus the tensor's residual.
      const std::vector<float> residual = r.compression.error_feedback ? tensors.Residual(i) : std::vector<float>{};
      errors = MeasureCandidates(x, n, measured, ranks, kAutoSampleValues,
                                 residual.size() == n ? residual.data() : nullptr);
      if (r.compression.error_feedback && errors.err2_ef.empty()) errors.err2_ef = errors.err2;  // no residual yet
    }
    Record(r.names[i], r.compression, r.dtype, n, errors);
  }
}

void AutoCompression::BeforeResponse(const Response& r, Communicator& world) {
  if (++responses_ % (kForgetAfter / 4) == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = tensors_.begin(); it != tensors_.end();) {
      const bool stale = it->second.last_seen + kForgetAfter < responses_ && !it->second.measured;
      if (stale) report_.erase(it->first);
      it = stale ? tensors_.erase(it) : std::next(it);
    }
  }
  bool due = false;
  for (const std::string& name : r.names) {
    Tensor& t = tensors_[name];
    if (t.steps == 0 || t.auto_spec != r.compression) {
      t = Tensor{};
      t.auto_spec = r.compression;
    }
    Measured(r.compression);  // parsed (and validated) once per spec
    ++t.steps;
    t.last_seen = responses_;
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
  // Every rank's statistics must have the same layout: they are allreduced side by side.
  GC_ENFORCE(errors.err2.size() == Measured(auto_spec).size() && errors.codec_seconds.size() == errors.err2.size() &&
                 errors.err2_ef.size() == (auto_spec.error_feedback ? errors.err2.size() : 0),
             "auto compression of '", name, "': ", errors.err2.size(), " errors, ", errors.err2_ef.size(),
             " with error feedback and ", errors.codec_seconds.size(), " codec times measured for ",
             Measured(auto_spec).size(), " settings");
  t.measured = true;
  t.measured_at = t.steps;
  t.dtype = dtype;
  t.n = n;
  t.errors = errors;
}

size_t AutoCompression::Candidates(const CompressionSpec& auto_spec) {
  return Measured(auto_spec).size() - AutoRelaxedLadder(auto_spec).size() - 1;
}

std::vector<std::pair<size_t, size_t>> AutoCompression::TrendRanges(size_t n) {
  constexpr size_t kBlock = 1024;
  if (n <= kTrendValues) return {{0, n}};
  const size_t blocks = kTrendValues / kBlock, stride = (n - kBlock) / (blocks - 1);
  std::vector<std::pair<size_t, size_t>> out;
  for (size_t b = 0; b < blocks; ++b) out.emplace_back(b * stride, kBlock);
  return out;
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

void AutoCompression::ProbeLink() {
  // The least of three timings at each size: the link, not the noise of one run.
  const auto least = [&](size_t bytes) {
    double best = probe_(bytes);
    for (int i = 0; i < 2; ++i) best = std::min(best, probe_(bytes));
    return best;
  };
  constexpr size_t kOne = sizeof(float), kSmall = size_t{64} << 10, kLarge = size_t{4} << 20;
  const double one = least(kOne), small = least(kSmall), large = least(kLarge);
  std::lock_guard<std::mutex> lock(mu_);
  link_ = LinkCost::Fit(kSmall, small, kLarge, large, one);
}

LinkCost AutoCompression::link() const {
  std::lock_guard<std::mutex> lock(mu_);
  return link_;
}

void AutoCompression::Choose(Communicator& world) {
  if (probe_ && (choices_ % kProbeEvery == 0)) ProbeLink();
  const Gathered g = Gather(world);
  // Rank 0 solves one program per auto spec and broadcasts the choices (identical inputs
  // everywhere, but one decider keeps replicas identical whatever the floating point).
  const LinkCost link = this->link();
  Decision d;
  d.flags.assign(2 * g.names.size(), -1);
  d.seconds.resize(g.names.size());
  if (world.rank() == 0) {
    for (const auto& [key, members] : g.groups) Solve(key, members, g, static_cast<double>(world.size()), link, d);
  }
  world.Broadcast(d.flags.data(), d.flags.size() * sizeof(int32_t), 0);
  Apply(g, d);
  if (log_ != nullptr && world.rank() == 0) {
    std::string cost;
    if (probe_) {
      cost = " (link: " + std::to_string(link.latency * 1e6) + " us + " +
             std::to_string(link.per_byte > 0 ? 1e-9 / link.per_byte : 0.0) + " GB/s)";
    }
    log_->info("auto compression choice {} for {} tensors{}:{}", choices_made(), g.names.size(), cost, d.summary);
  }
}

AutoCompression::Gathered AutoCompression::Gather(Communicator& world) const {
  // Every measurement waiting, in name order (the same on every rank): ||x||^2, then each
  // candidate's error and the reference's, then their codec seconds, then (with error
  // feedback) their errors on the compensated gradient, then the summed gradient's norm^2,
  // summed over ranks. The choice uses the errors without the residual: a tensor's residual
  // is its current setting's, and would carry that setting's history into the comparison.
  Gathered g;
  std::vector<double> mine;
  for (const auto& [name, t] : tensors_) {
    if (!t.measured) continue;
    g.groups[Key(t.auto_spec)].push_back(g.names.size());
    g.names.push_back(name);
    g.offset.push_back(mine.size());
    mine.push_back(t.errors.norm2);
    mine.insert(mine.end(), t.errors.err2.begin(), t.errors.err2.end());
    mine.insert(mine.end(), t.errors.codec_seconds.begin(), t.errors.codec_seconds.end());
    mine.insert(mine.end(), t.errors.err2_ef.begin(), t.errors.err2_ef.end());
    double trend2 = 0;  // scaled from the sample to the tensor
    for (float v : t.trend) trend2 += static_cast<double>(v) * v;
    mine.push_back(t.trend.empty() ? 0.0 : trend2 * static_cast<double>(t.n) / static_cast<double>(t.trend.size()));
  }
  g.sums.resize(mine.size());
  world.Allreduce(mine.data(), g.sums.data(), mine.size(), DataType::kFloat64, ReduceOp::kSum);
  // How far each tensor's summed gradient's norm (the last of its statistics) moved since the
  // previous choice (-1: no previous).
  for (size_t i = 0; i < g.names.size(); ++i) {
    g.trend.push_back(std::sqrt(g.sums[(i + 1 < g.names.size() ? g.offset[i + 1] : g.sums.size()) - 1]));
    const double before = tensors_.at(g.names[i]).last_norm;
    g.change.push_back(before > 0 ? std::abs(g.trend[i] - before) / before : -1.0);
  }
  return g;
}

void AutoCompression::Solve(const std::string& key, const std::vector<size_t>& members, const Gathered& g,
                            double ranks, const LinkCost& link, Decision& d) {
  const Program p = BuildProgram(key, members, g, ranks, link, d);
  const auto& list = measured_.at(key);
  const CompressionSpec& spec = tensors_.at(g.names[members.front()]).auto_spec;
  // One program per budget (the tensors in a critical regime, then each step of the ladder):
  // a critical tensor must not spend the slack of the calmer ones' budget.
  double total_bytes = 0, total_err2 = 0, reference_bytes = 0, reference_err2 = 0;
  std::map<std::string, int> counts, budgets;
  for (int bits = list.back().bits; bits >= std::max(1, spec.auto_relaxed_bits); --bits) {
    std::vector<std::vector<double>> sub_err2, sub_bytes;
    std::vector<double> sub_budget, sub_ref_bytes;
    std::vector<size_t> at;
    for (size_t j = 0; j < members.size(); ++j) {
      if (d.flags[2 * members[j] + 1] != bits) continue;
      at.push_back(j);
      sub_err2.push_back(p.err2[j]);
      sub_bytes.push_back(p.bytes[j]);
      sub_budget.push_back(p.budget[j]);
      sub_ref_bytes.push_back(p.ref_bytes[j]);
      reference_bytes += p.ref_bytes[j];
      reference_err2 += p.ref_err2[j];
    }
    if (at.empty()) continue;
    budgets["maxmin" + std::to_string(bits)] += static_cast<int>(at.size());
    const AutoChoice chosen = ChooseCandidates(sub_err2, sub_bytes, sub_budget, sub_ref_bytes);
    total_bytes += chosen.bytes;
    total_err2 += chosen.err2;
    for (size_t k = 0; k < at.size(); ++k) {
      d.flags[2 * members[at[k]]] = static_cast<int32_t>(chosen.index[k]);
      ++counts[CandidateToken(list[chosen.index[k]])];
    }
  }
  std::ostringstream summary;
  summary << " " << key << ": " << members.size() << " tensors, "
          << (reference_bytes > 0 ? total_bytes / reference_bytes : 1.0) << "x the reference's bytes at "
          << (reference_err2 > 0 ? std::sqrt(total_err2 / reference_err2) : 1.0) << "x its error (";
  for (auto c = counts.begin(); c != counts.end(); ++c) {
    summary << (c == counts.begin() ? "" : ", ") << c->first << " x" << c->second;
  }
  summary << ")";
  if (spec.auto_relaxed_bits > 0) summary << DescribeRegimes(members, g, p.in_critical, budgets);
  if (probe_) summary << ", " << p.raw << " left uncompressed by the cost model";
  summary << ";";
  d.summary += summary.str();
}

AutoCompression::Program AutoCompression::BuildProgram(const std::string& key, const std::vector<size_t>& members,
                                                       const Gathered& g, double ranks, const LinkCost& link,
                                                       Decision& d) {
  const auto& list = measured_.at(key);
  const CompressionSpec& spec = tensors_.at(g.names[members.front()]).auto_spec;
  const size_t candidates = Candidates(spec);
  const int reference_bits = list.back().bits, relaxed_bits = spec.auto_relaxed_bits;
  Program p;
  for (size_t i : members) {
    const Tensor& t = tensors_.at(g.names[i]);
    const double* s = &g.sums[g.offset[i] + 1];
    const double* codec = s + list.size();
    p.err2.emplace_back(s, s + candidates);
    std::vector<double> b;
    for (size_t c = 0; c < list.size(); ++c) {
      b.push_back(WireBytes(list[c], t.n, t.dtype));
      if (probe_) d.seconds[i].push_back(link.Seconds(b[c], codec[c] / ranks));
    }
    p.ref_bytes.push_back(b.back());
    b.resize(candidates);
    p.bytes.push_back(std::move(b));
    p.ref_err2.push_back(s[list.size() - 1]);
    // Normalized: every error over the tensor's mean square (sum over ranks of ||x||^2 / n).
    const double norm2 = g.sums[g.offset[i]];
    const double weight = spec.auto_normalized && norm2 > 0 ? static_cast<double>(t.n) / norm2 : 1.0;
    for (double& e : p.err2.back()) e *= weight;
    p.ref_err2.back() *= weight;
    // Regimes (Accordion): critical while the norm moves by critical_change or more between
    // two choices, and until a tensor has a previous norm to compare with. A calm tensor's
    // budget steps down one bit a choice, to the relaxed setting's.
    const bool critical = relaxed_bits == 0 || g.change[i] < 0 || g.change[i] >= spec.auto_critical_change;
    const int budget_bits =
        critical ? reference_bits : std::max(relaxed_bits, (t.budget_bits > 0 ? t.budget_bits : reference_bits) - 1);
    d.flags[2 * i + 1] = budget_bits;
    p.in_critical += critical;
    p.budget.push_back(critical ? p.ref_err2.back()
                                : weight * s[candidates + static_cast<size_t>(budget_bits - relaxed_bits)]);
    if (probe_) p.raw += LeaveOutSlowerThanRaw(list, candidates, d.seconds[i], p.err2.back());
  }
  return p;
}

bool AutoCompression::LeaveOutSlowerThanRaw(const std::vector<CompressionSpec>& list, size_t candidates,
                                            const std::vector<double>& seconds, std::vector<double>& err2) {
  const auto none = std::find_if(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(candidates),
                                 [](const CompressionSpec& c) { return c.exact(); });
  if (none == list.begin() + static_cast<std::ptrdiff_t>(candidates)) return false;
  const double raw_seconds = seconds[static_cast<size_t>(none - list.begin())];
  size_t kept = 0;
  for (size_t c = 0; c < candidates; ++c) {
    if (!list[c].exact() && seconds[c] > raw_seconds) {
      err2[c] = std::numeric_limits<double>::infinity();  // left out
    } else {
      ++kept;
    }
  }
  return kept == 1;
}

std::string AutoCompression::DescribeRegimes(const std::vector<size_t>& members, const Gathered& g,
                                             size_t in_critical, const std::map<std::string, int>& budgets) {
  std::ostringstream out;
  out << ", " << in_critical << " in a critical regime, budgets (the error of) ";
  for (auto b = budgets.rbegin(); b != budgets.rend(); ++b) {
    out << (b == budgets.rbegin() ? "" : ", ") << b->first << " x" << b->second;
  }
  std::vector<double> moved;
  for (size_t i : members) {
    if (g.change[i] >= 0) moved.push_back(g.change[i]);
  }
  if (!moved.empty()) {
    std::sort(moved.begin(), moved.end());
    out << ", summed gradients' norms moved by " << moved.front() << ".." << moved.back() << " (median "
        << moved[moved.size() / 2] << ")";
  }
  return out.str();
}

void AutoCompression::Apply(const Gathered& g, const Decision& d) {
  std::lock_guard<std::mutex> lock(mu_);
  ++choices_;
  for (size_t i = 0; i < g.names.size(); ++i) {
    Tensor& t = tensors_.at(g.names[i]);
    const auto& list = measured_.at(Key(t.auto_spec));
    const int32_t chosen = d.flags[2 * i];
    const size_t candidates = Candidates(t.auto_spec);
    GC_ENFORCE(chosen >= 0 && static_cast<size_t>(chosen) < candidates, "auto compression of '", g.names[i],
               "': rank 0 chose setting ", chosen, " of ", candidates);
    const CompressionSpec& before = t.choice < 0 ? list.back() : list[static_cast<size_t>(t.choice)];
    const CompressionSpec& after = list[static_cast<size_t>(chosen)];
    t.flush = t.flush || (!before.exact() && after.exact() && t.auto_spec.error_feedback);
    t.choice = chosen;
    t.measured = false;
    t.last_norm = g.trend[i];
    t.budget_bits = d.flags[2 * i + 1];
    std::fill(t.trend.begin(), t.trend.end(), 0.0f);
    AutoTensorReport& rep = report_[g.names[i]];
    rep.setting = after.Describe();
    rep.choice = choices_;
    rep.measured_at = t.measured_at;
    rep.budget_bits = d.flags[2 * i + 1];
    rep.critical = rep.budget_bits == list.back().bits;
    rep.norm_change = g.change[i];
    const double* stats = &g.sums[g.offset[i]];  // ||x||^2, then the errors
    const double* ef = t.errors.err2_ef.empty() ? nullptr : stats + 1 + 2 * list.size();
    RecordErrors(list, candidates, stats, ef, d.seconds[i], rep);
    if (timeline_.active()) MarkChoice(g.names[i], t, CandidateToken(after), ef != nullptr, rep);
  }
}

void AutoCompression::RecordErrors(const std::vector<CompressionSpec>& list, size_t candidates, const double* stats,
                                   const double* ef, const std::vector<double>& seconds, AutoTensorReport& rep) {
  const double norm2 = stats[0];
  for (size_t c = 0; c < list.size(); ++c) {
    const std::string token = c + 1 == list.size() ? "reference"
                              : c == candidates    ? "relaxed"
                                                   : CandidateToken(list[c]);
    // A step of the ladder that is also a candidate was measured twice, alike.
    if (c > candidates && c + 1 < list.size() &&
        std::any_of(list.begin(), list.begin() + static_cast<std::ptrdiff_t>(candidates),
                    [&](const CompressionSpec& x) { return CandidateToken(x) == token; })) {
      continue;
    }
    rep.relative_error[token] = Relative(stats[1 + c], norm2);
    if (ef != nullptr) rep.relative_error_ef[token] = Relative(ef[c], norm2);
    if (c < seconds.size()) rep.estimated_seconds[token] = seconds[c];
  }
}

void AutoCompression::MarkChoice(const std::string& name, const Tensor& t, const std::string& token, bool with_ef,
                                 AutoTensorReport& rep) {
  timeline_.Instant(name, "AUTO_CHOICE",
                    "\"setting\": \"" + JsonEscape(rep.setting) + "\", \"relative_error\": " +
                        std::to_string(rep.relative_error[token]) +
                        ", \"reference_error\": " + std::to_string(rep.relative_error["reference"]) +
                        (t.auto_spec.auto_relaxed_bits > 0
                             ? ", \"critical\": " + std::string(rep.critical ? "true" : "false") +
                                   ", \"budget_bits\": " + std::to_string(rep.budget_bits) +
                                   ", \"norm_change\": " + std::to_string(rep.norm_change)
                             : std::string()) +
                        (with_ef ? ", \"relative_error_ef\": " + std::to_string(rep.relative_error_ef[token])
                                 : std::string()));
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
