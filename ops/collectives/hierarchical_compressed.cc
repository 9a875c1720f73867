// Hierarchical compressed allreduce (compressed_allreduce.h): uncompressed inside each node
// (through the shared-memory window when the local communicator is shm), SRA (flat or 2-D)
// across nodes.
// The node-local steps move float32 values through host staging; SRA runs on the device.
#include "ops/collectives/context.h"
#include "ops/collectives/sra.h"

namespace gradcomp {

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
    const double scale = OutputScale(o, topo.size());
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    Device& d = ws.device;
    Stream& stream = *ws.stream;
    // Across nodes: flat SRA, or the 2-D SRA over the cross communicator's grid.
    const auto across = [&](const CompressedAllreduceOptions& q, const float* in, float* result) {
      if (cross_grid != nullptr) {
        Sra2d(*cross_grid, q, in, scale, result, ws, &st);
      } else {
        Sra(*topo.cross, q, in, scale, result, ws, &st);
      }
    };
    const size_t bytes = o.count * sizeof(float);
    // The values on the local communicator's side (the host, unless it reads device memory),
    // summed over the node in place below.
    const bool local_on_device = WireOnDevice(local, ws);
    const float* input = WorkingCopy(o, ws);
    StagedBuffer& x = ws.x;
    const bool in_x = input == x.device_as<float>();
    x.Reserve(d, bytes, local_on_device);  // keeps the working copy: the same size
    if (in_x) {
      x.ToWire(0, bytes, stream);
    } else if (local_on_device) {
      d.Copy(x.device(), input, bytes, stream);
    } else {
      d.CopyToHost(x.host(), input, bytes, stream);
    }
    StagedBuffer& result = ws.out;
    result.Reserve(d, bytes, local_on_device);
    stream.Synchronize();
    if (leader_only) {
      // The node's sum on its leader; leaders compress across nodes; the node gets the result.
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.Allreduce(x.wire(), x.wire(), o.count, DataType::kFloat32, ReduceOp::kSum);
      }
      if (local.rank() == 0) {  // residuals: of node sums
        x.FromWire(0, bytes, stream);
        across(o, x.device_as<float>(), result.device_as<float>());
        result.ToWire(0, bytes, stream);
        stream.Synchronize();
      }
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Broadcast(result.wire(), bytes, 0);
    } else {
      // Shard of the node sum; SRA of the shard across nodes; the node gathers the shards.
      const std::vector<size_t> shards = EvenSplit(o.count, local.size());
      const size_t me = static_cast<size_t>(local.rank()), s0 = Offsets(shards)[me], len = shards[me];
      StagedBuffer& shard = ws.shard;
      shard.Reserve(d, len * sizeof(float), local_on_device);
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.ReduceScatter(x.wire(), shard.wire(), shards, DataType::kFloat32, ReduceOp::kSum);
      }
      shard.FromWire(0, len * sizeof(float), stream);
      CompressedAllreduceOptions sub = o;
      sub.count = len;
      sub.segments.clear();
      for (const Piece& pc : PiecesIn(s0, len, SegmentBounds(o))) sub.segments.push_back(pc.len);
      sub.residual = o.residual ? o.residual + s0 : nullptr;
      sub.reduced_residual = o.reduced_residual ? o.reduced_residual + s0 : nullptr;
      StagedBuffer& shard_out = ws.shard_out;
      shard_out.Reserve(d, len * sizeof(float), local_on_device);
      across(sub, shard.device_as<float>(), shard_out.device_as<float>());
      shard_out.ToWire(0, len * sizeof(float), stream);
      stream.Synchronize();
      std::vector<size_t> shard_bytes(shards.size());
      for (size_t i = 0; i < shards.size(); ++i) shard_bytes[i] = shards[i] * sizeof(float);
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Allgatherv(shard_out.wire(), result.wire(), shard_bytes);
    }
    result.FromWire(0, bytes, stream);
    StoreOutput(o, ws, result.device_as<float>());
  });
  return st;
}

}  // namespace gradcomp
