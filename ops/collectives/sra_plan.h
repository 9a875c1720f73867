// Where SRA's bytes go: the buffer cut into one chunk per rank, each chunk into stripes, each
// (stripe, chunk) into pieces, one encoded segment each. The reduce-scatter and the allgather
// (compressed_shards.h) use the same layout with the caller's shards and one stripe; SRA's
// halves (sra_halves.h) run over it. Internal to ops/collectives.
#pragma once

#include <cstddef>
#include <vector>

#include "ops/collectives/compressed_steps.h"

namespace gradcomp {

/// Only buffers of at least this many values are pipelined in stripes.
constexpr size_t kPipelineMinValues = size_t{1} << 20;
/// A striped allreduce cuts a chunk into stripes whose messages stay near this size, at most
/// kMaxStripes of them. Larger messages made the link stall on the emulated cluster (4-8 MB
/// stripes ran at half the link rate), smaller ones pay more per-message overhead.
constexpr size_t kStripeBytes = size_t{1} << 20;
constexpr size_t kMaxStripes = 64;

/// `o` unstriped: one exchange of each step.
inline CompressedAllreduceOptions OneStripe(const CompressedAllreduceOptions& o) {
  CompressedAllreduceOptions one = o;
  one.pipeline_stripes = 1;
  return one;
}

/// The layout. Stripes end at bucket boundaries (so striping never changes the quantization:
/// the same bytes); pieces end at the tensors' bounds and are cut into cache blocks
/// (CutIntoBlocks). Buffers hold stripe after stripe, rank after rank.
struct SraPlan {
  size_t ranks = 0, mine = 0, stripes = 1;
  std::vector<size_t> chunks, chunk_offsets;            ///< values of each rank's chunk
  std::vector<std::vector<size_t>> cuts;                ///< [chunk][0..stripes]: stripe bounds
  std::vector<std::vector<std::vector<Piece>>> pieces;  ///< [stripe][chunk]
  std::vector<std::vector<size_t>> bytes;               ///< [stripe][chunk]: encoded size
  /// Offset of each stripe in the send (peers' chunks), receive (peers' encodings of this
  /// rank's chunk), own (this rank's reduced chunk) and all (every reduced chunk) buffers.
  std::vector<size_t> send_at, recv_at, own_at, all_at;
  size_t send_total = 0, recv_total = 0, own_total = 0, all_total = 0;

  /// SRA's plan of `o` among `ranks` ranks, seen from rank `me`: even chunks, striped as the
  /// options ask for buffers worth pipelining.
  static SraPlan Make(const CompressedAllreduceOptions& o, size_t ranks, size_t me);
  /// The sharded collectives' plan: chunk r is the counts[r] values of rank r's shard, one stripe.
  static SraPlan OfShards(const CompressedAllreduceOptions& o, const std::vector<size_t>& counts, size_t me);
  /// First value of stripe s of chunk c, and its length.
  size_t StripeBegin(size_t c, size_t s) const { return cuts[c][s]; }
  size_t StripeLength(size_t c, size_t s) const { return cuts[c][s + 1] - cuts[c][s]; }
  /// Bytes this rank sends to (`sending`) or receives from each peer in the scatter of
  /// stripe s (0 for itself).
  std::vector<size_t> ScatterBytes(size_t s, bool sending) const;
  /// Bytes this rank sends in the whole allreduce.
  size_t BytesSent() const;

 private:
  static SraPlan Layout(const CompressedAllreduceOptions& o, const std::vector<size_t>& chunks, size_t me,
                        size_t stripes);
};

}  // namespace gradcomp
