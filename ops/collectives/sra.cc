// SRA: every rank encodes each peer's chunk, the chunks are exchanged (all-to-all), the owner
// sums its chunk in float32, encodes it once, and the reduced chunks are allgathered
// (compressed_allreduce.h gives the error bound). Steps, then the two drivers.
#include "ops/collectives/sra.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "ops/collectives/context.h"
#include "ops/collectives/pipeline.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec_on_device.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

// Tags of the striped SRA's point-to-point messages: two per stripe (scatter, gather).
constexpr int kSraTagBase = 0x5300;
// Stripes of one step (scatter or gather) a rank has on the wire to each peer at once. One:
// more made runs swing to much slower, and since stripes go eagerly (mpi_environment.cc) two
// are no faster (docs/benchmarks.md, "Stripes on the wire"); the overlap that pays is encoding
// and decoding with the network, which one in flight keeps.
constexpr size_t kStripesInFlight = 1;

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
  SraPlan plan;
  plan.ranks = ranks;
  plan.mine = me;
  const std::vector<size_t> bounds = SegmentBounds(o);
  plan.chunks = EvenSplit(o.count, static_cast<int>(ranks));
  plan.chunk_offsets = Offsets(plan.chunks);
  plan.stripes = StripeCount(o, plan.chunks);
  const size_t bucket = static_cast<size_t>(std::max<int64_t>(1, o.params.bucket_size));
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

namespace {

// One SRA on one rank: the plan, the buffers and the three steps each stripe goes through.
class SraRun {
 public:
  SraRun(Communicator& comm, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
         float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings)
      : comm_(comm), o_(o), codec_(*o.codec), x_(x), scale_(scale), out_(out), ws_(ws), st_(st),
        plan_(SraPlan::Make(o, static_cast<size_t>(comm.size()), static_cast<size_t>(comm.rank()))),
        p1_(SraScatterParams(o.params, comm.rank())),
        p2_(SraGatherParams(o.params, comm.rank())),
        rr_(o.reduced_residual ? o.reduced_residual + plan_.chunk_offsets[plan_.mine] : nullptr),
        raw_(&codec_ == &NoneCodec() && !keep_encodings && o.residual == nullptr && rr_ == nullptr &&
             comm.nonblocking() && (ws.device.space() == MemorySpace::kHost || WireOnDevice(comm, ws))) {
    Device& d = ws.device;
    const bool wire_on_device = WireOnDevice(comm, ws);
    ws.recv.Reserve(d, plan_.recv_total, wire_on_device);
    if (raw_) return;
    ws.send.Reserve(d, plan_.send_total, wire_on_device);
    ws.own.Reserve(d, plan_.own_total, wire_on_device);
    ws.all.Reserve(d, plan_.all_total, wire_on_device);
  }

  void Run() {
    Pipeline pipe(plan_.stripes == 1);
    if (plan_.stripes == 1 && !raw_) {
      RunBlocking(pipe);
    } else {
      RunStriped(pipe);
    }
    st_->bytes_sent += plan_.BytesSent();
  }

 private:
  void EncodePeers(size_t s);
  void ReduceOwn(size_t s);
  void ReduceOwnRaw(size_t s);
  void DecodeAll(size_t s);
  void RunBlocking(Pipeline& pipe);
  void RunStriped(Pipeline& pipe);
  void ExchangeStripes(Pipeline& pipe, const std::vector<size_t>& encoded, std::vector<size_t>* decoded);
  // The striped exchange's transfers, per stripe: the scatter's and the gather's, in and out.
  using Transfers = std::vector<std::unique_ptr<PendingTransfer>>;
  struct StripeTransfers {
    std::vector<Transfers> scatter_in, gather_in, scatter_out, gather_out;
  };
  static int StripeTag(size_t s, int step) { return kSraTagBase + static_cast<int>(2 * s) + step; }
  // Stops at the first transfer still in flight: a finished one costs no transport call, and
  // one call progresses every transfer, so a poll costs a few calls instead of one per peer
  // (at 64 ranks, hundreds of progress calls a poll made the exchange slower than the link).
  static bool AllDone(Transfers& ts);
  /// Posts every receive of the striped exchange (RunStriped says which wait); returns how many
  /// stripes' gather receives it posted.
  size_t PostReceives(StripeTransfers& t, bool gather_after_scatter);
  void PostGather(size_t s, StripeTransfers& t);
  void SendScatter(size_t s, StripeTransfers& t);
  void SendGather(size_t s, StripeTransfers& t);

  Communicator& comm_;
  const CompressedAllreduceOptions& o_;
  const Codec& codec_;
  const float* x_;
  const OutputScaling scale_;
  float* out_;
  CompressionWorkspace& ws_;
  CompressedAllreduceStats* st_;
  const SraPlan plan_;
  const CodecParams p1_;  // this rank's stream in the scatter
  const CodecParams p2_;  // and in the gather
  float* rr_;             // reduced residual of this rank's chunk, or null
  // Raw float32 on the wire (the none codec, no error feedback) over a transport that reads
  // this memory: the scatter sends straight from x, the owner sums its chunk into out and sends
  // it from there, and every reduced chunk lands in out. Encoding and decoding the identity
  // were a copy each way of every value on the exchange's helper thread (perf, 25.2M-parameter
  // MLP at 1 Gbit/s), where gloo sends from and receives into the buffer.
  const bool raw_;

  // Where stripe s's messages leave from and land: peer p's scatter (at `at`, its offset in the
  // stripe's send buffer), this rank's reduced chunk, chunk c's (at `at` in the gather buffer).
  const uint8_t* ScatterFrom(size_t s, size_t p, size_t at) const {
    if (raw_) return reinterpret_cast<const uint8_t*>(x_ + plan_.StripeBegin(p, s));
    return ws_.send.wire() + plan_.send_at[s] + at;
  }
  const uint8_t* GatherFrom(size_t s) const {
    if (raw_) return reinterpret_cast<const uint8_t*>(out_ + plan_.StripeBegin(plan_.mine, s));
    return ws_.own.wire() + plan_.own_at[s];
  }
  uint8_t* GatherInto(size_t s, size_t c, size_t at) const {
    if (raw_) return reinterpret_cast<uint8_t*>(out_ + plan_.StripeBegin(c, s));
    return ws_.all.wire() + plan_.all_at[s] + at;
  }
};

// 1. Encodes every peer's stripe (and keeps what that encoding lost, for error feedback), and
// stages the encodings for the network (unless the communicator reads device memory).
void SraRun::EncodePeers(size_t s) {
  if (raw_) return;  // sent as they are
  Phase phase(o_, "COMPRESS", &st_->compress_seconds);
  Device& d = ws_.device;
  Stream& stream = *ws_.stream;
  const std::vector<size_t> bytes = plan_.ScatterBytes(s, true), off = Offsets(bytes);
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    uint8_t* dst = ws_.send.device() + plan_.send_at[s] + off[p];
    EncodePieces(ws_, codec_, p1_, x_, 0, plan_.pieces[s][p], dst);
    if (!o_.residual) continue;
    const size_t begin = plan_.StripeBegin(p, s), len = plan_.StripeLength(p, s);
    float* r = o_.residual + begin;
    DecodePieces(ws_, codec_, p1_, dst, plan_.pieces[s][p], begin, DataType::kFloat32, r);
    d.Subtract(r, x_ + begin, r, len, stream);
  }
  ws_.send.ToWire(plan_.send_at[s], off.back() + bytes.back(), stream);
  stream.Synchronize();
}

// 2 + 3. Sums this rank's stripe in float32 (own values, then the peers' in rank order),
// scales, compensates and encodes once: block by block, so the sum never leaves the cache.
void SraRun::ReduceOwn(size_t s) {
  if (raw_) return ReduceOwnRaw(s);
  Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
  Device& d = ws_.device;
  Stream& stream = *ws_.stream;
  const size_t mine = plan_.mine;
  const std::vector<size_t> bytes = plan_.ScatterBytes(s, false), off = Offsets(bytes);
  ws_.recv.FromWire(plan_.recv_at[s], off.back() + bytes.back(), stream);
  size_t longest = 0;
  for (const Piece& pc : plan_.pieces[s][mine]) longest = std::max(longest, pc.len);
  auto* a = static_cast<float*>(ws_.acc.Reserve(d, std::max(longest, kBlockValues) * sizeof(float)));
  size_t wire_at = 0;  // of this block in every peer's message, and in our own encoding
  for (const Piece& pc : plan_.pieces[s][mine]) {
    d.Copy(a, x_ + pc.start, pc.len * sizeof(float), stream);
    const size_t block_bytes = codec_.MaxWireSize(pc.len, p1_);
    AccumulatePeers(d, codec_, p1_, ws_.recv.device() + plan_.recv_at[s], off, wire_at, block_bytes, pc.len, mine, a,
                    stream);
    scale_.Apply(d, a, pc.len, stream);
    float* r = rr_ ? rr_ + (pc.start - plan_.chunk_offsets[mine]) : nullptr;
    if (r) d.Reduce(a, a, r, pc.len, DataType::kFloat32, ReduceOp::kSum, stream);
    uint8_t* dst = ws_.own.device() + plan_.own_at[s] + wire_at;
    EncodeOn(d, codec_, a, DataType::kFloat32, pc.len, p2_, pc.start, dst, stream);
    // This rank's share of the result is its encoding decoded, as on every other rank;
    // decoded here while it is in cache (x's block was read above, so out may alias x).
    float* result = out_ + pc.start;
    DecodeOn(d, codec_, dst, block_bytes, pc.len, p2_, DataType::kFloat32, result, false, stream);
    if (r) d.Subtract(r, a, result, pc.len, stream);
    wire_at += block_bytes;
  }
  ws_.own.ToWire(plan_.own_at[s], wire_at, stream);
  stream.Synchronize();
}

// 2 + 3, raw: out = x + the peers' values in rank order, scaled, block by block (the same sums
// as ReduceOwn's: decoding the identity is exact).
void SraRun::ReduceOwnRaw(size_t s) {
  Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
  Device& d = ws_.device;
  Stream& stream = *ws_.stream;
  const size_t mine = plan_.mine;
  const std::vector<size_t> off = Offsets(plan_.ScatterBytes(s, false));
  size_t wire_at = 0;  // of this block in every peer's message (read where it landed: raw_)
  for (const Piece& pc : plan_.pieces[s][mine]) {
    float* result = out_ + pc.start;
    const float* own = x_ + pc.start;
    for (size_t p = 0; p < plan_.ranks; ++p) {
      if (p == mine) continue;
      const uint8_t* peer = ws_.recv.device() + plan_.recv_at[s] + off[p] + wire_at;
      d.Reduce(result, own, peer, pc.len, DataType::kFloat32, ReduceOp::kSum, stream);
      own = result;
    }
    scale_.Apply(d, result, pc.len, stream);
    wire_at += pc.len * sizeof(float);
  }
  stream.Synchronize();
}

// 5. Decodes every other rank's stripe into the output (this rank's is decoded already).
void SraRun::DecodeAll(size_t s) {
  if (raw_) return;  // the gather wrote them in place
  Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
  const std::vector<size_t> off = Offsets(plan_.bytes[s]);
  for (size_t c = 0; c < plan_.ranks; ++c) {
    if (c == plan_.mine) continue;
    const size_t at = plan_.all_at[s] + off[c];
    ws_.all.FromWire(at, plan_.bytes[s][c], *ws_.stream);
    DecodePieces(ws_, codec_, SraGatherParams(o_.params, static_cast<int>(c)), ws_.all.device() + at,
                 plan_.pieces[s][c], 0, DataType::kFloat32, out_);
  }
}

// One stripe: encode, alltoall, reduce, allgather, decode, one after the other. Both exchanges
// post every message at once where the transport can (AlltoallAtOnce, AllgatherAtOnce): large worlds' columns of
// the 2-D SRA run here, and the transport's collectives step through the peers one by one.
void SraRun::RunBlocking(Pipeline& pipe) {
  const std::vector<size_t> send_bytes = plan_.ScatterBytes(0, true), recv_bytes = plan_.ScatterBytes(0, false);
  pipe.Wait(pipe.Submit([&] { EncodePeers(0); }));
  {
    Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
    AlltoallAtOnce(comm_, kSraTagBase, ws_.send.wire(), send_bytes, ws_.recv.wire(), recv_bytes);
  }
  pipe.Wait(pipe.Submit([&] { ReduceOwn(0); }));
  {
    Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
    // Every peer's reduced chunk into its place in ws.all (this rank's is in ws.own).
    AllgatherAtOnce(comm_, kSraTagBase + 1, ws_.own.wire(), ws_.all.wire(), plan_.bytes[0]);
  }
  pipe.Wait(pipe.Submit([&] { DecodeAll(0); }));
}

// Stripes travel point to point: every receive is posted up front (a stripe arriving early
// lands in place) and each send starts once its stripe is encoded (or reduced) and the
// previous stripe of that step has left (kStripesInFlight), so the scatter of one stripe, the
// gather of another and the helper thread's encoding and decoding overlap. (One blocking
// exchange per stripe left the link idle during each exchange's rendezvous handshake through
// a congested link.) This thread only polls (the transport progresses only inside MPI calls),
// napping between polls once nothing has progressed for a while (Poller): spinning through a
// link-bound exchange took ~60% of a core that the training thread needed (step_bench.py's CPU
// columns).
void SraRun::RunStriped(Pipeline& pipe) {
  const size_t stripes = plan_.stripes;
  std::vector<size_t> encoded(stripes), decoded(stripes);
  for (size_t s = 0; s < stripes; ++s) encoded[s] = pipe.Submit([this, s] { EncodePeers(s); });
  {
    Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
    ExchangeStripes(pipe, encoded, &decoded);
  }
  for (size_t s = 0; s < stripes; ++s) pipe.Wait(decoded[s]);
}

bool SraRun::AllDone(Transfers& ts) {
  for (auto& t : ts) {
    if (!t->Test()) return false;
  }
  return true;
}

void SraRun::PostGather(size_t s, StripeTransfers& t) {
  const std::vector<size_t> aoff = Offsets(plan_.bytes[s]);
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    t.gather_in[s].push_back(
        comm_.Irecv(GatherInto(s, p, aoff[p]), plan_.bytes[s][p], static_cast<int>(p), StripeTag(s, 1)));
  }
}

// Every receive is posted up front, stripe by stripe (posting every scatter's first was slower:
// docs/benchmarks.md, "Stripes on the wire"), except the gather's where they land on values
// this rank still sends (raw and in place: peer p's reduced stripe s overwrites the x values of
// it that the scatter sends to p): then once that stripe's scatter has left.
size_t SraRun::PostReceives(StripeTransfers& t, bool gather_after_scatter) {
  size_t gather_posted = 0;
  for (size_t s = 0; s < plan_.stripes; ++s) {
    const std::vector<size_t> roff = Offsets(plan_.ScatterBytes(s, false));
    for (size_t p = 0; p < plan_.ranks; ++p) {
      if (p == plan_.mine) continue;
      t.scatter_in[s].push_back(comm_.Irecv(ws_.recv.wire() + plan_.recv_at[s] + roff[p], plan_.bytes[s][plan_.mine],
                                            static_cast<int>(p), StripeTag(s, 0)));
    }
    if (!gather_after_scatter) PostGather(gather_posted++, t);
  }
  return gather_posted;
}

void SraRun::SendScatter(size_t s, StripeTransfers& t) {
  const std::vector<size_t> soff = Offsets(plan_.ScatterBytes(s, true));
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    t.scatter_out[s].push_back(
        comm_.Isend(ScatterFrom(s, p, soff[p]), plan_.bytes[s][p], static_cast<int>(p), StripeTag(s, 0)));
  }
}

void SraRun::SendGather(size_t s, StripeTransfers& t) {
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    t.gather_out[s].push_back(
        comm_.Isend(GatherFrom(s), plan_.bytes[s][plan_.mine], static_cast<int>(p), StripeTag(s, 1)));
  }
}

// The striped driver's network side: posts every receive, then polls, sending each stripe
// once it is ready and handing what arrives to the pipeline (reduce, then decode).
void SraRun::ExchangeStripes(Pipeline& pipe, const std::vector<size_t>& encoded, std::vector<size_t>* decoded) {
  const size_t stripes = plan_.stripes;
  StripeTransfers t;
  t.scatter_in.resize(stripes);
  t.gather_in.resize(stripes);
  t.scatter_out.resize(stripes);
  t.gather_out.resize(stripes);
  const std::less<const float*> before_ptr;
  const bool gather_after_scatter =
      raw_ && before_ptr(out_, x_ + o_.count) && before_ptr(x_, out_ + o_.count);  // out overlaps x
  size_t gather_posted = PostReceives(t, gather_after_scatter);
  // Every stripe went out (peers may finish decoding ours later than we finish decoding theirs).
  const auto all_sent = [&] {
    for (size_t s = 0; s < stripes; ++s) {
      if (!AllDone(t.scatter_out[s]) || !AllDone(t.gather_out[s])) return false;
    }
    return true;
  };
  const auto window_free = [&](std::vector<Transfers>& sends, size_t s) {
    return s < kStripesInFlight || AllDone(sends[s - kStripesInFlight]);
  };
  std::vector<size_t> reduced(stripes);
  size_t scattered = 0, reducing = 0, gathered = 0, decoding = 0;
  Poller poller(&comm_, pipe.wake_fd());
  while (true) {
    const size_t before = scattered + reducing + gathered + decoding + gather_posted;
    if (scattered < stripes && window_free(t.scatter_out, scattered) && pipe.Done(encoded[scattered])) {
      SendScatter(scattered++, t);
    }
    while (gather_posted < scattered && AllDone(t.scatter_out[gather_posted])) PostGather(gather_posted++, t);
    if (reducing < stripes && AllDone(t.scatter_in[reducing])) {
      reduced[reducing] = pipe.Submit([this, s = reducing] { ReduceOwn(s); });
      ++reducing;
    }
    if (gathered < reducing && window_free(t.gather_out, gathered) && pipe.Done(reduced[gathered])) {
      SendGather(gathered++, t);
    }
    if (decoding < gather_posted && AllDone(t.gather_in[decoding])) {
      (*decoded)[decoding] = pipe.Submit([this, s = decoding] { DecodeAll(s); });
      ++decoding;
    }
    // Done once every stripe came in and went out.
    const bool progressed = scattered + reducing + gathered + decoding + gather_posted != before;
    if (scattered == stripes && gathered == stripes && decoding == stripes && all_sent()) return;
    poller.Pause(progressed);
  }
}

}  // namespace

void Sra(Communicator& comm, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
         float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings) {
  if (comm.size() == 1) {  // nothing crosses a wire: exact
    ws.device.Copy(out, x, o.count * sizeof(float), *ws.stream);
    scale.Apply(ws.device, out, o.count, *ws.stream);
    if (o.residual) ws.device.Fill(o.residual, 0, o.count * sizeof(float), *ws.stream);
    return;
  }
  if (o.pipeline_stripes > 1 && !comm.nonblocking()) {
    // Stripes travel point to point; a transport without it (NCCL) takes one exchange of each.
    GC_ENFORCE(!keep_encodings, "the caller plans the encodings' layout: it must ask for one stripe");
    const CompressedAllreduceOptions one_stripe = OneStripe(o);
    return SraRun(comm, one_stripe, x, scale, out, ws, st, false).Run();
  }
  SraRun(comm, o, x, scale, out, ws, st, keep_encodings).Run();
}

CompressedAllreduceStats RunDenseAllreduce(const char* what, const CompressedAllreduceOptions& o, int ranks,
                                           const DenseAlgorithm& algorithm) {
  CompressedAllreduceStats st;
  WithTensorContext(what, o.name, [&] {
    ValidateCompressed(o, false);
    if (o.count == 0) return;
    WorkspaceFor workspace(o);
    CompressionWorkspace& ws = *workspace;
    const float* x = WorkingCopy(o, ws);
    float* out = ResultBuffer(o, ws);
    algorithm(x, OutputScale(o, ranks), out, ws, &st);
    StoreOutput(o, ws, out);
  });
  return st;
}

CompressedAllreduceStats CompressedAllreduce(Communicator& comm, const CompressedAllreduceOptions& o) {
  return RunDenseAllreduce("compressed allreduce", o, comm.size(),
                           [&](const float* x, const OutputScaling& scale, float* out, CompressionWorkspace& ws,
                               CompressedAllreduceStats* st) { Sra(comm, o, x, scale, out, ws, st); });
}

}  // namespace gradcomp
