#include "core/handle.h"

#include <chrono>

#include "ops/common/enforce.h"

namespace gradcomp {

bool Handle::Poll() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Handle::Wait() const {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return done_; });
  if (error_.empty()) return;
  if (invalid_argument_) throw InvalidArgument(error_);
  throw Error(error_);
}

bool Handle::WaitFor(double seconds) const {
  std::unique_lock<std::mutex> lock(mu_);
  if (!cv_.wait_for(lock, std::chrono::duration<double>(seconds), [&] { return done_; })) return false;
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
