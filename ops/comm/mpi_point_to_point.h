// Point-to-point messages for torch.distributed's send and recv on the backend "gradcomp"
// (without exposing mpi.h). Every runtime operation is negotiated by all the ranks of its
// group, and a message concerns two of them: so these are MPI messages that no runtime sees,
// on an MPI communicator of their own (a duplicate: they never meet a runtime's traffic),
// posted and tested from the caller's thread (MPI_THREAD_MULTIPLE, which process sets need
// too). As MPI, messages between two ranks with the same tag arrive in the order sent.
#pragma once

#include <cstddef>
#include <memory>
#include <vector>

namespace gradcomp {

/// One posted send or receive.
class PointToPointRequest {
 public:
  virtual ~PointToPointRequest() = default;
  /// True once the message has gone (a send) or arrived (a receive); never blocks. Throws when
  /// MPI fails it, or when the message that arrived is not the size of the receive's buffer
  /// (naming the peer, the tag and both sizes); then, and once complete, it keeps answering so.
  virtual bool Test() = 0;
  /// Withdraws a receive still pending (its buffer is free afterwards); a send cannot be.
  virtual void CancelReceive() = 0;
  /// The rank (in the communicator) a completed receive came from.
  virtual int source() const = 0;
};

class PointToPoint {
 public:
  /// Collective over MPI's world when `ranks` is empty, else over the sorted world `ranks`
  /// only, whose members pass the same `tag` (MPI_Comm_create_group, as CreateMpiGroupWorld).
  PointToPoint(const std::vector<int>& ranks, int tag);
  ~PointToPoint();
  PointToPoint(const PointToPoint&) = delete;
  PointToPoint& operator=(const PointToPoint&) = delete;

  int rank() const;
  int size() const;
  /// The largest tag a message may carry (MPI_TAG_UB, at least 32767).
  int max_tag() const;

  /// Sends `bytes` bytes (the buffer must stay valid until the request completes).
  std::unique_ptr<PointToPointRequest> Send(const void* data, size_t bytes, int peer, int tag);
  /// Receives a message of exactly `bytes` bytes from `peer`, or from any rank when `peer` is -1.
  std::unique_ptr<PointToPointRequest> Receive(void* data, size_t bytes, int peer, int tag);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace gradcomp
