// The uncompressed allreduce's algorithms as a table, as the compressed one's
// (allreduce_algorithms.h): each row names an algorithm of the fused allreduce, says what it
// needs (the op, the hierarchy asked for, the world on one node), estimates what it costs a rank
// (messages and bytes on the wire) and runs it on the fused tensors. FusedAllreduce runs the
// first row, in table order, whose needs hold.
//
// The rows, in the order they are tried:
//   adasum_nodes  Adasum's tree across nodes of each node's average (adasum.cc), where the
//                 hierarchy is asked for;
//   adasum        Adasum's tree over every rank (adasum.cc);
//   hierarchical  a reduce-scatter inside each node, an allreduce across nodes, an allgather inside
//                 each node (HierarchicalAllreduce, allreduce.cc), where asked for;
//   node          the node's communicator, the world being one node (the shared-memory one stages
//                 straight from the tensors, without a fusion buffer);
//   communicator  the world communicator's own allreduce (MPI's).
// Float32 sums and averages of 256 KB or more across nodes do not come here: the runtime runs them
// as the compressed table's SRA with the exact codec (GRADCOMP_UNCOMPRESSED_ALGORITHM), and
// tensors on a device whose communicator reads device memory as that communicator's allreduce.
#pragma once

#include <string_view>
#include <vector>

#include "ops/collectives/allreduce.h"
#include "ops/collectives/allreduce_algorithms.h"

namespace gradcomp {

/// One uncompressed allreduce of fused tensors, as the choice sees it.
struct UncompressedCase {
  const Topology* topo = nullptr;
  ReduceOp op = ReduceOp::kSum;
  DataType dtype = DataType::kFloat32;
  /// Values of all the tensors together.
  size_t count = 0;
  /// Whether the allreduce is asked to reduce inside each node first (GRADCOMP_HIERARCHICAL on
  /// nodes of several ranks; Adasum of GPU tensors on such nodes, as Horovod's).
  bool hierarchy = false;
};

/// A row of the table.
struct UncompressedAllreduceAlgorithm {
  const char* name;
  const char* description;
  /// What it needs: op Adasum (the other rows reduce every other op), the hierarchy asked for,
  /// the world on one node.
  bool adasum;
  bool hierarchy;
  bool one_node;
  AlgorithmCost (*cost)(const UncompressedCase& c);
  void (*run)(const UncompressedCase& c, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
              std::vector<char>& fusion);
};

/// The rows, in the order they are tried.
const std::vector<UncompressedAllreduceAlgorithm>& UncompressedAllreduceAlgorithms();
/// The row named `name`, or null.
const UncompressedAllreduceAlgorithm* LookupUncompressedAllreduce(std::string_view name);
/// The communicator row: a communicator's own allreduce (the runtime records a device
/// communicator's allreduce of device tensors under it).
const UncompressedAllreduceAlgorithm& CommunicatorAllreduce();
/// The first row whose needs hold for `c` (communicator holds for every op but Adasum).
const UncompressedAllreduceAlgorithm& ChooseUncompressedAllreduce(const UncompressedCase& c);

/// Allreduce of several tensors as one (Horovod's tensor fusion) by the row the table chooses;
/// returns it. `opts` gives dtype, op, scale factors and name; its buffers and count are ignored.
/// `fusion` holds the fused buffer where a row needs one. Every rank gets the same bits.
const UncompressedAllreduceAlgorithm& FusedAllreduce(const Topology& topo, bool hierarchical,
                                                     const std::vector<BufferPiece>& pieces,
                                                     const AllreduceOptions& opts, std::vector<char>& fusion);

}  // namespace gradcomp
