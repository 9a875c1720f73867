#include "ops/collectives/pipeline.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>

#include "ops/common/cpu.h"
#include "ops/common/simulation.h"

namespace gradcomp {

Pipeline::Pipeline(bool inline_tasks) : inline_(inline_tasks) {
  if (!inline_ && !sim::kSimulated) {
    // -1 if none (descriptors exhausted): a waiter on TCP then notices a finished task at its
    // next socket event or its nap's cap (Poller, 20 ms), late but never stuck.
    wake_fd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    thread_ = std::thread([this] {
      NameThisThread("gc-pipeline");
      Loop();
    });
  }
}

Pipeline::~Pipeline() {
  if (inline_ || sim::kSimulated) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (wake_fd_ >= 0) ::close(wake_fd_);
}

size_t Pipeline::Submit(std::function<void()> task) {
  if (sim::kSimulated) {
    // Encoding and decoding: their cost is the real time they take here, or what a measured
    // profile prices the work they count at (times the simulation's codec scale), on this
    // rank's core (inline) or on the helper's.
    const double cost = sim::TaskCost(task);
    if (inline_) {
      sim::Compute(cost);
      return done_++;
    }
    sim_free_at_ = std::max(sim::Now(), sim_free_at_) + cost;
    sim_done_at_.push_back(sim_free_at_);
    return submitted_++;
  }
  if (inline_) {
    task();
    return done_++;
  }
  std::lock_guard<std::mutex> lock(mu_);
  tasks_.push_back(std::move(task));
  cv_.notify_all();
  return submitted_++;
}

bool Pipeline::Done(size_t ticket) {
  if (inline_) return true;
  if (sim::kSimulated) return sim::Now() >= sim_done_at_.at(ticket);
  std::lock_guard<std::mutex> lock(mu_);
  if (error_) std::rethrow_exception(error_);
  return done_ > ticket;
}

void Pipeline::Wait(size_t ticket) {
  if (inline_) return;
  if (sim::kSimulated) {
    sim::Sleep(sim_done_at_.at(ticket) - sim::Now());
    return;
  }
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_ > ticket || error_; });
  if (error_) std::rethrow_exception(error_);
}

void Pipeline::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
    if (tasks_.empty()) return;
    std::function<void()> task = std::move(tasks_.front());
    tasks_.pop_front();
    lock.unlock();
    try {
      task();
    } catch (...) {
      lock.lock();
      if (!error_) error_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    ++done_;
    cv_.notify_all();
    if (wake_fd_ >= 0) {
      const uint64_t one = 1;
      (void)!::write(wake_fd_, &one, sizeof one);  // only fails when the counter is full: still readable
    }
  }
}

}  // namespace gradcomp
