// Sparse allreduce for topk (compressed_allreduce.h): every rank's encoding (values and
// indices) allgathered, scatter-added in rank order on every rank. Selection and
// scatter-adds run on the device; the encodings travel through host staging (or straight to a
// communicator that takes device memory), and their headers (each segment's size) are read on
// the host.
#include <algorithm>
#include <cstring>

#include "ops/collectives/compressed_steps.h"
#include "ops/collectives/context.h"
#include "ops/compression/codec_on_device.h"
#include "ops/compression/topk.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

// Tag of the encodings' point-to-point allgather.
constexpr int kSparseGatherTag = 0x5500;

// Every rank's encoding (this rank's `bytes` at ws.send's wire, at most `max_each` on any rank),
// gathered into ws.all's wire, each rank's size first (topk's size depends on the data);
// returns the sizes. The headers of the gathered encodings are read on the host: ws.all's host
// copy is made here.
std::vector<size_t> AllgatherEncodings(Communicator& comm, CompressionWorkspace& ws, size_t bytes, size_t max_each) {
  const size_t ranks = static_cast<size_t>(comm.size());
  const bool wire_on_device = WireOnDevice(comm, ws);
  Stream& stream = *ws.stream;
  // Slot `ranks` holds this rank's size, slots 0..ranks-1 receive everyone's.
  StagedBuffer& lens = ws.sizes;
  const size_t mine_at = ranks * sizeof(uint64_t), all_bytes = ranks * sizeof(uint64_t);
  lens.Reserve(ws.device, all_bytes + sizeof(uint64_t), wire_on_device);
  const uint64_t my_len = bytes;
  std::memcpy(lens.host() + mine_at, &my_len, sizeof my_len);
  if (wire_on_device) lens.ToDevice(mine_at, sizeof my_len, stream);
  stream.Synchronize();
  comm.Allgatherv(lens.wire() + mine_at, lens.wire(), std::vector<size_t>(ranks, sizeof(uint64_t)));
  if (wire_on_device) lens.ToHost(0, all_bytes, stream);
  stream.Synchronize();
  std::vector<size_t> sizes(ranks);
  for (size_t r = 0; r < ranks; ++r) {
    uint64_t len;
    std::memcpy(&len, lens.host() + r * sizeof(uint64_t), sizeof len);
    sizes[r] = static_cast<size_t>(len);
  }
  const size_t total = Offsets(sizes).back() + sizes.back();
  // Room for every rank's largest encoding, so that steps of varying sizes allocate nothing.
  ws.all.Reserve(ws.device, std::max(total, ranks * max_each), wire_on_device);
  // Every message at once (MPI's allgather steps through the peers); this rank's own encoding
  // copied into its slot.
  const size_t me = static_cast<size_t>(comm.rank()), encoding_at = Offsets(sizes)[me];
  if (wire_on_device) {
    ws.device.Copy(ws.all.wire() + encoding_at, ws.send.wire(), sizes[me], stream);
    stream.Synchronize();
  } else {
    std::memcpy(ws.all.wire() + encoding_at, ws.send.wire(), sizes[me]);
  }
  AllgatherAtOnce(comm, kSparseGatherTag, ws.send.wire(), ws.all.wire(), sizes);
  if (wire_on_device) {
    ws.all.ToHost(0, total, stream);
    stream.Synchronize();
  } else {
    ws.all.FromWire(0, total, stream);
  }
  return sizes;
}

// What this rank sent of segment `pc` (its wire at `at` of ws.all): error feedback keeps what
// was not sent (and the rounding of what was, for float16 values): the residual gets the
// wire decoded, subtracted from x once every segment is in; DGC masks the momentum of what
// was sent, so its indices are collected.
void AccountSent(const CompressedAllreduceOptions& o, CompressionWorkspace& ws, const TopKWire& wire, size_t at,
                 const Piece& pc, const CodecParams& p) {
  if (o.residual) {
    DecodeOn(ws.device, *o.codec, ws.all.device() + at, wire.bytes(), pc.len, p, DataType::kFloat32,
             o.residual + pc.start, false, *ws.stream);
  }
  if (o.sent_indices) {
    for (uint32_t j = 0; j < wire.kept(); ++j) o.sent_indices->push_back(static_cast<uint32_t>(pc.start) + wire.index(j));
  }
}

}  // namespace

CompressedAllreduceStats SparseAllreduce(Communicator& comm, const CompressedAllreduceOptions& o) {
  CompressedAllreduceStats st;
  WithTensorContext("sparse allreduce", o.name, [&] {
    ValidateCompressed(o, true);
    if (o.sent_indices) o.sent_indices->clear();
    if (o.count == 0) return;
    const Codec& codec = *o.codec;
    const size_t ranks = static_cast<size_t>(comm.size()), me = static_cast<size_t>(comm.rank());
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    Device& d = ws.device;
    Stream& stream = *ws.stream;
    // With error feedback x is the workspace's copy, which stays intact for the residual.
    const float* x = WorkingCopy(o, ws);
    const std::vector<Piece> segments = PiecesIn(0, o.count, SegmentBounds(o));
    const CodecParams p = SraScatterParams(o.params, static_cast<int>(me));
    const size_t max_each = EncodedSize(codec, p, segments);
    ws.send.Reserve(d, max_each, WireOnDevice(comm, ws));
    size_t mine = 0;
    {
      Phase phase(o, "COMPRESS", &st.compress_seconds);
      mine = EncodePieces(ws, codec, p, x, 0, segments, ws.send.device());
      ws.send.ToWire(0, mine, stream);
      stream.Synchronize();
    }
    std::vector<size_t> bytes;
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      bytes = AllgatherEncodings(comm, ws, mine, max_each);
    }
    // Scatter-add every rank's values in rank order (the same float operations everywhere),
    // into the result (the input is read no more: its encoding is made).
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    float* result = ResultBuffer(o, ws);
    d.Fill(result, 0, o.count * sizeof(float), stream);
    const std::vector<size_t> offsets = Offsets(bytes);
    for (size_t r = 0; r < ranks; ++r) {
      size_t at = offsets[r];
      for (const Piece& pc : segments) {
        const TopKWire wire(ws.all.host() + at, o.params.topk_value_dtype);
        DecodeOn(d, codec, ws.all.device() + at, wire.bytes(), pc.len, p, DataType::kFloat32, result + pc.start, true,
                 stream);
        if (r == me) AccountSent(o, ws, wire, at, pc, p);
        at += wire.bytes();
      }
    }
    if (o.residual) d.Subtract(o.residual, x, o.residual, o.count, stream);
    // As the uncompressed allreduce finishes (a true division for Average), so ratio 1 gives
    // its very bits.
    d.FinishReduction(result, o.count, DataType::kFloat32, o.op, o.postscale, static_cast<int>(ranks), stream);
    st.bytes_sent = mine * (ranks - 1);
    StoreOutput(o, ws, result);
  });
  return st;
}

}  // namespace gradcomp
