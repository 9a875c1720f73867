#include "ops/collectives/allgather.h"

#include <cstdint>

#include "ops/collectives/context.h"

namespace gradcomp {

std::vector<size_t> AllgatherCounts(Communicator& comm, size_t my_count) {
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<uint64_t> all(n);
  const uint64_t mine = my_count;
  comm.Allgatherv(&mine, all.data(), std::vector<size_t>(n, sizeof(uint64_t)));
  return std::vector<size_t>(all.begin(), all.end());
}

void Allgather(Communicator& comm, const AllgatherOptions& o) {
  WithTensorContext("allgather", o.name, [&] {
    const size_t me = static_cast<size_t>(comm.rank());
    if (o.counts.size() != static_cast<size_t>(comm.size())) {
      throw InvalidArgument("allgather needs one count per rank: got " + std::to_string(o.counts.size()) +
                            " for " + std::to_string(comm.size()) + " ranks");
    }
    if (o.counts[me] != o.count) {
      throw InvalidArgument("allgather: rank " + std::to_string(me) + " contributes " + std::to_string(o.count) +
                            " elements but counts[" + std::to_string(me) + "] = " + std::to_string(o.counts[me]));
    }
    const size_t esize = DataTypeSize(o.dtype);
    std::vector<size_t> bytes(o.counts.size());
    for (size_t r = 0; r < bytes.size(); ++r) bytes[r] = o.counts[r] * esize;
    comm.Allgatherv(o.input, o.output, bytes);
  });
}

}  // namespace gradcomp
