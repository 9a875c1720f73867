#include "ops/collectives/sra_halves.h"

#include <algorithm>

#include "ops/common/enforce.h"
#include "ops/compression/codec_on_device.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

// [stripe][chunk]: where each chunk's message of the stripe lies in a buffer holding stripe after
// stripe (at[s]), chunk after chunk, each `bytes(s, c)` long.
template <typename Bytes>
std::vector<std::vector<size_t>> MessageOffsets(const SraPlan& plan, const std::vector<size_t>& at,
                                                const Bytes& bytes) {
  std::vector<std::vector<size_t>> offsets(plan.stripes);
  for (size_t s = 0; s < plan.stripes; ++s) {
    std::vector<size_t> sizes(plan.ranks);
    for (size_t c = 0; c < plan.ranks; ++c) sizes[c] = bytes(s, c);
    offsets[s] = Offsets(sizes);
    for (size_t& off : offsets[s]) off += at[s];
  }
  return offsets;
}

}  // namespace

ScatterHalf::ScatterHalf(const CompressedAllreduceOptions& o, const SraPlan& plan, const CodecParams& stream,
                         const float* x, CompressionWorkspace& ws, bool raw)
    : o_(o), plan_(plan), p_(stream), x_(x), ws_(ws), raw_(raw) {
  const size_t mine = plan.mine;
  send_at_ = MessageOffsets(plan, plan.send_at, [&](size_t s, size_t c) { return c == mine ? 0 : plan.bytes[s][c]; });
  recv_at_ =
      MessageOffsets(plan, plan.recv_at, [&](size_t s, size_t c) { return c == mine ? 0 : plan.bytes[s][mine]; });
}

void ScatterHalf::Reserve(bool wire_on_device) {
  ws_.recv.Reserve(ws_.device, plan_.recv_total, wire_on_device);
  if (!raw_) ws_.send.Reserve(ws_.device, plan_.send_total, wire_on_device);
}

void ScatterHalf::Encode(size_t s, size_t p) {
  uint8_t* dst = ws_.send.device() + send_at_[s][p];
  EncodePieces(ws_, *o_.codec, p_, x_, 0, plan_.pieces[s][p], dst);
  if (!o_.residual) return;
  const size_t begin = plan_.StripeBegin(p, s), len = plan_.StripeLength(p, s);
  float* r = o_.residual + begin;
  DecodePieces(ws_, *o_.codec, p_, dst, plan_.pieces[s][p], begin, DataType::kFloat32, r);
  ws_.device.Subtract(r, x_ + begin, r, len, *ws_.stream);
}

void ScatterHalf::Stage(size_t s, size_t p) { ws_.send.ToWire(send_at_[s][p], plan_.bytes[s][p], *ws_.stream); }

void ScatterHalf::EncodePeers(size_t s) {
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p != plan_.mine) Encode(s, p);
  }
  const size_t end = s + 1 < plan_.stripes ? plan_.send_at[s + 1] : plan_.send_total;
  ws_.send.ToWire(plan_.send_at[s], end - plan_.send_at[s], *ws_.stream);
}

const uint8_t* ScatterHalf::SendFrom(size_t s, size_t p) {
  if (raw_) return reinterpret_cast<const uint8_t*>(x_ + plan_.StripeBegin(p, s));
  return ws_.send.wire() + send_at_[s][p];
}

uint8_t* ScatterHalf::ReceiveInto(size_t s, size_t p) { return ws_.recv.wire() + recv_at_[s][p]; }

void ScatterHalf::Reduce(size_t s, float* into, size_t into_base, const BlockSum& then) {
  Device& d = ws_.device;
  Stream& stream = *ws_.stream;
  const size_t mine = plan_.mine;
  const std::vector<Piece>& pieces = plan_.pieces[s][mine];
  size_t wire_at = 0;  // of this block in every peer's message
  if (raw_) {
    // into = x + the peers' values in rank order, read where they landed: the sums below
    // (decoding the identity is exact), without copying x first.
    GC_ENFORCE(into != nullptr, "the raw scatter half sums into the caller's buffer");
    for (const Piece& pc : pieces) {
      float* sum = into + (pc.start - into_base);
      const float* own = x_ + pc.start;
      for (size_t p = 0; p < plan_.ranks; ++p) {
        if (p == mine) continue;
        d.Reduce(sum, own, ws_.recv.device() + recv_at_[s][p] + wire_at, pc.len, DataType::kFloat32, ReduceOp::kSum,
                 stream);
        own = sum;
      }
      if (then) then(pc, sum, wire_at);
      wire_at += pc.len * sizeof(float);
    }
    return;
  }
  const size_t end = s + 1 < plan_.stripes ? plan_.recv_at[s + 1] : plan_.recv_total;
  ws_.recv.FromWire(plan_.recv_at[s], end - plan_.recv_at[s], stream);
  float* scratch = nullptr;
  if (into == nullptr) {
    size_t longest = 0;
    for (const Piece& pc : pieces) longest = std::max(longest, pc.len);
    scratch = static_cast<float*>(ws_.acc.Reserve(d, std::max(longest, kBlockValues) * sizeof(float)));
  }
  // The scatter-reduce step of every SRA: this rank's own values, then every peer's encoding
  // decoded in float32 and added, in rank order. The same sums in the same order wherever it
  // runs is what keeps results bit-identical across ranks and algorithms.
  for (const Piece& pc : pieces) {
    float* sum = scratch != nullptr ? scratch : into + (pc.start - into_base);
    if (sum != x_ + pc.start) d.Copy(sum, x_ + pc.start, pc.len * sizeof(float), stream);
    const size_t block_bytes = o_.codec->MaxWireSize(pc.len, p_);
    for (size_t p = 0; p < plan_.ranks; ++p) {
      if (p == mine) continue;
      DecodeOn(d, *o_.codec, ws_.recv.device() + recv_at_[s][p] + wire_at, block_bytes, pc.len, p_, DataType::kFloat32,
               sum, true, stream);
    }
    if (then) then(pc, sum, wire_at);
    wire_at += block_bytes;
  }
}

GatherHalf::GatherHalf(const CompressedAllreduceOptions& o, const SraPlan& plan, CompressionWorkspace& ws, bool raw,
                       void* out, DataType out_dtype)
    : o_(o),
      plan_(plan),
      ws_(ws),
      raw_(raw),
      out_(out),
      out_dtype_(out_dtype),
      own_(SraGatherParams(o.params, static_cast<int>(plan.mine))) {
  all_at_ = MessageOffsets(plan, plan.all_at, [&](size_t s, size_t c) { return plan.bytes[s][c]; });
}

void GatherHalf::Reserve(bool wire_on_device) {
  if (raw_) return;
  ws_.own.Reserve(ws_.device, plan_.own_total, wire_on_device);
  ws_.all.Reserve(ws_.device, plan_.all_total, wire_on_device);
}

void GatherHalf::EncodeBlock(size_t s, const Piece& pc, float* v, size_t wire_at, float* residual) {
  Device& d = ws_.device;
  Stream& stream = *ws_.stream;
  if (residual) d.Reduce(v, v, residual, pc.len, DataType::kFloat32, ReduceOp::kSum, stream);
  uint8_t* dst = ws_.own.device() + plan_.own_at[s] + wire_at;
  EncodeOn(d, *o_.codec, v, DataType::kFloat32, pc.len, own_, pc.start, dst, stream);
  // Decoded here while it is in cache (the caller's x block was read before, so out may alias x).
  char* result = static_cast<char*>(out_) + pc.start * DataTypeSize(out_dtype_);
  DecodeOn(d, *o_.codec, dst, o_.codec->MaxWireSize(pc.len, own_), pc.len, own_, out_dtype_, result, false, stream);
  if (!residual) return;
  GC_ENFORCE(out_dtype_ == DataType::kFloat32, "the allgather half's error feedback needs a float32 output");
  d.Subtract(residual, v, reinterpret_cast<float*>(result), pc.len, stream);
}

void GatherHalf::EncodeOwn(size_t s, const float* x, size_t base, uint8_t* dst) {
  EncodePieces(ws_, *o_.codec, own_, x, base, plan_.pieces[s][plan_.mine], dst);
}

void GatherHalf::Stage(size_t s) { ws_.own.ToWire(plan_.own_at[s], plan_.bytes[s][plan_.mine], *ws_.stream); }

const uint8_t* GatherHalf::SendFrom(size_t s) {
  if (raw_) return static_cast<const uint8_t*>(out_) + plan_.StripeBegin(plan_.mine, s) * sizeof(float);
  return ws_.own.wire() + plan_.own_at[s];
}

uint8_t* GatherHalf::ReceiveInto(size_t s, size_t c) {
  if (raw_) return static_cast<uint8_t*>(out_) + plan_.StripeBegin(c, s) * sizeof(float);
  return ws_.all.wire() + all_at_[s][c];
}

void GatherHalf::Decode(size_t s, size_t c, const uint8_t* encoding) {
  DecodePieces(ws_, *o_.codec, SraGatherParams(o_.params, static_cast<int>(c)), encoding, plan_.pieces[s][c], 0,
               out_dtype_, out_);
}

void GatherHalf::DecodeAll(size_t s, bool own_too) {
  if (raw_) return;
  for (size_t c = 0; c < plan_.ranks; ++c) {
    if (c == plan_.mine) {
      if (own_too) Decode(s, c, ws_.own.device() + plan_.own_at[s]);
      continue;
    }
    ws_.all.FromWire(all_at_[s][c], plan_.bytes[s][c], *ws_.stream);
    Decode(s, c, ws_.all.device() + all_at_[s][c]);
  }
}

void GatherHalf::DecodeFrom(const uint8_t* all) {
  for (size_t s = 0; s < plan_.stripes; ++s) {
    for (size_t c = 0; c < plan_.ranks; ++c) Decode(s, c, all + all_at_[s][c]);
  }
}

}  // namespace gradcomp
