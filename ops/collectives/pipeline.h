// The task pipeline of the striped compressed allreduces: one helper thread runs encode and
// decode tasks in submission order while the calling thread drives the network.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace gradcomp {

/// Runs tasks in submission order on one helper thread, so encoding and decoding overlap with
/// the calling thread's communication. With `inline_tasks` every task runs at once on the
/// caller (small buffers: a thread costs more than it saves). Tickets number the tasks.
class Pipeline {
 public:
  explicit Pipeline(bool inline_tasks);
  ~Pipeline();
  Pipeline(const Pipeline&) = delete;
  Pipeline& operator=(const Pipeline&) = delete;

  /// Queues `task`; returns its ticket.
  size_t Submit(std::function<void()> task);
  /// True once task `ticket` has run; never blocks; rethrows the first failure of any task.
  bool Done(size_t ticket);
  /// Waits until task `ticket` has run; rethrows the first failure of any task.
  void Wait(size_t ticket);
  /// A descriptor that becomes readable when a task has finished (an eventfd the helper thread
  /// writes after each), for a caller that waits in poll() on its sockets and its tasks at once
  /// (Communicator::WaitForProgress); -1 without a helper thread. Reading it is up to the waiter.
  int wake_fd() const { return wake_fd_; }

 private:
  void Loop();

  const bool inline_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  size_t submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
  int wake_fd_ = -1;
  /// Simulation: when each task ends on the simulated clock, and when the helper is free.
  std::vector<double> sim_done_at_;
  double sim_free_at_ = 0;
};

}  // namespace gradcomp
