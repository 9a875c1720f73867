#include "core/stall_inspector.h"

#include <sstream>

namespace gradcomp {

void StallInspector::RecordArrival(const std::string& name, const std::string& type, int rank,
                                   Clock::time_point now) {
  auto [it, inserted] = waiting_.try_emplace(name);
  if (inserted) {
    it->second.type = type;
    it->second.since = now;
  }
  it->second.ranks.insert(rank);
}

void StallInspector::Remove(const std::string& name) { waiting_.erase(name); }

namespace {

std::string RankList(const std::set<int>& ranks, const std::vector<int>& names) {
  std::ostringstream os;
  bool first = true;
  for (int r : ranks) {
    os << (first ? "" : ", ") << RankName(names, r);
    first = false;
  }
  return os.str();
}

}  // namespace

std::string StallInspector::Describe(const std::string& name, const Waiting& w, double seconds,
                                     const std::set<int>& joined) const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  std::set<int> missing;
  for (int r = 0; r < size_; ++r) {
    if (!w.ranks.count(r) && !joined.count(r)) missing.insert(r);
  }
  os << "tensor '" << name << "' (" << w.type << ") has waited " << seconds
     << " s for other ranks: submitted by ranks [" << RankList(w.ranks, names_) << "], missing ranks ["
     << RankList(missing, names_)
     << "]. All ranks must submit the same tensors (check for rank-dependent control flow).";
  return os.str();
}

namespace {

// "allgather.noname.82.sizes" -> ("allgather", 82, ".sizes"); false for other names.
bool SplitAutoName(const std::string& name, std::string* kind, uint64_t* number, std::string* rest) {
  static const std::string kMark = ".noname.";
  const size_t at = name.find(kMark);
  if (at == std::string::npos) return false;
  size_t end = at + kMark.size();
  const size_t digits = end;
  while (end < name.size() && name[end] >= '0' && name[end] <= '9') ++end;
  if (end == digits || end - digits > 18) return false;
  *kind = name.substr(0, at);
  *number = std::stoull(name.substr(digits, end - digits));
  *rest = name.substr(end);
  return true;
}

}  // namespace

std::vector<StallInspector::Drift> StallInspector::FindNameDrift(Clock::time_point now, double min_seconds) const {
  struct Auto {
    const std::string* name;
    const Waiting* w;
    uint64_t number;
  };
  std::map<std::string, std::vector<Auto>> by_kind;  // kind + rest -> waiting tensors
  for (const auto& [name, w] : waiting_) {
    std::string kind, rest;
    uint64_t number = 0;
    if (std::chrono::duration<double>(now - w.since).count() < min_seconds) continue;
    if (SplitAutoName(name, &kind, &number, &rest)) by_kind[kind + '\n' + rest].push_back({&name, &w, number});
  }
  std::vector<Drift> drifts;
  std::set<const std::string*> used;
  for (const auto& [key, list] : by_kind) {
    for (size_t i = 0; i < list.size(); ++i) {
      for (size_t j = i + 1; j < list.size(); ++j) {
        const Auto& a = list[i].number > list[j].number ? list[i] : list[j];
        const Auto& b = list[i].number > list[j].number ? list[j] : list[i];
        if (used.count(a.name) || used.count(b.name)) continue;
        bool disjoint = true;
        for (int r : a.w->ranks) disjoint = disjoint && !b.w->ranks.count(r);
        if (!disjoint) continue;
        used.insert(a.name);
        used.insert(b.name);
        const std::string kind = key.substr(0, key.find('\n'));
        drifts.push_back({*a.name, *b.name,
                          "unnamed collectives out of step between ranks: ranks [" + RankList(a.w->ranks, names_) +
                              "] submitted '" + *a.name + "' while ranks [" + RankList(b.w->ranks, names_) +
                              "] submitted '" + *b.name + "'. Each rank numbers its unnamed " + kind +
                              " calls, and these numbers no longer match (a call failed or was skipped on some "
                              "ranks only), so neither could ever complete. Give the tensors names (name=...) or "
                              "make every rank issue the same unnamed calls."});
      }
    }
  }
  return drifts;
}

StallInspector::Report StallInspector::Check(Clock::time_point now, const std::set<int>& joined) {
  Report report;
  for (auto& [name, w] : waiting_) {
    const double waited = std::chrono::duration<double>(now - w.since).count();
    if (shutdown_seconds_ > 0 && waited >= shutdown_seconds_ && report.shutdown.empty()) {
      std::ostringstream os;
      os << "gradcomp stopped after GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS=" << shutdown_seconds_ << ": "
         << Describe(name, w, waited, joined);
      report.shutdown = os.str();
    }
    if (warn_seconds_ > 0 && waited >= warn_seconds_ && !w.warned) {
      w.warned = true;
      report.warnings.push_back(Describe(name, w, waited, joined));
    }
  }
  return report;
}

}  // namespace gradcomp
