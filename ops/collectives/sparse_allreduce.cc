// Sparse allreduce for topk (compressed_allreduce.h): every rank's encoding (values and
// indices) allgathered, scatter-added in rank order on every rank.
#include <cstring>

#include "ops/collectives/compressed_steps.h"
#include "ops/collectives/context.h"
#include "ops/compression/topk.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

// Every rank's encoding, gathered (each rank's size first: topk's size depends on the data).
std::vector<uint8_t> AllgatherEncodings(Communicator& comm, const std::vector<uint8_t>& mine,
                                        std::vector<size_t>* bytes) {
  const size_t ranks = static_cast<size_t>(comm.size());
  std::vector<uint64_t> lens(ranks);
  const uint64_t my_len = mine.size();
  comm.Allgatherv(&my_len, lens.data(), std::vector<size_t>(ranks, sizeof(uint64_t)));
  bytes->assign(lens.begin(), lens.end());
  std::vector<uint8_t> all(Offsets(*bytes).back() + bytes->back());
  comm.Allgatherv(mine.data(), all.data(), *bytes);
  return all;
}

// What this rank sent of segment `pc` (its wire `w`): error feedback keeps what was not sent
// (and the rounding of what was, for float16 values) in x; DGC masks the momentum of what
// was sent, so its indices are collected.
void AccountSent(const CompressedAllreduceOptions& o, const TopKWire& w, const Piece& pc, std::vector<float>& x) {
  for (uint32_t j = 0; j < w.kept(); ++j) {
    const uint32_t idx = w.index(j);
    if (o.residual) x[pc.start + idx] -= w.value(j);
    if (o.sent_indices) o.sent_indices->push_back(static_cast<uint32_t>(pc.start) + idx);
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
    CompressionWorkspace local_ws;
    CompressionWorkspace& ws = o.workspace ? *o.workspace : local_ws;
    const float* input = WorkingCopy(o, ws);
    std::vector<float> x(input, input + o.count);
    const std::vector<Piece> segments = PiecesIn(0, o.count, SegmentBounds(o));
    const CodecParams p = SraScatterParams(o.params, static_cast<int>(me));
    std::vector<uint8_t> mine(EncodedSize(codec, p, segments));
    {
      Phase phase(o, "COMPRESS", &st.compress_seconds);
      mine.resize(EncodePieces(codec, p, x.data(), 0, segments, mine.data()));
    }
    std::vector<size_t> bytes;
    std::vector<uint8_t> all;
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      all = AllgatherEncodings(comm, mine, &bytes);
    }
    // Scatter-add every rank's values in rank order (the same float operations everywhere).
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    std::vector<float> acc(o.count, 0.0f);
    const std::vector<size_t> offsets = Offsets(bytes);
    for (size_t r = 0; r < ranks; ++r) {
      const uint8_t* w = all.data() + offsets[r];
      for (const Piece& pc : segments) {
        const TopKWire wire(w, o.params.topk_value_dtype);
        codec.DecodeAccumulate(w, wire.bytes(), pc.len, p, DataType::kFloat32, acc.data() + pc.start);
        if (r == me) AccountSent(o, wire, pc, x);
        w += wire.bytes();
      }
    }
    if (o.residual) std::memcpy(o.residual, x.data(), o.count * sizeof(float));
    // As the uncompressed allreduce finishes (a true division for Average), so ratio 1 gives
    // its very bits.
    FinishReduction(acc.data(), o.count, DataType::kFloat32, o.op, o.postscale, static_cast<int>(ranks));
    st.bytes_sent = mine.size() * (ranks - 1);
    StoreOutput(o, acc.data());
  });
  return st;
}

}  // namespace gradcomp
