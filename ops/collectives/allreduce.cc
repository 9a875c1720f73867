#include "ops/collectives/allreduce.h"

#include <cstring>

#include "ops/collectives/adasum.h"
#include "ops/collectives/context.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

void ValidateAllreduceOp(const AllreduceOptions& o) {
  if (o.dtype == DataType::kBool && o.op == ReduceOp::kAverage) {
    throw InvalidArgument("allreduce: op average is not defined for bool tensors (use sum, min or max)");
  }
}

namespace {

void Validate(const AllreduceOptions& o) {
  if (o.count > 0 && (o.input == nullptr || o.output == nullptr)) {
    throw InvalidArgument("allreduce got a null buffer for " + std::to_string(o.count) + " elements");
  }
  ValidateAllreduceOp(o);
}

// Copies input to output scaled by prescale when needed; returns the buffer to reduce from.
const void* ApplyPrescale(const AllreduceOptions& o) {
  if (o.prescale == 1.0) return o.input;
  if (o.output != o.input) std::memcpy(o.output, o.input, o.count * DataTypeSize(o.dtype));
  ScaleInPlace(o.output, o.count, o.dtype, o.prescale);
  return o.output;
}

ReduceOp LoweredOp(ReduceOp op) { return op == ReduceOp::kAverage ? ReduceOp::kSum : op; }

}  // namespace

void Allreduce(Communicator& comm, const AllreduceOptions& o) {
  if (o.op == ReduceOp::kAdasum) {
    Validate(o);
    std::vector<char> scratch;
    AdasumAllreduce(comm, {BufferPiece{o.input, o.output, o.count}}, o, scratch);
    return;
  }
  WithTensorContext("allreduce", o.name, [&] {
    Validate(o);
    if (o.count == 0) return;
    const void* src = ApplyPrescale(o);
    comm.Allreduce(src, o.output, o.count, o.dtype, LoweredOp(o.op));
    FinishReduction(o.output, o.count, o.dtype, o.op, o.postscale, comm.size());
  });
}

void HierarchicalAllreduce(const Topology& topo, const AllreduceOptions& o) {
  WithTensorContext("hierarchical allreduce", o.name, [&] {
    Validate(o);
    if (o.op == ReduceOp::kAdasum) throw InvalidArgument("op adasum has no hierarchical form (FusedAllreduce runs it)");
    if (!topo.homogeneous) {
      GC_THROW("hierarchical allreduce needs the same number of ranks on every node (rank ", topo.rank(),
               " has ", topo.local_size(), " local ranks)");
    }
    if (o.count == 0) return;
    Communicator& local = *topo.local;
    const size_t esize = DataTypeSize(o.dtype);
    const void* src = ApplyPrescale(o);
    const std::vector<size_t> counts = EvenSplit(o.count, local.size());
    const size_t mine = counts[static_cast<size_t>(local.rank())];
    std::vector<char> shard(mine * esize);
    local.ReduceScatter(src, shard.data(), counts, o.dtype, LoweredOp(o.op));
    if (topo.cross_size() > 1) topo.cross->Allreduce(shard.data(), shard.data(), mine, o.dtype, LoweredOp(o.op));
    FinishReduction(shard.data(), mine, o.dtype, o.op, o.postscale, topo.size());
    std::vector<size_t> bytes(counts.size());
    for (size_t i = 0; i < counts.size(); ++i) bytes[i] = counts[i] * esize;
    local.Allgatherv(shard.data(), o.output, bytes);
  });
}

}  // namespace gradcomp
