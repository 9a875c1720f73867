// The executor's compressed allreduce: staging a response's tensors for the codecs, the
// algorithm's options (stripes, grids, hierarchy) and the run, and the results back.
#include "core/executor.h"

#include <algorithm>

#include "ops/collectives/compressed_allreduce.h"
#include "ops/common/enforce.h"

#include "core/executor_parts.h"

namespace gradcomp {

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
  const AllreduceCase c = CaseOf(r, o, comms != nullptr ? *comms : topo_);
  const AllreduceAlgorithm& algorithm = planner_.Choose(c);
  const CompressedAllreduceStats st = algorithm.run(c, o);
  if (feedback) {
    memory_.ScatterResiduals(device, on.stream(), r.names, staged.segments, o.residual,
                             static_cast<const float*>(on.reduced.data()));
  }
  if (dgc) memory_.MaskSent(device, on.stream(), r.names, staged.segments, sent, staged.skip_masking);
  UnstageCompressed(r, entries, staged);
  if (spec.exact()) {  // an uncompressed allreduce on the compressed path's algorithm
    ++uncompressed_sra_;
    uncompressed_sra_bytes_ += st.bytes_sent;
  } else {
    bytes_in_ += total * DataTypeSize(r.dtype);
    bytes_on_wire_ += st.bytes_sent;
  }
  if (record) {
    // Each tensor's share of the bytes this rank sent, in proportion to its size; the algorithm
    // and the messages it estimates a rank sends for the whole response.
    const std::string how = ", \"codec\": \"" + JsonEscape(spec.Describe()) + "\", \"algorithm\": \"" +
                            algorithm.name + "\", \"estimated_messages\": " +
                            std::to_string(algorithm.cost(c).messages);
    for (size_t i = 0; i < r.names.size(); ++i) {
      const auto wire = static_cast<int64_t>(static_cast<double>(st.bytes_sent) *
                                             static_cast<double>(staged.segments[i]) / static_cast<double>(total));
      timeline_.End(r.names[i], "ALLREDUCE", EndArgs(r.dtype, r.shapes[i], wire) + how);
    }
  }
  CompleteAll(entries);
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
  DescribeReduction(r, o);
  o.dtype = s.dtype;  // DGC's velocities are float32 whatever the tensors' dtype
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
  return o;
}

AlgorithmSettings Executor::PlannerSettings(const Settings& s) {
  AlgorithmSettings a;
  a.algorithm = s.compressed_algorithm;
  a.grid_min_ranks = static_cast<int>(s.grid_min_ranks);
  a.grid_node_messages = static_cast<int>(s.grid_node_messages);
  a.leader_only = s.intra_broadcast;
  a.uncompressed = ParseUncompressedAlgorithm(s.uncompressed_algorithm);
  return a;
}

AllreduceCase Executor::CaseOf(const Response& r, const CompressedAllreduceOptions& o, const Topology& topo) {
  AllreduceCase c;
  c.codec = o.codec;
  c.topo = &topo;
  c.host_memory = o.device == &HostDevice();
  // The uncompressed SRA chosen automatically goes hierarchical on nodes of several ranks: flat,
  // every rank's scatter and gather cross its node's link, local_size times the traffic of
  // reducing inside the node first (docs/benchmarks.md, "The uncompressed SRA on nodes of
  // several ranks").
  const bool raw_auto = r.compression.exact() && planner_.settings().uncompressed == UncompressedAlgorithm::kAuto;
  c.hierarchy = settings_.hierarchical || settings_.intra_broadcast || raw_auto;
  c.count = o.count;
  c.dtype = o.dtype;
  c.params = o.params;
  c.planner = &planner_;
  return c;
}

}  // namespace gradcomp
