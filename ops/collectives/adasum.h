// Adasum, Horovod's op=hvd.Adasum (Maleki et al., "Scaling Distributed Training with Adaptive
// Summation", MLSys 2021): an allreduce whose result adapts to how the ranks' gradients relate.
//
// Two vectors a and b of one tensor combine as
//
//   a (+) b = (1 - a.b / (2 |a|^2)) a + (1 - a.b / (2 |b|^2)) b
//
// (a coefficient is 1 when its vector is zero). Orthogonal vectors add (a + b), equal ones
// average (a (+) a = a), and in between the component they share counts once. The operation is
// symmetric, and scale-free: (c a) (+) (c b) = c (a (+) b). Over n ranks it is a binary tree in
// Horovod's order: ranks 2i and 2i+1 first, then pairs of those results, and so on. Horovod
// refuses a world that is not a power of two; here the ranks beyond the largest power of two p
// first combine into rank r - p (whole vectors), and the tree runs over the first p.
//
// Each tensor of a fused buffer is a vector of its own: its own dot product and norms.
//
// Algorithm (Horovod's vector halving, distance doubling): at level d = 1, 2, 4, ... each rank
// exchanges half of the range it holds with rank ^ d and keeps the other half of both vectors;
// the dot products and squared norms of the whole vectors are the sums of what each of the 2d
// ranks that now hold their pieces computes on its own range (a recursive-doubling exchange of
// 3 doubles per tensor among them); each rank combines its range; the ranges are then gathered
// back in the reverse order. Per rank: the size of the buffer sent twice, log2(p) rounds.
// Dot products and norms accumulate in float64; the combination is computed in float64 for
// float32/float64 and in float32 for float16/bfloat16 (Horovod's precisions). Every rank ends
// with the same bits (the tree's ranges are gathered, the group sums are commutative).
//
// Across nodes (Horovod's Adasum of GPU tensors): the ranks of each node first average their
// tensors, and the tree runs over the nodes' averages, n_nodes vectors instead of n ranks'
// (Horovod sums in the node and divides the result by the node's size: the same value, as the
// operation is scale-free; its examples scale the learning rate by the node's size for it).
// With the same number of ranks on every node, each rank of a node holds a shard of the node's
// sum (a reduce-scatter), the tree runs among the ranks with the same local rank on their shards,
// and each level's dot products and norms are summed over the node's shards too (an allgather
// of the 3 doubles a tensor, added in local-rank order), so every tensor keeps the coefficients
// of its whole vectors; the shards are gathered back in the node. Per rank across nodes: its
// shard (the buffer / local) sent twice, every rank of a node sending at once. Nodes of
// different sizes: each node's first rank runs the tree on the whole average and broadcasts
// the result in its node.
#pragma once

#include <cstddef>
#include <vector>

#include "ops/collectives/allreduce.h"
#include "ops/comm/communicator.h"
#include "ops/comm/topology.h"

namespace gradcomp {

/// Adasum allreduce over `comm` of the tensors `pieces` (a joined rank's null input counts as a
/// zero vector, which leaves the other unchanged). `o` gives the dtype (float16, bfloat16,
/// float32 or float64), the prescale (applied to the inputs) and the postscale (to the result)
/// and the name for errors; its buffers and count are ignored. `scratch` holds the fused
/// buffer and the received halves (grown as needed).
void AdasumAllreduce(Communicator& comm, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                     std::vector<char>& scratch);

/// Adasum across the nodes of `topo` of each node's average (see above); the same arguments.
void NodeAdasumAllreduce(const Topology& topo, const std::vector<BufferPiece>& pieces, const AllreduceOptions& o,
                         std::vector<char>& scratch);

/// a = a (+) b for consecutive tensors of `counts` elements each, whole vectors on one rank (the
/// fold of the ranks beyond a power of two; tests use it as the reference).
void AdasumCombine(void* a, const void* b, const std::vector<size_t>& counts, DataType dtype);

}  // namespace gradcomp
