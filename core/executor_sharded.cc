// The executor's compressed reduce-scatter and allgather (ops/collectives/compressed_shards.h):
// a response's tensor on its device, the algorithm for the topology, error feedback by name.
#include "core/executor.h"

#include "ops/collectives/shard_algorithms.h"

#include "core/executor_parts.h"

namespace gradcomp {

CompressedAllreduceOptions Executor::ShardedOptions(const Response& r, EntryList& entries, const void* input,
                                                   const std::vector<size_t>& counts, size_t out_bytes,
                                                   std::vector<char>& local) {
  Device& device = DeviceOf(entries);
  OnDevice& on = On(device);
  CompressedAllreduceOptions o;
  o.device = &device;
  o.workspace = &on.workspace;
  o.input = input;
  // A rank with a device tensor has its entry; a joined rank's (no entry) is on the host.
  o.output = &device == &HostDevice() ? static_cast<void*>(HostOutput(entries, out_bytes, local))
                                      : entries[0]->handle->ReserveDeviceOutput(device, out_bytes);
  for (size_t c : counts) o.count += c;
  DescribeReduction(r, o);
  o.codec = &FindCodec(r.compression.codec);
  o.params = ParamsOf(r.compression);
  o.params.seed = static_cast<uint64_t>(settings_.seed);
  o.params.step = ++compressed_steps_;
  if (timeline_.active()) {
    o.on_phase = [this, name = r.names[0]](const char* phase, bool begin) {
      begin ? timeline_.Begin(name, phase) : timeline_.End(name, phase);
    };
  }
  WaitReady(entries);
  return o;
}

ShardCase Executor::ShardCaseOf(const Response& r, const EntryList& entries, bool compressed) {
  const Topology* comms = DeviceComms(r, entries);
  ShardCase c;
  c.topo = &topo_;
  c.flat = comms != nullptr ? comms->world.get() : topo_.world.get();
  c.host_memory = &DeviceOf(entries) == &HostDevice();
  c.planner = &planner_;
  c.compressed = compressed;
  return c;
}

void Executor::RunCompressedReducescatter(const Response& r, EntryList& entries, const void* input,
                                          const std::vector<size_t>& counts, size_t out_bytes) {
  std::vector<char> local;
  CompressedAllreduceOptions o = ShardedOptions(r, entries, input, counts, out_bytes, local);
  Device& device = *o.device;
  OnDevice& on = On(device);
  // Error feedback keeps what this rank's encodings of its peers' shards lost, by tensor name.
  const bool feedback = r.compression.error_feedback;
  const std::vector<std::string> names{r.names[0]};
  const std::vector<size_t> segments{o.count};
  if (feedback) {
    o.residual = static_cast<float*>(on.residual.Reserve(device, o.count * sizeof(float)));
    memory_.GatherResiduals(device, on.stream(), names, segments, o.residual, nullptr);
  }
  const ShardCase c = ShardCaseOf(r, entries, true);
  const CompressedAllreduceStats st = ChooseShardAlgorithm(c).reducescatter(c, o, counts);
  if (feedback) memory_.ScatterResiduals(device, on.stream(), names, segments, o.residual, nullptr);
  on.stream().Synchronize();
  // Against what an exact reduce-scatter sends: every peer's shard of this rank's values.
  bytes_in_ += (o.count - counts[static_cast<size_t>(topo_.rank())]) * DataTypeSize(r.dtype);
  bytes_on_wire_ += st.bytes_sent;
}

void Executor::RunCompressedAllgather(const Response& r, EntryList& entries, const void* input,
                                      const std::vector<size_t>& counts, size_t out_bytes) {
  std::vector<char> local;
  const CompressedAllreduceOptions o = ShardedOptions(r, entries, input, counts, out_bytes, local);
  const ShardCase c = ShardCaseOf(r, entries, true);
  const CompressedAllreduceStats st = ChooseShardAlgorithm(c).allgather(c, o, counts);
  // Against what an exact allgather sends: this rank's rows to every peer.
  bytes_in_ += counts[static_cast<size_t>(topo_.rank())] * DataTypeSize(r.dtype) * (counts.size() - 1);
  bytes_on_wire_ += st.bytes_sent;
}

}  // namespace gradcomp
