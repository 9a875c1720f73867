#include "ops/collectives/alltoall.h"

#include <cstdint>

#include "ops/collectives/context.h"

namespace gradcomp {

namespace {
void CheckSplits(const std::vector<size_t>& v, int size, const char* what) {
  if (v.size() != static_cast<size_t>(size)) {
    throw InvalidArgument(std::string("alltoall ") + what + " has " + std::to_string(v.size()) +
                          " entries but there are " + std::to_string(size) + " ranks");
  }
}
}  // namespace

std::vector<size_t> AlltoallRecvCounts(Communicator& comm, const std::vector<size_t>& send_counts) {
  CheckSplits(send_counts, comm.size(), "splits");
  const size_t n = send_counts.size();
  std::vector<uint64_t> send(send_counts.begin(), send_counts.end());
  std::vector<uint64_t> recv(n);
  const std::vector<size_t> one(n, sizeof(uint64_t));
  comm.Alltoallv(send.data(), one, recv.data(), one);
  return std::vector<size_t>(recv.begin(), recv.end());
}

void Alltoall(Communicator& comm, const AlltoallOptions& o) {
  WithTensorContext("alltoall", o.name, [&] {
    CheckSplits(o.send_counts, comm.size(), "splits");
    CheckSplits(o.recv_counts, comm.size(), "receive counts");
    const size_t esize = DataTypeSize(o.dtype);
    std::vector<size_t> send_bytes(o.send_counts.size()), recv_bytes(o.recv_counts.size());
    for (size_t i = 0; i < send_bytes.size(); ++i) {
      send_bytes[i] = o.send_counts[i] * esize;
      recv_bytes[i] = o.recv_counts[i] * esize;
    }
    comm.Alltoallv(o.input, send_bytes, o.output, recv_bytes);
  });
}

}  // namespace gradcomp
