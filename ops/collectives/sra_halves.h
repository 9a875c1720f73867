// SRA's two halves as steps over a plan (sra_plan.h), the code every compressed allreduce and
// sharded collective runs its halves with:
// - ScatterHalf, the compressed reduce-scatter: every peer's chunk encoded for it (error
//   feedback kept), the encodings exchanged by the caller, this rank's chunk summed in float32
//   block by block (its own values, then the peers' in rank order: Reduce, the one
//   scatter-reduce step).
// - GatherHalf, the compressed allgather: this rank's chunk encoded once (SRA's: block by block
//   as the scatter half sums it, while the sum is in cache), the encodings exchanged by the
//   caller, every chunk decoded.
// Flat SRA (sra.cc) is a ScatterHalf then a GatherHalf, stripe by stripe; the 2-D SRA's rows
// (sra2d.cc) and the reduce-scatter (compressed_reducescatter.cc) run the scatter half, the
// allgather (compressed_allgather.cc) the gather half; the hierarchical forms run these across
// nodes. The callers drive the network (one exchange, stripes, per peer), time the phases and
// synchronize the stream; the halves queue device work on the workspace's stream.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <vector>

#include "ops/collectives/sra_plan.h"

namespace gradcomp {

/// The reduce-scatter half over `plan` (ws.send: peers' chunks, ws.recv: their encodings of
/// this rank's). `x`: the buffer's float32 values (prescaled, compensated), x[0] its element 0.
/// `raw`: the none codec's values travel as they are (nothing encoded: sent from x, summed
/// where they landed), for a transport that reads that memory.
class ScatterHalf {
 public:
  ScatterHalf(const CompressedAllreduceOptions& o, const SraPlan& plan, const CodecParams& stream, const float* x,
              CompressionWorkspace& ws, bool raw);

  /// Reserves the plan's send (unless raw) and receive buffers.
  void Reserve(bool wire_on_device);
  /// Peer p's pieces of stripe s encoded into their place in ws.send (not staged), and what the
  /// encoding lost into o.residual.
  void Encode(size_t s, size_t p);
  /// Stages peer p's encoding of stripe s for the network.
  void Stage(size_t s, size_t p);
  /// Every peer's pieces of stripe s encoded, then staged at once.
  void EncodePeers(size_t s);
  /// The wire side of peer p's message of stripe s, and where p's encoding of ours lands.
  const uint8_t* SendFrom(size_t s, size_t p);
  uint8_t* ReceiveInto(size_t s, size_t p);

  /// What a caller does with each summed block while it is in cache: `sum` holds its pc.len
  /// float32 values; `wire_at` is the block's offset in the stripe's encoding of this chunk.
  using BlockSum = std::function<void(const Piece& pc, float* sum, size_t wire_at)>;
  /// Sums this rank's chunk of stripe s block by block into `into` (into[0] is buffer element
  /// `into_base`; null: a scratch block, which raw cannot use), then calls `then` (may be null).
  void Reduce(size_t s, float* into, size_t into_base, const BlockSum& then);

 private:
  const CompressedAllreduceOptions& o_;
  const SraPlan& plan_;
  const CodecParams p_;
  const float* x_;
  CompressionWorkspace& ws_;
  const bool raw_;
  std::vector<std::vector<size_t>> send_at_, recv_at_;  // [stripe][peer]: offsets in ws.send, ws.recv
};

/// The allgather half over `plan` (ws.own: this rank's encoding, ws.all: every chunk's), decoding
/// into `out` (buffer layout, `out_dtype`). Chunk c is encoded with SraGatherParams(c): every
/// rank decodes it with the stream it was encoded with. `raw`: float32 values sent from and
/// landing in `out`, nothing encoded.
class GatherHalf {
 public:
  GatherHalf(const CompressedAllreduceOptions& o, const SraPlan& plan, CompressionWorkspace& ws, bool raw, void* out,
             DataType out_dtype);

  /// Reserves the plan's own and every-chunk buffers (unless raw).
  void Reserve(bool wire_on_device);
  /// Encodes block pc of this rank's chunk of stripe s, the float32 `v`, at `wire_at` of its
  /// encoding in ws.own, and decodes it into the output: this rank's result is what every rank
  /// decodes. With `residual` (pc.len floats): it is added to v first, and receives what the
  /// encoding lost (float32 output only).
  void EncodeBlock(size_t s, const Piece& pc, float* v, size_t wire_at, float* residual);
  /// Encodes this rank's chunk of stripe s from `x` (x[0] is buffer element `base`) into `dst`.
  void EncodeOwn(size_t s, const float* x, size_t base, uint8_t* dst);
  /// Stages this rank's encoding of stripe s (ws.own) for the network.
  void Stage(size_t s);
  /// The wire side of this rank's message of stripe s, and where chunk c's lands.
  const uint8_t* SendFrom(size_t s);
  uint8_t* ReceiveInto(size_t s, size_t c);
  /// Decodes chunk c of stripe s from `encoding` (device memory) into the output.
  void Decode(size_t s, size_t c, const uint8_t* encoding);
  /// Decodes every other chunk of stripe s from where it landed (with `own_too`, this rank's
  /// from ws.own as well), in rank order. Nothing when raw: they landed in place.
  void DecodeAll(size_t s, bool own_too);
  /// Decodes every chunk of every stripe from `all` (device memory in ws.all's layout: a column's
  /// encodings the 2-D SRA's row gathered), stripe by stripe, in rank order.
  void DecodeFrom(const uint8_t* all);

 private:
  const CompressedAllreduceOptions& o_;
  const SraPlan& plan_;
  CompressionWorkspace& ws_;
  const bool raw_;
  void* out_;
  const DataType out_dtype_;
  const CodecParams own_;                    // this rank's stream
  std::vector<std::vector<size_t>> all_at_;  // [stripe][chunk]: offsets in ws.all
};

}  // namespace gradcomp
