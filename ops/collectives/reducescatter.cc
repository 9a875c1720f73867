#include "ops/collectives/reducescatter.h"

#include <cstring>

#include "ops/collectives/context.h"
#include "ops/device/staging.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

void CheckOptions(const ReducescatterOptions& o, int ranks) {
  if (o.counts.size() != static_cast<size_t>(ranks)) {
    throw InvalidArgument("reducescatter needs one count per rank: got " + std::to_string(o.counts.size()) + " for " +
                          std::to_string(ranks) + " ranks");
  }
  if (o.dtype == DataType::kBool && o.op == ReduceOp::kAverage) {
    throw InvalidArgument("reducescatter: op average is not defined for bool tensors");
  }
}

size_t Total(const std::vector<size_t>& counts) {
  size_t total = 0;
  for (size_t c : counts) total += c;
  return total;
}

ReduceOp Lowered(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

// The node-first reduce-scatter's staging buffers, kept by the thread that runs the collectives
// (as the node-first allgather's, allgather.cc): FSDP reduce-scatters a unit's gradients at
// every step, and new buffers of its size each time cost a zero fill and fresh pages
// (docs/benchmarks.md, "Node-first exchanges keep their staging buffers").
thread_local Scratch tls_packed, tls_node_sum;

}  // namespace

void Reducescatter(Communicator& comm, const ReducescatterOptions& o) {
  WithTensorContext("reducescatter", o.name, [&] {
    CheckOptions(o, comm.size());
    const size_t total = Total(o.counts), esize = DataTypeSize(o.dtype);
    const void* src = o.input;
    std::vector<char> scaled;
    if (o.prescale != 1.0 && total > 0) {
      scaled.assign(static_cast<const char*>(o.input), static_cast<const char*>(o.input) + total * esize);
      ScaleInPlace(scaled.data(), total, o.dtype, o.prescale);
      src = scaled.data();
    }
    comm.ReduceScatter(src, o.output, o.counts, o.dtype, Lowered(o.op));
    FinishReduction(o.output, o.counts[static_cast<size_t>(comm.rank())], o.dtype, o.op, o.postscale, comm.size());
  });
}

void HierarchicalReducescatter(const Topology& topo, const ReducescatterOptions& o) {
  WithTensorContext("hierarchical reducescatter", o.name, [&] {
    CheckOptions(o, topo.size());
    const std::vector<std::vector<int>> columns = NodeColumns(topo);
    const size_t esize = DataTypeSize(o.dtype), l = static_cast<size_t>(topo.local_rank());
    const std::vector<size_t> offsets = Offsets(o.counts);
    // The input packed by node column (local rank k's region: the slices of columns[k]'s ranks
    // in cross-rank order), scaled on the way.
    const size_t total = Total(o.counts);
    char* packed = static_cast<char*>(tls_packed.Reserve(HostDevice(), total * esize, true));
    size_t at = 0;
    for (const std::vector<int>& column : columns) {
      for (int r : column) {
        const size_t q = static_cast<size_t>(r);
        if (o.counts[q] > 0) {
          std::memcpy(packed + at * esize, static_cast<const char*>(o.input) + offsets[q] * esize,
                      o.counts[q] * esize);
        }
        at += o.counts[q];
      }
    }
    if (o.prescale != 1.0 && total > 0) ScaleInPlace(packed, total, o.dtype, o.prescale);
    const std::vector<size_t> regions = RegionSizes(columns, o.counts);
    char* node_sum = static_cast<char*>(tls_node_sum.Reserve(HostDevice(), regions[l] * esize, true));
    topo.local->ReduceScatter(packed, node_sum, regions, o.dtype, Lowered(o.op));
    std::vector<size_t> column_counts;
    for (int r : columns[l]) column_counts.push_back(o.counts[static_cast<size_t>(r)]);
    topo.cross->ReduceScatter(node_sum, o.output, column_counts, o.dtype, Lowered(o.op));
    FinishReduction(o.output, o.counts[static_cast<size_t>(topo.rank())], o.dtype, o.op, o.postscale, topo.size());
  });
}

}  // namespace gradcomp
