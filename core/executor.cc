#include "core/executor.h"

#include <algorithm>

#include "core/executor_parts.h"
#include "ops/collectives/allreduce.h"
#include "ops/common/enforce.h"
#include "ops/common/shape.h"
#include "ops/reduce/reduce.h"

namespace gradcomp {

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
        if (r.compression.exact() || r.compression.is_auto()) on.host_stage.Reserve(device, bytes, true);
        if (!r.compression.exact()) on.fusion.Reserve(device, bytes);
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

bool Executor::UseHierarchy() const {
  return settings_.hierarchical && topo_.nodes_of_several_ranks();
}

bool Executor::FusedHierarchy(const Response& r) const {
  if (r.op != ReduceOp::kAdasum) return UseHierarchy();
  return r.on_device && (!topo_.homogeneous || topo_.local_size() > 1);
}

void Executor::RunAllreduce(const Response& r, EntryList& entries) {
  const size_t esize = DataTypeSize(r.dtype);
  const bool record = timeline_.active();
  const size_t n = r.names.size();
  int64_t total = 0;
  for (size_t i = 0; i < n; ++i) total += NumElements(r.shapes[i]);
  if (r.compression.is_auto()) return RunAutoAllreduce(r, entries);
  if (DeliversResiduals(r)) {
    RunCompressedAllreduce(r, entries, static_cast<size_t>(total));
    for (const std::string& name : r.names) memory_.Forget(name);  // sent: nothing is owed
    return;
  }
  if (!r.compression.exact() || OwnUncompressedAllreduce(r, static_cast<size_t>(total))) {
    return RunCompressedAllreduce(r, entries, static_cast<size_t>(total));
  }
  AllreduceOptions o;
  o.count = static_cast<size_t>(total);
  DescribeReduction(r, o);
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
  const UncompressedAllreduceAlgorithm* algorithm = nullptr;
  if (comms != nullptr && comms->world->device_memory() != nullptr && comms->world->reduces(r.dtype) &&
      r.op != ReduceOp::kAdasum && (!arithmetic || DeviceOf(entries).Arithmetic(r.dtype))) {
    RunDeviceAllreduce(r, entries, o, *comms->world);
    algorithm = &CommunicatorAllreduce();  // the device communicator's own
  } else if (&DeviceOf(entries) != &HostDevice()) {
    algorithm = &RunStagedAllreduce(r, entries, o);
  } else {
    algorithm = &FusedAllreduce(topo_, FusedHierarchy(r), pieces, o, fusion_);
  }
  if (record) {
    // The algorithm and the messages it estimates a rank sends for the whole response.
    const UncompressedCase c{comms != nullptr ? comms : &topo_, r.op, r.dtype, o.count, FusedHierarchy(r)};
    const std::string how = ", \"algorithm\": \"" + std::string(algorithm->name) +
                            "\", \"estimated_messages\": " + std::to_string(algorithm->cost(c).messages);
    for (size_t i = 0; i < n; ++i) {
      const int64_t bytes = NumElements(r.shapes[i]) * static_cast<int64_t>(esize);
      timeline_.End(r.names[i], "COMMUNICATE", EndArgs(r.dtype, r.shapes[i], bytes) + how);
    }
  }
  CompleteAll(entries);
}

bool Executor::DeliversResiduals(const Response& r) {
  // "none" with error feedback: each tensor's residuals are added to its values and go out
  // exactly with them (the compressed path with the exact codec), then are dropped. How a
  // caller hands the error-feedback memories of its tensors over, averaged as its results are
  // (DiLoCo's commit), and how auto sends the residual of a tensor that moved to none. Only
  // the codecs' dtypes and ops keep residuals.
  return r.compression.exact() && r.compression.error_feedback && IsCodecDataType(r.dtype) &&
         (r.op == ReduceOp::kSum || r.op == ReduceOp::kAverage);
}

bool Executor::OwnUncompressedAllreduce(const Response& r, size_t total) const {
  // The "none" codec's scatter-reduce-allgather: the compressed path's algorithm (point-to-point,
  // striped, float32 sums in rank order) with raw float32 values on the wire.
  const UncompressedAlgorithm choice = planner_.settings().uncompressed;
  if (choice == UncompressedAlgorithm::kCommunicator || r.dtype != DataType::kFloat32) return false;
  if (r.op != ReduceOp::kSum && r.op != ReduceOp::kAverage) return false;
  if (choice == UncompressedAlgorithm::kSra) return true;
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

const UncompressedAllreduceAlgorithm& Executor::RunStagedAllreduce(const Response& r, EntryList& entries,
                                                                   const AllreduceOptions& o) {
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
  const UncompressedAllreduceAlgorithm& algorithm = FusedAllreduce(topo_, FusedHierarchy(r), pieces, o, fusion_);
  for (size_t i = 0; i < r.names.size(); ++i) {
    if (!entries[i]) continue;
    Device& d = EntryDevice(*entries[i]);
    d.CopyFromHost(entries[i]->output, pieces[i].input, pieces[i].count * esize, StreamOf(d));
  }
  SynchronizeAll(entries);
  return algorithm;
}

}  // namespace gradcomp
