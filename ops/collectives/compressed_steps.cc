#include "ops/collectives/compressed_steps.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "ops/common/enforce.h"
#include "ops/common/simulation.h"
#include "ops/compression/codec.h"
#include "ops/compression/codec_on_device.h"
#include "ops/compression/maxmin_math.h"

namespace gradcomp {

Phase::Phase(const CompressedAllreduceOptions& o, const char* name, double* seconds)
    : hook_(o.on_phase), name_(name), seconds_(seconds), start_(sim::WorkNow()) {
  if (hook_) hook_(name_, true);
}

Phase::~Phase() {
  *seconds_ += sim::WorkNow() - start_;
  if (hook_) hook_(name_, false);
}

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

void ValidateShards(const CompressedAllreduceOptions& o, const std::vector<size_t>& counts, int ranks, int me,
                    bool gather) {
  if (o.codec != nullptr && o.codec->sparse()) {
    throw InvalidArgument(std::string("needs a dense codec (maxmin, fp16, bf16), got ") + o.codec->name());
  }
  if (counts.size() != static_cast<size_t>(ranks)) {
    throw InvalidArgument("needs one shard count per rank: got " + std::to_string(counts.size()) + " for " +
                          std::to_string(ranks) + " ranks");
  }
  size_t total = 0;
  for (size_t c : counts) total += c;
  if (total != o.count) {
    throw InvalidArgument("the shards hold " + std::to_string(total) + " values, the " +
                          (gather ? "output " : "buffer ") + std::to_string(o.count));
  }
  const size_t mine = counts[static_cast<size_t>(me)];
  ValidateCompressed(o, false, gather ? mine : o.count, gather ? o.count : mine);
}

void CheckNodeShards(const Topology& topo, const CompressedAllreduceOptions& o) {
  if (!topo.homogeneous) GC_THROW("needs the same number of ranks on every node");
  if (DeviceOf(o).space() == MemorySpace::kDevice) {
    GC_THROW("works on host memory (a device's buffers take the flat form)");
  }
}

size_t EncodePieces(CompressionWorkspace& ws, const Codec& codec, const CodecParams& p, const float* x, size_t base,
                    const std::vector<Piece>& pieces, uint8_t* out) {
  size_t used = 0;
  for (const Piece& pc : pieces) {
    used += EncodeOn(ws.device, codec, x + (pc.start - base), DataType::kFloat32, pc.len, p, pc.start, out + used,
                     *ws.stream);
  }
  return used;
}

void DecodePieces(CompressionWorkspace& ws, const Codec& codec, const CodecParams& p, const uint8_t* wire,
                  const std::vector<Piece>& pieces, size_t base, DataType out_dtype, void* out) {
  const size_t esize = DataTypeSize(out_dtype);
  for (const Piece& pc : pieces) {
    const size_t bytes = codec.MaxWireSize(pc.len, p);
    DecodeOn(ws.device, codec, wire, bytes, pc.len, p, out_dtype, static_cast<char*>(out) + (pc.start - base) * esize,
             false, *ws.stream);
    wire += bytes;
  }
}

namespace {

// The parameters of random stream `stream`.
CodecParams StreamFor(const CodecParams& p, uint32_t stream) {
  CodecParams q = p;
  q.seed = p.seed ^ (static_cast<uint64_t>(maxmin::Mix32(stream + 0x51ed27u)) << 32);
  return q;
}

}  // namespace

CodecParams SraScatterParams(const CodecParams& p, int rank) { return StreamFor(p, static_cast<uint32_t>(rank)); }

CodecParams SraGatherParams(const CodecParams& p, int rank) {
  return StreamFor(p, 0x10000u + static_cast<uint32_t>(rank));
}

namespace {

// Peer p's message (from `in`: at p's offset in send_bytes, or all of it with same_to_all)
// into p's offset in `out`; every receive and then every send posted at once.
void ExchangeAll(Communicator& comm, int tag, const uint8_t* in, const std::vector<size_t>& send_bytes,
                 bool same_to_all, uint8_t* out, const std::vector<size_t>& recv_bytes) {
  const std::vector<size_t> send_at = Offsets(send_bytes), recv_at = Offsets(recv_bytes);
  std::vector<std::unique_ptr<PendingTransfer>> pending;
  const int n = comm.size(), me = comm.rank();
  for (int p = 0; p < n; ++p) {
    if (p != me) pending.push_back(comm.Irecv(out + recv_at[p], recv_bytes[p], p, tag));
  }
  for (int p = 0; p < n; ++p) {
    if (p != me) pending.push_back(comm.Isend(in + (same_to_all ? 0 : send_at[p]), send_bytes[p], p, tag));
  }
  PollUntil([&] {
    for (auto& t : pending) {
      if (!t->Test()) return false;
    }
    return true;
  }, &comm);
}

}  // namespace

void AlltoallAtOnce(Communicator& comm, int tag, const uint8_t* in, const std::vector<size_t>& send_bytes, uint8_t* out,
                    const std::vector<size_t>& recv_bytes) {
  if (!comm.nonblocking()) return comm.Alltoallv(in, send_bytes, out, recv_bytes);
  ExchangeAll(comm, tag, in, send_bytes, false, out, recv_bytes);
}

void AllgatherAtOnce(Communicator& comm, int tag, const uint8_t* mine, uint8_t* out, const std::vector<size_t>& bytes) {
  if (!comm.nonblocking()) return comm.Allgatherv(mine, out, bytes);
  const std::vector<size_t> send_bytes(bytes.size(), bytes[static_cast<size_t>(comm.rank())]);
  ExchangeAll(comm, tag, mine, send_bytes, true, out, bytes);
}

bool WireOnDevice(const Communicator& comm, const CompressionWorkspace& ws) {
  return ws.device.space() == MemorySpace::kDevice && comm.device_memory() == &ws.device;
}

Device& DeviceOf(const CompressedAllreduceOptions& o) { return o.device != nullptr ? *o.device : HostDevice(); }

void ValidateCompressed(const CompressedAllreduceOptions& o, bool sparse) {
  ValidateCompressed(o, sparse, o.count, o.count);
}

void ValidateCompressed(const CompressedAllreduceOptions& o, bool sparse, size_t in_count, size_t out_count) {
  if (o.codec == nullptr) throw InvalidArgument("compressed allreduce needs a codec");
  if (o.codec->sparse() != sparse) {
    throw InvalidArgument(std::string("codec ") + o.codec->name() + (sparse ? " is not sparse" : " needs the sparse allreduce"));
  }
  CheckCodecDataType(o.dtype, o.codec->name(), "tensor");
  if (o.op != ReduceOp::kSum && o.op != ReduceOp::kAverage) {
    throw InvalidArgument(std::string("compressed allreduce supports sum and average, not ") + ReduceOpName(o.op));
  }
  o.codec->Validate(o.params);
  if (!o.segments.empty()) {
    size_t total = 0;
    for (size_t s : o.segments) total += s;
    if (total != o.count) {
      throw InvalidArgument("compressed allreduce: segments sum to " + std::to_string(total) + ", not " +
                            std::to_string(o.count));
    }
  }
  if ((in_count > 0 && o.input == nullptr) || (out_count > 0 && o.output == nullptr)) {
    throw InvalidArgument("compressed allreduce got a null buffer");
  }
  if (o.workspace != nullptr && &o.workspace->device != &DeviceOf(o)) {
    throw InvalidArgument(std::string("compressed allreduce: the buffers are on device ") + DeviceOf(o).name() +
                          " but the workspace is on " + o.workspace->device.name());
  }
}

WorkspaceFor::WorkspaceFor(const CompressedAllreduceOptions& o) {
  if (o.workspace == nullptr) local_ = std::make_unique<CompressionWorkspace>(DeviceOf(o));
  ws_ = o.workspace != nullptr ? o.workspace : local_.get();
}

const float* WorkingCopy(const CompressedAllreduceOptions& o, CompressionWorkspace& ws) {
  if (o.dtype == DataType::kFloat32 && o.prescale == 1.0 && o.residual == nullptr) {
    return static_cast<const float*>(o.input);
  }
  Device& d = ws.device;
  ws.x.Reserve(d, o.count * sizeof(float));
  float* x = ws.x.device_as<float>();
  d.Cast(o.input, o.dtype, o.count, x, DataType::kFloat32, false, *ws.stream);
  if (o.prescale != 1.0) d.Scale(x, o.count, DataType::kFloat32, o.prescale, *ws.stream);
  if (o.residual != nullptr) d.Reduce(x, x, o.residual, o.count, DataType::kFloat32, ReduceOp::kSum, *ws.stream);
  return x;
}

float* ResultBuffer(const CompressedAllreduceOptions& o, CompressionWorkspace& ws) {
  if (o.dtype == DataType::kFloat32) return static_cast<float*>(o.output);
  ws.out.Reserve(ws.device, o.count * sizeof(float));
  return ws.out.device_as<float>();
}

OutputScaling OutputScale(const CompressedAllreduceOptions& o, int ranks) {
  return {o.postscale, o.op == ReduceOp::kAverage ? ranks : 1, o.codec == &NoneCodec()};
}

void OutputScaling::Apply(Device& d, float* v, size_t n, Stream& stream) const {
  if (exact && divisor != 1) {
    d.FinishReduction(v, n, DataType::kFloat32, ReduceOp::kAverage, factor, divisor, stream);
  } else {
    d.Scale(v, n, DataType::kFloat32, factor / divisor, stream);
  }
}

void StoreOutput(const CompressedAllreduceOptions& o, CompressionWorkspace& ws, const float* result) {
  if (result != o.output) {
    ws.device.Cast(result, DataType::kFloat32, o.count, o.output, o.dtype, false, *ws.stream);
  }
  ws.stream->Synchronize();
}

}  // namespace gradcomp
