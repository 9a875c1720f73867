// Tensors enqueued by the framework threads and not yet executed, keyed by name.
#pragma once

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/handle.h"
#include "core/message.h"
#include "ops/device/device.h"

namespace gradcomp {

/// One enqueued tensor: the caller's buffers and the handle to complete (its request goes to
/// the background thread's negotiation).
struct TensorEntry {
  RequestType type = RequestType::kAllreduce;  // for error messages
  const void* input = nullptr;
  /// allreduce / broadcast destination (may equal input); allgather / reducescatter: the
  /// caller's host buffer for the result (output_bytes long), or null: the handle allocates it.
  void* output = nullptr;
  size_t output_bytes = 0;
  /// The device input and output live on (null: the host; allreduce and broadcast only).
  Device* device = nullptr;
  /// Recorded on the framework's stream at enqueue: the input is ready once it is reached.
  std::shared_ptr<Event> ready;
  std::shared_ptr<Handle> handle;
};

/// Thread-safe store of pending tensors. Framework threads Push; the background thread
/// takes new requests each cycle and takes entries out when it executes them.
class TensorQueue final : public WaitObserver {
 public:
  /// Adds the tensor of `request`; throws InvalidArgument when one with the same name is
  /// pending.
  void Push(Request request, TensorEntry entry);
  /// Adds tensors at once (the background thread sees all or none of them); throws, adding
  /// none, when any name is pending or repeated.
  void PushGroup(std::vector<Request> requests, std::vector<TensorEntry> entries);
  /// Requests pushed since the previous call, in push order.
  std::vector<Request> TakeNewRequests();
  /// Removes and returns the entry of `name`; nullptr when this rank has none (joined).
  std::unique_ptr<TensorEntry> Take(const std::string& name);
  /// Number of pending entries.
  size_t size() const;
  /// Fails and removes every pending entry.
  void FailAll(const std::string& message);
  /// Blocks until a new request is pushed (while WaitForBatch(b > 0) holds, until new
  /// allreduces total b bytes or another kind of request comes, or a caller begins to block
  /// on a handle), Wake() is called, or `timeout` passes.
  /// Returns true when there are new requests.
  bool WaitForNew(std::chrono::duration<double> timeout);
  /// Wakes WaitForNew (shutdown, timeline changes).
  void Wake();
  /// Blocks while a burst of pushes goes on: returns once no push came for `quiet`, a caller
  /// blocks on a pending handle (WaitBegins: it submits nothing more for now), Wake() is
  /// called, or `longest` passes.
  void WaitForBurstEnd(std::chrono::duration<double> quiet, std::chrono::duration<double> longest);

  /// Whether a caller blocks on a pending handle now.
  bool CallerWaiting() const;
  /// The controller holds ready tensors for a larger batch that lacks `missing_bytes` (0:
  /// none held): pushes wake WaitForNew only once new allreduces total that much (or a request
  /// of another kind comes), and a caller that begins to block on a handle wakes it too (its
  /// flag releases the batch). With 0, any push wakes it.
  void WaitForBatch(int64_t missing_bytes);

  // WaitObserver: callers blocking on pending handles.
  void WaitBegins() override;
  void WaitEnds() override;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  /// Throws the duplicate-name error (mu_ held).
  [[noreturn]] void ThrowPending(const Request& request, RequestType pending_type) const;
  /// Adds one checked tensor (mu_ held).
  void Add(Request request, TensorEntry entry);

  std::unordered_map<std::string, std::unique_ptr<TensorEntry>> entries_;
  std::vector<Request> fresh_;
  bool woken_ = false;
  uint64_t pushes_ = 0;
  int blocked_callers_ = 0;
  // The background thread sleeps in WaitForNew / WaitForBurstEnd: only then do pushes and
  // blocking callers notify (a notify per push would wake it once per tensor of a burst).
  bool consumer_waiting_for_new_ = false;
  bool consumer_gathering_ = false;
  int64_t wake_bytes_ = 0;   // WaitForBatch's missing bytes
  int64_t fresh_bytes_ = 0;  // of the allreduces in fresh_; any other request counts as "enough"
  bool FreshEnough() const { return !fresh_.empty() && fresh_bytes_ >= wake_bytes_; }
};

}  // namespace gradcomp
