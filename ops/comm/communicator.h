// The narrow transport interface every collective algorithm is written against
// (in the spirit of gloo's Context/Pair). Implementations: MPI (mpi_communicator.h),
// an MPI-3 shared-memory window for node-local exchange (shm_communicator.h) and
// in-process thread ranks for tests (inprocess_communicator.h). Algorithms include only
// this header, never mpi.h.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/common/dtype.h"

namespace gradcomp {

class Device;

/// How ranks of one node talk to each other in hierarchical algorithms
/// (CGX_INNER_COMMUNICATOR_TYPE): through a shared-memory window or through MPI messages.
enum class LocalTransport { kSharedMemory, kMessages };

/// One tensor of a fused allreduce: `count` elements read from `input` (nullptr: zeros, the
/// contribution of a rank that has joined) whose result goes to `output` (nullptr: dropped).
/// `input == output` is allowed.
struct BufferPiece {
  const void* input = nullptr;
  void* output = nullptr;
  size_t count = 0;
};

/// Applied to reduced elements before they reach the outputs (Average's division, postscale).
using FinishFn = std::function<void(void* data, size_t count)>;

/// A point-to-point transfer in flight (Communicator::Isend / Irecv). The buffer must stay
/// valid until Test() has returned true; destroying an unfinished transfer waits for it.
class PendingTransfer {
 public:
  virtual ~PendingTransfer() = default;
  /// Advances the transport and returns true once the transfer is complete; never blocks.
  /// Throws gradcomp::Error when the transfer failed.
  virtual bool Test() = 0;
};

/// A group of ranks that can exchange bytes and run the few collectives we delegate.
/// Every collective must be called by all ranks of the communicator in the same order.
/// Methods throw gradcomp::Error (with rank and operation) on failure.
class Communicator {
 public:
  virtual ~Communicator() = default;

  /// This rank's index in the group, 0..size()-1.
  virtual int rank() const = 0;
  /// Number of ranks in the group.
  virtual int size() const = 0;
  /// Short name of the implementation: "mpi", "shm" or "inproc".
  virtual const char* kind() const = 0;
  /// The device whose memory every buffer handed to this communicator lives in (NCCL,
  /// CUDA-aware MPI), or null: host memory (the default). The compressed collectives hand such
  /// a communicator their device buffers directly instead of staging them through the host.
  virtual Device* device_memory() const { return nullptr; }
  /// Whether Allreduce / ReduceScatter take `dtype` in the memory it works on (CUDA-aware MPI
  /// cannot reduce 16-bit floats in GPU memory: MPI has no such type, gradcomp's own reduction
  /// runs on the host).
  virtual bool reduces(DataType) const { return true; }

  /// Blocking send of `bytes` bytes to `peer`; messages with the same (peer, tag) stay ordered.
  virtual void Send(const void* data, size_t bytes, int peer, int tag) = 0;
  /// Blocking receive of exactly `bytes` bytes from `peer`.
  virtual void Recv(void* data, size_t bytes, int peer, int tag) = 0;
  /// Sends to `dst` and receives from `src` at once, so exchange patterns cannot deadlock.
  virtual void SendRecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                        int src, int tag) = 0;

  /// Starts sending `bytes` bytes to `peer` (matched by the peer's Irecv or Recv with the
  /// same tag, in order). Transports without nonblocking transfers throw InvalidArgument.
  virtual std::unique_ptr<PendingTransfer> Isend(const void* data, size_t bytes, int peer, int tag);
  /// Starts receiving exactly `bytes` bytes from `peer`.
  virtual std::unique_ptr<PendingTransfer> Irecv(void* data, size_t bytes, int peer, int tag);
  /// Whether Isend and Irecv work on this transport.
  virtual bool nonblocking() const { return false; }
  /// A polling loop's pause between polls of this communicator's transfers: returns after
  /// `seconds`, or earlier once its transfers may have progressed or `wake_fd` (>= 0, an
  /// eventfd: Pipeline::wake_fd) became readable, which it then reads. The default sleeps
  /// (MPI moves bytes only inside its calls: nothing can wake the waiter); the TCP
  /// communicator waits in poll() on its sockets and wake_fd (wakes_waiters()).
  virtual void WaitForProgress(double seconds, int wake_fd = -1);
  /// Whether WaitForProgress returns when the transfers progress, so that a loop waiting on
  /// nothing else may wait long instead of napping on a timer.
  virtual bool wakes_waiters() const { return false; }

  /// Returns once every rank has entered.
  virtual void Barrier() = 0;
  /// out[i] = op over ranks of in[i]; `in == out` is allowed. op is Sum, Min, Max or Product.
  virtual void Allreduce(const void* in, void* out, size_t count, DataType dtype, ReduceOp op) = 0;
  /// Starts an Allreduce of a small buffer (at most INT_MAX elements) that the caller completes
  /// by polling (PollUntil), so a thread that waits long for its peers does not hold a core
  /// the way a blocking MPI call's busy-poll does. Buffers stay untouched until it completes.
  /// The default runs the blocking Allreduce and returns a completed transfer.
  virtual std::unique_ptr<PendingTransfer> Iallreduce(const void* in, void* out, size_t count, DataType dtype,
                                                      ReduceOp op);
  /// Allreduce of the concatenation of `pieces` (Horovod's fusion): inputs are multiplied by
  /// `prescale` (when it is not 1) before the reduction and `finish` (may be empty) is applied
  /// to every reduced element before it reaches its output. This default builds the
  /// concatenation in `fusion` (grown as needed), runs Allreduce on it and copies the results
  /// out; a single piece with an input is reduced in place. The shared-memory communicator
  /// overrides it to stage straight from the inputs and write straight to the outputs.
  virtual void AllreducePieces(const std::vector<BufferPiece>& pieces, DataType dtype, ReduceOp op,
                               double prescale, const FinishFn& finish, std::vector<char>& fusion);
  /// Reduces `in` (sum of counts elements) over ranks; rank r receives the slice that starts at
  /// the prefix sum of counts[0..r) and holds counts[r] elements. `out` must not overlap `in`.
  virtual void ReduceScatter(const void* in, void* out, const std::vector<size_t>& counts,
                             DataType dtype, ReduceOp op) = 0;
  /// out = concatenation over ranks of their `in` (rank r contributes bytes[r] bytes).
  virtual void Allgatherv(const void* in, void* out, const std::vector<size_t>& bytes) = 0;
  /// Root receives the concatenation over ranks of their `in` (rank r contributes bytes[r]
  /// bytes; every rank passes the same `bytes`); `out` is used on the root only.
  virtual void Gatherv(const void* in, void* out, const std::vector<size_t>& bytes, int root) = 0;
  /// Copies `bytes` bytes of root's `data` into every rank's `data`.
  virtual void Broadcast(void* data, size_t bytes, int root) = 0;
  /// Rank r sends send_bytes[p] bytes (consecutive in `in`) to each p and receives
  /// recv_bytes[p] bytes from each p into consecutive regions of `out`.
  virtual void Alltoallv(const void* in, const std::vector<size_t>& send_bytes, void* out,
                         const std::vector<size_t>& recv_bytes) = 0;
  /// Collective: ranks passing the same color form a new communicator, ordered by (key, rank).
  /// A negative color returns nullptr for that rank.
  virtual std::unique_ptr<Communicator> Split(int color, int key) = 0;
  /// Collective: the communicator of the ranks on this rank's node, of the same kind as this
  /// one. forced_local_size > 0 groups consecutive ranks in nodes of that size (to exercise
  /// hierarchy on one machine); 0 detects the real shared-memory domain. BuildTopology decides
  /// which transport the node uses.
  virtual std::unique_ptr<Communicator> SplitLocal(int forced_local_size) = 0;
};

/// Collective: every rank's string, in rank order (an allgather of sizes, then of bytes).
std::vector<std::string> AllgatherStrings(Communicator& comm, const std::string& mine);

/// The pacing of a polling loop: after a poll that neither finished nor made progress, spin
/// on for the first ~20 us since the last progress, then nap between polls, a tenth of the time
/// since it (see the .cc), so a long wait leaves the core to the training thread while a busy
/// exchange, progressing every few hundred microseconds, is never napped through.
class Poller {
 public:
  /// `comm`: the communicator whose transfers the loop polls, whose WaitForProgress the naps
  /// use (null: plain sleeps); `wake_fd`: what else the loop waits for (Pipeline::wake_fd), or
  /// -1. Where comm->wakes_waiters(), every event the loop waits for wakes it, and a nap lasts
  /// until one (at most kEventWaitCap) instead of a timer's tenth of the time waited.
  explicit Poller(Communicator* comm = nullptr, int wake_fd = -1);
  /// After a poll that did not finish; `progressed`: it completed or started something.
  void Pause(bool progressed);

 private:
  Communicator* comm_;
  int wake_fd_;
  double since_;  // the last progress, sim::Now()
};

/// Polls `done` (which should test pending transfers of `comm`, so the transport progresses)
/// until it returns true, paced by a Poller on `comm` (may be null).
void PollUntil(const std::function<bool()>& done, Communicator* comm = nullptr);

/// Splits `count` elements into `parts` contiguous slices whose sizes differ by at most one
/// (the first count % parts slices get the extra element).
std::vector<size_t> EvenSplit(size_t count, int parts);
/// Prefix sums: offsets[i] = sum of sizes[0..i).
std::vector<size_t> Offsets(const std::vector<size_t>& sizes);

/// Copies the pieces' inputs (times `prescale`; zeros for a null input) one after another
/// into `fusion` (grown as needed); returns the number of elements.
size_t FusePieces(const std::vector<BufferPiece>& pieces, DataType dtype, double prescale, std::vector<char>& fusion);
/// Copies `fused` back to the pieces' outputs, applying `finish` (may be empty) to each.
void UnfusePieces(const std::vector<BufferPiece>& pieces, DataType dtype, const void* fused, const FinishFn& finish);

}  // namespace gradcomp
