#include "ops/collectives/compressed_allreduce.h"

#include <chrono>
#include <cstring>

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
                  size_t base, DataType out_dtype, void* out, bool accumulate) {
  const size_t esize = DataTypeSize(out_dtype);
  for (const Piece& pc : pieces) {
    const size_t bytes = codec.MaxWireSize(pc.len, p);
    void* dst = static_cast<char*>(out) + (pc.start - base) * esize;
    if (accumulate) {
      codec.DecodeAccumulate(wire, bytes, pc.len, p, out_dtype, dst);
    } else {
      codec.Decode(wire, bytes, pc.len, p, out_dtype, dst);
    }
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

// SRA of the o.count float32 values x (already prescaled and compensated) into float32 `out`.
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
  const std::vector<size_t> bounds = SegmentBounds(o);
  const std::vector<size_t> chunks = EvenSplit(count, n), coff = Offsets(chunks);
  std::vector<std::vector<Piece>> pieces(static_cast<size_t>(n));
  std::vector<size_t> bytes(static_cast<size_t>(n));
  for (int c = 0; c < n; ++c) {
    const size_t i = static_cast<size_t>(c);
    pieces[i] = PiecesIn(coff[i], chunks[i], bounds);
    bytes[i] = EncodedSize(codec, o.params, pieces[i]);
  }
  const size_t mine = static_cast<size_t>(me);

  // 1. Encode every peer's chunk and exchange.
  const CodecParams p1 = StreamFor(o.params, static_cast<uint32_t>(me));
  std::vector<size_t> send_bytes(static_cast<size_t>(n), 0), recv_bytes(static_cast<size_t>(n), 0);
  for (size_t p = 0; p < send_bytes.size(); ++p) {
    if (p == mine) continue;
    send_bytes[p] = bytes[p];
    recv_bytes[p] = bytes[mine];
  }
  std::vector<uint8_t>& send = ws.send;
  std::vector<uint8_t>& recv = ws.recv;
  send.resize(Offsets(send_bytes).back() + send_bytes.back());
  recv.resize(Offsets(recv_bytes).back() + recv_bytes.back());
  const std::vector<size_t> soff = Offsets(send_bytes), roff = Offsets(recv_bytes);
  {
    Phase phase(o, "COMPRESS", &st->compress_seconds);
    for (size_t p = 0; p < send_bytes.size(); ++p) {
      if (p != mine) EncodePieces(codec, p1, x, 0, pieces[p], send.data() + soff[p]);
    }
  }
  if (o.residual) {
    // Error feedback: what this rank's encoding lost, per element (nothing for its own chunk).
    Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
    for (size_t p = 0; p < send_bytes.size(); ++p) {
      float* r = o.residual + coff[p];
      if (p == mine) {
        std::memset(r, 0, chunks[p] * sizeof(float));
        continue;
      }
      DecodePieces(codec, p1, send.data() + soff[p], pieces[p], coff[p], DataType::kFloat32, r, false);
      for (size_t k = 0; k < chunks[p]; ++k) r[k] = x[coff[p] + k] - r[k];
    }
  }
  {
    Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
    comm.Alltoallv(send.data(), send_bytes, recv.data(), recv_bytes);
  }

  // 2. Sum the contributions to this rank's chunk in float32, in rank order.
  std::vector<float>& acc = ws.acc;
  acc.assign(x + coff[mine], x + coff[mine] + chunks[mine]);
  {
    Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
    for (size_t p = 0; p < recv_bytes.size(); ++p) {
      if (p != mine) {
        DecodePieces(codec, p1, recv.data() + roff[p], pieces[mine], coff[mine], DataType::kFloat32, acc.data(), true);
      }
    }
  }

  // 3. Scale, compensate, encode the reduced chunk once.
  float* rr = o.reduced_residual ? o.reduced_residual + coff[mine] : nullptr;
  const CodecParams p2 = StreamFor(o.params, 0x10000u + static_cast<uint32_t>(me));
  std::vector<uint8_t>& own = ws.own;
  own.resize(bytes[mine]);
  {
    Phase phase(o, "COMPRESS", &st->compress_seconds);
    ScaleInPlace(acc.data(), acc.size(), DataType::kFloat32, scale);
    if (rr) ReduceInto(acc.data(), rr, acc.size(), DataType::kFloat32, ReduceOp::kSum);
    EncodePieces(codec, p2, acc.data(), coff[mine], pieces[mine], own.data());
  }
  if (rr) {
    Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
    std::vector<float>& dec = ws.dec;
    dec.resize(acc.size());
    DecodePieces(codec, p2, own.data(), pieces[mine], coff[mine], DataType::kFloat32, dec.data(), false);
    for (size_t k = 0; k < acc.size(); ++k) rr[k] = acc[k] - dec[k];
  }

  // 4. Allgather the encoded chunks; 5. every rank decodes every chunk (its own too).
  std::vector<uint8_t>& all = ws.all;
  all.resize(Offsets(bytes).back() + bytes.back());
  {
    Phase phase(o, "COMMUNICATE", &st->communicate_seconds);
    comm.Allgatherv(own.data(), all.data(), bytes);
  }
  {
    Phase phase(o, "DECOMPRESS", &st->decompress_seconds);
    const std::vector<size_t> aoff = Offsets(bytes);
    for (size_t c = 0; c < bytes.size(); ++c) {
      const CodecParams pc = StreamFor(o.params, 0x10000u + static_cast<uint32_t>(c));
      DecodePieces(codec, pc, all.data() + aoff[c], pieces[c], 0, DataType::kFloat32, out, false);
    }
  }
  size_t sent = 0;
  for (size_t b : send_bytes) sent += b;
  st->bytes_sent += sent + static_cast<size_t>(n - 1) * bytes[mine];
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
