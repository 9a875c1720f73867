// The executor's other collectives: allgather, broadcast, alltoall and reducescatter of a response.
#include "core/executor.h"

#include <algorithm>
#include <cstring>

#include "ops/collectives/allgather.h"
#include "ops/collectives/alltoall.h"
#include "ops/collectives/broadcast.h"
#include "ops/collectives/reducescatter.h"
#include "ops/common/enforce.h"

#include "core/executor_parts.h"

namespace gradcomp {

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
  if (!r.compression.exact()) {
    RunCompressedAllgather(r, entries, o.input, o.counts, out_bytes);
  } else if (&DeviceOf(entries) != &HostDevice()) {
    RunIntoDeviceOutput(r, entries, o.count * esize, out_bytes, true, OnBuffers(o, Allgather));
  } else {
    std::vector<char> local;
    o.output = HostOutput(entries, out_bytes, local);
    const ShardCase c = ShardCaseOf(r, entries, false);
    ChooseShardAlgorithm(c).plain_allgather(c, o);
  }
  if (timeline_.active()) {
    timeline_.End(r.names[0], "COMMUNICATE",
                  EndArgs(r.dtype, shape, NumElements(shape) * static_cast<int64_t>(DataTypeSize(r.dtype))));
  }
  CompleteOutput(entries, r, out_bytes, shape);
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
    RunIntoDeviceOutput(r, entries, in_bytes, out_bytes, true, OnBuffers(o, Alltoall));
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

void Executor::RunReducescatter(const Response& r, EntryList& entries, bool through_codec) {
  if (r.compression.is_auto()) return RunAutoReducescatter(r, entries);
  const std::vector<int64_t>& shape = r.shapes[0];
  const size_t row = static_cast<size_t>(RowElements(shape));
  const std::vector<size_t> rows = EvenSplit(static_cast<size_t>(shape[0]), topo_.size());
  const size_t me = static_cast<size_t>(topo_.rank());
  ReducescatterOptions o;
  DescribeReduction(r, o);
  for (size_t rr : rows) o.counts.push_back(rr * row);
  if (entries[0]) {
    o.input = entries[0]->input;
  } else {
    std::memset(scratch_.data(), 0, static_cast<size_t>(NumElements(shape)) * DataTypeSize(r.dtype));
    o.input = scratch_.data();
  }
  const size_t esize = DataTypeSize(r.dtype), out_bytes = o.counts[me] * esize;
  if (!r.compression.exact() || through_codec) {
    RunCompressedReducescatter(r, entries, o.input, o.counts, out_bytes);
  } else if (&DeviceOf(entries) != &HostDevice()) {
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
        return OnBuffers(o, Reducescatter)(comm, in, out);
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
    const ShardCase c = ShardCaseOf(r, entries, false);
    ChooseShardAlgorithm(c).plain_reducescatter(c, o);
  }
  std::vector<int64_t> out_shape = shape;
  out_shape[0] = static_cast<int64_t>(rows[me]);
  CompleteOutput(entries, r, out_bytes, std::move(out_shape));
}

}  // namespace gradcomp
