// 2-D SRA (compressed_allreduce.h gives the algorithm and its error bound): SRA's scatter in
// each row, a full SRA of the row sums in each column, the column's encodings allgathered in
// each row as they are, in the column SRA's plan's layout, which every rank of the row can make.
// A column may run on a grid of its own (Grid::column_grid: rows are nodes, 2-D across them):
// then its allreduce is this algorithm again, and the encodings the row allgathers are that
// grid's, each of its row chunks' column result in turn (ResultBytes, DecodeResult).
// The row steps post every message at once (an MPI allgather's ring would pay a latency per
// peer, one after the other), and for large striped buffers overlap the codec with the network
// (RowExchange); the column SRA stripes as the options say.
#include <algorithm>
#include <functional>
#include <memory>
#include <utility>

#include "ops/collectives/context.h"
#include "ops/collectives/pipeline.h"
#include "ops/collectives/sra.h"
#include "ops/collectives/sra_halves.h"

namespace gradcomp {

namespace {

// The column's rounding streams differ from the row scatter's (both are keyed by rank), and
// each level of a nested grid's from the others'.
constexpr uint64_t kColumnSeed = 0x2D5A2D5A2D5A2D5Aull;
// Tags of the row steps' messages.
constexpr int kRowScatterTag = 0x5400, kRowGatherTag = 0x5401;

// The options of the column SRA of row chunk c.
CompressedAllreduceOptions ColumnOptions(const CompressedAllreduceOptions& o, const SraPlan& row, size_t c) {
  CompressedAllreduceOptions sub = o;
  const size_t c0 = row.chunk_offsets[c], len = row.chunks[c];
  sub.count = len;
  sub.segments.clear();
  for (const Piece& pc : PiecesIn(c0, len, SegmentBounds(o))) sub.segments.push_back(pc.len);
  sub.residual = o.residual ? o.residual + c0 : nullptr;
  sub.reduced_residual = o.reduced_residual ? o.reduced_residual + c0 : nullptr;
  sub.params.seed = o.params.seed + kColumnSeed;
  sub.sent_indices = nullptr;
  return sub;
}

// The row scatter's plan of `o` over a row of `b` ranks, seen from rank j: one stripe (the row
// steps post every message at once).
SraPlan RowPlan(const CompressedAllreduceOptions& o, size_t b, size_t j) {
  return SraPlan::Make(OneStripe(o), b, j);
}

// Bytes of the encodings a column of `ranks` ranks (on `grid`, or flat) leaves in ws.all after
// its allreduce of `o`, every rank's result decoded from them: flat SRA's every reduced chunk in
// its plan's `all` layout; a grid's, the column result of each of its row chunks in turn.
size_t ResultBytes(size_t ranks, const Grid* grid, const CompressedAllreduceOptions& o) {
  if (grid == nullptr) return SraPlan::Make(o, ranks, 0).all_total;
  const SraPlan rp = RowPlan(o, static_cast<size_t>(grid->columns()), 0);
  size_t total = 0;
  for (size_t k = 0; k < rp.ranks; ++k) {
    total += ResultBytes(static_cast<size_t>(grid->rows()), grid->column_grid.get(), ColumnOptions(o, rp, k));
  }
  return total;
}

// out[0, o.count) = the result decoded from those encodings; returns their bytes (ResultBytes).
size_t DecodeResult(size_t ranks, const Grid* grid, const CompressedAllreduceOptions& o, const uint8_t* encodings,
                    float* out, CompressionWorkspace& ws) {
  if (grid == nullptr) {
    const SraPlan cp = SraPlan::Make(o, ranks, 0);
    GatherHalf(o, cp, ws, false, out, DataType::kFloat32).DecodeFrom(encodings);
    return cp.all_total;
  }
  const SraPlan rp = RowPlan(o, static_cast<size_t>(grid->columns()), 0);
  size_t read = 0;
  for (size_t k = 0; k < rp.ranks; ++k) {
    read += DecodeResult(static_cast<size_t>(grid->rows()), grid->column_grid.get(), ColumnOptions(o, rp, k),
                         encodings + read, out + rp.chunk_offsets[k], ws);
  }
  return read;
}

// A row step whose codec runs on `pipe`'s helper thread, over point-to-point transfers: every
// receive posted at once; peer p's message (from `in`: at p's offset in send_bytes, or all of it
// with same_to_all) sent once `ready(p)` says it is encoded (null: at once), the next peers first;
// `arrived(p)` called on this thread as p's message lands in p's offset of `out` (null: nothing),
// to hand its decoding to the helper. Polled to the end, napping on the transport and the helper
// (Poller). Where the codec costs more than the link (a CPU's, at 25 Gbit/s) AlltoallAtOnce and
// AllgatherAtOnce left the link idle while every chunk was encoded and the codec idle until every
// message had come (docs/benchmarks.md, "Messages posted at once").
void RowExchange(Communicator& row, int tag, Pipeline& pipe, const uint8_t* in, const std::vector<size_t>& send_bytes,
                 bool same_to_all, uint8_t* out, const std::vector<size_t>& recv_bytes,
                 const std::function<bool(size_t)>& ready, const std::function<void(size_t)>& arrived) {
  const size_t n = static_cast<size_t>(row.size()), me = static_cast<size_t>(row.rank());
  const std::vector<size_t> send_at = Offsets(send_bytes), recv_at = Offsets(recv_bytes);
  std::vector<std::unique_ptr<PendingTransfer>> receives(n), sends(n);
  for (size_t p = 0; p < n; ++p) {
    if (p != me) receives[p] = row.Irecv(out + recv_at[p], recv_bytes[p], static_cast<int>(p), tag);
  }
  size_t to_send = n - 1, to_land = n - 1;
  std::vector<bool> landed(n, false);
  Poller poller(&row, pipe.wake_fd());
  while (true) {
    bool progressed = false;
    for (size_t k = 1; k < n; ++k) {
      const size_t p = (me + k) % n;
      if (!sends[p] && (!ready || ready(p))) {
        sends[p] = row.Isend(in + (same_to_all ? 0 : send_at[p]), send_bytes[p], static_cast<int>(p), tag);
        --to_send;
        progressed = true;
      }
      if (!landed[p] && receives[p]->Test()) {
        landed[p] = true;
        --to_land;
        progressed = true;
        if (arrived) arrived(p);
      }
    }
    if (to_send == 0 && to_land == 0) {
      bool sent = true;
      for (size_t p = 0; p < n && sent; ++p) sent = p == me || sends[p]->Test();
      if (sent) return;
    }
    poller.Pause(progressed);
  }
}

void Sra2dOn(const Grid& grid, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
             float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings);

// The column's allreduce of this rank's row sum v (in place), leaving in ws.all the encodings
// of its result (ResultBytes' layout).
void ColumnAllreduce(const Grid& grid, const CompressedAllreduceOptions& mine, float* v, const OutputScaling& scale,
                     CompressionWorkspace& ws, CompressedAllreduceStats* st) {
  if (grid.column_grid) {
    Sra2dOn(*grid.column_grid, mine, v, scale, v, ws, st, true);
    return;
  }
  Sra(*grid.column, mine, v, scale, v, ws, st, true);
  // ws.all holds every other column rank's encodings; this rank's own are in ws.own.
  Device& d = ws.device;
  Stream& stream = *ws.stream;
  const SraPlan cp = SraPlan::Make(mine, static_cast<size_t>(grid.rows()), static_cast<size_t>(grid.column->rank()));
  for (size_t s = 0; s < cp.stripes; ++s) {
    const size_t at = cp.all_at[s] + Offsets(cp.bytes[s])[cp.mine], bytes = cp.bytes[s][cp.mine];
    d.Copy(ws.all.device() + at, ws.own.device() + cp.own_at[s], bytes, stream);
    ws.all.ToWire(at, bytes, stream);
  }
  stream.Synchronize();
}

// One rank's 2-D SRA on a grid of two dimensions, step by step; the steps share the row's plan
// and, for large buffers over point-to-point rows, overlap the codec with the row steps
// (RowExchange). Otherwise encoding and decoding run on this thread, through an inline
// pipeline so that a simulation (ops/common/simulation.h) counts them as codec work.
class Sra2dSteps {
 public:
  Sra2dSteps(const Grid& grid, const CompressedAllreduceOptions& o, const float* x, float* out,
             CompressionWorkspace& ws, CompressedAllreduceStats* st)
      : grid_(grid),
        row_(*grid.row),
        o_(o),
        out_(out),
        ws_(ws),
        st_(st),
        d_(ws.device),
        stream_(*ws.stream),
        b_(static_cast<size_t>(row_.size())),
        j_(static_cast<size_t>(row_.rank())),
        rp_(RowPlan(o, b_, j_)),
        scatter_(o, rp_, SraScatterParams(o.params, grid.rank), x, ws, false),
        wire_on_device_(WireOnDevice(row_, ws)),
        overlap_(o.pipeline_stripes > 1 && o.count >= kPipelineMinValues && row_.nonblocking()) {}

  /// 1. The row's scatter (the reduce-scatter half): every other chunk of the row, encoded for
  /// its owner.
  void Scatter();
  /// 2. The row sum of chunk j in float32, where chunk j's result goes (x may be out): this
  /// rank's values, then the peers' in row order (the half's Reduce). Returns where it is.
  float* SumOwnChunk();
  /// 3. (ColumnAllreduce of that sum, with these options.)
  CompressedAllreduceOptions ColumnOptionsOfOwnChunk() const { return ColumnOptions(o_, rp_, j_); }
  /// 4. The row's allgather of the column's encodings; every other chunk decoded from them.
  /// With keep_encodings ws.all ends holding the encodings of the whole result.
  void Allgather(bool keep_encodings);

 private:
  const Grid& grid_;
  Communicator& row_;
  const CompressedAllreduceOptions& o_;
  float* out_;
  CompressionWorkspace& ws_;
  CompressedAllreduceStats* st_;
  Device& d_;
  Stream& stream_;
  const size_t b_, j_;  // the row's size, this rank's place in it
  const SraPlan rp_;
  ScatterHalf scatter_;
  const bool wire_on_device_, overlap_;
  Pipeline codec_work_{true};
};

void Sra2dSteps::Scatter() {
  scatter_.Reserve(wire_on_device_);
  const std::vector<size_t> send_bytes = rp_.ScatterBytes(0, true), recv_bytes = rp_.ScatterBytes(0, false);
  if (overlap_) {
    Pipeline helper(false);
    std::vector<size_t> encoded(b_);
    for (size_t k = 1; k < b_; ++k) {  // the next peers first: not every row's rank to peer 0 at once
      const size_t p = (j_ + k) % b_;
      encoded[p] = helper.Submit([&, p] {
        Phase phase(o_, "COMPRESS", &st_->compress_seconds);
        scatter_.Encode(0, p);
        scatter_.Stage(0, p);
        stream_.Synchronize();
      });
    }
    Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
    RowExchange(row_, kRowScatterTag, helper, ws_.send.wire(), send_bytes, false, ws_.recv.wire(), recv_bytes,
                [&](size_t p) { return helper.Done(encoded[p]); }, nullptr);
  } else {
    codec_work_.Submit([&] {
      Phase phase(o_, "COMPRESS", &st_->compress_seconds);
      scatter_.EncodePeers(0);
      stream_.Synchronize();
    });
    Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
    AlltoallAtOnce(row_, kRowScatterTag, ws_.send.wire(), send_bytes, ws_.recv.wire(), recv_bytes);
  }
  st_->bytes_sent += rp_.send_total;
}

float* Sra2dSteps::SumOwnChunk() {
  codec_work_.Submit([&] {
    Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
    scatter_.Reduce(0, out_, 0, nullptr);
    stream_.Synchronize();
  });
  return out_ + rp_.chunk_offsets[j_];
}

void Sra2dSteps::Allgather(bool keep_encodings) {
  const size_t column_ranks = static_cast<size_t>(grid_.column->size());
  std::vector<CompressedAllreduceOptions> chunk_options;
  std::vector<size_t> blob_bytes(b_);
  for (size_t k = 0; k < b_; ++k) {
    chunk_options.push_back(ColumnOptions(o_, rp_, k));
    blob_bytes[k] = ResultBytes(column_ranks, grid_.column_grid.get(), chunk_options[k]);
  }
  const std::vector<size_t> blob_at = Offsets(blob_bytes);
  ws_.recv.Reserve(d_, blob_at.back() + blob_bytes.back(), wire_on_device_);
  const auto decode_chunk = [&](size_t k) {
    ws_.recv.FromWire(blob_at[k], blob_bytes[k], stream_);
    DecodeResult(column_ranks, grid_.column_grid.get(), chunk_options[k], ws_.recv.device() + blob_at[k],
                 out_ + rp_.chunk_offsets[k], ws_);
  };
  if (overlap_) {
    Pipeline helper(false);
    std::vector<size_t> decoded;
    {
      Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
      const std::vector<size_t> sent(b_, blob_bytes[j_]);
      RowExchange(row_, kRowGatherTag, helper, ws_.all.wire(), sent, true, ws_.recv.wire(), blob_bytes, nullptr,
                  [&](size_t k) {
                    decoded.push_back(helper.Submit([&, k] {
                      Phase decompress(o_, "DECOMPRESS", &st_->decompress_seconds);
                      decode_chunk(k);
                      stream_.Synchronize();
                    }));
                  });
    }
    for (size_t t : decoded) helper.Wait(t);
  } else {
    {
      Phase phase(o_, "COMMUNICATE", &st_->communicate_seconds);
      AllgatherAtOnce(row_, kRowGatherTag, ws_.all.wire(), ws_.recv.wire(), blob_bytes);
    }
    codec_work_.Submit([&] {
      Phase phase(o_, "DECOMPRESS", &st_->decompress_seconds);
      for (size_t k = 0; k < b_; ++k) {
        if (k != j_) decode_chunk(k);
      }
      stream_.Synchronize();
    });
  }
  st_->bytes_sent += (b_ - 1) * blob_bytes[j_];
  if (keep_encodings) {
    // This rank's encodings into their place among the peers' (ws.recv), and the buffers swapped.
    d_.Copy(ws_.recv.device() + blob_at[j_], ws_.all.device(), blob_bytes[j_], stream_);
    ws_.recv.ToWire(blob_at[j_], blob_bytes[j_], stream_);
    stream_.Synchronize();
    ws_.all.Swap(ws_.recv);
  }
}

// Sra2d; with keep_encodings, ws.all ends holding the encodings of the whole result
// (ResultBytes' layout), for the row above when this grid runs a column.
void Sra2dOn(const Grid& grid, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
             float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st, bool keep_encodings) {
  Communicator& row = *grid.row;
  Communicator& column = *grid.column;
  if (row.size() == 1 || column.size() == 1) {
    // Only a grid the caller made: the nested ones have two dimensions (MakeNodeGrid).
    GC_ENFORCE(!keep_encodings, "a nested grid of one row or column");
    if (row.size() == 1 && grid.column_grid) {
      Sra2dOn(*grid.column_grid, o, x, scale, out, ws, st, false);
    } else {
      Sra(row.size() == 1 ? column : row, o, x, scale, out, ws, st);
    }
    return;
  }
  Sra2dSteps steps(grid, o, x, out, ws, st);
  steps.Scatter();
  float* sum = steps.SumOwnChunk();
  // 3. The column's allreduce of the row sums: chunk j reduced over the world, in place, and the
  // encodings every rank decodes chunk j from in ws.all.
  ColumnAllreduce(grid, steps.ColumnOptionsOfOwnChunk(), sum, scale, ws, st);
  steps.Allgather(keep_encodings);
}

// Whether every communicator of the grid (nested ones too) has point-to-point transfers.
bool PointToPoint(const Grid& grid) {
  return grid.row->nonblocking() && grid.column->nonblocking() && (!grid.column_grid || PointToPoint(*grid.column_grid));
}

}  // namespace

void Sra2d(const Grid& grid, const CompressedAllreduceOptions& o, const float* x, const OutputScaling& scale,
           float* out, CompressionWorkspace& ws, CompressedAllreduceStats* st) {
  if (o.pipeline_stripes > 1 && !PointToPoint(grid)) {
    // Stripes travel point to point; a transport without it (NCCL) takes one exchange of each
    // (chosen here: every level plans the layout of the columns' encodings alike).
    return Sra2dOn(grid, OneStripe(o), x, scale, out, ws, st, false);
  }
  Sra2dOn(grid, o, x, scale, out, ws, st, false);
}

CompressedAllreduceStats CompressedAllreduce2d(const Grid& grid, const CompressedAllreduceOptions& o) {
  return RunDenseAllreduce("2-D compressed allreduce", o, grid.row->size() * grid.column->size(),
                           [&](const float* x, const OutputScaling& scale, float* out, CompressionWorkspace& ws,
                               CompressedAllreduceStats* st) { Sra2d(grid, o, x, scale, out, ws, st); });
}

}  // namespace gradcomp
