// Hierarchical compressed allreduce (compressed_allreduce.h): uncompressed inside each node
// (through the shared-memory window when the local communicator is shm), SRA (flat or 2-D)
// across nodes.
// The node-local steps move float32 values (a GPU's through host staging unless the local
// communicator reads device memory); SRA runs on the device.
#include <functional>

#include "ops/collectives/context.h"
#include "ops/collectives/sra.h"

namespace gradcomp {

namespace {

// The compressed allreduce across nodes of q's values at `in` into `result` (on the device).
using AcrossNodes = std::function<void(const CompressedAllreduceOptions& q, const float* in, float* result)>;

// Where the node-local steps read this rank's values and write the result: the tensors
// themselves on the host device, or on a device whose memory the local communicator reads
// (NCCL); a GPU's tensors through host staging for a host communicator (MPI, shm).
struct LocalSide {
  bool on_device = false;  // the local communicator's buffers are device memory
  bool direct = false;     // it reads the input and writes the result where they are
  const void* in = nullptr;
  float* direct_out = nullptr;  // the result buffer, when direct
  void* out = nullptr;          // where the local steps leave the result
};

LocalSide StageLocal(const CompressedAllreduceOptions& o, Communicator& local, CompressionWorkspace& ws) {
  Device& d = ws.device;
  Stream& stream = *ws.stream;
  const size_t bytes = o.count * sizeof(float);
  LocalSide side;
  side.on_device = WireOnDevice(local, ws);
  side.direct = side.on_device || d.space() != MemorySpace::kDevice;
  const float* input = WorkingCopy(o, ws);
  StagedBuffer& x = ws.x;
  side.in = input;
  if (input == x.device_as<float>()) {
    x.Reserve(d, bytes, side.on_device);  // keeps the working copy: the same size
    x.ToWire(0, bytes, stream);
    side.in = x.wire();
  } else if (!side.direct) {
    x.Reserve(d, bytes, false);
    d.CopyToHost(x.host(), input, bytes, stream);
    side.in = x.host();
  } else {
    StagedBuffer::CountAsGpuCopy(sim::Work::kToHost, bytes);
  }
  side.direct_out = side.direct ? ResultBuffer(o, ws) : nullptr;
  if (!side.direct) ws.out.Reserve(d, bytes, false);
  side.out = side.direct ? static_cast<void*>(side.direct_out) : ws.out.host();
  stream.Synchronize();
  return side;
}

// The node's sum on its leader; leaders compress across nodes; the node gets the result.
void ReduceOnLeader(const CompressedAllreduceOptions& o, Communicator& local, CompressionWorkspace& ws,
                    const LocalSide& side, const AcrossNodes& across, CompressedAllreduceStats* st) {
  Stream& stream = *ws.stream;
  const size_t bytes = o.count * sizeof(float);
  StagedBuffer& x = ws.x;
  x.Reserve(ws.device, bytes, side.on_device);
  {
    Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
    local.Allreduce(side.in, x.wire(), o.count, DataType::kFloat32, ReduceOp::kSum);
  }
  if (local.rank() == 0) {  // residuals: of node sums
    x.FromWire(0, bytes, stream);
    if (side.direct) {
      across(o, x.device_as<float>(), side.direct_out);
    } else {
      across(o, x.device_as<float>(), ws.out.device_as<float>());
      ws.out.ToWire(0, bytes, stream);
    }
    stream.Synchronize();
  }
  Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
  local.Broadcast(side.out, bytes, 0);
}

// Shard of the node sum; SRA of the shard across nodes; the node gathers the shards.
void ReduceByShards(const CompressedAllreduceOptions& o, Communicator& local, CompressionWorkspace& ws,
                    const LocalSide& side, const AcrossNodes& across, CompressedAllreduceStats* st) {
  Device& d = ws.device;
  Stream& stream = *ws.stream;
  const std::vector<size_t> shards = EvenSplit(o.count, local.size());
  const size_t me = static_cast<size_t>(local.rank()), s0 = Offsets(shards)[me], len = shards[me];
  StagedBuffer& shard = ws.shard;
  shard.Reserve(d, len * sizeof(float), side.on_device);
  {
    Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
    local.ReduceScatter(side.in, shard.wire(), shards, DataType::kFloat32, ReduceOp::kSum);
  }
  shard.FromWire(0, len * sizeof(float), stream);
  CompressedAllreduceOptions sub = o;
  sub.count = len;
  sub.segments.clear();
  for (const Piece& pc : PiecesIn(s0, len, SegmentBounds(o))) sub.segments.push_back(pc.len);
  sub.residual = o.residual ? o.residual + s0 : nullptr;
  sub.reduced_residual = o.reduced_residual ? o.reduced_residual + s0 : nullptr;
  StagedBuffer& shard_out = ws.shard_out;
  shard_out.Reserve(d, len * sizeof(float), side.on_device);
  across(sub, shard.device_as<float>(), shard_out.device_as<float>());
  shard_out.ToWire(0, len * sizeof(float), stream);
  stream.Synchronize();
  std::vector<size_t> shard_bytes(shards.size());
  for (size_t i = 0; i < shards.size(); ++i) shard_bytes[i] = shards[i] * sizeof(float);
  Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
  local.Allgatherv(shard_out.wire(), side.out, shard_bytes);
}

}  // namespace

CompressedAllreduceStats HierarchicalCompressedAllreduce(const Topology& topo, const CompressedAllreduceOptions& o,
                                                         bool leader_only, const Grid* cross_grid) {
  CompressedAllreduceStats st;
  WithTensorContext("hierarchical compressed allreduce", o.name, [&] {
    ValidateCompressed(o, false);
    if (!topo.homogeneous) {
      GC_THROW("hierarchical allreduce needs the same number of ranks on every node (rank ", topo.rank(), " has ",
               topo.local_size(), " local ranks)");
    }
    if (o.count == 0) return;
    Communicator& local = *topo.local;
    const OutputScaling scale = OutputScale(o, topo.size());
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    // Across nodes: flat SRA, or the 2-D SRA over the cross communicator's grid.
    const AcrossNodes across = [&](const CompressedAllreduceOptions& q, const float* in, float* result) {
      if (cross_grid != nullptr) {
        Sra2d(*cross_grid, q, in, scale, result, ws, &st);
      } else {
        Sra(*topo.cross, q, in, scale, result, ws, &st);
      }
    };
    const LocalSide side = StageLocal(o, local, ws);
    if (leader_only) {
      ReduceOnLeader(o, local, ws, side, across, &st);
    } else {
      ReduceByShards(o, local, ws, side, across, &st);
    }
    if (side.direct) {
      StagedBuffer::CountAsGpuCopy(sim::Work::kFromHost, o.count * sizeof(float));
      StoreOutput(o, ws, side.direct_out);
    } else {
      ws.out.FromWire(0, o.count * sizeof(float), *ws.stream);
      StoreOutput(o, ws, ws.out.device_as<float>());
    }
  });
  return st;
}

}  // namespace gradcomp
