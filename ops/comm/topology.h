// Node structure of a world: the node-local and cross-node communicators hierarchical
// algorithms compose (UCC-style: hierarchical = local + cross).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "ops/comm/communicator.h"

namespace gradcomp {

/// A world communicator with its node-local and cross-node sub-communicators.
/// cross groups the ranks that have the same local rank, one per node.
struct Topology {
  std::unique_ptr<Communicator> world;
  std::unique_ptr<Communicator> local;
  std::unique_ptr<Communicator> cross;
  /// True when every node has the same number of ranks (hierarchical algorithms need it).
  bool homogeneous = true;

  int rank() const { return world->rank(); }
  int size() const { return world->size(); }
  int local_rank() const { return local->rank(); }
  int local_size() const { return local->size(); }
  int cross_rank() const { return cross->rank(); }
  int cross_size() const { return cross->size(); }
  /// Equal nodes of several ranks each, and several nodes: where node-first algorithms pay.
  bool nodes_of_several_ranks() const { return homogeneous && local_size() > 1 && cross_size() > 1; }
};

/// The ranks of a communicator as a grid for two-level algorithms (the 2-D SRA): rows of
/// `columns` consecutive ranks; a column holds the ranks at the same place in their rows.
/// A column may itself be a grid (three levels: rows are nodes, the columns across nodes are
/// 2-D), as MakeNodeGrid makes it.
struct Grid {
  std::unique_ptr<Communicator> row;
  std::unique_ptr<Communicator> column;
  /// The grid of `column` its allreduces run on, or null (flat). Every column's grid has the
  /// same shape.
  std::unique_ptr<Grid> column_grid;
  int rank = 0;  ///< unique in the communicator the grid was made of (its rounding streams)

  int columns() const { return row->size(); }
  int rows() const { return column->size(); }
};

/// Collective over `comm`: its grid of rows of `columns` ranks (which must divide its size);
/// 0 picks the most square grid with rows at least as long as columns (for a prime size, one row).
Grid MakeGrid(Communicator& comm, int columns = 0);

/// Collective over `comm`: MakeGrid(comm, columns[0]), its column on MakeGrid(column,
/// columns[1]), and so on, one level per entry (0: that level's most square grid); nesting stops
/// before a level whose grid would have one row or one column. Empty `columns`: one row.
Grid MakeNestedGrid(Communicator& comm, const std::vector<int>& columns);

/// Collective over topo.world (homogeneous): the grid whose rows are the nodes and whose columns
/// are the ranks of one local rank across nodes. With `cross_columns` each column runs on a
/// grid of its own, MakeNestedGrid(column, cross_columns) (levels of one row left out); empty:
/// flat SRA across nodes.
Grid MakeNodeGrid(const Topology& topo, const std::vector<int>& cross_columns = {});

/// GRADCOMP_GRID_NODE_MESSAGES' default: a node's ranks together post at most about this many
/// messages in one row step of a grid across nodes (GridShape): many small messages at once
/// run below the link's rate under SMPI's TCP model, and the grid this gives holds up under
/// both of SimGrid's models where the most square one does not (docs/benchmarks.md, "A fat
/// tree, up to 1024 nodes").
constexpr int kNodeRowMessages = 128;

/// Row lengths, one per level, of the nested grid (MakeNestedGrid) an SRA over `ranks` ranks
/// runs on when `ranks_per_node` ranks of every node run one such SRA each at once (the columns
/// of a node grid, or one rank a node): the most square grid, with rows of at most
/// node_messages / ranks_per_node ranks; its column runs a grid of its own, by the same rule,
/// when it is longer than that and at least `nest_min_ranks` long (flat SRA's 2 (n - 1)
/// messages a rank of 1/n^2 of the buffer are latency-bound there). 1024 x 1: {32} (32 x 32);
/// 1024 x 8: {16, 8} (rows of 16 nodes, 64-node columns on an 8 x 8 grid).
std::vector<int> GridShape(int ranks, int ranks_per_node, int nest_min_ranks, int node_messages = kNodeRowMessages);

/// Collective over topo.world: [l][c] is the world rank of local rank l on the node whose ranks
/// have cross rank c (homogeneous nodes), whatever order the launcher gave the world's ranks.
std::vector<std::vector<int>> NodeColumns(const Topology& topo);

/// Local rank k's region of a buffer laid out by node column: the sum of `sizes` (one a world
/// rank, elements or bytes) over the ranks of columns[k], for every k.
std::vector<size_t> RegionSizes(const std::vector<std::vector<int>>& columns, const std::vector<size_t>& sizes);

/// Collective over `world`: builds the node and cross communicators. forced_local_size > 0
/// forces nodes of that many consecutive ranks (GRADCOMP_LOCAL_SIZE; it must divide the
/// world size); 0 detects shared-memory domains. `shm_staging_bytes` sizes the node's
/// shared-memory window areas (GRADCOMP_SHM_BUFFER_MB).
Topology BuildTopology(std::unique_ptr<Communicator> world, int forced_local_size, LocalTransport transport,
                       size_t shm_staging_bytes = size_t{16} << 20);

}  // namespace gradcomp
