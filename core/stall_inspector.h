// Finds tensors that some ranks submitted and others did not: warns after the check time,
// naming the missing ranks, and asks for a shutdown after the shutdown time. Runs on the
// coordinator (rank 0), which sees every rank's requests.
#pragma once

#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace gradcomp {

/// How messages name rank `r` of a runtime's world: its rank in MPI's world when `names` maps
/// them (a process set's runtime), else `r`.
inline int RankName(const std::vector<int>& names, int r) {
  return r >= 0 && static_cast<size_t>(r) < names.size() ? names[static_cast<size_t>(r)] : r;
}

class StallInspector {
 public:
  using Clock = std::chrono::steady_clock;

  /// 0 disables the warning or the shutdown.
  StallInspector(double warn_seconds, double shutdown_seconds, int size)
      : warn_seconds_(warn_seconds), shutdown_seconds_(shutdown_seconds), size_(size) {}

  /// Messages name rank r as names[r] (a process set's ranks in MPI's world; empty: r).
  void SetRankNames(std::vector<int> names) { names_ = std::move(names); }

  /// Rank `rank` submitted `name` (of collective `type`).
  void RecordArrival(const std::string& name, const std::string& type, int rank, Clock::time_point now);
  /// `name` was answered (ready on all ranks, or failed).
  void Remove(const std::string& name);

  struct Report {
    std::vector<std::string> warnings;  ///< one per newly stalled tensor
    std::string shutdown;               ///< non-empty: stop every rank with this message
  };
  /// Checks every waiting tensor; `joined` ranks count as present.
  Report Check(Clock::time_point now, const std::set<int>& joined);

  /// Two waiting tensors that show the ranks' counters of unnamed collectives out of step.
  struct Drift {
    std::string ahead, behind;  ///< "<kind>.noname.<n>..." with the larger and the smaller n
    std::string message;
  };
  /// Pairs of tensors named "<kind>.noname.<n><rest>" (the adapters' automatic names) with
  /// the same kind and rest but different numbers, submitted by disjoint sets of ranks, both
  /// waiting at least `min_seconds`. The ranks at the larger number have passed the smaller
  /// one without submitting it, and it cannot have completed without them: their counters
  /// drifted (a call failed or was skipped on some ranks only), and both would wait forever.
  /// The wait rules out a momentary reordering between threads of one process.
  std::vector<Drift> FindNameDrift(Clock::time_point now, double min_seconds) const;

 private:
  struct Waiting {
    std::string type;
    std::set<int> ranks;
    Clock::time_point since;
    bool warned = false;
  };
  std::string Describe(const std::string& name, const Waiting& w, double seconds, const std::set<int>& joined) const;

  double warn_seconds_;
  double shutdown_seconds_;
  int size_;
  std::vector<int> names_;
  std::map<std::string, Waiting> waiting_;
};

}  // namespace gradcomp
