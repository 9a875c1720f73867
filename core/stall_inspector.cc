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

std::string StallInspector::Describe(const std::string& name, const Waiting& w, double seconds,
                                     const std::set<int>& joined) const {
  std::ostringstream os;
  os.setf(std::ios::fixed);
  os.precision(1);
  os << "tensor '" << name << "' (" << w.type << ") has waited " << seconds << " s for other ranks: submitted by ranks [";
  bool first = true;
  for (int r : w.ranks) {
    os << (first ? "" : ", ") << r;
    first = false;
  }
  os << "], missing ranks [";
  first = true;
  for (int r = 0; r < size_; ++r) {
    if (w.ranks.count(r) || joined.count(r)) continue;
    os << (first ? "" : ", ") << r;
    first = false;
  }
  os << "]. All ranks must submit the same tensors (check for rank-dependent control flow).";
  return os.str();
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
