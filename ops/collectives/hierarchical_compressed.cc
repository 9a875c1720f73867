// Hierarchical compressed allreduce (compressed_allreduce.h): uncompressed inside each node
// (through the shared-memory window when the local communicator is shm), SRA (flat or 2-D)
// across nodes.
// The node-local steps move float32 values (a GPU's through host staging unless the local
// communicator reads device memory); SRA runs on the device.
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
    const OutputScaling scale = OutputScale(o, topo.size());
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
    // The local communicator reads the node's values and writes the result where it can reach
    // them: the tensors themselves on the host device, or on a device whose memory it reads
    // (NCCL); a GPU's tensors through host staging for a host communicator (MPI, shm).
    const bool local_on_device = WireOnDevice(local, ws);
    const bool direct = local_on_device || d.space() != MemorySpace::kDevice;
    const float* input = WorkingCopy(o, ws);
    StagedBuffer& x = ws.x;
    const void* local_in = input;
    if (input == x.device_as<float>()) {
      x.Reserve(d, bytes, local_on_device);  // keeps the working copy: the same size
      x.ToWire(0, bytes, stream);
      local_in = x.wire();
    } else if (!direct) {
      x.Reserve(d, bytes, false);
      d.CopyToHost(x.host(), input, bytes, stream);
      local_in = x.host();
    } else {
      StagedBuffer::CountAsGpuCopy(sim::Work::kToHost, bytes);
    }
    // The result, on the local communicator's side.
    StagedBuffer& result = ws.out;
    float* const direct_out = direct ? ResultBuffer(o, ws) : nullptr;
    if (!direct) result.Reserve(d, bytes, false);
    void* const local_out = direct ? static_cast<void*>(direct_out) : result.host();
    stream.Synchronize();
    if (leader_only) {
      // The node's sum on its leader; leaders compress across nodes; the node gets the result.
      x.Reserve(d, bytes, local_on_device);
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.Allreduce(local_in, x.wire(), o.count, DataType::kFloat32, ReduceOp::kSum);
      }
      if (local.rank() == 0) {  // residuals: of node sums
        x.FromWire(0, bytes, stream);
        if (direct) {
          across(o, x.device_as<float>(), direct_out);
        } else {
          across(o, x.device_as<float>(), result.device_as<float>());
          result.ToWire(0, bytes, stream);
        }
        stream.Synchronize();
      }
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Broadcast(local_out, bytes, 0);
    } else {
      // Shard of the node sum; SRA of the shard across nodes; the node gathers the shards.
      const std::vector<size_t> shards = EvenSplit(o.count, local.size());
      const size_t me = static_cast<size_t>(local.rank()), s0 = Offsets(shards)[me], len = shards[me];
      StagedBuffer& shard = ws.shard;
      shard.Reserve(d, len * sizeof(float), local_on_device);
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.ReduceScatter(local_in, shard.wire(), shards, DataType::kFloat32, ReduceOp::kSum);
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
      local.Allgatherv(shard_out.wire(), local_out, shard_bytes);
    }
    if (direct) {
      StagedBuffer::CountAsGpuCopy(sim::Work::kFromHost, bytes);
      StoreOutput(o, ws, direct_out);
    } else {
      result.FromWire(0, bytes, stream);
      StoreOutput(o, ws, result.device_as<float>());
    }
  });
  return st;
}

}  // namespace gradcomp
