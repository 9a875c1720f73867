#include "ops/collectives/sra_plan.h"

#include <algorithm>

namespace gradcomp {

namespace {

// How many stripes: the options' count for buffers worth pipelining, raised so that each
// stripe's message stays near kStripeBytes (large messages need the transport's progress all
// along once the kernel's socket buffer is full; small stripes are handed over whole).
size_t StripeCount(const CompressedAllreduceOptions& o, const std::vector<size_t>& chunks) {
  if (o.count < kPipelineMinValues || o.pipeline_stripes <= 1) return 1;
  const size_t chunk_wire = o.codec->MaxWireSize(*std::max_element(chunks.begin(), chunks.end()), o.params);
  return std::min(kMaxStripes, std::max(o.pipeline_stripes, (chunk_wire + kStripeBytes - 1) / kStripeBytes));
}

// Bound s of chunk [c0, c1): about s/stripes of the way, moved up to where a bucket of the
// tensor there begins anyway.
size_t StripeCut(size_t c0, size_t c1, size_t s, size_t stripes, size_t bucket, const std::vector<size_t>& bounds) {
  const size_t len = c1 - c0;
  if (s == 0) return c0;
  if (s >= stripes) return c1;
  const size_t target = c0 + std::min(len, s * ((len + stripes - 1) / stripes));
  if (target >= c1) return c1;
  const size_t k = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), target) - bounds.begin()) - 1;
  const size_t piece_start = std::max(bounds[k], c0), piece_end = std::min(bounds[k + 1], c1);
  const size_t cut = piece_start + (target - piece_start + bucket - 1) / bucket * bucket;
  return std::min(cut, piece_end);
}

}  // namespace

SraPlan SraPlan::Make(const CompressedAllreduceOptions& o, size_t ranks, size_t me) {
  const std::vector<size_t> chunks = EvenSplit(o.count, static_cast<int>(ranks));
  return Layout(o, chunks, me, StripeCount(o, chunks));
}

SraPlan SraPlan::OfShards(const CompressedAllreduceOptions& o, const std::vector<size_t>& counts, size_t me) {
  return Layout(o, counts, me, 1);
}

SraPlan SraPlan::Layout(const CompressedAllreduceOptions& o, const std::vector<size_t>& chunks, size_t me,
                        size_t stripes) {
  SraPlan plan;
  plan.ranks = chunks.size();
  plan.mine = me;
  const std::vector<size_t> bounds = SegmentBounds(o);
  plan.chunks = chunks;
  plan.chunk_offsets = Offsets(plan.chunks);
  plan.stripes = stripes;
  const size_t ranks = plan.ranks, bucket = static_cast<size_t>(std::max<int64_t>(1, o.params.bucket_size));
  plan.cuts.assign(ranks, std::vector<size_t>(plan.stripes + 1));
  for (size_t c = 0; c < ranks; ++c) {
    const size_t c0 = plan.chunk_offsets[c], c1 = c0 + plan.chunks[c];
    for (size_t s = 0; s <= plan.stripes; ++s) plan.cuts[c][s] = StripeCut(c0, c1, s, plan.stripes, bucket, bounds);
  }
  plan.pieces.assign(plan.stripes, std::vector<std::vector<Piece>>(ranks));
  plan.bytes.assign(plan.stripes, std::vector<size_t>(ranks));
  for (size_t s = 0; s < plan.stripes; ++s) {
    for (size_t c = 0; c < ranks; ++c) {
      plan.pieces[s][c] = CutIntoBlocks(PiecesIn(plan.StripeBegin(c, s), plan.StripeLength(c, s), bounds), bucket);
      plan.bytes[s][c] = EncodedSize(*o.codec, o.params, plan.pieces[s][c]);
    }
  }
  for (size_t s = 0; s < plan.stripes; ++s) {
    plan.send_at.push_back(plan.send_total);
    plan.recv_at.push_back(plan.recv_total);
    plan.own_at.push_back(plan.own_total);
    plan.all_at.push_back(plan.all_total);
    for (size_t c = 0; c < ranks; ++c) {
      if (c != me) plan.send_total += plan.bytes[s][c];
      if (c != me) plan.recv_total += plan.bytes[s][me];
      plan.all_total += plan.bytes[s][c];
    }
    plan.own_total += plan.bytes[s][me];
  }
  return plan;
}

std::vector<size_t> SraPlan::ScatterBytes(size_t s, bool sending) const {
  std::vector<size_t> v(ranks, 0);
  for (size_t c = 0; c < ranks; ++c) {
    if (c != mine) v[c] = sending ? bytes[s][c] : bytes[s][mine];
  }
  return v;
}

size_t SraPlan::BytesSent() const {
  size_t sent = send_total;
  for (size_t s = 0; s < stripes; ++s) sent += (ranks - 1) * bytes[s][mine];
  return sent;
}

}  // namespace gradcomp
