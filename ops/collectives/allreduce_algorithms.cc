// The compressed allreduce's table (allreduce_algorithms.h): its rows and the choice.
#include "ops/collectives/allreduce_algorithms.h"

#include <algorithm>

#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

// The bytes a codec's encoding of `count` values takes, by its own estimate (exact but for topk).
size_t Encoded(const AllreduceCase& c, size_t count) { return c.codec->MaxWireSize(count, c.params); }

// A rank's messages in an SRA over `ranks` ranks on `grid` (null: flat): each level's row scatters
// and gathers along the row, the last level's columns run the flat SRA.
size_t SraMessages(int ranks, const Grid* grid) {
  if (grid == nullptr) return 2 * static_cast<size_t>(ranks - 1);
  return 2 * static_cast<size_t>(grid->columns() - 1) + SraMessages(grid->rows(), grid->column_grid.get());
}

// A rank's bytes in an SRA over `ranks` ranks of `encoded` bytes, flat or on a grid: each rank
// sends (n - 1) / n of the encoded buffer in its scatter and as much in its gather.
size_t SraBytes(int ranks, size_t encoded) {
  return 2 * encoded * static_cast<size_t>(ranks - 1) / static_cast<size_t>(ranks);
}

AlgorithmCost SraCost(const AllreduceCase& c, const Grid* grid) {
  const int n = c.topo->world->size();
  return {SraMessages(n, grid), SraBytes(n, Encoded(c, c.count))};
}

// --- sparse: sparse_allreduce.cc ---
bool Always(const AllreduceCase&) { return true; }

AlgorithmCost SparseCost(const AllreduceCase& c) {
  // Every peer gets this rank's size, then its encoding (topk's: at most MaxWireSize).
  const auto peers = static_cast<size_t>(c.topo->world->size() - 1);
  return {2 * peers, peers * (Encoded(c, c.count) + sizeof(uint64_t))};
}

CompressedAllreduceStats RunSparse(const AllreduceCase& c, const CompressedAllreduceOptions& o) {
  return SparseAllreduce(*c.topo->world, o);
}

// --- hierarchical: hierarchical_compressed.cc ---
bool HierarchyAsked(const AllreduceCase& c) { return c.hierarchy; }

AlgorithmCost HierarchicalCost(const AllreduceCase& c) {
  // Inside the node: a reduce-scatter and an allgather of the raw values; across nodes: the SRA
  // of this rank's shard (of the whole buffer on a leader, with leader_only).
  const int local = c.topo->local_size(), nodes = c.topo->cross_size();
  const size_t raw = c.count * DataTypeSize(c.dtype);
  const size_t across = c.planner->settings().leader_only ? c.count : c.count / static_cast<size_t>(local);
  const Grid* grid = c.planner->PlannedGrid(*c.topo->cross);
  return {2 * static_cast<size_t>(local - 1) + SraMessages(nodes, grid),
          SraBytes(local, raw) + SraBytes(nodes, Encoded(c, across))};
}

CompressedAllreduceStats RunHierarchical(const AllreduceCase& c, const CompressedAllreduceOptions& o) {
  return HierarchicalCompressedAllreduce(*c.topo, o, c.planner->settings().leader_only,
                                         c.planner->GridFor(*c.topo, *c.topo->cross));
}

// --- sra2d: sra2d.cc ---
bool GridWanted(const AllreduceCase& c) { return c.planner->GridFor(*c.topo, *c.topo->world) != nullptr; }

AlgorithmCost Sra2dCost(const AllreduceCase& c) { return SraCost(c, c.planner->PlannedGrid(*c.topo->world)); }

CompressedAllreduceStats RunSra2d(const AllreduceCase& c, const CompressedAllreduceOptions& o) {
  return CompressedAllreduce2d(*c.planner->GridFor(*c.topo, *c.topo->world), o);
}

// --- sra: sra.cc ---
AlgorithmCost FlatCost(const AllreduceCase& c) { return SraCost(c, nullptr); }

CompressedAllreduceStats RunFlat(const AllreduceCase& c, const CompressedAllreduceOptions& o) {
  return CompressedAllreduce(*c.topo->world, o);
}

std::vector<AllreduceAlgorithm>& Table() {
  static std::vector<AllreduceAlgorithm> table{
      {"sparse", "allgather of every rank's selection, scatter-added in rank order", CodecKind::kSparse, false, 1,
       false, Always, SparseCost, RunSparse},
      {"hierarchical", "inside each node first (exact), an SRA of each shard across nodes, the node's allgather",
       CodecKind::kDense, true, 1, false, HierarchyAsked, HierarchicalCost, RunHierarchical},
      {"sra2d", "scatter-reduce-allgather on a grid: 2 (rows + columns - 2) messages a rank", CodecKind::kDense, false,
       4, false, GridWanted, Sra2dCost, RunSra2d},
      {"sra", "scatter-reduce-allgather: 2 (n - 1) messages a rank", CodecKind::kDense, false, 1, false, Always,
       FlatCost, RunFlat},
  };
  return table;
}

}  // namespace

UncompressedAlgorithm ParseUncompressedAlgorithm(std::string_view name) {
  if (name == "auto") return UncompressedAlgorithm::kAuto;
  if (name == "mpi") return UncompressedAlgorithm::kCommunicator;
  if (name == "sra") return UncompressedAlgorithm::kSra;
  throw InvalidArgument("GRADCOMP_UNCOMPRESSED_ALGORITHM='" + std::string(name) + "': auto, mpi or sra");
}

const std::vector<AllreduceAlgorithm>& AllreduceAlgorithms() { return Table(); }

const AllreduceAlgorithm* LookupAllreduceAlgorithm(std::string_view name) {
  for (const AllreduceAlgorithm& row : Table()) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

void RegisterAllreduceAlgorithm(const AllreduceAlgorithm& row) {
  if (LookupAllreduceAlgorithm(row.name) != nullptr) {
    throw InvalidArgument(std::string("allreduce algorithm '") + row.name + "' is already in the table");
  }
  Table().insert(Table().begin(), row);
}

void UnregisterAllreduceAlgorithm(std::string_view name) {
  auto& table = Table();
  table.erase(std::remove_if(table.begin(), table.end(), [&](const AllreduceAlgorithm& r) { return name == r.name; }),
              table.end());
}

bool NeedsHold(const AllreduceAlgorithm& row, const AllreduceCase& c) {
  const Topology& topo = *c.topo;
  const CodecKind kind = c.codec->sparse() ? CodecKind::kSparse : CodecKind::kDense;
  return row.codec == kind && (!row.nodes || topo.nodes_of_several_ranks()) && topo.world->size() >= row.min_ranks &&
         (!row.host_only || c.host_memory);
}

AllreducePlanner::AllreducePlanner(AlgorithmSettings settings) : settings_(std::move(settings)) {
  if (settings_.algorithm != "auto" && LookupAllreduceAlgorithm(settings_.algorithm) == nullptr) {
    std::string names;
    for (const AllreduceAlgorithm& row : Table()) names += std::string(names.empty() ? "" : ", ") + row.name;
    throw InvalidArgument("GRADCOMP_COMPRESSED_ALGORITHM='" + settings_.algorithm +
                          "': no such allreduce algorithm (auto, " + names + ")");
  }
}

const AllreduceAlgorithm& AllreducePlanner::Choose(const AllreduceCase& c) {
  for (const AllreduceAlgorithm& row : Table()) {
    if (NeedsHold(row, c) && row.wanted(c)) return row;
  }
  // Only a codec no row reduces gets here (every dense codec fits sra).
  throw InvalidArgument(std::string("no allreduce algorithm reduces codec '") + c.codec->name() + "'");
}

CompressedAllreduceStats AllreducePlanner::Run(AllreduceCase c, const CompressedAllreduceOptions& o) {
  c.planner = this;
  return Choose(c).run(c, o);
}

const Grid* AllreducePlanner::GridFor(const Topology& topo, Communicator& across) {
  // On nodes of several ranks flat SRA sends every rank's encoded chunks across the node's link,
  // local_size times what a node needs to send (docs/benchmarks.md, "2 nodes x 2 ranks: node
  // rows"): then the grid's rows are the nodes. Elsewhere flat SRA sends 2 (n - 1) messages a
  // rank of size/n^2 encoded bytes each; past a few dozen ranks their count, not their bytes,
  // sets the time (simulated 25 Gbit/s clusters, docs/benchmarks.md "Scale"), and the grid is
  // the most square.
  const bool node_rows = &across == topo.world.get() && topo.nodes_of_several_ranks() && settings_.algorithm != "sra";
  if (!node_rows && !WantsGrid(across.size())) return nullptr;
  std::unique_ptr<Grid>& grid = grids_[&across];
  if (!grid) {
    // The columns across nodes run a grid of their own when they are long enough, nested again
    // when a node's ranks would post too many messages at once on the most square one
    // (GridShape). Every rank of a node runs one such SRA at once across nodes (the node grid's
    // columns, the hierarchical SRA's shards); a grid over a world of one node crosses no link.
    const int per_node = node_rows || &across == topo.cross.get() ? topo.local_size() : 1;
    const auto shape = [&](int ranks) {
      return GridShape(ranks, per_node, settings_.grid_min_ranks, settings_.grid_node_messages);
    };
    grid = std::make_unique<Grid>(
        node_rows ? MakeNodeGrid(topo, WantsGrid(topo.cross_size()) ? shape(topo.cross_size()) : std::vector<int>{})
                  : MakeNestedGrid(across, shape(across.size())));
  }
  // A prime number of ranks makes one row: flat SRA.
  return grid->rows() > 1 ? grid.get() : nullptr;
}

const Grid* AllreducePlanner::PlannedGrid(const Communicator& across) const {
  const auto it = grids_.find(&across);
  return it != grids_.end() && it->second->rows() > 1 ? it->second.get() : nullptr;
}

bool AllreducePlanner::FlatShards(bool compressed) const {
  return compressed ? settings_.algorithm == "sra" : settings_.uncompressed == UncompressedAlgorithm::kCommunicator;
}

bool AllreducePlanner::WantsGrid(int ranks) const {
  const std::string& choice = settings_.algorithm;
  return ranks >= 4 && (choice == "sra2d" || (choice == "auto" && ranks >= settings_.grid_min_ranks));
}

}  // namespace gradcomp
