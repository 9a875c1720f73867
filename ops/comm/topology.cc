#include "ops/comm/topology.h"

#include <algorithm>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "ops/comm/mpi_communicator.h"
#include "ops/comm/shm_posix_window.h"
#if !defined(GRADCOMP_SIMULATION)
#include "ops/comm/shm_mpi_window.h"
#endif
#include "ops/common/enforce.h"

namespace gradcomp {

Topology BuildTopology(std::unique_ptr<Communicator> world, int forced_local_size, LocalTransport transport,
                       size_t shm_staging_bytes) {
  GC_ENFORCE(world != nullptr, "BuildTopology needs a world communicator");
  if (forced_local_size < 0) GC_THROW("GRADCOMP_LOCAL_SIZE=", forced_local_size, " must be >= 0");
  if (forced_local_size > 0 && world->size() % forced_local_size != 0) {
    GC_THROW("GRADCOMP_LOCAL_SIZE=", forced_local_size, " does not divide the world size ", world->size());
  }
  Topology topo;
  topo.local = world->SplitLocal(forced_local_size);
  if (transport == LocalTransport::kSharedMemory) {
    // Over MPI, the node's ranks exchange through a shared-memory window, over TCP through a
    // POSIX shared-memory object (the tests' in-process ranks share memory already).
    if (const auto* node = dynamic_cast<const MpiCommunicator*>(topo.local.get())) {
#if defined(GRADCOMP_SIMULATION)
      (void)node;
      GC_THROW("the shared-memory node transport does not exist under SimGrid's SMPI (no MPI-3 shared windows): ",
               "simulate nodes with LocalTransport::kMessages");
#else
      topo.local = MakeMpiShmCommunicator(node->handle(), shm_staging_bytes);
#endif
    } else if (std::string(topo.local->kind()) == "tcp") {
      topo.local = MakePosixShmCommunicator(std::move(topo.local), shm_staging_bytes);
    }
  }
  topo.cross = world->Split(topo.local->rank(), world->rank());
  // Every rank learns every node's size: hierarchy needs the same number of ranks per node.
  const int n = world->size();
  int mine = topo.local->size();
  std::vector<int> sizes(static_cast<size_t>(n));
  world->Allgatherv(&mine, sizes.data(), std::vector<size_t>(static_cast<size_t>(n), sizeof(int)));
  for (int s : sizes) topo.homogeneous = topo.homogeneous && (s == mine);
  topo.world = std::move(world);
  return topo;
}

std::vector<std::vector<int>> NodeColumns(const Topology& topo) {
  GC_ENFORCE(topo.homogeneous, "NodeColumns needs the same number of ranks on every node");
  const int n = topo.size();
  const int mine[2] = {topo.local_rank(), topo.cross_rank()};
  std::vector<int> all(2 * static_cast<size_t>(n));
  topo.world->Allgatherv(mine, all.data(), std::vector<size_t>(static_cast<size_t>(n), sizeof(mine)));
  std::vector<std::vector<int>> columns(static_cast<size_t>(topo.local_size()),
                                        std::vector<int>(static_cast<size_t>(topo.cross_size()), -1));
  for (int r = 0; r < n; ++r) {
    const size_t l = static_cast<size_t>(all[2 * r]), c = static_cast<size_t>(all[2 * r + 1]);
    GC_ENFORCE(l < columns.size() && c < columns[l].size() && columns[l][c] < 0, "rank ", r, " has local rank ", l,
               " and cross rank ", c, ", which another rank has too or which is out of range");
    columns[l][c] = r;
  }
  return columns;
}

std::vector<size_t> RegionSizes(const std::vector<std::vector<int>>& columns, const std::vector<size_t>& sizes) {
  std::vector<size_t> regions;
  for (const std::vector<int>& column : columns) {
    size_t total = 0;
    for (int r : column) total += sizes[static_cast<size_t>(r)];
    regions.push_back(total);
  }
  return regions;
}

namespace {

// The row length of the most square grid of n ranks with rows at least as long as columns.
int MostSquareColumns(int n) {
  int rows = 1;
  for (int r = 1; r * r <= n; ++r) {
    if (n % r == 0) rows = r;
  }
  return n / rows;
}

// The grid `column` runs on (MakeNestedGrid), or null where its first level has one row or column.
std::unique_ptr<Grid> ColumnGrid(Communicator& column, const std::vector<int>& columns) {
  if (columns.empty()) return nullptr;
  auto inner = std::make_unique<Grid>(MakeNestedGrid(column, columns));
  if (inner->rows() > 1 && inner->columns() > 1) return inner;
  return nullptr;
}

}  // namespace

Grid MakeGrid(Communicator& comm, int columns) {
  const int n = comm.size();
  if (columns <= 0) columns = MostSquareColumns(n);
  GC_ENFORCE(n % columns == 0, "a grid of rows of ", columns, " ranks does not divide ", n, " ranks");
  Grid g;
  g.rank = comm.rank();
  g.row = comm.Split(comm.rank() / columns, comm.rank());
  g.column = comm.Split(comm.rank() % columns, comm.rank());
  return g;
}

Grid MakeNestedGrid(Communicator& comm, const std::vector<int>& columns) {
  Grid g = MakeGrid(comm, columns.empty() ? comm.size() : columns[0]);
  if (columns.size() > 1 && g.rows() > 1 && g.columns() > 1) {
    g.column_grid = ColumnGrid(*g.column, std::vector<int>(columns.begin() + 1, columns.end()));
  }
  return g;
}

Grid MakeNodeGrid(const Topology& topo, const std::vector<int>& cross_columns) {
  GC_ENFORCE(topo.homogeneous, "a grid whose rows are the nodes needs the same number of ranks on every node");
  // Copies of the node's and the cross-node communicator (their own tags' space; a shared-memory
  // node's copy is its point-to-point communicator, which the row steps use).
  Grid g;
  g.rank = topo.rank();
  g.row = topo.local->Split(0, topo.local_rank());
  g.column = topo.cross->Split(0, topo.cross_rank());
  g.column_grid = ColumnGrid(*g.column, cross_columns);
  return g;
}

std::vector<int> GridShape(int ranks, int ranks_per_node, int nest_min_ranks, int node_messages) {
  GC_ENFORCE(ranks >= 1 && ranks_per_node >= 1, "GridShape of ", ranks, " ranks, ", ranks_per_node, " a node");
  const int longest = std::max(2, node_messages / ranks_per_node);
  std::vector<int> shape;
  for (int n = ranks;;) {
    int b = MostSquareColumns(n);
    if (b > longest) {
      // The longest row that divides n and keeps the node's messages in bounds (none: a prime
      // n keeps one row, flat SRA).
      for (int d = longest; d >= 2; --d) {
        if (n % d == 0) {
          b = d;
          break;
        }
      }
    }
    shape.push_back(b);
    n /= b;
    if (n <= longest || n < nest_min_ranks) break;
  }
  return shape;
}

}  // namespace gradcomp
