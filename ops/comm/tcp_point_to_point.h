// torch.distributed's send and recv in a world without MPI (ops/comm/store_communicator.h): the
// messages of a group travel on TCP connections of their own (a mesh connected for the group, so
// they never meet a runtime's traffic), posted and tested from the caller's threads, as the MPI
// ones of mpi_point_to_point.h are. The mesh is single-threaded: every call on it holds a lock.
// As MPI, messages between two ranks with the same tag arrive in the order sent.
#pragma once

#include <climits>
#include <memory>

#include "ops/comm/communicator.h"
#include "ops/comm/mpi_point_to_point.h"

namespace gradcomp {

class TcpPointToPoint {
 public:
  struct Shared;  // the group and the lock every call on it holds (shared with the requests)

  /// Over `group`: a communicator of ConnectStoreWorld's, for these messages alone.
  explicit TcpPointToPoint(std::unique_ptr<Communicator> group);

  int rank() const;
  int size() const;
  /// Tags are 32-bit on the wire; negative ones are refused.
  int max_tag() const { return INT_MAX; }

  /// Sends `bytes` bytes (the buffer must stay valid until the request completes).
  std::unique_ptr<PointToPointRequest> Send(const void* data, size_t bytes, int peer, int tag);
  /// Receives a message of exactly `bytes` bytes from `peer`, or from whichever rank sends first
  /// on `tag` when `peer` is -1.
  std::unique_ptr<PointToPointRequest> Receive(void* data, size_t bytes, int peer, int tag);

 private:
  std::shared_ptr<Shared> shared_;
};

}  // namespace gradcomp
