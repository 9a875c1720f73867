#include "core/watchdog.h"

#include <utility>

#include "ops/common/cpu.h"

namespace gradcomp {

Watchdog::Watchdog(double timeout_seconds, std::function<void(Expired)> on_expired)
    : timeout_(timeout_seconds), on_expired_(std::move(on_expired)) {
  if (timeout_ > 0) {
    thread_ = std::thread([this] {
      NameThisThread("gc-watchdog");
      Loop();
    });
  }
}

Watchdog::~Watchdog() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void Watchdog::Begin(std::string what, std::vector<std::shared_ptr<Handle>> handles) {
  if (timeout_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  active_ = true;
  what_ = std::move(what);
  handles_ = std::move(handles);
  since_ = std::chrono::steady_clock::now();
  // No notify: a step begins every cycle, and the watchdog wakes by itself at least once per
  // timeout, then sleeps until the running step's deadline (steps only move it later).
}

void Watchdog::End() {
  if (timeout_ <= 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  active_ = false;
  handles_.clear();
}

bool Watchdog::expired() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expired_;
}

void Watchdog::Loop() {
  using namespace std::chrono;
  const auto timeout = duration_cast<steady_clock::duration>(duration<double>(timeout_));
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    const auto now = steady_clock::now();
    if (!active_ || now < since_ + timeout) {
      // A step that begins while this sleeps has run less than a timeout at the wake-up,
      // which then sleeps until that step's deadline: detection is exact.
      cv_.wait_until(lock, active_ ? since_ + timeout : now + timeout);
      continue;
    }
    expired_ = true;
    Expired e{what_, duration<double>(steady_clock::now() - since_).count(), handles_};
    lock.unlock();
    on_expired_(std::move(e));
    return;
  }
}

}  // namespace gradcomp
