// The uncompressed allreduce's table (uncompressed_algorithms.h): its rows and the choice.
#include "ops/collectives/uncompressed_algorithms.h"

#include "ops/collectives/adasum.h"
#include "ops/collectives/context.h"
#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

size_t RawBytes(const UncompressedCase& c) { return c.count * DataTypeSize(c.dtype); }

// A ring allreduce of `bytes` over `ranks` ranks, as a communicator's own one is estimated: a
// reduce-scatter and an allgather, each (ranks - 1) messages of 1/ranks of the buffer.
AlgorithmCost Ring(int ranks, size_t bytes) {
  const auto n = static_cast<size_t>(ranks);
  return {2 * (n - 1), 2 * bytes * (n - 1) / n};
}

// Adasum's tree over `ranks` ranks: vector halving then distance doubling over the largest power
// of two p, a message of half the range held at each of log2(p) levels each way (the dot
// products' few doubles a level are left out).
AlgorithmCost Tree(int ranks, size_t bytes) {
  size_t p = 1, levels = 0;
  while (2 * p <= static_cast<size_t>(ranks)) {
    p *= 2;
    ++levels;
  }
  return {2 * levels, 2 * bytes * (p - 1) / p};
}

AlgorithmCost Plus(AlgorithmCost a, AlgorithmCost b) { return {a.messages + b.messages, a.wire_bytes + b.wire_bytes}; }

// --- adasum_nodes: each node's average, Adasum's tree across nodes (NodeAdasumAllreduce) ---
AlgorithmCost AdasumNodesCost(const UncompressedCase& c) {
  return Plus(Ring(c.topo->local_size(), RawBytes(c)), Tree(c.topo->cross_size(), RawBytes(c)));
}

void RunAdasumNodes(const UncompressedCase& c, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                    std::vector<char>& fusion) {
  NodeAdasumAllreduce(*c.topo, pieces, o, fusion);
}

// --- adasum: Adasum's tree over every rank ---
AlgorithmCost AdasumCost(const UncompressedCase& c) { return Tree(c.topo->size(), RawBytes(c)); }

void RunAdasum(const UncompressedCase& c, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
               std::vector<char>& fusion) {
  AdasumAllreduce(*c.topo->world, pieces, o, fusion);
}

// --- hierarchical: HierarchicalAllreduce of the fused tensors (of the one tensor in place) ---
AlgorithmCost HierarchicalCost(const UncompressedCase& c) {
  const int local = c.topo->local_size();
  // The node's reduce-scatter and allgather (a ring's two halves), the ring of this rank's shard
  // across nodes.
  return Plus(Ring(local, RawBytes(c)), Ring(c.topo->cross_size(), RawBytes(c) / static_cast<size_t>(local)));
}

void RunHierarchical(const UncompressedCase& c, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                     std::vector<char>& fusion) {
  AllreduceOptions whole = o;
  if (pieces.size() == 1 && pieces[0].input != nullptr && pieces[0].output != nullptr) {
    whole.input = pieces[0].input;
    whole.output = pieces[0].output;
    whole.count = pieces[0].count;
    HierarchicalAllreduce(*c.topo, whole);
    return;
  }
  whole.count = FusePieces(pieces, o.dtype, o.prescale, fusion);
  whole.input = whole.output = fusion.data();
  whole.prescale = 1.0;
  HierarchicalAllreduce(*c.topo, whole);
  UnfusePieces(pieces, o.dtype, fusion.data(), nullptr);
}

// --- node and communicator: a communicator's AllreducePieces, finished for Average and postscale ---
void RunPieces(Communicator& comm, const UncompressedCase& c, const std::vector<BufferPiece>& pieces,
               const AllreduceOptions& o, std::vector<char>& fusion) {
  FinishFn finish;
  if (o.op == ReduceOp::kAverage || o.postscale != 1.0) {
    const int ranks = c.topo->size();
    finish = [&o, ranks](void* data, size_t count) { FinishReduction(data, count, o.dtype, o.op, o.postscale, ranks); };
  }
  comm.AllreducePieces(pieces, o.dtype, o.op == ReduceOp::kAverage ? ReduceOp::kSum : o.op, o.prescale, finish, fusion);
}

AlgorithmCost NodeCost(const UncompressedCase& c) { return Ring(c.topo->local_size(), RawBytes(c)); }

void RunNode(const UncompressedCase& c, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
             std::vector<char>& fusion) {
  RunPieces(*c.topo->local, c, pieces, o, fusion);
}

AlgorithmCost CommunicatorCost(const UncompressedCase& c) { return Ring(c.topo->size(), RawBytes(c)); }

void RunCommunicator(const UncompressedCase& c, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                     std::vector<char>& fusion) {
  RunPieces(*c.topo->world, c, pieces, o, fusion);
}

bool NeedsHold(const UncompressedAllreduceAlgorithm& row, const UncompressedCase& c) {
  return row.adasum == (c.op == ReduceOp::kAdasum) && (!row.hierarchy || c.hierarchy) &&
         (!row.one_node || c.topo->cross_size() == 1);
}

}  // namespace

const std::vector<UncompressedAllreduceAlgorithm>& UncompressedAllreduceAlgorithms() {
  static const std::vector<UncompressedAllreduceAlgorithm> rows = {
      {"adasum_nodes", "Adasum's tree across nodes of each node's average", true, true, false, AdasumNodesCost,
       RunAdasumNodes},
      {"adasum", "Adasum's tree over every rank", true, false, false, AdasumCost, RunAdasum},
      {"hierarchical", "reduce-scatter inside each node, allreduce across nodes, allgather inside each node", false,
       true, false, HierarchicalCost, RunHierarchical},
      {"node", "the node's communicator (the world is one node)", false, false, true, NodeCost, RunNode},
      {"communicator", "the world communicator's own allreduce", false, false, false, CommunicatorCost,
       RunCommunicator},
  };
  return rows;
}

const UncompressedAllreduceAlgorithm* LookupUncompressedAllreduce(std::string_view name) {
  for (const UncompressedAllreduceAlgorithm& row : UncompressedAllreduceAlgorithms()) {
    if (name == row.name) return &row;
  }
  return nullptr;
}

const UncompressedAllreduceAlgorithm& CommunicatorAllreduce() { return UncompressedAllreduceAlgorithms().back(); }

const UncompressedAllreduceAlgorithm& ChooseUncompressedAllreduce(const UncompressedCase& c) {
  for (const UncompressedAllreduceAlgorithm& row : UncompressedAllreduceAlgorithms()) {
    if (NeedsHold(row, c)) return row;
  }
  GC_THROW("no uncompressed allreduce algorithm reduces op ", ReduceOpName(c.op));  // communicator: every other
}

const UncompressedAllreduceAlgorithm& FusedAllreduce(const Topology& topo, bool hierarchical,
                                                     const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                                                     std::vector<char>& fusion) {
  UncompressedCase c{&topo, o.op, o.dtype, 0, hierarchical};
  for (const BufferPiece& piece : pieces) c.count += piece.count;
  const UncompressedAllreduceAlgorithm* row = nullptr;
  WithTensorContext("allreduce", o.name, [&] {
    ValidateAllreduceOp(o);  // the pieces carry the buffers
    row = &ChooseUncompressedAllreduce(c);
    row->run(c, pieces, o, fusion);
  });
  return *row;
}

}  // namespace gradcomp
