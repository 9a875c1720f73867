// The reduce-scatter's and allgather's algorithms, compressed (compressed_shards.h) and not
// (reducescatter.h, allgather.h), as a table, as the allreduce's (allreduce_algorithms.h): each row
// names an algorithm, says what it needs (equal nodes of several ranks, host memory), whether the
// settings want it, and runs both collectives in both forms. The runtime asks
// ChooseShardAlgorithm for a sharded collective's row: the first whose needs hold and which the
// settings want.
//   node_first  summed (gathered) inside each node first, only a node's share crosses its link
//               (HierarchicalCompressedReducescatter / Allgather, HierarchicalReducescatter /
//               Allgather), unless the setting asks for the flat form (compressed: sra;
//               uncompressed: mpi);
//   flat        every rank's shards straight to their owners (CompressedReducescatter / Allgather,
//               the communicator's Reducescatter / Allgather).
#pragma once

#include <cstddef>
#include <vector>

#include "ops/collectives/allgather.h"
#include "ops/collectives/allreduce_algorithms.h"
#include "ops/collectives/compressed_shards.h"
#include "ops/collectives/reducescatter.h"

namespace gradcomp {

/// One sharded collective, as the choice sees it.
struct ShardCase {
  /// The host's communicators (the node-first forms run over them).
  const Topology* topo = nullptr;
  /// What the flat forms run over: the world of the buffers' device where it has one.
  Communicator* flat = nullptr;
  /// Whether its buffers are in host memory.
  bool host_memory = true;
  /// The settings (AllreducePlanner::FlatShards).
  const AllreducePlanner* planner = nullptr;
  /// Whether it is the compressed form (the settings that keep it flat differ).
  bool compressed = true;
};

/// A row of the table.
struct ShardAlgorithm {
  const char* name;
  const char* description;
  /// What it needs: equal nodes of several ranks (and several nodes), host memory.
  bool nodes;
  bool host_only;
  bool (*wanted)(const ShardCase& c);
  CompressedAllreduceStats (*reducescatter)(const ShardCase& c, const CompressedAllreduceOptions& o,
                                            const std::vector<size_t>& counts);
  CompressedAllreduceStats (*allgather)(const ShardCase& c, const CompressedAllreduceOptions& o,
                                        const std::vector<size_t>& counts);
  /// The uncompressed forms.
  void (*plain_reducescatter)(const ShardCase& c, const ReducescatterOptions& o);
  void (*plain_allgather)(const ShardCase& c, const AllgatherOptions& o);
};

/// The rows, in the order they are tried.
const std::vector<ShardAlgorithm>& ShardAlgorithms();
/// The first row whose needs hold and which the settings want (flat holds everywhere).
const ShardAlgorithm& ChooseShardAlgorithm(const ShardCase& c);

}  // namespace gradcomp
