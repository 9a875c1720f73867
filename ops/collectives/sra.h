// SRA (scatter-reduce-allgather), the compressed allreduce of compressed_allreduce.h, in its
// parts: the plan of where every byte goes (a value), and the run over a communicator with a
// blocking driver (one alltoall, one allgather) or a striped one (point-to-point stripes whose
// encoding and decoding overlap the network). Internal to ops/collectives; the hierarchical
// algorithm runs it across nodes.
#pragma once

#include <cstddef>
#include <functional>
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

/// Where SRA's bytes go. The buffer is cut into one chunk per rank, each chunk into stripes
/// at bucket boundaries (so striping never changes the quantization: the same bytes), each
/// (stripe, chunk) into pieces, one encoded segment each. Buffers hold stripe after stripe,
/// rank after rank.
struct SraPlan {
  size_t ranks = 0, mine = 0, stripes = 1;
  std::vector<size_t> chunks, chunk_offsets;          ///< values of each rank's chunk
  std::vector<std::vector<size_t>> cuts;              ///< [chunk][0..stripes]: stripe bounds
  std::vector<std::vector<std::vector<Piece>>> pieces;  ///< [stripe][chunk]
  std::vector<std::vector<size_t>> bytes;             ///< [stripe][chunk]: encoded size
  /// Offset of each stripe in the send (peers' chunks), receive (peers' encodings of this
  /// rank's chunk), own (this rank's reduced chunk) and all (every reduced chunk) buffers.
  std::vector<size_t> send_at, recv_at, own_at, all_at;
  size_t send_total = 0, recv_total = 0, own_total = 0, all_total = 0;

  /// The plan of `o` among `ranks` ranks, seen from rank `me`.
  static SraPlan Make(const CompressedAllreduceOptions& o, size_t ranks, size_t me);
  /// First value of stripe s of chunk c, and its length.
  size_t StripeBegin(size_t c, size_t s) const { return cuts[c][s]; }
  size_t StripeLength(size_t c, size_t s) const { return cuts[c][s + 1] - cuts[c][s]; }
  /// Bytes this rank sends to (`sending`) or receives from each peer in the scatter of
  /// stripe s (0 for itself).
  std::vector<size_t> ScatterBytes(size_t s, bool sending) const;
  /// Bytes this rank sends in the whole allreduce.
  size_t BytesSent() const;
};

/// A dense algorithm on the float32 working copy x (prescaled, compensated), writing the scaled
/// result to out, as Sra and Sra2d.
using DenseAlgorithm = std::function<void(const float* x, const OutputScaling& scale, float* out,
                                          CompressionWorkspace& ws, CompressedAllreduceStats* st)>;
/// The frame of a dense compressed allreduce over `ranks` ranks: the options checked (errors
/// name `what` and the tensor), the working copy and the result buffer made, the output stored.
CompressedAllreduceStats RunDenseAllreduce(const char* what, const CompressedAllreduceOptions& o, int ranks,
                                           const DenseAlgorithm& algorithm);

/// 2-D SRA of x (as Sra, over `grid`; compressed_allreduce.h).
void Sra2d(const Grid& grid, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
           float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st);

/// SRA of the o.count float32 values x (already prescaled and compensated) into float32 `out`
/// (which may alias x), scaled by `scale`; o.residual and o.reduced_residual receive the
/// errors of the two compressions. Adds to `st`. The none codec's values travel from x and into
/// out as they are, unless the caller reads the encodings afterwards (`keep_encodings`: this
/// rank's reduced chunk in ws.own, every other's in ws.all, in the plan's layout).
void Sra(Communicator& comm, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
         float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings = false);

}  // namespace gradcomp
