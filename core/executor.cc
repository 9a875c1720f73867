#include "core/executor.h"

#include <algorithm>
#include <chrono>
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

Device& EntryDevice(const TensorEntry& e) { return e.device != nullptr ? *e.device : HostDevice(); }

// The host output of a collective whose output the runtime allocates: the handle's, `bytes`
// long, or `local` on a rank that joined (it has no handle).
char* HostOutput(EntryList& entries, size_t bytes, std::vector<char>& local) {
  std::vector<char>& out = entries[0] ? entries[0]->handle->mutable_output() : local;
  out.resize(bytes);
  return out.data();
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
      Device& device = DeviceOf(entries);
      if (&device != &HostDevice()) {
        OnDevice& on = On(device);
        if (r.compression.codec == "none" || r.compression.is_auto()) on.host_stage.Reserve(device, bytes, true);
        if (r.compression.codec != "none") on.fusion.Reserve(device, bytes);
      } else if ((r.names.size() > 1 || any_missing) && fusion_.size() < bytes) {
        fusion_.resize(bytes);
      }
      // Adasum works on the host in the fusion buffer: the values and the halves received.
      if (r.op == ReduceOp::kAdasum && fusion_.size() < 2 * bytes) fusion_.resize(2 * bytes);
      return;
    }
    case RequestType::kBroadcast:
    case RequestType::kReducescatter: {
      const size_t bytes = static_cast<size_t>(NumElements(r.shapes[0])) * esize;
      if (!entries[0] && scratch_.size() < bytes) scratch_.resize(bytes);
      Device& device = DeviceOf(entries);
      if (&device != &HostDevice()) On(device).host_stage.Reserve(device, 2 * bytes, true);  // in and out
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

Executor::OnDevice& Executor::On(Device& device) {
  std::unique_ptr<OnDevice>& d = devices_[&device];
  if (!d) d = std::make_unique<OnDevice>(device);
  return *d;
}

Device& Executor::DeviceOf(const EntryList& entries) {
  for (const auto& e : entries) {
    if (e) return EntryDevice(*e);
  }
  return HostDevice();
}

void Executor::WaitReady(const EntryList& entries) {
  for (const auto& e : entries) {
    if (e && e->ready) e->ready->Block(StreamOf(EntryDevice(*e)));
  }
}

void Executor::Transfer(Device& to, void* dst, Device& from, const void* src, size_t bytes) {
  if (&to == &from) {  // ordered on the device's stream like the rest of its work
    to.Copy(dst, src, bytes, StreamOf(to));
    return;
  }
  // Across devices (a fused response with tensors of several devices): each device's own
  // stream does its side, and both are waited for.
  if (from.space() == MemorySpace::kHost) {
    StreamOf(from).Synchronize();
    to.CopyFromHost(dst, src, bytes, StreamOf(to));
  } else if (to.space() == MemorySpace::kHost) {
    StreamOf(to).Synchronize();
    from.CopyToHost(dst, src, bytes, StreamOf(from));
  } else {  // two devices: through the host
    std::vector<char> host(bytes);
    from.CopyToHost(host.data(), src, bytes, StreamOf(from));
    StreamOf(from).Synchronize();
    to.CopyFromHost(dst, host.data(), bytes, StreamOf(to));
  }
  StreamOf(to).Synchronize();
  StreamOf(from).Synchronize();
}

void Executor::SynchronizeAll(const EntryList& entries) {
  for (const auto& e : entries) {
    if (e) StreamOf(EntryDevice(*e)).Synchronize();
  }
}

bool Executor::UseHierarchy(bool compressed, bool raw_auto) const {
  const bool wanted = settings_.hierarchical || (compressed && settings_.intra_broadcast) || raw_auto;
  return wanted && topo_.homogeneous && topo_.local_size() > 1 && topo_.cross_size() > 1;
}

bool Executor::FusedHierarchy(const Response& r) const {
  if (r.op != ReduceOp::kAdasum) return UseHierarchy(false);
  return r.on_device && (!topo_.homogeneous || topo_.local_size() > 1);
}

void Executor::RunAllreduce(const Response& r, EntryList& entries) {
  const size_t esize = DataTypeSize(r.dtype);
  const bool record = timeline_.active();
  const size_t n = r.names.size();
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += NumElements(r.shapes[i]);
  if (r.compression.is_auto()) return RunAutoAllreduce(r, entries);
  if (r.compression.codec != "none" || OwnUncompressedAllreduce(r, static_cast<size_t>(total))) {
    return RunCompressedAllreduce(r, entries, static_cast<size_t>(total));
  }
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
  const Topology* comms = DeviceComms(r, entries);
  // Device arithmetic is needed for the scale factors and Average; without it, staging.
  const bool arithmetic = r.op == ReduceOp::kAverage || r.prescale != 1.0 || r.postscale != 1.0;
  // Adasum is gradcomp's own algorithm on host memory (a device communicator has no such op).
  if (comms != nullptr && comms->world->device_memory() != nullptr && comms->world->reduces(r.dtype) &&
      r.op != ReduceOp::kAdasum && (!arithmetic || DeviceOf(entries).Arithmetic(r.dtype))) {
    RunDeviceAllreduce(r, entries, o, *comms->world);
  } else if (&DeviceOf(entries) != &HostDevice()) {
    RunStagedAllreduce(r, entries, o);
  } else {
    FusedAllreduce(topo_, FusedHierarchy(r), pieces, o, fusion_);
  }
  if (record) {
    for (size_t i = 0; i < n; ++i) {
      const int64_t bytes = NumElements(r.shapes[i]) * static_cast<int64_t>(esize);
      timeline_.End(r.names[i], "COMMUNICATE", EndArgs(r.dtype, r.shapes[i], bytes));
    }
  }
  CompleteAll(entries);
}

bool Executor::OwnUncompressedAllreduce(const Response& r, size_t total) const {
  // The "none" codec's scatter-reduce-allgather: the compressed path's algorithm (point-to-point,
  // striped, float32 sums in rank order) with raw float32 values on the wire.
  const std::string& choice = settings_.uncompressed_algorithm;
  if (choice == "mpi" || r.dtype != DataType::kFloat32) return false;
  if (r.op != ReduceOp::kSum && r.op != ReduceOp::kAverage) return false;
  if (choice == "sra") return true;
  return total * sizeof(float) >= kOwnUncompressedMinBytes && topo_.cross_size() > 1;
}

const Topology* Executor::DeviceComms(const Response& r, const EntryList& entries) {
  Device& device = DeviceOf(entries);
  if (!r.on_device || !device_comms_ || &device == &HostDevice()) return nullptr;
  OnDevice& on = On(device);
  if (!on.comms_made) {
    on.comms_made = true;  // once, whatever happens: every rank tried at the same response
    auto world = device_comms_(*topo_.world, device, CommLevel::kWorld);
    auto local = device_comms_(*topo_.local, device, CommLevel::kLocal);
    auto cross = device_comms_(*topo_.cross, device, CommLevel::kCross);
    if (world || local || cross) {
      // Levels that stay on the host get copies of the host communicators (the topology owns its own).
      const auto copy = [](Communicator& c) { return c.Split(0, c.rank()); };
      on.comms = std::make_unique<Topology>();
      on.comms->world = world ? std::move(world) : copy(*topo_.world);
      on.comms->local = local ? std::move(local) : copy(*topo_.local);
      on.comms->cross = cross ? std::move(cross) : copy(*topo_.cross);
      on.comms->homogeneous = topo_.homogeneous;
    }
  }
  return on.comms.get();
}

void Executor::RunDeviceAllreduce(const Response& r, EntryList& entries, const AllreduceOptions& o,
                                  Communicator& comm) {
  // The tensors packed on the device (or the one tensor in place), reduced by a communicator
  // that reads device memory, finished and unpacked there.
  OnDevice& on = On(DeviceOf(entries));
  Device& device = on.device();
  Stream& stream = on.stream();
  WaitReady(entries);
  const size_t n = r.names.size(), esize = DataTypeSize(r.dtype);
  const bool in_place = n == 1 && entries[0];
  char* buffer = in_place ? static_cast<char*>(entries[0]->output)
                          : static_cast<char*>(on.fusion.Reserve(device, o.count * esize));
  std::vector<size_t> counts(n);
  for (size_t i = 0, at = 0; i < n; at += counts[i] * esize, ++i) {
    counts[i] = static_cast<size_t>(NumElements(r.shapes[i]));
    if (entries[i]) {  // in place: the input copied onto the output, when they differ
      Transfer(device, buffer + at, EntryDevice(*entries[i]), entries[i]->input, counts[i] * esize);
    } else {
      device.Fill(buffer + at, 0, counts[i] * esize, stream);
    }
  }
  if (o.prescale != 1.0) device.Scale(buffer, o.count, r.dtype, o.prescale, stream);
  stream.Synchronize();
  comm.Allreduce(buffer, buffer, o.count, r.dtype, r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op);
  device.FinishReduction(buffer, o.count, r.dtype, r.op, r.postscale, comm.size(), stream);
  if (!in_place) {
    for (size_t i = 0, at = 0; i < n; at += counts[i] * esize, ++i) {
      if (entries[i]) Transfer(EntryDevice(*entries[i]), entries[i]->output, device, buffer + at, counts[i] * esize);
    }
  }
  stream.Synchronize();
}

void Executor::RunIntoDeviceOutput(const Response& r, EntryList& entries, size_t in_bytes, size_t out_bytes,
                                   bool direct, const std::function<void(Communicator&, const void*, void*)>& run) {
  TensorEntry& e = *entries[0];  // a rank with a device tensor has its entry
  Device& device = EntryDevice(e);
  OnDevice& on = On(device);
  Stream& stream = on.stream();
  void* out = e.handle->ReserveDeviceOutput(device, out_bytes);
  WaitReady(entries);
  const Topology* comms = DeviceComms(r, entries);
  if (direct && comms != nullptr && comms->world->device_memory() != nullptr) {
    stream.Synchronize();
    run(*comms->world, e.input, out);
    stream.Synchronize();
    return;
  }
  char* stage = static_cast<char*>(on.host_stage.Reserve(device, in_bytes + out_bytes, true));
  device.CopyToHost(stage, e.input, in_bytes, stream);
  stream.Synchronize();
  run(*topo_.world, stage, stage + in_bytes);
  device.CopyFromHost(out, stage + in_bytes, out_bytes, stream);
  stream.Synchronize();
}

void Executor::RunStagedAllreduce(const Response& r, EntryList& entries, const AllreduceOptions& o) {
  // Without a communicator that reads device memory, the values go through host staging: each
  // tensor is copied in, the host buffer reduced in place, each result copied back.
  WaitReady(entries);
  const size_t esize = DataTypeSize(r.dtype);
  char* stage = static_cast<char*>(On(DeviceOf(entries)).host_stage.data());
  std::vector<BufferPiece> pieces(r.names.size());
  for (size_t i = 0, at = 0; i < r.names.size(); at += pieces[i].count * esize, ++i) {
    pieces[i].count = static_cast<size_t>(NumElements(r.shapes[i]));
    if (!entries[i]) continue;  // a joined rank contributes zeros
    Device& d = EntryDevice(*entries[i]);
    d.CopyToHost(stage + at, entries[i]->input, pieces[i].count * esize, StreamOf(d));
    pieces[i].input = pieces[i].output = stage + at;
  }
  SynchronizeAll(entries);
  FusedAllreduce(topo_, FusedHierarchy(r), pieces, o, fusion_);
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (!entries[i]) continue;
    Device& d = EntryDevice(*entries[i]);
    d.CopyFromHost(entries[i]->output, pieces[i].input, pieces[i].count * esize, StreamOf(d));
  }
  SynchronizeAll(entries);
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
  OnDevice& on = *staged.on;
  Device& device = on.device();
  CompressedAllreduceOptions o = CompressedOptions(r, codec, staged);
  // Error feedback: each tensor's residuals, assembled in buffer order.
  const bool feedback = spec.error_feedback && !dgc;
  if (feedback) {
    auto* own = static_cast<float*>(on.residual.Reserve(device, total * sizeof(float)));
    auto* reduced = static_cast<float*>(on.reduced.Reserve(device, total * sizeof(float)));
    memory_.GatherResiduals(device, on.stream(), r.names, staged.segments, own, reduced);
    o.residual = own;
    o.reduced_residual = codec.sparse() ? nullptr : reduced;
  }
  std::vector<uint32_t> sent;
  if (dgc) o.sent_indices = &sent;
  if (record) {
    o.on_phase = [&](const char* phase, bool begin) {
      for (const auto& name : r.names) begin ? timeline_.Begin(name, phase) : timeline_.End(name, phase);
    };
  }
  const Topology* comms = DeviceComms(r, entries);
  const CompressedAllreduceStats st = RunCompressedAlgorithm(codec, o, comms != nullptr ? *comms : topo_);
  if (feedback) {
    memory_.ScatterResiduals(device, on.stream(), r.names, staged.segments, o.residual,
                             static_cast<const float*>(on.reduced.data()));
  }
  if (dgc) memory_.MaskSent(device, on.stream(), r.names, staged.segments, sent, staged.skip_masking);
  UnstageCompressed(r, entries, staged);
  if (spec.codec == "none") {  // an uncompressed allreduce on the compressed path's algorithm
    ++uncompressed_sra_;
    uncompressed_sra_bytes_ += st.bytes_sent;
  } else {
    bytes_in_ += total * DataTypeSize(r.dtype);
    bytes_on_wire_ += st.bytes_sent;
  }
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

// The response's entries as adaptive compression reads them: float32 on the host, copied from
// their device or cast where they are not that already.
class Executor::AutoView final : public AutoTensors {
 public:
  AutoView(Executor& ex, const Response& r, const EntryList& entries) : ex_(ex), r_(r), entries_(entries) {}
  bool Has(size_t i) const override { return entries_[i] != nullptr; }
  const float* Values(size_t i, const std::vector<std::pair<size_t, size_t>>& ranges,
                      std::vector<float>* keep) override {
    const auto n = static_cast<size_t>(NumElements(r_.shapes[i]));
    if (ranges.size() == 1 && ranges[0].first == 0 && ranges[0].second == n) {
      return ex_.HostFloats(*entries_[i], r_.dtype, n, keep);
    }
    return ex_.SampleFloats(*entries_[i], r_.dtype, ranges, keep);
  }
  std::vector<float> Residual(size_t i) override {
    OnDevice& on = ex_.On(EntryDevice(*entries_[i]));
    return ex_.memory_.OwnResidual(on.device(), on.stream(), r_.names[i]);
  }

 private:
  Executor& ex_;
  const Response& r_;
  const EntryList& entries_;
};

void Executor::RunAutoAllreduce(const Response& r, EntryList& entries) {
  AutoView view(*this, r, entries);
  for (const AutoGroup& g : auto_->Resolve(r, view, *topo_.world)) RunAutoGroup(r, entries, g);
}

void Executor::RunAutoGroup(const Response& r, EntryList& entries, const AutoGroup& g) {
  Response sub = r;
  sub.names.clear();
  sub.shapes.clear();
  sub.compression = g.spec;
  EntryList part;
  size_t total = 0;
  for (size_t i : g.members) {
    sub.names.push_back(r.names[i]);
    sub.shapes.push_back(r.shapes[i]);
    part.push_back(std::move(entries[i]));
    total += static_cast<size_t>(NumElements(r.shapes[i]));
  }
  // The entries go back whatever happens: the caller fails their handles on an error.
  struct Return {
    EntryList& from;
    EntryList& to;
    const std::vector<size_t>& at;
    ~Return() {
      for (size_t j = 0; j < at.size(); ++j) to[at[j]] = std::move(from[j]);
    }
  } give_back{part, entries, g.members};
  if (g.flush) {  // a tensor that moved to none with a residual sends it this once, exactly
    RunCompressedAllreduce(sub, part, total);
    for (const std::string& name : sub.names) memory_.Forget(name);
  } else {
    RunAllreduce(sub, part);
  }
}

double Executor::TimeUncompressed(size_t bytes) {
  Response r;
  r.names = {"gradcomp.auto.probe"};
  r.shapes = {{static_cast<int64_t>(bytes / sizeof(float))}};
  std::vector<float> values(bytes / sizeof(float), 1.0f);
  EntryList entries;
  entries.push_back(std::make_unique<TensorEntry>());
  entries[0]->input = entries[0]->output = values.data();
  entries[0]->handle = std::make_shared<Handle>();
  Prepare(r, entries);
  topo_.world->Barrier();
  const auto start = std::chrono::steady_clock::now();
  RunAllreduce(r, entries);
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

const float* Executor::HostFloats(const TensorEntry& e, DataType dtype, size_t n, std::vector<float>* keep) {
  if (&EntryDevice(e) == &HostDevice() && dtype == DataType::kFloat32) return static_cast<const float*>(e.input);
  return SampleFloats(e, dtype, {{0, n}}, keep);
}

const float* Executor::SampleFloats(const TensorEntry& e, DataType dtype,
                                    const std::vector<std::pair<size_t, size_t>>& ranges, std::vector<float>* keep) {
  Device& device = EntryDevice(e);
  const size_t width = DataTypeSize(dtype);
  size_t m = 0;
  for (const auto& range : ranges) m += range.second;
  keep->resize(m);
  if (&device == &HostDevice()) {  // cast range by range, straight from the tensor
    size_t at = 0;
    for (const auto& [from, count] : ranges) {
      CastBuffer(static_cast<const char*>(e.input) + from * width, dtype, count, keep->data() + at,
                 DataType::kFloat32, false);
      at += count;
    }
    return keep->data();
  }
  std::vector<char> raw(m * width);
  if (e.ready) e.ready->Block(StreamOf(device));
  size_t at = 0;
  for (const auto& [from, count] : ranges) {
    device.CopyToHost(raw.data() + at, static_cast<const char*>(e.input) + from * width, count * width,
                      StreamOf(device));
    at += count * width;
  }
  StreamOf(device).Synchronize();
  CastBuffer(raw.data(), dtype, m, keep->data(), DataType::kFloat32, false);
  return keep->data();
}

Executor::Staged Executor::StageCompressed(const Response& r, EntryList& entries, size_t total, bool dgc) {
  // The tensors one after another on the response's device (zeros for a joined rank), unless
  // one tensor can be reduced in place; DGC replaces each gradient by its momentum-corrected
  // velocity (float32).
  const size_t n = r.names.size();
  Staged s;
  s.on = &On(DeviceOf(entries));
  Device& device = s.on->device();
  Stream& stream = s.on->stream();
  WaitReady(entries);
  s.dtype = dgc ? DataType::kFloat32 : r.dtype;
  const size_t esize = DataTypeSize(s.dtype), in_size = DataTypeSize(r.dtype);
  const bool in_place = n == 1 && entries[0] && !dgc;
  if (!in_place) {
    Scratch& buffer = dgc ? s.on->velocities : s.on->fusion;
    s.packed = static_cast<char*>(&device == &HostDevice() && !dgc ? fusion_.data()
                                                                   : buffer.Reserve(device, total * esize));
  }
  s.segments.resize(n);
  s.skip_masking.assign(n, false);
  for (size_t i = 0, at = 0; i < n; at += s.segments[i], ++i) {
    s.segments[i] = static_cast<size_t>(NumElements(r.shapes[i]));
    s.skip_masking[i] = !entries[i];
    if (s.packed == nullptr) continue;
    char* dst = s.packed + at * esize;
    const size_t count = s.segments[i];
    if (!entries[i]) {
      device.Fill(dst, 0, count * esize, stream);
      continue;
    }
    Device& from = EntryDevice(*entries[i]);
    if (!dgc) {
      Transfer(device, dst, from, entries[i]->input, count * esize);
      continue;
    }
    const void* input = entries[i]->input;
    if (&from != &device) {  // the tensor's bytes onto the response's device, then the cast
      input = s.on->bounce.Reserve(device, count * in_size);
      Transfer(device, const_cast<void*>(input), from, entries[i]->input, count * in_size);
    }
    device.Cast(input, r.dtype, count, dst, DataType::kFloat32, false, stream);
    s.skip_masking[i] =
        !memory_.Compensate(device, stream, r.names[i], reinterpret_cast<float*>(dst), count, r.compression);
  }
  s.input = s.packed != nullptr ? s.packed : entries[0]->input;
  s.output = s.packed != nullptr ? static_cast<void*>(s.packed) : entries[0]->output;
  return s;
}

void Executor::UnstageCompressed(const Response& r, EntryList& entries, const Staged& s) {
  if (s.packed == nullptr) return;  // reduced in place
  Device& device = s.on->device();
  Stream& stream = s.on->stream();
  for (size_t i = 0, at = 0; i < r.names.size(); at += s.segments[i], ++i) {
    if (!entries[i]) continue;
    const char* src = s.packed + at * DataTypeSize(s.dtype);
    const size_t count = s.segments[i], bytes = count * DataTypeSize(r.dtype);
    Device& to = EntryDevice(*entries[i]);
    if (s.dtype != r.dtype) {  // DGC's float32 velocities back to the tensor's dtype
      if (&to == &device) {
        device.Cast(src, s.dtype, count, entries[i]->output, r.dtype, false, stream);
        continue;
      }
      char* cast = static_cast<char*>(s.on->bounce.Reserve(device, bytes));
      device.Cast(src, s.dtype, count, cast, r.dtype, false, stream);
      src = cast;
    }
    Transfer(to, entries[i]->output, device, src, bytes);
  }
  stream.Synchronize();
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
  o.device = &s.on->device();
  o.workspace = &s.on->workspace;
  // Stripes overlap encoding and decoding with the network and keep the link busy between the
  // two phases. Automatically across nodes only: on one node there is no network time to hide
  // behind (only a helper thread competing for the cores).
  const bool auto_stripes = topo_.cross_size() > 1;
  o.pipeline_stripes = settings_.pipeline_stripes > 0 ? static_cast<size_t>(settings_.pipeline_stripes)
                       : auto_stripes                 ? kAutoPipelineStripes
                                                      : 1;
  o.name = FusedName(r);
  return o;
}

CompressedAllreduceStats Executor::RunCompressedAlgorithm(const Codec& codec, const CompressedAllreduceOptions& o,
                                                          const Topology& topo) {
  if (codec.sparse()) return SparseAllreduce(*topo.world, o);
  // The uncompressed SRA chosen automatically goes hierarchical on nodes of several ranks: flat,
  // every rank's scatter and gather cross its node's link, local_size times the traffic of
  // reducing inside the node first (2 nodes x 2 ranks at 1 Gbit/s, MLP step: 3.57 s flat, 2.70 s
  // hierarchical, torch DDP on gloo 2.67 s).
  const bool raw_auto = std::strcmp(codec.name(), "none") == 0 && settings_.uncompressed_algorithm == "auto";
  if (UseHierarchy(true, raw_auto)) {
    return HierarchicalCompressedAllreduce(topo, o, settings_.intra_broadcast, GridFor(topo, *topo.cross));
  }
  if (const Grid* grid = GridFor(topo, *topo.world)) return CompressedAllreduce2d(*grid, o);
  return CompressedAllreduce(*topo.world, o);
}

const Grid* Executor::GridFor(const Topology& topo, Communicator& across) {
  // On nodes of several ranks flat SRA sends every rank's encoded chunks across the node's link,
  // local_size times what a node needs to send (2 nodes x 2 ranks at 1 Gbit/s, 64 MB: 4 bits
  // 0.171 s flat, 0.127 s with node rows; 8 bits 0.342 s, 0.208 s): then the grid's rows are the
  // nodes. Elsewhere flat SRA sends 2 (n - 1) messages a rank of size/n^2 encoded bytes each;
  // past a few dozen ranks their count, not their bytes, sets the time (simulated 25 Gbit/s
  // clusters, docs/benchmarks.md "Scale"), and the grid is the most square.
  const bool node_rows = &across == topo.world.get() && topo.homogeneous && topo.local_size() > 1 &&
                         topo.cross_size() > 1 && settings_.compressed_algorithm != "sra";
  if (!node_rows && !WantsGrid(across.size())) return nullptr;
  std::unique_ptr<Grid>& grid = grids_[&across];
  if (!grid) {
    // The columns across nodes run a grid of their own when they are long enough, nested again
    // when a node's ranks would post too many messages at once on the most square one
    // (GridShape). Every rank of a node runs one such SRA at once across nodes (the node grid's
    // columns, the hierarchical SRA's shards); a grid over a world of one node crosses no link.
    const int per_node = node_rows || &across == topo.cross.get() ? topo.local_size() : 1;
    const auto shape = [&](int ranks) {
      return GridShape(ranks, per_node, static_cast<int>(settings_.grid_min_ranks),
                       static_cast<int>(settings_.grid_node_messages));
    };
    grid = std::make_unique<Grid>(node_rows ? MakeNodeGrid(topo, WantsGrid(topo.cross_size()) ? shape(topo.cross_size())
                                                                                               : std::vector<int>{})
                                            : MakeNestedGrid(across, shape(across.size())));
  }
  // A prime number of ranks makes one row: flat SRA.
  return grid->rows() > 1 ? grid.get() : nullptr;
}

bool Executor::WantsGrid(int ranks) const {
  const std::string& choice = settings_.compressed_algorithm;
  return ranks >= 4 && (choice == "sra2d" || (choice == "auto" && ranks >= settings_.grid_min_ranks));
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
  const size_t esize = DataTypeSize(r.dtype), out_bytes = static_cast<size_t>(NumElements(shape)) * esize;
  if (timeline_.active()) timeline_.Begin(r.names[0], "COMMUNICATE");
  if (&DeviceOf(entries) != &HostDevice()) {
    RunIntoDeviceOutput(r, entries, o.count * esize, out_bytes, true, [&](Communicator& comm, const void* in, void* out) {
      AllgatherOptions d = o;
      d.input = in;
      d.output = out;
      Allgather(comm, d);
    });
  } else {
    std::vector<char> local;
    o.output = HostOutput(entries, out_bytes, local);
    Allgather(*topo_.world, o);
  }
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
  Device& device = DeviceOf(entries);
  if (&device == &HostDevice()) {
    Broadcast(*topo_.world, o);
    return CompleteAll(entries);
  }
  if (const Topology* comms = DeviceComms(r, entries); comms && comms->world->device_memory() != nullptr) {
    WaitReady(entries);
    StreamOf(device).Synchronize();
    Broadcast(*comms->world, o);
    return CompleteAll(entries);
  }
  // A device buffer travels through host staging.
  OnDevice& on = On(device);
  const size_t bytes = o.count * DataTypeSize(r.dtype);
  void* device_buffer = o.buffer;
  o.buffer = on.host_stage.Reserve(device, bytes, true);
  WaitReady(entries);
  device.CopyToHost(o.buffer, device_buffer, bytes, on.stream());
  on.stream().Synchronize();
  Broadcast(*topo_.world, o);
  device.CopyFromHost(device_buffer, o.buffer, bytes, on.stream());
  on.stream().Synchronize();
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
  const size_t esize = DataTypeSize(r.dtype), out_bytes = static_cast<size_t>(total_rows) * row * esize;
  o.input = entries[0]->input;
  if (&DeviceOf(entries) != &HostDevice()) {
    size_t in_bytes = 0;
    for (size_t c : o.send_counts) in_bytes += c * esize;
    RunIntoDeviceOutput(r, entries, in_bytes, out_bytes, true, [&](Communicator& comm, const void* in, void* out) {
      AlltoallOptions d = o;
      d.input = in;
      d.output = out;
      Alltoall(comm, d);
    });
  } else {
    std::vector<char> unused;
    o.output = HostOutput(entries, out_bytes, unused);
    Alltoall(*topo_.world, o);
  }
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
  const size_t esize = DataTypeSize(r.dtype), out_bytes = o.counts[me] * esize;
  if (&DeviceOf(entries) != &HostDevice()) {
    // Over a communicator on device memory the scale factors and Average's division are the
    // device's work (where it has the dtype's arithmetic), the reduction the communicator's.
    Device& device = DeviceOf(entries);
    OnDevice& on = On(device);
    const bool arithmetic = r.op == ReduceOp::kAverage || r.prescale != 1.0 || r.postscale != 1.0;
    const Topology* comms = DeviceComms(r, entries);
    const bool direct = (!arithmetic || device.Arithmetic(r.dtype)) && (comms == nullptr || comms->world->reduces(r.dtype));
    const size_t in_bytes = static_cast<size_t>(NumElements(shape)) * esize;
    RunIntoDeviceOutput(r, entries, in_bytes, out_bytes, direct, [&](Communicator& comm, const void* in, void* out) {
      if (comm.device_memory() == nullptr) {  // staged: the host collective does it all
        ReducescatterOptions d = o;
        d.input = in;
        d.output = out;
        return Reducescatter(comm, d);
      }
      if (o.prescale != 1.0) {
        void* scaled = on.bounce.Reserve(device, in_bytes);
        device.Copy(scaled, in, in_bytes, on.stream());
        device.Scale(scaled, in_bytes / esize, r.dtype, o.prescale, on.stream());
        on.stream().Synchronize();
        in = scaled;
      }
      comm.ReduceScatter(in, out, o.counts, r.dtype, r.op == ReduceOp::kAverage ? ReduceOp::kSum : r.op);
      device.FinishReduction(out, o.counts[me], r.dtype, r.op, r.postscale, comm.size(), on.stream());
    });
  } else {
    std::vector<char> local;
    o.output = HostOutput(entries, out_bytes, local);
    Reducescatter(*topo_.world, o);
  }
  if (entries[0]) {
    entries[0]->handle->mutable_output_shape() = shape;
    entries[0]->handle->mutable_output_shape()[0] = static_cast<int64_t>(rows[me]);
    entries[0]->handle->Complete();
  }
}

}  // namespace gradcomp
