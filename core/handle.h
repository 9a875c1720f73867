// Handle to one enqueued operation, with c10d Work's contract: Poll() never blocks, Wait()
// blocks on a condition variable (never spins) and rethrows the operation's error.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "ops/device/staging.h"

namespace gradcomp {

/// Told when a caller starts and stops blocking on an unfinished handle. A blocked caller
/// submits nothing until it wakes, so the runtime need not wait for more of its tensors
/// before negotiating (the end of a burst is known at once instead of after a quiet time).
class WaitObserver {
 public:
  virtual ~WaitObserver() = default;
  virtual void WaitBegins() = 0;
  virtual void WaitEnds() = 0;
};

/// Completion state of one operation, shared between the caller and the background thread.
class Handle {
 public:
  Handle() = default;
  /// `observer` hears of callers blocking in Wait/WaitFor (it may be gone by then).
  explicit Handle(std::weak_ptr<WaitObserver> observer) : observer_(std::move(observer)) {}

  /// True once the operation finished (successfully or not). Never blocks.
  bool Poll() const;
  /// Blocks until the operation finished; rethrows its error (InvalidArgument or Error).
  void Wait() const;
  /// Like Wait, giving up after `seconds`; returns false on time-out.
  bool WaitFor(double seconds) const;
  /// The error message, or "" (valid once Poll() is true).
  std::string ErrorMessage() const;

  /// Output the runtime allocated (allgather, alltoall, reducescatter), valid after Wait().
  const std::vector<char>& output() const { return output_; }
  /// Shape of that output.
  const std::vector<int64_t>& output_shape() const { return output_shape_; }
  /// The device whose memory holds that output instead (a device tensor's allgather, alltoall
  /// or reducescatter), or null; its bytes are device_output(), freed with the handle.
  Device* output_device() const { return output_device_; }
  const void* device_output() const { return device_output_.data(); }
  /// Bytes of the output, wherever it is.
  size_t output_size() const { return output_device_ != nullptr ? device_output_bytes_ : output_.size(); }
  /// alltoall: rows received from each rank; join: {last rank to join}.
  const std::vector<int64_t>& aux() const { return aux_; }

  /// Runs `fn` once the operation completes (at once if it already has); from the
  /// background thread otherwise. For adapters that signal a framework event.
  void OnComplete(std::function<void()> fn);

  // ---- background-thread side ------------------------------------------------------------
  std::vector<char>& mutable_output() { return output_; }
  std::vector<int64_t>& mutable_output_shape() { return output_shape_; }
  std::vector<int64_t>& mutable_aux() { return aux_; }
  /// Places the output in `device`'s memory, `bytes` long (kept until the handle goes).
  void* ReserveDeviceOutput(Device& device, size_t bytes) {
    output_device_ = &device;
    device_output_bytes_ = bytes;
    return device_output_.Reserve(device, bytes);
  }
  /// Marks success and wakes waiters.
  void Complete();
  /// Marks every handle successful before waking any waiter, so a caller waiting on them
  /// one after another wakes once instead of once per handle.
  static void CompleteAll(const std::vector<Handle*>& handles);
  /// Marks failure with `message`; `invalid_argument` selects the exception Wait() throws.
  void Fail(const std::string& message, bool invalid_argument = false);

 private:
  void Finish(std::unique_lock<std::mutex>& lock);
  /// Marks done without waking; returns the callbacks to run (nothing if already done).
  bool MarkDone(std::vector<std::function<void()>>* callbacks);

  /// Blocks on cv_ until done_ or `deadline` (nullptr: no deadline), telling the observer;
  /// `lock` holds mu_. Returns done_.
  bool BlockUntilDone(std::unique_lock<std::mutex>& lock, const std::chrono::steady_clock::time_point* deadline) const;

  std::weak_ptr<WaitObserver> observer_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool done_ = false;
  bool invalid_argument_ = false;
  std::string error_;
  std::vector<char> output_;
  std::vector<int64_t> output_shape_;
  std::vector<int64_t> aux_;
  Device* output_device_ = nullptr;
  Scratch device_output_;
  size_t device_output_bytes_ = 0;
  std::vector<std::function<void()>> callbacks_;
};

}  // namespace gradcomp
