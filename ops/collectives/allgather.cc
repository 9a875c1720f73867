#include "ops/collectives/allgather.h"

#include <cstdint>
#include <cstring>

#include "ops/collectives/context.h"
#include "ops/device/staging.h"

namespace gradcomp {

namespace {

// Each rank's contribution in bytes, after checking the counts against the world and this rank.
std::vector<size_t> CheckedBytes(const AllgatherOptions& o, int ranks, int rank) {
  const size_t me = static_cast<size_t>(rank);
  if (o.counts.size() != static_cast<size_t>(ranks)) {
    throw InvalidArgument("allgather needs one count per rank: got " + std::to_string(o.counts.size()) + " for " +
                          std::to_string(ranks) + " ranks");
  }
  if (o.counts[me] != o.count) {
    throw InvalidArgument("allgather: rank " + std::to_string(me) + " contributes " + std::to_string(o.count) +
                          " elements but counts[" + std::to_string(me) + "] = " + std::to_string(o.counts[me]));
  }
  const size_t esize = DataTypeSize(o.dtype);
  std::vector<size_t> bytes(o.counts.size());
  for (size_t r = 0; r < bytes.size(); ++r) bytes[r] = o.counts[r] * esize;
  return bytes;
}

// The node-first allgather's staging buffers, kept by the thread that runs the collectives
// (the background thread; a test's thread ranks each): FSDP gathers a unit's parameters at
// every step, and new buffers of its size each time cost a zero fill and fresh pages
// (docs/benchmarks.md, "Node-first exchanges keep their staging buffers").
thread_local Scratch tls_region, tls_packed;

}  // namespace

std::vector<size_t> AllgatherCounts(Communicator& comm, size_t my_count) {
  const size_t n = static_cast<size_t>(comm.size());
  std::vector<uint64_t> all(n);
  const uint64_t mine = my_count;
  comm.Allgatherv(&mine, all.data(), std::vector<size_t>(n, sizeof(uint64_t)));
  return std::vector<size_t>(all.begin(), all.end());
}

void Allgather(Communicator& comm, const AllgatherOptions& o) {
  WithTensorContext("allgather", o.name, [&] {
    comm.Allgatherv(o.input, o.output, CheckedBytes(o, comm.size(), comm.rank()));
  });
}

void HierarchicalAllgather(const Topology& topo, const AllgatherOptions& o) {
  WithTensorContext("hierarchical allgather", o.name, [&] {
    const std::vector<size_t> bytes = CheckedBytes(o, topo.size(), topo.rank()), offsets = Offsets(bytes);
    const std::vector<std::vector<int>> columns = NodeColumns(topo);
    const size_t l = static_cast<size_t>(topo.local_rank());
    // Across nodes: this local rank's region (the inputs of columns[l]'s ranks in cross-rank
    // order); inside the node: every local rank's region, then each input to its place.
    std::vector<size_t> column_bytes;
    for (int r : columns[l]) column_bytes.push_back(bytes[static_cast<size_t>(r)]);
    const std::vector<size_t> region_bytes = RegionSizes(columns, bytes), region_at = Offsets(region_bytes);
    char* region = static_cast<char*>(tls_region.Reserve(HostDevice(), region_bytes[l], true));
    const size_t node_bytes = region_at.back() + region_bytes.back();
    char* packed = static_cast<char*>(tls_packed.Reserve(HostDevice(), node_bytes, true));
    topo.cross->Allgatherv(o.input, region, column_bytes);
    topo.local->Allgatherv(region, packed, region_bytes);
    for (size_t k = 0; k < columns.size(); ++k) {
      size_t at = region_at[k];
      for (int r : columns[k]) {
        const size_t q = static_cast<size_t>(r);
        if (bytes[q] > 0) std::memcpy(static_cast<char*>(o.output) + offsets[q], packed + at, bytes[q]);
        at += bytes[q];
      }
    }
  });
}

}  // namespace gradcomp
