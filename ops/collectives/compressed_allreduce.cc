#include "ops/collectives/compressed_allreduce.h"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <numeric>
#include <thread>

#include "ops/collectives/context.h"
#include "ops/compression/maxmin_math.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

using Clock = std::chrono::steady_clock;

double Since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

// Times one phase into `seconds` and reports its begin and end to the options' hook.
class Phase {
 public:
  Phase(const CompressedAllreduceOptions& o, const char* name, double* seconds)
      : hook_(o.on_phase), name_(name), seconds_(seconds), start_(Clock::now()) {
    if (hook_) hook_(name_, true);
  }
  ~Phase() {
    *seconds_ += Since(start_);
    if (hook_) hook_(name_, false);
  }
  Phase(const Phase&) = delete;
  Phase& operator=(const Phase&) = delete;

 private:
  const std::function<void(const char*, bool)>& hook_;
  const char* name_;
  double* seconds_;
  Clock::time_point start_;
};

/// A run of values inside one chunk and one tensor: an encoded segment of its own.
struct Piece {
  size_t start;  // in buffer coordinates
  size_t len;
};

std::vector<size_t> SegmentBounds(const CompressedAllreduceOptions& o) {
  std::vector<size_t> bounds{0};
  if (o.segments.empty()) {
    bounds.push_back(o.count);
    return bounds;
  }
  for (size_t s : o.segments) bounds.push_back(bounds.back() + s);
  return bounds;
}

std::vector<Piece> PiecesIn(size_t begin, size_t len, const std::vector<size_t>& bounds) {
  std::vector<Piece> pieces;
  const size_t end = begin + len;
  for (size_t k = 0; k + 1 < bounds.size(); ++k) {
    const size_t a = std::max(begin, bounds[k]), b = std::min(end, bounds[k + 1]);
    if (a < b) pieces.push_back({a, b - a});
  }
  return pieces;
}

// Pieces longer than a block are cut into blocks of whole buckets (and whole 8-value code
// groups), so each step of the reduction works on data that stays in cache. The buckets, the
// values and the bytes on the wire stay the same; each block is an encoded segment of its own.
constexpr size_t kBlockValues = size_t{1} << 14;

std::vector<Piece> CutIntoBlocks(const std::vector<Piece>& pieces, size_t bucket_size) {
  const size_t unit = std::lcm(std::max<size_t>(bucket_size, 1), size_t{8});
  if (unit > kBlockValues) return pieces;
  const size_t block = kBlockValues / unit * unit;
  std::vector<Piece> out;
  for (const Piece& pc : pieces) {
    for (size_t at = 0; at < pc.len; at += block) out.push_back({pc.start + at, std::min(block, pc.len - at)});
  }
  return out;
}

size_t EncodedSize(const Codec& codec, const CodecParams& p, const std::vector<Piece>& pieces) {
  size_t total = 0;
  for (const Piece& pc : pieces) total += codec.MaxWireSize(pc.len, p);
  return total;
}

// Encodes the float32 values of `pieces` piece after piece; x[0] is buffer element `base`.
size_t EncodePieces(const Codec& codec, const CodecParams& p, const float* x, size_t base,
                    const std::vector<Piece>& pieces, uint8_t* out) {
  size_t used = 0;
  for (const Piece& pc : pieces) {
    used += codec.Encode(x + (pc.start - base), DataType::kFloat32, pc.len, p, pc.start, out + used);
  }
  return used;
}

// Decodes pieces into `out`, whose element 0 is buffer element `base`.
void DecodePieces(const Codec& codec, const CodecParams& p, const uint8_t* wire, const std::vector<Piece>& pieces,
                  size_t base, DataType out_dtype, void* out) {
  const size_t esize = DataTypeSize(out_dtype);
  for (const Piece& pc : pieces) {
    const size_t bytes = codec.MaxWireSize(pc.len, p);
    codec.Decode(wire, bytes, pc.len, p, out_dtype, static_cast<char*>(out) + (pc.start - base) * esize);
    wire += bytes;
  }
}

// Each rank (and each stage) rounds with its own random stream.
CodecParams StreamFor(const CodecParams& p, uint32_t stream) {
  CodecParams q = p;
  q.seed = p.seed ^ (static_cast<uint64_t>(maxmin::Mix32(stream + 0x51ed27u)) << 32);
  return q;
}

void Validate(const CompressedAllreduceOptions& o, bool sparse) {
  if (o.codec == nullptr) throw InvalidArgument("compressed allreduce needs a codec");
  const bool is_topk = std::string(o.codec->name()) == "topk";
  if (is_topk != sparse) {
    throw InvalidArgument(std::string("codec ") + o.codec->name() + (sparse ? " is not sparse" : " needs the sparse allreduce"));
  }
  CheckCodecDataType(o.dtype, o.codec->name(), "tensor");
  if (o.op != ReduceOp::kSum && o.op != ReduceOp::kAverage) {
    throw InvalidArgument(std::string("compressed allreduce supports sum and average, not ") + ReduceOpName(o.op));
  }
  ValidateCodecParams(o.codec->name(), o.params);
  if (!o.segments.empty()) {
    size_t total = 0;
    for (size_t s : o.segments) total += s;
    if (total != o.count) {
      throw InvalidArgument("compressed allreduce: segments sum to " + std::to_string(total) + ", not " +
                            std::to_string(o.count));
    }
  }
  if (o.count > 0 && (o.input == nullptr || o.output == nullptr)) {
    throw InvalidArgument("compressed allreduce got a null buffer");
  }
}

// The float32 values to reduce: input * prescale (+ the carried residual). A float32 input
// with nothing to add is used in place (it is only read, and before any output is written).
const float* WorkingCopy(const CompressedAllreduceOptions& o, CompressionWorkspace& ws) {
  if (o.dtype == DataType::kFloat32 && o.prescale == 1.0 && o.residual == nullptr) {
    return static_cast<const float*>(o.input);
  }
  ws.x.resize(o.count);
  CastBuffer(o.input, o.dtype, o.count, ws.x.data(), DataType::kFloat32, false, o.params.isa);
  if (o.prescale != 1.0) ScaleInPlace(ws.x.data(), o.count, DataType::kFloat32, o.prescale);
  if (o.residual != nullptr) ReduceInto(ws.x.data(), o.residual, o.count, DataType::kFloat32, ReduceOp::kSum);
  return ws.x.data();
}

// Where the float32 result goes: the output itself when it is float32.
float* ResultBuffer(const CompressedAllreduceOptions& o, CompressionWorkspace& ws) {
  if (o.dtype == DataType::kFloat32) return static_cast<float*>(o.output);
  ws.out.resize(o.count);
  return ws.out.data();
}

double OutputScale(const CompressedAllreduceOptions& o, int ranks) {
  return o.op == ReduceOp::kAverage ? o.postscale / ranks : o.postscale;
}

// Runs tasks in submission order on one helper thread, so encoding and decoding overlap with
// the calling thread's communication; Wait() waits for a task. With `inline_tasks` every task
// runs at once on the caller (small buffers: a thread costs more than it saves).
class Pipeline {
 public:
  explicit Pipeline(bool inline_tasks) : inline_(inline_tasks) {
    if (!inline_) thread_ = std::thread([this] { Loop(); });
  }
  ~Pipeline() {
    if (inline_) return;
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  // Queues `task`; returns its ticket.
  size_t Submit(std::function<void()> task) {
    if (inline_) {
      task();
      return done_++;
    }
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
    cv_.notify_all();
    return submitted_++;
  }
  // True while tasks are queued or running.
  bool Busy() {
    if (inline_) return false;
    std::lock_guard<std::mutex> lock(mu_);
    return done_ < submitted_;
  }
  // True once task `ticket` has run; never blocks; rethrows the first failure of any task.
  bool Done(size_t ticket) {
    if (inline_) return true;
    std::lock_guard<std::mutex> lock(mu_);
    if (error_) std::rethrow_exception(error_);
    return done_ > ticket;
  }
  // Waits until task `ticket` has run; rethrows the first failure of any task.
  void Wait(size_t ticket) {
    if (inline_) return;
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return done_ > ticket || error_; });
    if (error_) std::rethrow_exception(error_);
  }

 private:
  void Loop() {
    std::unique_lock<std::mutex> lock(mu_);
    while (true) {
      cv_.wait(lock, [&] { return stop_ || !tasks_.empty(); });
      if (tasks_.empty()) return;
      std::function<void()> task = std::move(tasks_.front());
      tasks_.pop_front();
      lock.unlock();
      try {
        task();
      } catch (...) {
        lock.lock();
        if (!error_) error_ = std::current_exception();
        lock.unlock();
      }
      lock.lock();
      ++done_;
      cv_.notify_all();
    }
  }

  const bool inline_;
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  size_t submitted_ = 0, done_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

// Only buffers of at least this many values are pipelined in stripes.
constexpr size_t kPipelineMinValues = size_t{1} << 20;
// A striped allreduce cuts a chunk into stripes whose messages stay near this size, at most
// kMaxStripes of them. Larger messages made the link stall on the emulated cluster (4-8 MB
// stripes ran at half the link rate), smaller ones pay more per-message overhead.
constexpr size_t kStripeBytes = size_t{1} << 20;
constexpr size_t kMaxStripes = 64;
// Tags of the striped SRA's point-to-point messages: two per stripe (scatter, gather).
constexpr int kSraTagBase = 0x5300;
// Stripes of one step (scatter or gather) a rank has on the wire to each peer at once. One:
// on the emulated 1 Gbit/s cluster two or four in flight made runs swing to much slower (fp16
// 0.42-0.49 s against 0.29-0.32 s for 64 MB); the overlap that pays is encoding and decoding
// with the network, which one in flight keeps.
constexpr size_t kStripesInFlight = 1;

// SRA of the o.count float32 values x (already prescaled and compensated) into float32 `out`.
// Each chunk is cut into stripes at bucket boundaries; stripe s goes through encode, exchange,
// reduce + encode, allgather, decode, and the encoding and decoding of one stripe overlap with
// the communication of its neighbours.
void Sra(Communicator& comm, const CompressedAllreduceOptions& o, const float* x, double scale, float* out,
         CompressionWorkspace& ws, CompressedAllreduceStats* st) {
  const Codec& codec = *o.codec;
  const int n = comm.size(), me = comm.rank();
  const size_t count = o.count;
  if (n == 1) {  // nothing crosses a wire: exact
    ScaleCopy(out, x, count, DataType::kFloat32, scale);
    if (o.residual) std::memset(o.residual, 0, count * sizeof(float));
    return;
  }
  const size_t ranks = static_cast<size_t>(n), mine = static_cast<size_t>(me);
  const std::vector<size_t> bounds = SegmentBounds(o);
  const std::vector<size_t> chunks = EvenSplit(count, n), coff = Offsets(chunks);
  size_t stripes = count >= kPipelineMinValues ? std::max<size_t>(1, o.pipeline_stripes) : 1;
  if (stripes > 1) {
    // Large messages need the transport's progress all along (once the kernel's socket buffer
    // is full); small stripes are handed to the kernel whole while this thread may be napping.
    const size_t chunk_wire = codec.MaxWireSize(*std::max_element(chunks.begin(), chunks.end()), o.params);
    stripes = std::min(kMaxStripes, std::max(stripes, (chunk_wire + kStripeBytes - 1) / kStripeBytes));
  }
  // Stripe s of chunk c: about chunk/stripes values, cut only where a bucket of the tensor
  // there begins anyway, so striping never changes the quantization (the same bytes).
  const size_t bucket = std::max<size_t>(1, o.params.bucket_size);
  const auto boundary = [&](size_t c, size_t s) {
    const size_t c0 = coff[c], c1 = coff[c] + chunks[c];
    if (s == 0) return c0;
    if (s >= stripes) return c1;
    const size_t target = c0 + std::min(chunks[c], s * ((chunks[c] + stripes - 1) / stripes));
    if (target >= c1) return c1;
    const size_t k = static_cast<size_t>(std::upper_bound(bounds.begin(), bounds.end(), target) - bounds.begin()) - 1;
    const size_t piece_start = std::max(bounds[k], c0), piece_end = std::min(bounds[k + 1], c1);
    const size_t cut = piece_start + (target - piece_start + bucket - 1) / bucket * bucket;
    return std::min(cut, piece_end);
  };
  const auto stripe_range = [&](size_t c, size_t s, size_t* begin, size_t* len) {
    *begin = boundary(c, s);
    *len = boundary(c, s + 1) - *begin;
  };
  // pieces[s][c] and their encoded sizes bytes[s][c].
  std::vector<std::vector<std::vector<Piece>>> pieces(stripes, std::vector<std::vector<Piece>>(ranks));
  std::vector<std::vector<size_t>> bytes(stripes, std::vector<size_t>(ranks));
  for (size_t s = 0; s < stripes; ++s) {
    for (size_t c = 0; c < ranks; ++c) {
      size_t begin, len;
      stripe_range(c, s, &begin, &len);
      pieces[s][c] = CutIntoBlocks(PiecesIn(begin, len, bounds), o.params.bucket_size);
      bytes[s][c] = EncodedSize(codec, o.params, pieces[s][c]);
    }
  }
  // Buffer layout: stripe after stripe, rank after rank.
  std::vector<size_t> send_at(stripes), recv_at(stripes), own_at(stripes), all_at(stripes);
  size_t send_total = 0, recv_total = 0, own_total = 0, all_total = 0;
  for (size_t s = 0; s < stripes; ++s) {
    send_at[s] = send_total;
    recv_at[s] = recv_total;
    own_at[s] = own_total;
    all_at[s] = all_total;
    for (size_t c = 0; c < ranks; ++c) {
      if (c != mine) send_total += bytes[s][c];
      if (c != mine) recv_total += bytes[s][mine];
      all_total += bytes[s][c];
    }
    own_total += bytes[s][mine];
  }
  ws.send.resize(send_total);
  ws.recv.resize(recv_total);
  ws.own.resize(own_total);
  ws.all.resize(all_total);
  float* rr = o.reduced_residual ? o.reduced_residual + coff[mine] : nullptr;
  const CodecParams p1 = StreamFor(o.params, static_cast<uint32_t>(me));
  const CodecParams p2 = StreamFor(o.params, 0x10000u + static_cast<uint32_t>(me));
  const auto sizes = [&](size_t s, bool sending) {
    std::vector<size_t> v(ranks, 0);
    for (size_t c = 0; c < ranks; ++c) {
      if (c != mine) v[c] = sending ? bytes[s][c] : bytes[s][mine];
    }
    return v;
  };

  // 1. Encode every peer's stripe (and what that encoding lost, for error feedback).
  const auto encode_peers = [&](size_t s) {
    Phase phase(o, "COMPRESS", &st->compress_seconds);
    const std::vector<size_t> off = Offsets(sizes(s, true));
    for (size_t p = 0; p < ranks; ++p) {
      if (p == mine) continue;
      uint8_t* dst = ws.send.data() + send_at[s] + off[p];
      EncodePieces(codec, p1, x, 0, pieces[s][p], dst);
      if (!o.residual) continue;
      size_t begin, len;
      stripe_range(p, s, &begin, &len);
      float* r = o.residual + begin;
      DecodePieces(codec, p1, dst, pieces[s][p], begin, DataType::kFloat32, r);
      for (size_t k = 0; k < len; ++k) r[k] = x[begin + k] - r[k];
    }
  };
  // 2 + 3. Sum this rank's stripe in float32 (own values, then the peers' in rank order),
  // scale, compensate and encode once: block by block, so the sum never leaves the cache.
  const auto reduce_own = [&](size_t s) {
    Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
    const std::vector<size_t> off = Offsets(sizes(s, false));
    std::vector<float>& acc = ws.acc;
    acc.resize(kBlockValues);
    size_t wire_at = 0;  // of this block in every peer's message, and in our own encoding
    for (const Piece& pc : pieces[s][mine]) {
      float* a = pc.len <= acc.size() ? acc.data() : (acc.resize(pc.len), acc.data());
      std::memcpy(a, x + pc.start, pc.len * sizeof(float));
      const size_t block_bytes = codec.MaxWireSize(pc.len, p1);
      for (size_t p = 0; p < ranks; ++p) {
        if (p == mine) continue;
        codec.DecodeAccumulate(ws.recv.data() + recv_at[s] + off[p] + wire_at, block_bytes, pc.len, p1,
                               DataType::kFloat32, a);
      }
      ScaleInPlace(a, pc.len, DataType::kFloat32, scale);
      float* r = rr ? rr + (pc.start - coff[mine]) : nullptr;
      if (r) ReduceInto(a, r, pc.len, DataType::kFloat32, ReduceOp::kSum);
      uint8_t* dst = ws.own.data() + own_at[s] + wire_at;
      codec.Encode(a, DataType::kFloat32, pc.len, p2, pc.start, dst);
      // This rank's share of the result is its encoding decoded, as on every other rank;
      // decoded here while it is in cache (x's block was read above, so out may alias x).
      float* result = out + pc.start;
      codec.Decode(dst, block_bytes, pc.len, p2, DataType::kFloat32, result);
      if (r) {
        for (size_t k = 0; k < pc.len; ++k) r[k] = a[k] - result[k];
      }
      wire_at += block_bytes;
    }
  };
  // 5. Decode every other rank's stripe into the output (this rank's is decoded already).
  const auto decode_all = [&](size_t s) {
    Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
    std::vector<size_t> stripe_bytes(ranks);
    for (size_t c = 0; c < ranks; ++c) stripe_bytes[c] = bytes[s][c];
    const std::vector<size_t> off = Offsets(stripe_bytes);
    for (size_t c = 0; c < ranks; ++c) {
      if (c == mine) continue;
      const CodecParams pc = StreamFor(o.params, 0x10000u + static_cast<uint32_t>(c));
      DecodePieces(codec, pc, ws.all.data() + all_at[s] + off[c], pieces[s][c], 0, DataType::kFloat32, out);
    }
  };

  Pipeline pipe(stripes == 1);
  std::vector<size_t> encoded(stripes), reduced(stripes), decoded(stripes);
  for (size_t s = 0; s < stripes; ++s) encoded[s] = pipe.Submit([&, s] { encode_peers(s); });
  if (stripes == 1) {
    pipe.Wait(encoded[0]);
    {
      Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
      comm.Alltoallv(ws.send.data(), sizes(0, true), ws.recv.data(), sizes(0, false));
    }
    reduced[0] = pipe.Submit([&] { reduce_own(0); });
    pipe.Wait(reduced[0]);
    {
      Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
      comm.Allgatherv(ws.own.data(), ws.all.data(), bytes[0]);
    }
    decoded[0] = pipe.Submit([&] { decode_all(0); });
  } else {
    // Stripes travel point to point: every receive is posted up front (a stripe arriving
    // early lands in place) and each send starts once its stripe is encoded (or reduced) and
    // the previous stripe of that step has left (kStripesInFlight), so the scatter of one
    // stripe, the gather of another and the helper thread's encoding and decoding overlap.
    // (One blocking exchange per stripe left the link idle during each exchange's
    // rendezvous handshake through a congested link.) This thread only polls, napping while
    // the helper thread works (it needs the core) and spinning otherwise (the transport
    // progresses only inside MPI calls).
    Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
    using Transfers = std::vector<std::unique_ptr<PendingTransfer>>;
    std::vector<Transfers> scatter_in(stripes), gather_in(stripes), scatter_out(stripes), gather_out(stripes);
    const auto tag = [](size_t s, int step) { return kSraTagBase + static_cast<int>(2 * s) + step; };
    for (size_t s = 0; s < stripes; ++s) {
      const std::vector<size_t> roff = Offsets(sizes(s, false)), aoff = Offsets(bytes[s]);
      for (size_t p = 0; p < ranks; ++p) {
        if (p == mine) continue;
        const int peer = static_cast<int>(p);
        scatter_in[s].push_back(comm.Irecv(ws.recv.data() + recv_at[s] + roff[p], bytes[s][mine], peer, tag(s, 0)));
        gather_in[s].push_back(comm.Irecv(ws.all.data() + all_at[s] + aoff[p], bytes[s][p], peer, tag(s, 1)));
      }
    }
    const auto all_done = [](Transfers& ts) {
      bool done = true;
      for (auto& t : ts) done = t->Test() && done;
      return done;
    };
    size_t scattered = 0, reducing = 0, gathered = 0, decoding = 0;
    PollUntil([&] {
      const auto window_free = [&](std::vector<Transfers>& sends, size_t s) {
        return s < kStripesInFlight || all_done(sends[s - kStripesInFlight]);
      };
      if (scattered < stripes && window_free(scatter_out, scattered) && pipe.Done(encoded[scattered])) {
        const std::vector<size_t> soff = Offsets(sizes(scattered, true));
        for (size_t p = 0; p < ranks; ++p) {
          if (p == mine) continue;
          scatter_out[scattered].push_back(comm.Isend(ws.send.data() + send_at[scattered] + soff[p],
                                                      bytes[scattered][p], static_cast<int>(p), tag(scattered, 0)));
        }
        ++scattered;
      }
      if (reducing < stripes && all_done(scatter_in[reducing])) {
        reduced[reducing] = pipe.Submit([&, s = reducing] { reduce_own(s); });
        ++reducing;
      }
      if (gathered < reducing && window_free(gather_out, gathered) && pipe.Done(reduced[gathered])) {
        for (size_t p = 0; p < ranks; ++p) {
          if (p == mine) continue;
          gather_out[gathered].push_back(comm.Isend(ws.own.data() + own_at[gathered], bytes[gathered][mine],
                                                    static_cast<int>(p), tag(gathered, 1)));
        }
        ++gathered;
      }
      if (decoding < stripes && all_done(gather_in[decoding])) {
        decoded[decoding] = pipe.Submit([&, s = decoding] { decode_all(s); });
        ++decoding;
      }
      // Done once every stripe went out (peers may finish decoding ours later than we finish
      // decoding theirs) and every stripe came in.
      if (scattered < stripes || gathered < stripes || decoding < stripes) return false;
      bool sent = true;
      for (size_t s = 0; s < stripes; ++s) sent = all_done(scatter_out[s]) && all_done(gather_out[s]) && sent;
      return sent;
    }, [&] { return pipe.Busy(); });
  }
  for (size_t s = 0; s < stripes; ++s) pipe.Wait(decoded[s]);
  size_t sent = send_total;
  for (size_t s = 0; s < stripes; ++s) sent += (ranks - 1) * bytes[s][mine];
  st->bytes_sent += sent;
}

void StoreOutput(const CompressedAllreduceOptions& o, const float* result) {
  if (result != o.output) CastBuffer(result, DataType::kFloat32, o.count, o.output, o.dtype, false, o.params.isa);
}

}  // namespace

CompressedAllreduceStats CompressedAllreduce(Communicator& comm, const CompressedAllreduceOptions& o) {
  CompressedAllreduceStats st;
  WithTensorContext("compressed allreduce", o.name, [&] {
    Validate(o, false);
    if (o.count == 0) return;
    CompressionWorkspace local;
    CompressionWorkspace& ws = o.workspace ? *o.workspace : local;
    const float* x = WorkingCopy(o, ws);
    float* out = ResultBuffer(o, ws);
    Sra(comm, o, x, OutputScale(o, comm.size()), out, ws, &st);
    StoreOutput(o, out);
  });
  return st;
}

CompressedAllreduceStats HierarchicalCompressedAllreduce(const Topology& topo, const CompressedAllreduceOptions& o,
                                                         bool leader_only) {
  CompressedAllreduceStats st;
  WithTensorContext("hierarchical compressed allreduce", o.name, [&] {
    Validate(o, false);
    if (!topo.homogeneous) {
      GC_THROW("hierarchical allreduce needs the same number of ranks on every node (rank ", topo.rank(), " has ",
               topo.local_size(), " local ranks)");
    }
    if (o.count == 0) return;
    Communicator& local = *topo.local;
    const double scale = OutputScale(o, topo.size());
    CompressionWorkspace local_ws;
    CompressionWorkspace& ws = o.workspace ? *o.workspace : local_ws;
    const float* input = WorkingCopy(o, ws);
    std::vector<float>& x = ws.x;  // summed over the node in place below
    if (input != x.data()) x.assign(input, input + o.count);
    std::vector<float>& result = ws.out;
    result.resize(o.count);
    if (leader_only) {
      // The node's sum on its leader; leaders compress across nodes; the node gets the result.
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.Allreduce(x.data(), x.data(), o.count, DataType::kFloat32, ReduceOp::kSum);
      }
      if (local.rank() == 0) Sra(*topo.cross, o, x.data(), scale, result.data(), ws, &st);  // residuals: node sums
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Broadcast(result.data(), o.count * sizeof(float), 0);
    } else {
      // Shard of the node sum; SRA of the shard across nodes; the node gathers the shards.
      const std::vector<size_t> shards = EvenSplit(o.count, local.size());
      const size_t me = static_cast<size_t>(local.rank()), s0 = Offsets(shards)[me], len = shards[me];
      std::vector<float>& shard = ws.shard;
      shard.resize(len);
      {
        Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
        local.ReduceScatter(x.data(), shard.data(), shards, DataType::kFloat32, ReduceOp::kSum);
      }
      CompressedAllreduceOptions sub = o;
      sub.count = len;
      sub.segments.clear();
      for (const Piece& pc : PiecesIn(s0, len, SegmentBounds(o))) sub.segments.push_back(pc.len);
      sub.residual = o.residual ? o.residual + s0 : nullptr;
      sub.reduced_residual = o.reduced_residual ? o.reduced_residual + s0 : nullptr;
      std::vector<float>& shard_out = ws.shard_out;
      shard_out.resize(len);
      Sra(*topo.cross, sub, shard.data(), scale, shard_out.data(), ws, &st);
      std::vector<size_t> bytes(shards.size());
      for (size_t i = 0; i < shards.size(); ++i) bytes[i] = shards[i] * sizeof(float);
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      local.Allgatherv(shard_out.data(), result.data(), bytes);
    }
    StoreOutput(o, result.data());
  });
  return st;
}

CompressedAllreduceStats SparseAllreduce(Communicator& comm, const CompressedAllreduceOptions& o) {
  CompressedAllreduceStats st;
  WithTensorContext("sparse allreduce", o.name, [&] {
    Validate(o, true);
    if (o.sent_indices) o.sent_indices->clear();
    if (o.count == 0) return;
    const Codec& codec = *o.codec;
    const int n = comm.size();
    CompressionWorkspace local_ws;
    CompressionWorkspace& ws = o.workspace ? *o.workspace : local_ws;
    const float* input = WorkingCopy(o, ws);
    std::vector<float> x(input, input + o.count);
    const std::vector<size_t> bounds = SegmentBounds(o);
    const std::vector<Piece> segments = PiecesIn(0, o.count, bounds);
    const CodecParams p = StreamFor(o.params, static_cast<uint32_t>(comm.rank()));
    // Encode every tensor of the buffer.
    size_t max_bytes = 0;
    for (const Piece& pc : segments) max_bytes += codec.MaxWireSize(pc.len, p);
    std::vector<uint8_t> mine(max_bytes);
    {
      Phase phase(o, "COMPRESS", &st.compress_seconds);
      mine.resize(EncodePieces(codec, p, x.data(), 0, segments, mine.data()));
    }
    // Allgather the variable-size encodings.
    const size_t ranks = static_cast<size_t>(n);
    std::vector<size_t> bytes(ranks);
    std::vector<uint8_t> all;
    {
      Phase phase(o, "COMMUNICATE", &st.communicate_seconds);
      std::vector<uint64_t> lens(ranks);
      const uint64_t my_len = mine.size();
      comm.Allgatherv(&my_len, lens.data(), std::vector<size_t>(ranks, sizeof(uint64_t)));
      bytes.assign(lens.begin(), lens.end());
      all.resize(Offsets(bytes).back() + bytes.back());
      comm.Allgatherv(mine.data(), all.data(), bytes);
    }
    // Scatter-add every rank's values in rank order (the same float operations everywhere).
    Phase phase(o, "DECOMPRESS", &st.decompress_seconds);
    const size_t vsize = DataTypeSize(o.params.topk_value_dtype);
    std::vector<float> acc(o.count, 0.0f);
    const std::vector<size_t> offsets = Offsets(bytes);
    for (size_t r = 0; r < ranks; ++r) {
      const uint8_t* w = all.data() + offsets[r];
      for (const Piece& pc : segments) {
        uint32_t kept;
        std::memcpy(&kept, w, 4);
        const size_t seg_bytes = 4 + size_t{kept} * (4 + vsize);
        codec.DecodeAccumulate(w, seg_bytes, pc.len, p, DataType::kFloat32, acc.data() + pc.start);
        if (r == static_cast<size_t>(comm.rank())) {
          // Error feedback keeps what was not sent (and the rounding of what was, for
          // float16 values); DGC masks the momentum of what was sent.
          const uint8_t* values = w + 4 + 4 * size_t{kept};
          for (uint32_t j = 0; j < kept; ++j) {
            uint32_t idx;
            std::memcpy(&idx, w + 4 + 4 * size_t{j}, 4);
            if (o.residual) {
              float sent;
              CastBuffer(values + j * vsize, o.params.topk_value_dtype, 1, &sent, DataType::kFloat32, false,
                         Isa::kScalar);
              x[pc.start + idx] -= sent;
            }
            if (o.sent_indices) o.sent_indices->push_back(static_cast<uint32_t>(pc.start) + idx);
          }
        }
        w += seg_bytes;
      }
    }
    if (o.residual) std::memcpy(o.residual, x.data(), o.count * sizeof(float));
    ScaleInPlace(acc.data(), o.count, DataType::kFloat32, OutputScale(o, n));
    st.bytes_sent = mine.size() * (ranks - 1);
    StoreOutput(o, acc.data());
  });
  return st;
}

}  // namespace gradcomp
