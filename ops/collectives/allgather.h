// Allgather where each rank may contribute a different number of elements (tensors whose
// first dimension differs per rank).
#pragma once

#include <string>
#include <vector>

#include "ops/comm/communicator.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// Arguments of one allgather. `output` holds sum(counts) elements, rank r's at the prefix
/// sum of counts[0..r).
struct AllgatherOptions {
  const void* input = nullptr;
  size_t count = 0;  ///< elements this rank contributes
  void* output = nullptr;
  std::vector<size_t> counts;  ///< elements every rank contributes (see AllgatherCounts)
  DataType dtype = DataType::kFloat32;
  std::string name;
};

/// Collective: every rank's element count, so callers can size the output.
std::vector<size_t> AllgatherCounts(Communicator& comm, size_t my_count);

/// Gathers every rank's input into every rank's output.
void Allgather(Communicator& comm, const AllgatherOptions& opts);

/// The same result, gathered across nodes first among the ranks with the same local rank and
/// then inside each node: a node's link carries each of the other nodes' inputs once, where a
/// flat exchange sends them once for every rank of the node. Needs the same number of ranks on
/// every node; counts are the world's.
void HierarchicalAllgather(const Topology& topo, const AllgatherOptions& opts);

}  // namespace gradcomp
