#include "core/autotune.h"

#include <algorithm>
#include <cmath>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

// The grid with `own` in it, sorted.
std::vector<double> With(std::vector<double> grid, double own) {
  if (std::find(grid.begin(), grid.end(), own) == grid.end()) grid.push_back(own);
  std::sort(grid.begin(), grid.end());
  return grid;
}

size_t IndexOf(const std::vector<double>& grid, double v) {
  return static_cast<size_t>(std::find(grid.begin(), grid.end(), v) - grid.begin());
}

}  // namespace

Autotuner::Autotuner(const Settings& settings, spdlog::logger& log)
    : log_(log),
      window_seconds_(settings.autotune_window_seconds),
      start_fusion_mb_(settings.fusion_threshold_mb),
      start_cycle_ms_(settings.cycle_time_ms),
      fusion_grid_(With({1, 4, 16, 32, 64, 128}, settings.fusion_threshold_mb)),
      cycle_grid_(With({0.5, 1, 2.5, 5, 10}, settings.cycle_time_ms)),
      fusion_mb_(settings.fusion_threshold_mb),
      cycle_ms_(settings.cycle_time_ms) {
  fusion_ = best_fusion_ = IndexOf(fusion_grid_, settings.fusion_threshold_mb);
  cycle_ = best_cycle_ = IndexOf(cycle_grid_, settings.cycle_time_ms);
  if (!settings.autotune_log.empty()) {
    csv_.open(settings.autotune_log);
    GC_ENFORCE(csv_.good(), "GRADCOMP_AUTOTUNE_LOG: cannot write '", settings.autotune_log, "'");
    csv_ << "fusion_threshold_mb,cycle_time_ms,bytes_per_second\n";
  }
}

uint64_t Autotuner::Word(double fusion_mb, double cycle_ms) {
  const auto kb = static_cast<uint64_t>(std::llround(fusion_mb * 1024));
  const auto us = static_cast<uint64_t>(std::llround(cycle_ms * 1000));
  return (kb << 32) | (us & 0xffffffffu);
}

void Autotuner::Apply(uint64_t word) {
  fusion_mb_.store(static_cast<double>(word >> 32) / 1024);
  cycle_ms_.store(static_cast<double>(word & 0xffffffffu) / 1000);
}

uint64_t Autotuner::Advance(Clock::time_point now) {
  if (phase_ == 2) return Current();
  if (window_start_ == Clock::time_point{}) {  // the first cycle: try the first threshold
    fusion_ = 0;
    window_start_ = now;
    bytes_ = 0;
    return Current();
  }
  const double elapsed = std::chrono::duration<double>(now - window_start_).count();
  if (elapsed < window_seconds_) return Current();
  if (bytes_ == 0) {  // nothing ran: this window says nothing
    window_start_ = now;
    return Current();
  }
  if (settling_) {
    settling_ = false;
  } else {
    EndWindow(static_cast<double>(bytes_) / elapsed);
    settling_ = true;
  }
  window_start_ = now;
  bytes_ = 0;
  return Current();
}

void Autotuner::EndWindow(double score) {
  const double fusion = fusion_grid_[fusion_], cycle = cycle_grid_[cycle_];
  log_.info("autotune: fusion threshold {} MB, cycle time {} ms: {:.1f} MB/s", fusion, cycle, score / 1e6);
  if (csv_.is_open()) csv_ << fusion << "," << cycle << "," << score << std::endl;
  if (fusion == fusion_mb_start() && cycle == cycle_ms_start()) start_score_ = score;
  if (score > best_score_) {
    best_score_ = score;
    best_fusion_ = fusion_;
    best_cycle_ = cycle_;
  }
  if (phase_ == 0) {
    if (fusion_ + 1 < fusion_grid_.size()) {
      ++fusion_;
      return;
    }
    phase_ = 1;  // every cycle time at the best threshold (the settings' cycle time is scored)
    fusion_ = best_fusion_;
    next_ = 0;
  } else {
    next_ = cycle_ + 1;
  }
  const size_t start_cycle = IndexOf(cycle_grid_, cycle_ms_start());
  if (next_ == start_cycle) ++next_;
  if (next_ < cycle_grid_.size()) {
    cycle_ = next_;
    return;
  }
  phase_ = 2;
  fusion_ = best_fusion_;
  cycle_ = best_cycle_;
  done_.store(true);
  log_.info("autotune chose fusion threshold {} MB and cycle time {} ms: {:.1f} MB/s (the settings' {} MB, {} ms: "
            "{:.1f} MB/s)",
            fusion_grid_[fusion_], cycle_grid_[cycle_], best_score_ / 1e6, fusion_mb_start(), cycle_ms_start(),
            start_score_ / 1e6);
}

}  // namespace gradcomp
