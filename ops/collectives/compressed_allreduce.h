// Compressed allreduce algorithms (docs/design.md "Compressed allreduce"), one file each:
// sra.cc (with its plan in sra.h), hierarchical_compressed.cc, sparse_allreduce.cc; the steps
// they share in compressed_steps.h and the helper thread of the striped SRA in pipeline.h.
//
// SRA (scatter-reduce-allgather, as CGX and Bagua): the buffer is cut into one chunk per
// rank; every rank encodes each peer's chunk and the chunks are exchanged (all-to-all); the
// owner decodes and sums the contributions in float32 (its own chunk in full precision),
// applies Average/postscale, encodes its reduced chunk once, decodes it into its own output
// too, and the encoded chunks are allgathered; every rank decodes every chunk. All ranks end
// with bit-identical results, and the error does not grow with the number of ranks.
//
// Error bound (nearest rounding; stochastic: twice each term, strict). For element i owned by
// rank o, with u_r(i) the unit of the bucket rank r used for i in the first exchange (range
// of that bucket / (2^bits - 1)) and s the output scale (postscale, divided by the number of
// ranks for Average), the first stage adds at most E1(i) = s * sum_{r != o} u_r(i) / 2; the
// second quantizes the reduced bucket B, whose range is at most R(B) + 2 max_{j in B} E1(j)
// with R(B) the range of the exact scaled sums in B, adding at most half its unit. So
//   |out(i) - exact(i)| <= E1(i) + (R(B) + 2 max_B E1) / (2 (2^bits - 1)).
// With error feedback the errors of both stages are carried into the next call, so the
// average of the outputs over many calls converges to the exact average.
//
// 2-D SRA (sra2d.cc), for worlds where flat SRA's n^2 messages of size/n^2 bytes each cost
// more than their bytes: the ranks form a grid (MakeGrid, rows of b ranks, a = n/b rows). A
// row runs SRA's scatter on the whole buffer (b chunks), so each rank holds the float32 sum of
// its chunk j over its row, P_j; its column runs a full SRA on P_j (scatter, float32 sum,
// encode once, allgather), so every rank of column j holds the encodings of the reduced chunk j;
// the row allgathers those encodings as they are, and every rank decodes every chunk. A rank
// sends 2 (n-1)/n of the encoded size (as flat SRA) in 2 (a + b - 2) messages instead of
// 2 (n - 1), and results stay bit-identical on every rank.
//
// Error bound (nearest rounding; stochastic: twice each term). Element i of chunk j, in the
// column SRA's piece owned by row o. Each rank (r, k), k != j, quantized its own value with
// unit u1_{r,k}(i); each row r != o quantized its float32 row sum P_{r,j} with unit u2_r(i)
// (range of that row sum's bucket / (2^bits - 1)). Before the final encoding the error is
//   E(i) = s * ( sum_r sum_{k != j} u1_{r,k}(i) / 2 + sum_{r != o} u2_r(i) / 2 ),
// and the final encoding of the scaled sum's bucket B adds at most (R(B) + 2 max_B E) /
// (2 (2^bits - 1)), as in SRA. Against flat SRA, n - a of the n - 1 first-stage terms are the
// same and a - 1 are units of row sums, whose range is at most b times a value's (typically
// sqrt(b) for independent noise): three quantizations on a value's path instead of two, never
// one per level of a tree, so the error does not grow with the world (test_compressed_allreduce).
//
// Nested grids (MakeNodeGrid), for nodes of several ranks: the rows are the nodes (the row
// steps cross only the node's loopback) and each column, the ranks of one local rank across the
// nodes, runs the 2-D SRA on a grid of its own instead of flat SRA. What the node row
// allgathers is then that grid's result encodings, each of its row chunks' column encodings
// in turn (a layout every rank can make from the shapes alone, as every column's grid has
// the same shape), still one final encoding per value: results stay bit-identical. A rank sends
// 2 (N-1)/N of its chunk's encoded size across nodes (N nodes; its chunk is 1/L of the buffer
// with L ranks a node: together the node sends flat SRA's bytes among the nodes) in
// 2 (a' + b' - 2) messages (the cross grid's a' rows of b'), and 2 (L-1)/L of the encoded size
// over the loopback in 2 (L - 1) messages. The most square grid of all ranks has rows that span
// several nodes once the world outgrows L^2 ranks, and then every rank's whole encoded buffer
// crosses the node's link. The grid across nodes may nest again (MakeNestedGrid; the runtime's
// shape is GridShape's): its columns run the 2-D SRA on grids of their own, each level's row
// allgathering the encodings of the level below as they are. At 1024 nodes of 8 the most square
// 32 x 32 grid across makes every node post 8 x 31 row messages at once; rows of 16 nodes with
// their 64-node columns on 8 x 8 grids keep it to 8 x 15 and 8 x 7 (four levels).
//
// Error bound of any nesting, level by level (NestedSraBound in test/support computes it).
// At a level, a participant holds a partial sum P (its own value at the first level; its row's
// sum below) that already lost e(P) (unscaled). The row scatter quantizes P for the owner of
// each other row chunk with half the unit of its bucket, whose range is at most
// R(P) + 2 max e(P); the owner's row sum carries the sum of its row's e and those halves. At the
// last level, flat SRA's owner o of a sub-chunk adds s * (sum_r e_r + sum_{r != o} u_r / 2),
// and the final encoding of the scaled sum's bucket B adds (R(B) + 2 max_B E) / (2 (2^bits - 1)).
// A value is quantized once per level and once at the end: flat SRA 2, the 2-D SRA 3, node rows
// with a grid across 4, its columns nested once more 5: a fixed number (the grid's depth, which
// GridShape keeps to a few levels: rows of up to GRADCOMP_GRID_NODE_MESSAGES / L nodes, so n
// nodes take about log(n) / log(that) levels), never one per level of a binary tree. Measured
// (test_compressed_allreduce, Sra2d.FourBitErrorAtLargeWorldsStaysNearFlatSra, 4 bits, 1024
// thread ranks): flat SRA 0.090-0.127, node rows with a grid across 0.093-0.202, nested once more
// 0.100-0.219.
//
// Sparse (topk): each rank encodes its whole buffer (values and indices), the variable-size
// encodings are allgathered and every rank scatter-adds all of them in rank order.
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "ops/collectives/reduction_options.h"
#include "ops/comm/communicator.h"
#include "ops/comm/topology.h"
#include "ops/compression/codec.h"
#include "ops/device/device.h"
#include "ops/device/staging.h"

namespace gradcomp {

/// Stripes the runtime uses for allreduces that cross nodes when GRADCOMP_PIPELINE_STRIPES is 0
/// (auto): every dense codec, raw float32 included, since a stripe's allgather keeping the link
/// busy while the next stripe is scattered is what holds a TCP link near its rate.
constexpr size_t kAutoPipelineStripes = 4;

/// Scratch buffers reused across calls (large fresh allocations cost a page fault per 4 KB
/// on every call), on one device, with the stream the collectives queue their work on. One
/// per caller thread and device; optional.
struct CompressionWorkspace {
  explicit CompressionWorkspace(Device& dev = HostDevice()) : device(dev), stream(dev.NewStream()) {}
  Device& device;
  std::unique_ptr<Stream> stream;
  /// float32 values: the working copy, the result, a node's shard and its result.
  StagedBuffer x, out, shard, shard_out;
  /// The reduction's block (device only).
  Scratch acc;
  /// Encoded bytes: peers' chunks sent, peers' encodings received, this rank's reduced chunk,
  /// every reduced chunk (sparse: this rank's encoding, everyone's).
  StagedBuffer send, recv, own, all;
  /// The sparse allreduce's encoding sizes.
  StagedBuffer sizes;
};

/// Arguments of a compressed allreduce. Buffers are float32, float16 or bfloat16; the op is
/// Sum or Average. `output` may equal `input`. Every buffer (input, output, residuals) is in
/// the memory of `device`; encoding, reduction and decoding run there, and only encoded bytes
/// are staged to the host for the communicator. The work is done when the call returns.
struct CompressedAllreduceOptions : ReductionOptions {
  /// The device the buffers live on (null: the host).
  Device* device = nullptr;
  size_t count = 0;
  const Codec* codec = nullptr;
  CodecParams params;
  /// Element counts of the tensors packed in the buffer (summing to count); quantization
  /// buckets restart at each tensor and at each chunk boundary. Empty: one tensor.
  std::vector<size_t> segments;
  /// Error feedback of this rank's own compression (count floats, in buffer order), or null.
  float* residual = nullptr;
  /// Error feedback of the reduced chunk this rank owns (count floats, in buffer order), or null.
  float* reduced_residual = nullptr;
  /// topk: receives the indices (in buffer order) this rank sent, for DGC's momentum masking.
  std::vector<uint32_t>* sent_indices = nullptr;
  /// SRA of at least 1M values: cut each chunk into this many stripes (at bucket boundaries)
  /// and encode/decode one stripe on a helper thread while the next is on the wire. 1 = off.
  /// The result is the same bytes either way.
  size_t pipeline_stripes = 1;
  /// Reused scratch space (recommended for repeated calls) on `device`, or null.
  CompressionWorkspace* workspace = nullptr;
  /// Called as each phase ("COMPRESS", "COMMUNICATE", "DECOMPRESS") begins and ends (timeline).
  std::function<void(const char* phase, bool begin)> on_phase;
};

/// What a compressed allreduce moved and spent.
struct CompressedAllreduceStats {
  size_t bytes_sent = 0;  ///< bytes this rank sent in total
  double compress_seconds = 0;
  double decompress_seconds = 0;
  double communicate_seconds = 0;
};

/// The parameters rank `rank` encodes with in SRA's scatter (its peers' chunks) and in its
/// gather (its reduced chunk): each rank and stage rounds with its own random stream. The DDP
/// hook (frameworks/python) uses the same streams through _core.
CodecParams SraScatterParams(const CodecParams& p, int rank);
CodecParams SraGatherParams(const CodecParams& p, int rank);

/// SRA over `comm` (maxmin, fp16, bf16; none works too, as a float32 reference).
CompressedAllreduceStats CompressedAllreduce(Communicator& comm, const CompressedAllreduceOptions& opts);

/// Hierarchical: node-local reduce-scatter (uncompressed, through the shared-memory window
/// when the local communicator is shm), SRA of each shard among the ranks with the same local
/// rank, node-local allgather. With `leader_only` (CGX_INTRA_BROADCAST) the node reduces to
/// its local rank 0, only those leaders run SRA across nodes, and the result is broadcast in
/// the node.
/// With `cross_grid` (MakeGrid of topo.cross) the SRA across nodes is the 2-D SRA.
CompressedAllreduceStats HierarchicalCompressedAllreduce(const Topology& topo, const CompressedAllreduceOptions& opts,
                                                         bool leader_only, const Grid* cross_grid = nullptr);

/// 2-D SRA over `grid` (MakeGrid of the communicator the allreduce spans; see above). A grid of
/// one row or one column is flat SRA over the other.
CompressedAllreduceStats CompressedAllreduce2d(const Grid& grid, const CompressedAllreduceOptions& opts);

/// Sparse allreduce for topk: allgather of every rank's (values, indices), scatter-add.
CompressedAllreduceStats SparseAllreduce(Communicator& comm, const CompressedAllreduceOptions& opts);

}  // namespace gradcomp
