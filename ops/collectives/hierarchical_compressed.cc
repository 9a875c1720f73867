// Hierarchical compressed allreduce (compressed_allreduce.h): uncompressed inside each node
// (through the shared-memory window when the local communicator is shm), SRA across nodes.
#include "ops/collectives/context.h"
#include "ops/collectives/sra.h"

namespace gradcomp {

CompressedAllreduceStats HierarchicalCompressedAllreduce(const Topology& topo, const CompressedAllreduceOptions& o,
                                                         bool leader_only) {
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
    CompressionWorkspace local_ws;
    CompressionWorkspace& ws = o.workspace ? *o.workspace : local_ws;
    const float* input = WorkingCopy(o, ws);
    std::vector<float>& x = ws.x;  // summed over the node in place below
    if (input != x.data()) x.assign(input, input + o.count);
    std::vector<float>& result = ws.out;
    result.resize(o.count);
    if (leader_only) {
      // The node's sum on its leader; leaders compress across nodes; the node gets the result.
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.Allreduce(x.data(), x.data(), o.count, DataType::kFloat32, ReduceOp::kSum);
      }
      if (local.rank() == 0) Sra(*topo.cross, o, x.data(), scale, result.data(), ws, &st);  // residuals: node sums
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Broadcast(result.data(), o.count * sizeof(float), 0);
    } else {
      // Shard of the node sum; SRA of the shard across nodes; the node gathers the shards.
      const std::vector<size_t> shards = EvenSplit(o.count, local.size());
      const size_t me = static_cast<size_t>(local.rank()), s0 = Offsets(shards)[me], len = shards[me];
      std::vector<float>& shard = ws.shard;
      shard.resize(len);
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.ReduceScatter(x.data(), shard.data(), shards, DataType::kFloat32, ReduceOp::kSum);
      }
      CompressedAllreduceOptions sub = o;
      sub.count = len;
      sub.segments.clear();
      for (const Piece& pc : PiecesIn(s0, len, SegmentBounds(o))) sub.segments.push_back(pc.len);
      sub.residual = o.residual ? o.residual + s0 : nullptr;
      sub.reduced_residual = o.reduced_residual ? o.reduced_residual + s0 : nullptr;
      std::vector<float>& shard_out = ws.shard_out;
      shard_out.resize(len);
      Sra(*topo.cross, sub, shard.data(), scale, shard_out.data(), ws, &st);
      std::vector<size_t> bytes(shards.size());
      for (size_t i = 0; i < shards.size(); ++i) bytes[i] = shards[i] * sizeof(float);
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Allgatherv(shard_out.data(), result.data(), bytes);
    }
    StoreOutput(o, result.data());
  });
  return st;
}

}  // namespace gradcomp
