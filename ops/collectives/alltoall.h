// Alltoall with per-destination splits.
#pragma once

#include <string>
#include <vector>

#include "ops/comm/communicator.h"

namespace gradcomp {

/// Arguments of one alltoall: `input` holds sum(send_counts) elements, the first
/// send_counts[0] for rank 0 and so on; `output` receives recv_counts[p] elements from each p.
struct AlltoallOptions {
  const void* input = nullptr;
  std::vector<size_t> send_counts;
  void* output = nullptr;
  std::vector<size_t> recv_counts;  ///< see AlltoallRecvCounts
  DataType dtype = DataType::kFloat32;
  std::string name;
};

/// Collective: how many elements this rank will receive from each rank.
std::vector<size_t> AlltoallRecvCounts(Communicator& comm, const std::vector<size_t>& send_counts);

/// Exchanges the splits between all ranks.
void Alltoall(Communicator& comm, const AlltoallOptions& opts);

}  // namespace gradcomp
