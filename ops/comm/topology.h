// Node structure of a world: the node-local and cross-node communicators hierarchical
// algorithms compose (UCC-style: hierarchical = local + cross).
#pragma once

#include <memory>
#include <string>

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

/// Collective over topo.world (homogeneous): the grid whose rows are the nodes and whose columns
/// are the ranks of one local rank across nodes. With `cross_columns` >= 0 each column runs on
/// its own grid, MakeGrid(column, cross_columns), unless that grid has one row.
Grid MakeNodeGrid(const Topology& topo, int cross_columns = -1);

/// Collective over `world`: builds the node and cross communicators. forced_local_size > 0
/// forces nodes of that many consecutive ranks (GRADCOMP_LOCAL_SIZE; it must divide the
/// world size); 0 detects shared-memory domains. `shm_staging_bytes` sizes the node's
/// shared-memory window areas (GRADCOMP_SHM_BUFFER_MB).
Topology BuildTopology(std::unique_ptr<Communicator> world, int forced_local_size, LocalTransport transport,
                       size_t shm_staging_bytes = size_t{16} << 20);

}  // namespace gradcomp
