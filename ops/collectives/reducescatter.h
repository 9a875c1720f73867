// Reduce-scatter: the reduction of a buffer, each rank keeping one slice of the result.
#pragma once

#include <string>
#include <vector>

#include "ops/collectives/reduction_options.h"
#include "ops/comm/communicator.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// Arguments of one reduce-scatter: `input` holds sum(counts) elements; rank r receives the
/// reduced slice of counts[r] elements starting at the prefix sum of counts[0..r).
/// EvenSplit(total, size) gives Horovod's default split.
struct ReducescatterOptions : ReductionOptions {
  std::vector<size_t> counts;
};

/// Reduces across ranks; each rank keeps its slice.
void Reducescatter(Communicator& comm, const ReducescatterOptions& opts);

/// The same result, reduced inside each node first (every local rank gets the node's sum of
/// the slices of the ranks with its local rank) and then across nodes among the ranks with the
/// same local rank: a node's link carries its share of the other nodes' slices once, where a
/// flat exchange sends it once for every rank of the node. Needs the same number of ranks on
/// every node; counts are the world's.
void HierarchicalReducescatter(const Topology& topo, const ReducescatterOptions& opts);

}  // namespace gradcomp
