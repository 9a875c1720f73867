// Tensors enqueued by the framework threads and not yet executed, keyed by name.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/handle.h"
#include "core/message.h"

namespace gradcomp {

/// One enqueued tensor: its request, the caller's buffers and the handle to complete.
struct TensorEntry {
  Request request;
  const void* input = nullptr;
  /// allreduce / broadcast destination (may equal input); other types allocate in the handle.
  void* output = nullptr;
  std::shared_ptr<Handle> handle;
  std::chrono::steady_clock::time_point enqueued;
};

/// Thread-safe store of pending tensors. Framework threads Push; the background thread
/// takes new requests each cycle and takes entries out when it executes them.
class TensorQueue {
 public:
  /// Adds an entry; throws InvalidArgument when a tensor with the same name is pending.
  void Push(TensorEntry entry);
  /// Adds entries at once (the background thread sees all or none of them); throws, adding
  /// none, when any name is pending or repeated.
  void PushGroup(std::vector<TensorEntry> entries);
  /// Requests pushed since the previous call, in push order.
  std::vector<Request> TakeNewRequests();
  /// Removes and returns the entry of `name`; nullptr when this rank has none (joined).
  std::unique_ptr<TensorEntry> Take(const std::string& name);
  /// Number of pending entries.
  size_t size() const;
  /// Fails and removes every pending entry.
  void FailAll(const std::string& message);
  /// Blocks until a new request is pushed, Wake() is called, or `timeout` passes.
  /// Returns true when there are new requests.
  bool WaitForNew(std::chrono::duration<double> timeout);
  /// Wakes WaitForNew (shutdown, timeline changes).
  void Wake();
  /// Number of pushes so far (a monotonic counter).
  uint64_t pushes() const;
  /// Blocks until the push counter exceeds `seen` or `timeout` passes; true on a new push.
  bool WaitForPushAfter(uint64_t seen, std::chrono::duration<double> timeout);

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::unordered_map<std::string, std::unique_ptr<TensorEntry>> entries_;
  std::deque<Request> fresh_;
  bool woken_ = false;
  uint64_t pushes_ = 0;
};

}  // namespace gradcomp
