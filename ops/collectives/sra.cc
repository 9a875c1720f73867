// SRA: every rank encodes each peer's chunk, the chunks are exchanged (all-to-all), the owner
// sums its chunk in float32 (the reduce-scatter half), encodes it once, and the reduced chunks
// are allgathered (the allgather half; sra_halves.h). compressed_allreduce.h gives the error
// bound. The steps of a stripe, then the two drivers.
#include "ops/collectives/sra.h"

#include <algorithm>
#include <functional>
#include <memory>

#include "ops/collectives/context.h"
#include "ops/collectives/pipeline.h"
#include "ops/collectives/sra_halves.h"
#include "ops/common/enforce.h"

namespace gradcomp {

namespace {

// Tags of the striped SRA's point-to-point messages: two per stripe (scatter, gather).
constexpr int kSraTagBase = 0x5300;
// Stripes of one step (scatter or gather) a rank has on the wire to each peer at once. One:
// more made runs swing to much slower, and since stripes go eagerly (mpi_environment.cc) two
// are no faster (docs/benchmarks.md, "Stripes on the wire"); the overlap that pays is encoding
// and decoding with the network, which one in flight keeps.
constexpr size_t kStripesInFlight = 1;

// One SRA on one rank: the plan, its two halves and the steps each stripe goes through.
class SraRun {
 public:
  SraRun(Communicator& comm, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
         float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings)
      : comm_(comm), o_(o), x_(x), scale_(scale), out_(out), ws_(ws), st_(st),
        plan_(SraPlan::Make(o, static_cast<size_t>(comm.size()), static_cast<size_t>(comm.rank()))),
        rr_(o.reduced_residual ? o.reduced_residual + plan_.chunk_offsets[plan_.mine] : nullptr),
        raw_(o.codec == &NoneCodec() && !keep_encodings && o.residual == nullptr && rr_ == nullptr &&
             comm.nonblocking() && (ws.device.space() == MemorySpace::kHost || WireOnDevice(comm, ws))),
        scatter_(o, plan_, SraScatterParams(o.params, comm.rank()), x, ws, raw_),
        gather_(o, plan_, ws, raw_, out, DataType::kFloat32) {
    const bool wire_on_device = WireOnDevice(comm, ws);
    scatter_.Reserve(wire_on_device);
    gather_.Reserve(wire_on_device);
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
  const float* x_;
  const OutputScaling scale_;
  float* out_;
  CompressionWorkspace& ws_;
  CompressedAllreduceStats* st_;
  const SraPlan plan_;
  float* rr_;  // reduced residual of this rank's chunk, or null
  // Raw float32 on the wire (the none codec, no error feedback) over a transport that reads
  // this memory: the scatter sends straight from x, the owner sums its chunk into out and sends
  // it from there, and every reduced chunk lands in out. Encoding and decoding the identity
  // were a copy each way of every value on the exchange's helper thread (perf, 25.2M-parameter
  // MLP at 1 Gbit/s), where gloo sends from and receives into the buffer.
  const bool raw_;
  ScatterHalf scatter_;
  GatherHalf gather_;
};

// 1. Encodes every peer's stripe (the scatter half), staged for the network.
void SraRun::EncodePeers(size_t s) {
  if (raw_) return;  // sent as they are
  Phase phase(o_, "COMPRESS", &st_->compress_seconds);
  scatter_.EncodePeers(s);
  ws_.stream->Synchronize();
}

// 2 + 3. Sums this rank's stripe (the scatter half), and block by block, while the sum is in
// cache, scales it and encodes it once (the gather half, with the reduced residual's feedback).
// Raw: the sum is scaled where it lies, in out, and sent from there.
void SraRun::ReduceOwn(size_t s) {
  Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
  Device& d = ws_.device;
  Stream& stream = *ws_.stream;
  if (raw_) {
    scatter_.Reduce(s, out_, 0, [&](const Piece& pc, float* sum, size_t) { scale_.Apply(d, sum, pc.len, stream); });
  } else {
    const size_t chunk_at = plan_.chunk_offsets[plan_.mine];
    scatter_.Reduce(s, nullptr, 0, [&](const Piece& pc, float* sum, size_t wire_at) {
      scale_.Apply(d, sum, pc.len, stream);
      gather_.EncodeBlock(s, pc, sum, wire_at, rr_ ? rr_ + (pc.start - chunk_at) : nullptr);
    });
    gather_.Stage(s);
  }
  stream.Synchronize();
}

// 5. Decodes every other rank's stripe into the output (this rank's is decoded already).
void SraRun::DecodeAll(size_t s) {
  if (raw_) return;  // the gather wrote them in place
  Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
  gather_.DecodeAll(s, false);
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
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    t.gather_in[s].push_back(
        comm_.Irecv(gather_.ReceiveInto(s, p), plan_.bytes[s][p], static_cast<int>(p), StripeTag(s, 1)));
  }
}

// Every receive is posted up front, stripe by stripe (posting every scatter's first was slower:
// docs/benchmarks.md, "Stripes on the wire"), except the gather's where they land on values
// this rank still sends (raw and in place: peer p's reduced stripe s overwrites the x values of
// it that the scatter sends to p): then once that stripe's scatter has left.
size_t SraRun::PostReceives(StripeTransfers& t, bool gather_after_scatter) {
  size_t gather_posted = 0;
  for (size_t s = 0; s < plan_.stripes; ++s) {
    for (size_t p = 0; p < plan_.ranks; ++p) {
      if (p == plan_.mine) continue;
      t.scatter_in[s].push_back(
          comm_.Irecv(scatter_.ReceiveInto(s, p), plan_.bytes[s][plan_.mine], static_cast<int>(p), StripeTag(s, 0)));
    }
    if (!gather_after_scatter) PostGather(gather_posted++, t);
  }
  return gather_posted;
}

void SraRun::SendScatter(size_t s, StripeTransfers& t) {
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    t.scatter_out[s].push_back(
        comm_.Isend(scatter_.SendFrom(s, p), plan_.bytes[s][p], static_cast<int>(p), StripeTag(s, 0)));
  }
}

void SraRun::SendGather(size_t s, StripeTransfers& t) {
  for (size_t p = 0; p < plan_.ranks; ++p) {
    if (p == plan_.mine) continue;
    t.gather_out[s].push_back(
        comm_.Isend(gather_.SendFrom(s), plan_.bytes[s][plan_.mine], static_cast<int>(p), StripeTag(s, 1)));
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
