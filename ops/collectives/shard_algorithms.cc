// The sharded collectives' table (shard_algorithms.h): its rows and the choice.
#include "ops/collectives/shard_algorithms.h"

namespace gradcomp {

namespace {

bool NodeFirstWanted(const ShardCase& c) { return !c.planner->FlatShards(c.compressed); }
bool Always(const ShardCase&) { return true; }

CompressedAllreduceStats NodeFirstReducescatter(const ShardCase& c, const CompressedAllreduceOptions& o,
                                                const std::vector<size_t>& counts) {
  return HierarchicalCompressedReducescatter(*c.topo, o, counts);
}
CompressedAllreduceStats NodeFirstAllgather(const ShardCase& c, const CompressedAllreduceOptions& o,
                                            const std::vector<size_t>& counts) {
  return HierarchicalCompressedAllgather(*c.topo, o, counts);
}
CompressedAllreduceStats FlatReducescatter(const ShardCase& c, const CompressedAllreduceOptions& o,
                                           const std::vector<size_t>& counts) {
  return CompressedReducescatter(*c.flat, o, counts);
}
CompressedAllreduceStats FlatAllgather(const ShardCase& c, const CompressedAllreduceOptions& o,
                                       const std::vector<size_t>& counts) {
  return CompressedAllgather(*c.flat, o, counts);
}
void NodeFirstPlainReducescatter(const ShardCase& c, const ReducescatterOptions& o) {
  HierarchicalReducescatter(*c.topo, o);
}
void NodeFirstPlainAllgather(const ShardCase& c, const AllgatherOptions& o) { HierarchicalAllgather(*c.topo, o); }
void FlatPlainReducescatter(const ShardCase& c, const ReducescatterOptions& o) { Reducescatter(*c.flat, o); }
void FlatPlainAllgather(const ShardCase& c, const AllgatherOptions& o) { Allgather(*c.flat, o); }

}  // namespace

const std::vector<ShardAlgorithm>& ShardAlgorithms() {
  static const std::vector<ShardAlgorithm> table{
      {"node_first", "inside each node first (exact), only a node's share (of encodings) crosses its link", true, true,
       NodeFirstWanted, NodeFirstReducescatter, NodeFirstAllgather, NodeFirstPlainReducescatter,
       NodeFirstPlainAllgather},
      {"flat", "every rank's shards (encoded) straight to their owners", false, false, Always, FlatReducescatter,
       FlatAllgather, FlatPlainReducescatter, FlatPlainAllgather},
  };
  return table;
}

const ShardAlgorithm& ChooseShardAlgorithm(const ShardCase& c) {
  for (const ShardAlgorithm& row : ShardAlgorithms()) {
    if ((!row.nodes || c.topo->nodes_of_several_ranks()) && (!row.host_only || c.host_memory) && row.wanted(c))
      return row;
  }
  return ShardAlgorithms().back();  // flat: its needs always hold
}

}  // namespace gradcomp
