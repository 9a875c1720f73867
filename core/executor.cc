#include "core/executor.h"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "ops/collectives/allgather.h"
#include "ops/collectives/allreduce.h"
#include "ops/collectives/alltoall.h"
#include "ops/collectives/broadcast.h"
#include "ops/collectives/compressed_allreduce.h"
#include "ops/collectives/reducescatter.h"
#include "ops/common/enforce.h"
#include "ops/common/shape.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

namespace {

int64_t RowElements(const std::vector<int64_t>& shape) {
  return shape.empty() ? 1 : NumElements(std::vector<int64_t>(shape.begin() + 1, shape.end()));
}

// Args of a tensor's end event: dtype, shape, bytes in, bytes on the wire, ratio.
std::string EndArgs(DataType dtype, const std::vector<int64_t>& shape, int64_t wire_bytes) {
  const int64_t bytes = NumElements(shape) * static_cast<int64_t>(DataTypeSize(dtype));
  std::ostringstream os;
  os << "\"dtype\": \"" << DataTypeName(dtype) << "\", \"shape\": " << ShapeString(shape) << ", \"bytes\": " << bytes
     << ", \"wire_bytes\": " << wire_bytes << ", \"ratio\": " << (wire_bytes > 0 ? double(bytes) / wire_bytes : 1.0);
  return os.str();
}

// "w3", or "fusion of 12 tensors starting with 'w3'" (error messages, logs).
std::string FusedName(const Response& r) {
  const size_t n = r.names.size();
  return n == 1 ? r.names[0] : "fusion of " + std::to_string(n) + " tensors starting with '" + r.names[0] + "'";
}

// out = in converted to out_dtype (a copy when the dtypes are equal).
void CastOrCopy(const void* in, DataType in_dtype, size_t n, void* out, DataType out_dtype) {
  if (in_dtype == out_dtype) {
    std::memcpy(out, in, n * DataTypeSize(in_dtype));
  } else {
    CastBuffer(in, in_dtype, n, out, out_dtype, false);
  }
}

void CompleteAll(EntryList& entries) {
  std::vector<Handle*> handles;
  for (auto& e : entries) {
    if (e) handles.push_back(e->handle.get());
  }
  Handle::CompleteAll(handles);
}

}  // namespace

void Executor::Prepare(const Response& r, EntryList& entries) {
  const size_t esize = DataTypeSize(r.dtype);
  switch (r.type) {
    case RequestType::kAllreduce: {
      int64_t total = 0;
      bool any_missing = false;
      for (size_t i = 0; i < r.names.size(); ++i) {
        total += NumElements(r.shapes[i]);
        any_missing = any_missing || !entries[i];
      }
      // Sized here, before the ranks agree to run: an allocation failure then fails the
      // tensors on every rank instead of leaving the others inside the collective.
      const size_t bytes = static_cast<size_t>(total) * esize;
      if ((r.names.size() > 1 || any_missing) && fusion_.size() < bytes) fusion_.resize(bytes);
      return;
    }
    case RequestType::kBroadcast:
    case RequestType::kReducescatter: {
      const size_t bytes = static_cast<size_t>(NumElements(r.shapes[0])) * esize;
      if (!entries[0] && scratch_.size() < bytes) scratch_.resize(bytes);
      return;
    }
    default: return;
  }
}

void Executor::Run(const Response& r, EntryList& entries) {
  switch (r.type) {
    case RequestType::kAllreduce: return RunAllreduce(r, entries);
    case RequestType::kAllgather: return RunAllgather(r, entries);
    case RequestType::kBroadcast: return RunBroadcast(r, entries);
    case RequestType::kAlltoall: return RunAlltoall(r, entries);
    case RequestType::kReducescatter: return RunReducescatter(r, entries);
    case RequestType::kBarrier:
      topo_.world->Barrier();
      return CompleteAll(entries);
    case RequestType::kJoin:
      for (auto& e : entries) {
        if (!e) continue;
        e->handle->mutable_aux() = {r.last_joined};
        e->handle->Complete();
      }
      return;
  }
}

bool Executor::UseHierarchy(bool compressed) const {
  const bool wanted = settings_.hierarchical || (compressed && settings_.intra_broadcast);
  return wanted && topo_.homogeneous && topo_.local_size() > 1 && topo_.cross_size() > 1;
}

void Executor::RunAllreduce(const Response& r, EntryList& entries) {
  const size_t esize = DataTypeSize(r.dtype);
  const bool record = timeline_.active();
  const size_t n = r.names.size();
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += NumElements(r.shapes[i]);
  if (r.compression.codec != "none") return RunCompressedAllreduce(r, entries, static_cast<size_t>(total));
  AllreduceOptions o;
  o.count = static_cast<size_t>(total);
  o.dtype = r.dtype;
  o.op = r.op;
  o.prescale = r.prescale;
  o.postscale = r.postscale;
  o.name = FusedName(r);
  // The tensors are reduced where they lie, as one buffer: the communicator fuses them (or
  // stages them straight into shared memory); a joined rank contributes zeros.
  std::vector<BufferPiece> pieces(n);
  for (size_t i = 0; i < n; ++i) {
    pieces[i].count = static_cast<size_t>(NumElements(r.shapes[i]));
    if (entries[i]) {
      pieces[i].input = entries[i]->input;
      pieces[i].output = entries[i]->output;
    }
  }
  if (record) {
    for (const auto& name : r.names) timeline_.Begin(name, "COMMUNICATE");
  }
  FusedAllreduce(topo_, UseHierarchy(false), pieces, o, fusion_);
  if (record) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t bytes = NumElements(r.shapes[i]) * static_cast<int64_t>(esize);
      timeline_.End(r.names[i], "COMMUNICATE", EndArgs(r.dtype, r.shapes[i], bytes));
    }
  }
  CompleteAll(entries);
}

void Executor::RunCompressedAllreduce(const Response& r, EntryList& entries, size_t total) {
  const CompressionSpec& spec = r.compression;
  const Codec& codec = FindCodec(spec.codec);
  const bool dgc = (codec.fields() & kFieldMomentum) != 0 && spec.topk_momentum > 0;
  const bool record = timeline_.active();
  if (record) {
    for (const auto& name : r.names) timeline_.Begin(name, "ALLREDUCE");
  }
  const Staged staged = StageCompressed(r, entries, total, dgc);
  CompressedAllreduceOptions o = CompressedOptions(r, codec, staged);
  // Error feedback: each tensor's residuals, assembled in buffer order.
  std::vector<float> residual, reduced;
  const bool feedback = spec.error_feedback && !dgc;
  if (feedback) {
    memory_.GatherResiduals(r.names, staged.segments, &residual, &reduced);
    o.residual = residual.data();
    o.reduced_residual = codec.sparse() ? nullptr : reduced.data();
  }
  std::vector<uint32_t> sent;
  if (dgc) o.sent_indices = &sent;
  if (record) {
    o.on_phase = [&](const char* phase, bool begin) {
      for (const auto& name : r.names) begin ? timeline_.Begin(name, phase) : timeline_.End(name, phase);
    };
  }
  const CompressedAllreduceStats st = RunCompressedAlgorithm(codec, o);
  if (feedback) memory_.ScatterResiduals(r.names, staged.segments, residual, reduced);
  if (dgc) memory_.MaskSent(r.names, staged.segments, sent, staged.skip_masking);
  UnstageCompressed(r, entries, staged);
  bytes_in_ += total * DataTypeSize(r.dtype);
  bytes_on_wire_ += st.bytes_sent;
  if (record) {
    // Each tensor's share of the bytes this rank sent, in proportion to its size.
    for (size_t i = 0; i < r.names.size(); ++i) {
      const auto wire = static_cast<int64_t>(static_cast<double>(st.bytes_sent) *
                                             static_cast<double>(staged.segments[i]) / static_cast<double>(total));
      timeline_.End(r.names[i], "ALLREDUCE",
                    EndArgs(r.dtype, r.shapes[i], wire) + ", \"codec\": \"" + JsonEscape(spec.Describe()) + "\"");
    }
  }
  CompleteAll(entries);
}

Executor::Staged Executor::StageCompressed(const Response& r, EntryList& entries, size_t total, bool dgc) {
  // The tensors one after another (zeros for a joined rank), unless one tensor can be reduced
  // in place; DGC replaces each gradient by its momentum-corrected velocity (float32).
  const size_t n = r.names.size();
  Staged s;
  s.dtype = dgc ? DataType::kFloat32 : r.dtype;
  s.packed = n == 1 && entries[0] && !dgc ? nullptr : fusion_.data();
  if (dgc) {
    s.velocities.resize(total * sizeof(float));
    s.packed = s.velocities.data();
  }
  s.segments.resize(n);
  s.skip_masking.assign(n, false);
  const size_t esize = DataTypeSize(s.dtype);
  for (size_t i = 0, at = 0; i < n; at += s.segments[i], ++i) {
    s.segments[i] = static_cast<size_t>(NumElements(r.shapes[i]));
    s.skip_masking[i] = !entries[i];
    if (s.packed == nullptr) continue;
    char* dst = s.packed + at * esize;
    if (!entries[i]) {
      std::memset(dst, 0, s.segments[i] * esize);
    } else if (dgc) {
      CastBuffer(entries[i]->input, r.dtype, s.segments[i], dst, DataType::kFloat32, false);
      s.skip_masking[i] = !memory_.Compensate(r.names[i], reinterpret_cast<float*>(dst), s.segments[i], r.compression);
    } else {
      std::memcpy(dst, entries[i]->input, s.segments[i] * esize);
    }
  }
  s.input = s.packed != nullptr ? s.packed : entries[0]->input;
  s.output = s.packed != nullptr ? static_cast<void*>(s.packed) : entries[0]->output;
  return s;
}

void Executor::UnstageCompressed(const Response& r, EntryList& entries, const Staged& s) {
  if (s.packed == nullptr) return;  // reduced in place
  for (size_t i = 0, at = 0; i < r.names.size(); at += s.segments[i], ++i) {
    if (!entries[i]) continue;
    // Converts DGC's float32 velocities back to the tensor's dtype.
    CastOrCopy(s.packed + at * DataTypeSize(s.dtype), s.dtype, s.segments[i], entries[i]->output, r.dtype);
  }
}

CompressedAllreduceOptions Executor::CompressedOptions(const Response& r, const Codec& codec, const Staged& s) {
  CompressedAllreduceOptions o;
  o.input = s.input;
  o.output = s.output;
  for (size_t seg : s.segments) o.count += seg;
  o.dtype = s.dtype;
  o.op = r.op;
  o.prescale = r.prescale;
  o.postscale = r.postscale;
  o.codec = &codec;
  o.params = ParamsOf(r.compression);
  o.params.seed = static_cast<uint64_t>(settings_.seed);
  o.params.step = ++compressed_steps_;
  o.segments = s.segments;
  o.workspace = &workspace_;
  // Stripes overlap encoding and decoding with the network. Automatically only for codecs
  // whose encoding is worth hiding, across nodes: on one node there is no network time to
  // hide behind (only a helper thread competing for the cores).
  const bool auto_stripes = codec.stripes_pay() && topo_.cross_size() > 1;
  o.pipeline_stripes = settings_.pipeline_stripes > 0 ? static_cast<size_t>(settings_.pipeline_stripes)
                       : auto_stripes                 ? kAutoPipelineStripes
                                                      : 1;
  o.name = FusedName(r);
  return o;
}

CompressedAllreduceStats Executor::RunCompressedAlgorithm(const Codec& codec, const CompressedAllreduceOptions& o) {
  if (codec.sparse()) return SparseAllreduce(*topo_.world, o);
  if (UseHierarchy(true)) return HierarchicalCompressedAllreduce(topo_, o, settings_.intra_broadcast);
  return CompressedAllreduce(*topo_.world, o);
}

void Executor::RunAllgather(const Response& r, EntryList& entries) {
  const std::vector<int64_t>& shape = r.shapes[0];
  const size_t row = static_cast<size_t>(RowElements(shape));
  const size_t me = static_cast<size_t>(topo_.rank());
  AllgatherOptions o;
  o.dtype = r.dtype;
  o.name = r.names[0];
  for (int64_t d : r.rank_dims) o.counts.push_back(static_cast<size_t>(d) * row);
  o.count = o.counts[me];
  o.input = entries[0] ? entries[0]->input : nullptr;
  std::vector<char> local;
  std::vector<char>& out = entries[0] ? entries[0]->handle->mutable_output() : local;
  out.resize(static_cast<size_t>(NumElements(shape)) * DataTypeSize(r.dtype));
  o.output = out.data();
  if (timeline_.active()) timeline_.Begin(r.names[0], "COMMUNICATE");
  Allgather(*topo_.world, o);
  if (timeline_.active()) {
    timeline_.End(r.names[0], "COMMUNICATE",
                  EndArgs(r.dtype, shape, NumElements(shape) * static_cast<int64_t>(DataTypeSize(r.dtype))));
  }
  if (entries[0]) {
    entries[0]->handle->mutable_output_shape() = shape;
    entries[0]->handle->Complete();
  }
}

void Executor::RunBroadcast(const Response& r, EntryList& entries) {
  BroadcastOptions o;
  o.count = static_cast<size_t>(NumElements(r.shapes[0]));
  o.dtype = r.dtype;
  o.root = r.root;
  o.name = r.names[0];
  o.buffer = entries[0] ? entries[0]->output : scratch_.data();
  Broadcast(*topo_.world, o);
  CompleteAll(entries);
}

void Executor::RunAlltoall(const Response& r, EntryList& entries) {
  const std::vector<int64_t>& shape = r.shapes[0];
  const size_t row = static_cast<size_t>(RowElements(shape));
  const size_t n = static_cast<size_t>(topo_.size()), me = static_cast<size_t>(topo_.rank());
  AlltoallOptions o;
  o.dtype = r.dtype;
  o.name = r.names[0];
  std::vector<int64_t> recv_rows(n);
  for (size_t p = 0; p < n; ++p) {
    o.send_counts.push_back(static_cast<size_t>(r.rank_dims[me * n + p]) * row);
    recv_rows[p] = r.rank_dims[p * n + me];
    o.recv_counts.push_back(static_cast<size_t>(recv_rows[p]) * row);
  }
  int64_t total_rows = 0;
  for (int64_t rows : recv_rows) total_rows += rows;
  Handle& h = *entries[0]->handle;  // alltoall never runs with joined ranks
  h.mutable_output().resize(static_cast<size_t>(total_rows) * row * DataTypeSize(r.dtype));
  o.input = entries[0]->input;
  o.output = h.mutable_output().data();
  Alltoall(*topo_.world, o);
  h.mutable_output_shape() = shape;
  h.mutable_output_shape()[0] = total_rows;
  h.mutable_aux() = recv_rows;
  h.Complete();
}

void Executor::RunReducescatter(const Response& r, EntryList& entries) {
  const std::vector<int64_t>& shape = r.shapes[0];
  const size_t row = static_cast<size_t>(RowElements(shape));
  const std::vector<size_t> rows = EvenSplit(static_cast<size_t>(shape[0]), topo_.size());
  const size_t me = static_cast<size_t>(topo_.rank());
  ReducescatterOptions o;
  o.dtype = r.dtype;
  o.op = r.op;
  o.prescale = r.prescale;
  o.postscale = r.postscale;
  o.name = r.names[0];
  for (size_t rr : rows) o.counts.push_back(rr * row);
  if (entries[0]) {
    o.input = entries[0]->input;
  } else {
    std::memset(scratch_.data(), 0, static_cast<size_t>(NumElements(shape)) * DataTypeSize(r.dtype));
    o.input = scratch_.data();
  }
  std::vector<char> local;
  std::vector<char>& out = entries[0] ? entries[0]->handle->mutable_output() : local;
  out.resize(o.counts[me] * DataTypeSize(r.dtype));
  o.output = out.data();
  Reducescatter(*topo_.world, o);
  if (entries[0]) {
    entries[0]->handle->mutable_output_shape() = shape;
    entries[0]->handle->mutable_output_shape()[0] = static_cast<int64_t>(rows[me]);
    entries[0]->handle->Complete();
  }
}

}  // namespace gradcomp
