#include "core/tensor_queue.h"

#include <algorithm>
#include <cstdint>
#include <set>

#include "ops/common/enforce.h"

namespace gradcomp {

void TensorQueue::ThrowPending(const Request& request, RequestType pending_type) const {
  const std::string type = RequestTypeName(pending_type);
  throw InvalidArgument((type.find_first_of("aeiou") == 0 ? "an " : "a ") + type + " of tensor '" + request.name +
                        "' is already pending on rank " + std::to_string(request.rank) +
                        "; wait for it (synchronize) before submitting the same name again");
}

void TensorQueue::Add(Request request, TensorEntry entry) {
  entry.type = request.type;
  entries_.emplace(request.name, std::make_unique<TensorEntry>(std::move(entry)));
  fresh_bytes_ = request.type != RequestType::kAllreduce
                     ? INT64_MAX
                     : std::min<int64_t>(INT64_MAX / 2, fresh_bytes_) +
                           request.NumElements() * static_cast<int64_t>(DataTypeSize(request.dtype));
  fresh_.push_back(std::move(request));
  ++pushes_;
}

void TensorQueue::Push(Request request, TensorEntry entry) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(request.name);
  if (it != entries_.end()) ThrowPending(request, it->second->type);
  Add(std::move(request), std::move(entry));
  if (consumer_waiting_for_new_ && FreshEnough()) cv_.notify_one();
}

void TensorQueue::PushGroup(std::vector<Request> requests, std::vector<TensorEntry> entries) {
  GC_ENFORCE(requests.size() == entries.size(), "PushGroup needs one entry per request");
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> names;
  for (const Request& request : requests) {
    auto it = entries_.find(request.name);
    if (it != entries_.end()) ThrowPending(request, it->second->type);
    if (!names.insert(request.name).second) ThrowPending(request, request.type);
  }
  for (size_t i = 0; i < requests.size(); ++i) Add(std::move(requests[i]), std::move(entries[i]));
  if (consumer_waiting_for_new_ && FreshEnough()) cv_.notify_one();
}

void TensorQueue::WaitForBurstEnd(std::chrono::duration<double> quiet, std::chrono::duration<double> longest) {
  using Clock = std::chrono::steady_clock;
  const Clock::time_point deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(longest);
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t seen = pushes_;
  while (blocked_callers_ == 0 && !woken_) {
    const Clock::time_point now = Clock::now();
    if (now >= deadline) return;
    consumer_gathering_ = true;
    const auto until = std::min(deadline, now + std::chrono::duration_cast<Clock::duration>(quiet));
    cv_.wait_until(lock, until, [&] { return blocked_callers_ > 0 || woken_; });
    consumer_gathering_ = false;
    if (pushes_ == seen) return;  // quiet for `quiet`
    seen = pushes_;
  }
}

void TensorQueue::WaitBegins() {
  std::lock_guard<std::mutex> lock(mu_);
  ++blocked_callers_;
  if (wake_bytes_ > 0 && consumer_waiting_for_new_) {
    woken_ = true;
    cv_.notify_one();
  } else if (consumer_gathering_) {
    cv_.notify_one();
  }
}

bool TensorQueue::CallerWaiting() const {
  std::lock_guard<std::mutex> lock(mu_);
  return blocked_callers_ > 0;
}

void TensorQueue::WaitForBatch(int64_t missing_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  wake_bytes_ = missing_bytes;
}

void TensorQueue::WaitEnds() {
  std::lock_guard<std::mutex> lock(mu_);
  --blocked_callers_;
}

std::vector<Request> TensorQueue::TakeNewRequests() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request> out;
  out.swap(fresh_);
  fresh_bytes_ = 0;
  return out;
}

std::unique_ptr<TensorEntry> TensorQueue::Take(const std::string& name) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = entries_.find(name);
  if (it == entries_.end()) return nullptr;
  std::unique_ptr<TensorEntry> entry = std::move(it->second);
  entries_.erase(it);
  return entry;
}

size_t TensorQueue::size() const {
  std::lock_guard<std::mutex> lock(mu_);
  return entries_.size();
}

void TensorQueue::FailAll(const std::string& message) {
  std::unordered_map<std::string, std::unique_ptr<TensorEntry>> entries;
  {
    std::lock_guard<std::mutex> lock(mu_);
    entries.swap(entries_);
    fresh_.clear();
  }
  for (auto& kv : entries) kv.second->handle->Fail(message);
}

bool TensorQueue::WaitForNew(std::chrono::duration<double> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  consumer_waiting_for_new_ = true;
  cv_.wait_for(lock, timeout, [&] { return FreshEnough() || woken_; });
  consumer_waiting_for_new_ = false;
  woken_ = false;
  return !fresh_.empty();
}

void TensorQueue::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  cv_.notify_one();
}

}  // namespace gradcomp
