// Compressed allgather (compressed_shards.h): SRA's allgather half (sra_halves.h), each rank's
// shard encoded once, the encodings allgathered (across nodes, then inside each node), every
// shard decoded on every rank.
#include <cstring>

#include "ops/collectives/compressed_shards.h"
#include "ops/collectives/compressed_steps.h"
#include "ops/collectives/context.h"
#include "ops/collectives/sra_halves.h"

namespace gradcomp {

namespace {

constexpr int kAllgatherTag = 0x5410;

// Encodes this rank's shard (the float32 values of o.input: a cast, or the input itself) once,
// into `dst` on the device.
void EncodeOwn(const CompressedAllreduceOptions& o, GatherHalf& half, const SraPlan& plan, CompressionWorkspace& ws,
               uint8_t* dst, CompressedAllreduceStats* st) {
  Phase phase(o, "COMPRESS", &st->compress_seconds);
  CompressedAllreduceOptions own = o;
  own.count = plan.chunks[plan.mine];
  own.prescale = 1.0;
  own.residual = nullptr;
  half.EncodeOwn(0, WorkingCopy(own, ws), plan.chunk_offsets[plan.mine], dst);
}

}  // namespace

CompressedAllreduceStats CompressedAllgather(Communicator& comm, const CompressedAllreduceOptions& o,
                                             const std::vector<size_t>& counts) {
  CompressedAllreduceStats st;
  WithTensorContext("compressed allgather", o.name, [&] {
    ValidateShards(o, counts, comm.size(), comm.rank(), true);
    if (o.count == 0) return;
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    Stream& stream = *ws.stream;
    const SraPlan plan = SraPlan::OfShards(o, counts, static_cast<size_t>(comm.rank()));
    GatherHalf half(o, plan, ws, false, o.output, o.dtype);
    half.Reserve(WireOnDevice(comm, ws));
    EncodeOwn(o, half, plan, ws, ws.own.device(), &st);
    half.Stage(0);
    stream.Synchronize();
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      AllgatherAtOnce(comm, kAllgatherTag, ws.own.wire(), ws.all.wire(), plan.bytes[0]);
    }
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    half.DecodeAll(0, true);
    stream.Synchronize();
    st.bytes_sent += (plan.ranks - 1) * plan.bytes[0][plan.mine];
  });
  return st;
}

// Across nodes each local rank k gathers the encodings of its cross communicator's shards
// (columns[k]), which form region k of the node's buffer of encodings; inside the node the
// regions are allgathered as they are, and every rank decodes every shard from the same bytes.
CompressedAllreduceStats HierarchicalCompressedAllgather(const Topology& topo, const CompressedAllreduceOptions& o,
                                                         const std::vector<size_t>& counts) {
  CompressedAllreduceStats st;
  WithTensorContext("hierarchical compressed allgather", o.name, [&] {
    ValidateShards(o, counts, topo.size(), topo.rank(), true);
    CheckNodeShards(topo, o);
    if (o.count == 0) return;
    const std::vector<std::vector<int>> columns = NodeColumns(topo);
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    Device& d = ws.device;
    Stream& stream = *ws.stream;
    const size_t me = static_cast<size_t>(topo.rank()), l = static_cast<size_t>(topo.local_rank());
    const SraPlan plan = SraPlan::OfShards(o, counts, me);
    const std::vector<size_t>& shard_bytes = plan.bytes[0];
    GatherHalf half(o, plan, ws, false, o.output, o.dtype);
    // Where each shard's encoding lies in the node's buffer: region by region, in cross-rank order.
    std::vector<size_t> at(counts.size()), region_bytes;
    size_t total = 0;
    for (const std::vector<int>& column : columns) {
      size_t region = 0;
      for (int r : column) {
        at[static_cast<size_t>(r)] = total + region;
        region += shard_bytes[static_cast<size_t>(r)];
      }
      region_bytes.push_back(region);
      total += region;
    }
    std::vector<size_t> column_bytes;
    for (int r : columns[l]) column_bytes.push_back(shard_bytes[static_cast<size_t>(r)]);
    const size_t region_at = at[static_cast<size_t>(columns[l][0])];
    ws.own.Reserve(d, region_bytes[l]);
    ws.all.Reserve(d, total);
    ws.send.Reserve(d, shard_bytes[me]);
    EncodeOwn(o, half, plan, ws, ws.send.device(), &st);
    stream.Synchronize();
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      uint8_t* column = ws.own.wire();
      AllgatherAtOnce(*topo.cross, kAllgatherTag, ws.send.wire(), column, column_bytes);
      std::memcpy(column + (at[me] - region_at), ws.send.wire(), shard_bytes[me]);
      topo.local->Allgatherv(column, ws.all.wire(), region_bytes);
    }
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    for (size_t r = 0; r < counts.size(); ++r) half.Decode(0, r, ws.all.device() + at[r]);
    stream.Synchronize();
    st.bytes_sent += (column_bytes.size() - 1) * shard_bytes[me];
  });
  return st;
}

}  // namespace gradcomp
