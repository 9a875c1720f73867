// Compressed reduce-scatter (compressed_shards.h): SRA's reduce-scatter half (the scatter and the
// owner's float32 sum) over one communicator, or summed inside each node first and compressed
// across nodes.

#include "ops/collectives/compressed_shards.h"
#include "ops/collectives/compressed_steps.h"
#include "ops/collectives/context.h"
#include "ops/collectives/sra_halves.h"

namespace gradcomp {

namespace {

constexpr int kReducescatterTag = 0x5400;

// The options of this rank's shard of `o` alone (its output's size and dtype).
CompressedAllreduceOptions ShardOf(const CompressedAllreduceOptions& o, size_t count) {
  CompressedAllreduceOptions shard = o;
  shard.count = count;
  shard.segments.clear();
  shard.residual = nullptr;
  return shard;
}

// Over `comm`: the reduce-scatter half (sra_halves.h) over the shards' plan: every peer's shard
// of x (o.count float32 values, prescaled and compensated) encoded and exchanged, this rank's
// shard summed in float32 (its own values first, then the peers' in rank order) and scaled into
// `out`. o.residual (o.count floats, or null) receives what each peer's encoding lost.
void ScatterReduce(Communicator& comm, const CompressedAllreduceOptions& o, const std::vector<size_t>& counts,
                   const float* x, const OutputScaling& scale, float* out, CompressionWorkspace& ws,
                   CompressedAllreduceStats* st) {
  Stream& stream = *ws.stream;
  const SraPlan plan = SraPlan::OfShards(o, counts, static_cast<size_t>(comm.rank()));
  ScatterHalf half(o, plan, SraScatterParams(o.params, comm.rank()), x, ws, false);
  half.Reserve(WireOnDevice(comm, ws));
  {
    Phase phase(o, "COMPRESS", &st->compress_seconds);
    half.EncodePeers(0);
    stream.Synchronize();
  }
  {
    Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
    AlltoallAtOnce(comm, kReducescatterTag, ws.send.wire(), plan.ScatterBytes(0, true), ws.recv.wire(),
                   plan.ScatterBytes(0, false));
  }
  Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
  half.Reduce(0, out, plan.chunk_offsets[plan.mine], nullptr);
  scale.Apply(ws.device, out, plan.chunks[plan.mine], stream);
  stream.Synchronize();
  st->bytes_sent += plan.send_total;
}

// Copies the shards of `column` from the buffer layout (shards at `offsets`) into one region
// (the shards one after the other), or with `unpack` from a region back into the buffer layout.
void CopyColumn(Device& d, Stream& stream, const std::vector<int>& column, const std::vector<size_t>& counts,
                const std::vector<size_t>& offsets, const float* from, float* to, bool unpack) {
  size_t at = 0;
  for (int r : column) {
    const size_t q = static_cast<size_t>(r), bytes = counts[q] * sizeof(float);
    if (unpack) {
      d.Copy(to + offsets[q], from + at, bytes, stream);
    } else {
      d.Copy(to + at, from + offsets[q], bytes, stream);
    }
    at += counts[q];
  }
}

}  // namespace

CompressedAllreduceStats CompressedReducescatter(Communicator& comm, const CompressedAllreduceOptions& o,
                                                 const std::vector<size_t>& counts) {
  CompressedAllreduceStats st;
  WithTensorContext("compressed reducescatter", o.name, [&] {
    ValidateShards(o, counts, comm.size(), comm.rank(), false);
    if (o.count == 0) return;
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    const float* x = WorkingCopy(o, ws);
    const CompressedAllreduceOptions shard = ShardOf(o, counts[static_cast<size_t>(comm.rank())]);
    float* out = ResultBuffer(shard, ws);
    ScatterReduce(comm, o, counts, x, OutputScale(o, comm.size()), out, ws, &st);
    StoreOutput(shard, ws, out);
  });
  return st;
}

// Inside the node the working copy is packed by region (local rank k's: the shards of cross
// communicator k) and reduce-scattered uncompressed; across nodes each local rank's region is
// the compressed reduce-scatter's buffer. Error feedback needs no layer of its own: the residual
// a rank carries is added to its values before the node's sum, which is the same as adding it
// to that sum (the other ranks of the node carry zeros there).
CompressedAllreduceStats HierarchicalCompressedReducescatter(const Topology& topo, const CompressedAllreduceOptions& o,
                                                             const std::vector<size_t>& counts) {
  CompressedAllreduceStats st;
  WithTensorContext("hierarchical compressed reducescatter", o.name, [&] {
    ValidateShards(o, counts, topo.size(), topo.rank(), false);
    CheckNodeShards(topo, o);
    if (o.count == 0) return;
    const std::vector<std::vector<int>> columns = NodeColumns(topo);
    const size_t l = static_cast<size_t>(topo.local_rank());
    const std::vector<size_t> regions = RegionSizes(columns, counts), offsets = Offsets(counts);
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    Device& d = ws.device;
    Stream& stream = *ws.stream;
    const float* x = WorkingCopy(o, ws);
    ws.shard.Reserve(d, o.count * sizeof(float));
    float* packed = ws.shard.device_as<float>();
    for (size_t k = 0, at = 0; k < columns.size(); at += regions[k], ++k) {
      CopyColumn(d, stream, columns[k], counts, offsets, x, packed + at, false);
    }
    ws.shard_out.Reserve(d, regions[l] * sizeof(float));
    float* node_sum = ws.shard_out.device_as<float>();
    stream.Synchronize();
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      topo.local->ReduceScatter(packed, node_sum, regions, DataType::kFloat32, ReduceOp::kSum);
    }
    // Across nodes: this local rank's region, its tensors' bounds and its residuals in region order.
    CompressedAllreduceOptions across = ShardOf(o, regions[l]);
    std::vector<size_t> shard_counts;
    const std::vector<size_t> bounds = SegmentBounds(o);
    for (int r : columns[l]) {
      const size_t q = static_cast<size_t>(r);
      shard_counts.push_back(counts[q]);
      for (const Piece& pc : PiecesIn(offsets[q], counts[q], bounds)) across.segments.push_back(pc.len);
    }
    if (o.residual != nullptr) {
      across.residual = packed;  // the packed values are summed already: the space is free
      CopyColumn(d, stream, columns[l], counts, offsets, o.residual, across.residual, false);
    }
    const CompressedAllreduceOptions shard = ShardOf(o, counts[static_cast<size_t>(topo.rank())]);
    float* out = ResultBuffer(shard, ws);
    ScatterReduce(*topo.cross, across, shard_counts, node_sum, OutputScale(o, topo.size()), out, ws, &st);
    if (o.residual != nullptr) CopyColumn(d, stream, columns[l], counts, offsets, across.residual, o.residual, true);
    StoreOutput(shard, ws, out);
  });
  return st;
}

}  // namespace gradcomp
