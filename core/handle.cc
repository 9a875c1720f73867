#include "core/handle.h"

#include <chrono>

#include "ops/common/enforce.h"

namespace gradcomp {

bool Handle::Poll() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

bool Handle::BlockUntilDone(std::unique_lock<std::mutex>& lock,
                            const std::chrono::steady_clock::time_point* deadline) const {
  const auto wait = [&] {
    if (deadline == nullptr) {
      cv_.wait(lock, [&] { return done_; });
      return true;
    }
    return cv_.wait_until(lock, *deadline, [&] { return done_; });
  };
  if (done_) return true;
  const std::shared_ptr<WaitObserver> observer = observer_.lock();
  if (observer == nullptr) return wait();
  // The observer is told without holding mu_ (it takes its own lock).
  lock.unlock();
  observer->WaitBegins();
  lock.lock();
  const bool done = wait();
  lock.unlock();
  observer->WaitEnds();
  lock.lock();
  return done;
}

void Handle::Wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  BlockUntilDone(lock, nullptr);
  if (error_.empty()) return;
  if (invalid_argument_) throw InvalidArgument(error_);
  throw Error(error_);
}

bool Handle::WaitFor(double seconds) const {
  std::unique_lock<std::mutex> lock(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(std::chrono::duration<double>(seconds));
  if (!BlockUntilDone(lock, &deadline)) return false;
  lock.unlock();
  Wait();
  return true;
}

std::string Handle::ErrorMessage() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void Handle::OnComplete(std::function<void()> fn) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) {
    lock.unlock();
    fn();
    return;
  }
  callbacks_.push_back(std::move(fn));
}

void Handle::Complete() {
  std::unique_lock<std::mutex> lock(mu_);
  Finish(lock);
}

bool Handle::MarkDone(std::vector<std::function<void()>>* callbacks) {
  std::lock_guard<std::mutex> lock(mu_);
  if (done_) return false;
  done_ = true;
  *callbacks = std::move(callbacks_);
  return true;
}

void Handle::CompleteAll(const std::vector<Handle*>& handles) {
  std::vector<std::vector<std::function<void()>>> callbacks(handles.size());
  std::vector<bool> marked(handles.size());
  for (size_t i = 0; i < handles.size(); ++i) marked[i] = handles[i]->MarkDone(&callbacks[i]);
  for (size_t i = 0; i < handles.size(); ++i) {
    if (!marked[i]) continue;
    {
      // Waiters check `done_` under the mutex: taking it orders the notify after their check.
      std::lock_guard<std::mutex> lock(handles[i]->mu_);
    }
    handles[i]->cv_.notify_all();
    for (auto& fn : callbacks[i]) fn();
  }
}

void Handle::Fail(const std::string& message, bool invalid_argument) {
  std::unique_lock<std::mutex> lock(mu_);
  if (done_) return;  // an operation fails at most once
  error_ = message.empty() ? "unknown error" : message;
  invalid_argument_ = invalid_argument;
  Finish(lock);
}

void Handle::Finish(std::unique_lock<std::mutex>& lock) {
  if (done_) return;
  done_ = true;
  std::vector<std::function<void()>> callbacks = std::move(callbacks_);
  lock.unlock();
  cv_.notify_all();
  for (auto& fn : callbacks) fn();
}

}  // namespace gradcomp
