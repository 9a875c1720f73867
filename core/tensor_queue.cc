#include "core/tensor_queue.h"

#include <set>

#include "ops/common/enforce.h"

namespace gradcomp {

void TensorQueue::Push(TensorEntry entry) {
  std::vector<TensorEntry> one;
  one.push_back(std::move(entry));
  PushGroup(std::move(one));
}

void TensorQueue::PushGroup(std::vector<TensorEntry> group) {
  std::lock_guard<std::mutex> lock(mu_);
  std::set<std::string> names;
  for (const TensorEntry& entry : group) {
    const std::string& name = entry.request.name;
    auto it = entries_.find(name);
    if (it != entries_.end() || !names.insert(name).second) {
      const RequestType type = it != entries_.end() ? it->second->request.type : entry.request.type;
      throw InvalidArgument("a " + std::string(RequestTypeName(type)) + " of tensor '" + name +
                            "' is already pending on rank " + std::to_string(entry.request.rank) +
                            "; wait for it (synchronize) before submitting the same name again");
    }
  }
  for (TensorEntry& entry : group) {
    const std::string name = entry.request.name;
    fresh_.push_back(entry.request);
    entries_.emplace(name, std::make_unique<TensorEntry>(std::move(entry)));
    ++pushes_;
  }
  cv_.notify_one();
}

uint64_t TensorQueue::pushes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pushes_;
}

bool TensorQueue::WaitForPushAfter(uint64_t seen, std::chrono::duration<double> timeout) {
  std::unique_lock<std::mutex> lock(mu_);
  return cv_.wait_for(lock, timeout, [&] { return pushes_ > seen || woken_; }) && pushes_ > seen;
}

std::vector<Request> TensorQueue::TakeNewRequests() {
  std::lock_guard<std::mutex> lock(mu_);
  std::vector<Request> out(fresh_.begin(), fresh_.end());
  fresh_.clear();
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
  cv_.wait_for(lock, timeout, [&] { return !fresh_.empty() || woken_; });
  woken_ = false;
  return !fresh_.empty();
}

void TensorQueue::Wake() {
  std::lock_guard<std::mutex> lock(mu_);
  woken_ = true;
  cv_.notify_one();
}

}  // namespace gradcomp
