// Compressed allgather (compressed_shards.h): each rank's shard encoded once, the encodings
// allgathered (across nodes, then inside each node), every shard decoded on every rank.
#include <cstring>

#include "ops/collectives/compressed_shards.h"
#include "ops/collectives/compressed_steps.h"
#include "ops/collectives/context.h"

namespace gradcomp {

namespace {

constexpr int kAllgatherTag = 0x5410;

// Encodes this rank's shard (counts[me] values of o.input, shard `me` of `shards`) once, with its
// rounding stream, into `dst` on the device.
void EncodeOwn(const CompressedAllreduceOptions& o, const ShardPieces& shards, const std::vector<size_t>& counts,
               size_t me, CompressionWorkspace& ws, uint8_t* dst, CompressedAllreduceStats* st) {
  Phase phase(o, "COMPRESS", &st->compress_seconds);
  CompressedAllreduceOptions own = o;
  own.count = counts[me];
  own.prescale = 1.0;
  own.residual = nullptr;
  const float* x = WorkingCopy(own, ws);  // float32 values: a cast, or the input itself
  EncodePieces(ws, *o.codec, SraGatherParams(o.params, static_cast<int>(me)), x, shards.offsets[me], shards.pieces[me],
               dst);
}

// Decodes shard r's encoding at `wire` (device memory) into its place in the output.
void DecodeShard(const CompressedAllreduceOptions& o, const ShardPieces& shards, size_t r, const uint8_t* wire,
                 CompressionWorkspace& ws) {
  DecodePieces(ws, *o.codec, SraGatherParams(o.params, static_cast<int>(r)), wire, shards.pieces[r], 0, o.dtype,
               o.output);
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
    Device& d = ws.device;
    Stream& stream = *ws.stream;
    const size_t n = counts.size(), me = static_cast<size_t>(comm.rank());
    const ShardPieces shards(o, counts);
    const std::vector<size_t> all_at = Offsets(shards.bytes);
    const bool wire_on_device = WireOnDevice(comm, ws);
    ws.own.Reserve(d, shards.bytes[me], wire_on_device);
    ws.all.Reserve(d, all_at.back() + shards.bytes.back(), wire_on_device);
    EncodeOwn(o, shards, counts, me, ws, ws.own.device(), &st);
    ws.own.ToWire(0, shards.bytes[me], stream);
    stream.Synchronize();
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      AllgatherAtOnce(comm, kAllgatherTag, ws.own.wire(), ws.all.wire(), shards.bytes);
    }
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    for (size_t r = 0; r < n; ++r) {
      if (r == me) {
        DecodeShard(o, shards, r, ws.own.device(), ws);
        continue;
      }
      ws.all.FromWire(all_at[r], shards.bytes[r], stream);
      DecodeShard(o, shards, r, ws.all.device() + all_at[r], ws);
    }
    stream.Synchronize();
    st.bytes_sent += (n - 1) * shards.bytes[me];
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
    const ShardPieces shards(o, counts);
    // Where each shard's encoding lies in the node's buffer: region by region, in cross-rank order.
    std::vector<size_t> at(counts.size()), region_bytes;
    size_t total = 0;
    for (const std::vector<int>& column : columns) {
      size_t region = 0;
      for (int r : column) {
        at[static_cast<size_t>(r)] = total + region;
        region += shards.bytes[static_cast<size_t>(r)];
      }
      region_bytes.push_back(region);
      total += region;
    }
    std::vector<size_t> column_bytes;
    for (int r : columns[l]) column_bytes.push_back(shards.bytes[static_cast<size_t>(r)]);
    const size_t region_at = at[static_cast<size_t>(columns[l][0])];
    ws.own.Reserve(d, region_bytes[l]);
    ws.all.Reserve(d, total);
    ws.send.Reserve(d, shards.bytes[me]);
    EncodeOwn(o, shards, counts, me, ws, ws.send.device(), &st);
    stream.Synchronize();
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      uint8_t* column = ws.own.wire();
      AllgatherAtOnce(*topo.cross, kAllgatherTag, ws.send.wire(), column, column_bytes);
      std::memcpy(column + (at[me] - region_at), ws.send.wire(), shards.bytes[me]);
      topo.local->Allgatherv(column, ws.all.wire(), region_bytes);
    }
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    for (size_t r = 0; r < counts.size(); ++r) DecodeShard(o, shards, r, ws.all.device() + at[r], ws);
    stream.Synchronize();
    st.bytes_sent += (column_bytes.size() - 1) * shards.bytes[me];
  });
  return st;
}

}  // namespace gradcomp
