// The two halves of SRA (compressed_allreduce.h) on their own, for sharded data parallelism
// (FSDP, ZeRO): gradients reduce-scattered from quantized pieces, weights allgathered quantized.
//
// Compressed reduce-scatter: the buffer is cut into the ranks' shards (counts); every rank
// encodes each peer's shard and the encodings are exchanged (all-to-all); the owner decodes and
// sums its shard's contributions in float32, its own values in full precision, in rank order,
// and applies Average/postscale. Nothing is quantized a second time: the error is SRA's first
// stage alone. For element i of rank o's shard, with u_r(i) the unit of the bucket rank r used
// for i (range of that bucket / (2^bits - 1)) and s the output scale (postscale, divided by the
// number of ranks for Average):
//   |out(i) - exact(i)| <= s * sum_{r != o} u_r(i) / 2   (stochastic rounding: twice that).
// With error feedback (o.residual, the whole buffer's count floats) what each rank's encoding
// lost is carried into its next call, so the average of the outputs over calls converges to
// the exact one.
//
// Compressed allgather: every rank encodes its shard once (the maxmin codec's buckets, which
// restart at each shard and each tensor), the encodings are allgathered, and every rank decodes
// every shard, its own included: all ranks end with bit-identical outputs (what FSDP needs of
// the weights it unshards), each value within half a unit of its bucket (range / (2^bits - 1)).
//
// Hierarchical (nodes of several ranks, the world's ranks node after node): the reduce-scatter
// first sums inside the node, uncompressed, each local rank receiving the shards of its
// same-local-rank peers across nodes, then runs the compressed reduce-scatter among those
// peers; the allgather runs the compressed allgather among them and then allgathers the
// encodings inside the node, where every rank decodes them all. Only encoded bytes cross a
// node's link: a node sends its shards' encodings once, as flat SRA's halves do.
#pragma once

#include <cstddef>
#include <vector>

#include "ops/collectives/compressed_allreduce.h"

namespace gradcomp {

/// Compressed reduce-scatter over `comm`. o.input holds o.count values (the whole buffer, the
/// sum of `counts`, one per rank); rank r's o.output receives the counts[r] values of its shard,
/// which begins at the sum of counts[0..r). Dense codecs only (maxmin, fp16, bf16; none as a
/// float32 reference); op Sum or Average.
CompressedAllreduceStats CompressedReducescatter(Communicator& comm, const CompressedAllreduceOptions& o,
                                                 const std::vector<size_t>& counts);

/// Compressed allgather over `comm`. o.input holds this rank's counts[rank] values; o.output
/// receives o.count values (the sum of `counts`), rank r's at the sum of counts[0..r). o.op,
/// the scale factors and the residuals are not used.
CompressedAllreduceStats CompressedAllgather(Communicator& comm, const CompressedAllreduceOptions& o,
                                             const std::vector<size_t>& counts);

/// The hierarchical forms over `topo` (homogeneous nodes; topo.world's rank r is local rank
/// r % L of node r / L): the same results' layout as the flat ones over topo.world. Host memory.
CompressedAllreduceStats HierarchicalCompressedReducescatter(const Topology& topo, const CompressedAllreduceOptions& o,
                                                             const std::vector<size_t>& counts);
CompressedAllreduceStats HierarchicalCompressedAllgather(const Topology& topo, const CompressedAllreduceOptions& o,
                                                         const std::vector<size_t>& counts);

}  // namespace gradcomp
