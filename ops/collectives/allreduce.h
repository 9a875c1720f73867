// Uncompressed allreduce: flat (the communicator's own collective, i.e. MPI_Allreduce)
// and hierarchical (node-local reduce-scatter, cross-node allreduce, node-local allgather).
// FusedAllreduce, of several tensors as one, chooses among these and Adasum by its table
// (uncompressed_algorithms.h).
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "ops/collectives/reduction_options.h"
#include "ops/comm/communicator.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// Arguments of one allreduce. `output` may equal `input`.
struct AllreduceOptions : ReductionOptions {
  size_t count = 0;
};

/// Flat allreduce over `comm`; the reduction itself is the communicator's (MPI's) collective
/// (Adasum: AdasumAllreduce over `comm`).
void Allreduce(Communicator& comm, const AllreduceOptions& opts);

/// Hierarchical allreduce: reduce-scatter inside each node (through the shared-memory window
/// with an shm local communicator), allreduce of each shard among the ranks with the same
/// local rank, allgather inside each node. Needs the same number of ranks on every node.
void HierarchicalAllreduce(const Topology& topo, const AllreduceOptions& opts);

/// Throws InvalidArgument for an op the allreduce does not define for its dtype (Average of bool).
void ValidateAllreduceOp(const AllreduceOptions& opts);

}  // namespace gradcomp
