// Autotune of the fusion threshold and the cycle time (GRADCOMP_AUTOTUNE, off by default;
// Horovod's HOROVOD_AUTOTUNE idea with a simpler search).
//
// Rank 0 scores each setting by the payload bytes of the collectives executed per second of
// wall time over a window (GRADCOMP_AUTOTUNE_WINDOW_SECONDS of time in which something ran;
// a window in which nothing ran does not count). The search is coordinate descent over two
// grids that include the settings' own values: every fusion threshold at the settings' cycle
// time, then every cycle time at the best threshold; it ends on the best pair and stays there.
// Each setting is tried for one window after a settle window (the first cycles after a change
// still carry tensors fused the old way). Every window's score and the final choice are logged
// on rank 0 (and written to GRADCOMP_AUTOTUNE_LOG as CSV).
//
// The fusion threshold must be the same on every rank (each fuses its cached responses itself):
// the controller carries rank 0's choice in one word of each cycle's bitwise-AND agreement (rank
// 0 writes it, the others all ones), so every rank switches at the same cycle.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "core/settings.h"

namespace gradcomp {

class Autotuner {
 public:
  using Clock = std::chrono::steady_clock;
  Autotuner(const Settings& settings, spdlog::logger& log);

  /// Rank 0: payload bytes of a collective executed on this rank.
  void Executed(int64_t bytes) { bytes_ += bytes; }
  /// Rank 0, once per cycle: moves the search on when a window is over; returns the agreement
  /// word of the setting to use from this cycle on.
  uint64_t Advance(Clock::time_point now);
  /// Every rank: applies the agreed word.
  void Apply(uint64_t word);

  double fusion_threshold_mb() const { return fusion_mb_.load(); }
  double cycle_time_ms() const { return cycle_ms_.load(); }
  /// The search ended (on rank 0; others follow at the next cycle).
  bool done() const { return done_.load(); }

  const std::vector<double>& fusion_grid() const { return fusion_grid_; }
  const std::vector<double>& cycle_grid() const { return cycle_grid_; }

 private:
  // A setting as one word: the threshold in KB (high half) and the cycle time in microseconds.
  static uint64_t Word(double fusion_mb, double cycle_ms);
  uint64_t Current() const { return Word(fusion_grid_[fusion_], cycle_grid_[cycle_]); }
  // Ends the current window: scores the setting, picks the next one.
  void EndWindow(double seconds);

  double fusion_mb_start() const { return start_fusion_mb_; }
  double cycle_ms_start() const { return start_cycle_ms_; }

  spdlog::logger& log_;
  const double window_seconds_;
  const double start_fusion_mb_, start_cycle_ms_;  // the settings'
  std::vector<double> fusion_grid_, cycle_grid_;
  size_t fusion_ = 0, cycle_ = 0;            // rank 0: the setting being tried
  size_t best_fusion_ = 0, best_cycle_ = 0;  // rank 0: the best so far
  double best_score_ = -1, start_score_ = -1;
  int phase_ = 0;     // 0: fusion thresholds, 1: cycle times, 2: done
  bool settling_ = true;
  size_t next_ = 0;   // index in the grid of the phase of the next setting to try
  Clock::time_point window_start_{};
  int64_t bytes_ = 0;
  std::ofstream csv_;
  std::atomic<double> fusion_mb_, cycle_ms_;
  std::atomic<bool> done_{false};
};

}  // namespace gradcomp
