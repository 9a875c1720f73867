// gradcomp._core.Runtime and Handle over raw host buffers: the native half of gradcomp.numpy
// and gradcomp.torch, which pass (address, dtype code, shape) and the objects owning the
// memory; the handle keeps those alive until the operation completes. Waiting releases the GIL.
// No framework header is included here: the core stays free of numpy and torch types.
#include <pybind11/numpy.h>  // only for returning output bytes
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "ops/comm/mpi_environment.h"
#include "ops/comm/mpi_exit.h"
#include "ops/comm/mpi_point_to_point.h"
#include "ops/comm/store_communicator.h"
#include "ops/comm/tcp_point_to_point.h"
#include "gradcomp/config.h"
#include "ops/common/enforce.h"
#include "placement.h"
#include "py_store.h"

namespace py = pybind11;

namespace gradcomp {
namespace {

DataType DtypeFromInt(int code, const std::string& what) {
  if (code < 0 || code >= kNumDataTypes) {
    throw InvalidArgument(what + ": unknown dtype code " + std::to_string(code));
  }
  return static_cast<DataType>(code);
}

/// Buffers arrive as raw host addresses: the adapters (numpy, torch) own the memory and pass
/// the objects that own it as `keep`, which the handle holds until the operation completes.
const void* Ptr(uintptr_t address) { return reinterpret_cast<const void*>(address); }
void* MutablePtr(uintptr_t address) { return reinterpret_cast<void*>(address); }

/// A native handle plus the Python objects its buffers belong to.
struct PyHandle {
  std::shared_ptr<Handle> handle;
  py::object keep_alive;  // the Python objects owning the buffers
  bool poll() const { return handle->Poll(); }
  void wait() const {
    py::gil_scoped_release release;
    handle->Wait();
  }
  /// The runtime-allocated output (allgather, alltoall, reducescatter) as new uint8 bytes;
  /// the adapter views them with the dtype and output_shape().
  py::array_t<uint8_t> output_bytes() const {
    wait();
    // Shape and strides spelled out: pybind11 3's array_t(count) made a stride of 0 under NumPy 2,
    // an array no view() could give another dtype.
    const std::vector<py::ssize_t> shape{static_cast<py::ssize_t>(handle->output_size())}, strides{1};
    py::array_t<uint8_t> out(shape, strides);
    CopyOutputTo(out.mutable_data(), handle->output_size(), -1, 0);
    return out;
  }
  /// Whether that output is in a GPU's memory (the tensor was, and stayed there).
  bool output_on_device() const {
    wait();
    return handle->output_device() != nullptr;
  }
  /// Copies that output to `bytes` bytes at `address` on `device` (-1: host memory), ordered
  /// on `stream` there, and waits for the copy.
  void CopyOutputTo(void* address, size_t bytes, int device, uintptr_t stream) const {
    wait();
    if (bytes != handle->output_size()) {
      throw InvalidArgument("the output is " + std::to_string(handle->output_size()) + " bytes, the destination " +
                            std::to_string(bytes));
    }
    if (bytes == 0) return;
    Where to(device, stream, "copying an output");
    py::gil_scoped_release release;
    if (Device* from = handle->output_device()) {
      if (device < 0) {
        from->CopyToHost(address, handle->device_output(), bytes, to.stream());
      } else {
        GC_ENFORCE(&to.device() == from, "an output on one GPU copied to another");
        from->Copy(address, handle->device_output(), bytes, to.stream());
      }
    } else if (device < 0) {
      std::memcpy(address, handle->output().data(), bytes);
    } else {
      to.device().CopyFromHost(address, handle->output().data(), bytes, to.stream());
    }
    to.stream().Synchronize();
  }
  std::vector<int64_t> output_shape() const {
    wait();
    return handle->output_shape();
  }
  std::vector<int64_t> aux() const {
    wait();
    return handle->aux();
  }
};

// None: the settings' policy; otherwise a dict with "codec" and any of the other keys of
// CompressionSpec::ForEachField (bits, bucket_size, ..., ratio, momentum, nesterov).
std::optional<CompressionSpec> SpecFrom(const py::object& obj) {
  if (obj.is_none()) return std::nullopt;
  const py::dict d = obj.cast<py::dict>();
  CompressionSpec spec;
  size_t found = 0;
  CompressionSpec::ForEachField(
      [&](const SpecField& f, auto& v) {
        if (!d.contains(f.key)) return;
        v = d[f.key].template cast<std::decay_t<decltype(v)>>();
        ++found;
      },
      spec);
  if (found == d.size()) return spec;
  // Some key is none of the fields: name it, and the fields there are.
  std::set<std::string> known;
  std::string keys;
  CompressionSpec::ForEachField(
      [&](const SpecField& f, const auto&) {
        known.insert(f.key);
        keys += (keys.empty() ? "" : ", ") + std::string(f.key);
      },
      spec);
  for (auto item : d) {
    const std::string key = py::str(item.first);
    if (!known.count(key)) throw InvalidArgument("unknown compression field '" + key + "' (" + keys + ")");
  }
  return spec;
}

/// The inverse of SpecFrom: a spec as the dict the adapters pass in.
py::dict SpecDict(const CompressionSpec& spec) {
  py::dict d;
  CompressionSpec::ForEachField([&](const SpecField& f, const auto& v) { d[f.key] = v; }, spec);
  return d;
}

std::map<std::string, std::string> EnvironmentWith(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> vars;
  for (char** env = environ; env && *env; ++env) {
    const std::string kv = *env;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos &&
        (kv.rfind("GRADCOMP_", 0) == 0 || kv.rfind("CGX_", 0) == 0 || kv.rfind("HOROVOD_", 0) == 0)) {
      vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  for (const auto& kv : overrides) vars[kv.first] = kv.second;
  return vars;
}

// Where a runtime's ranks find each other without MPI (an env:// launch): a store of Python's,
// this rank's place, and a key prefix fresh for each world.
struct StoreWorld {
  py::object store;  // None: MPI's world
  int rank = -1;
  int size = 0;
  std::string prefix;
  double timeout_seconds = 300;
};

// The TCP world connected through the store (called with the GIL released: the store takes it).
std::unique_ptr<Communicator> ConnectThrough(const StoreWorld& where, const Settings& settings) {
  PyStore store(where.store);
  TcpOptions tcp;
  tcp.iface = settings.controller_iface;
  tcp.unreachable_seconds = UnreachableSeconds(settings);
  return ConnectStoreWorld(store, where.prefix, where.rank, where.size, where.timeout_seconds, tcp);
}

std::unique_ptr<Runtime> MakeRuntime(const std::map<std::string, std::string>& overrides, const py::object& store,
                                     int rank, int size, const std::string& prefix, double timeout) {
  RuntimeOptions options;
  options.settings = Settings::FromMap(EnvironmentWith(overrides));
  const StoreWorld where{store, rank, size, prefix, timeout};
  py::gil_scoped_release release;  // construction is collective: let other Python threads run
  if (!where.store.is_none()) options.world = ConnectThrough(where, options.settings);
  return std::make_unique<Runtime>(std::move(options));
}

// GRADCOMP_LOCAL_SIZE (nodes of that many consecutive world ranks) as the set's ranks see it:
// the number of the set's ranks on each node when every node holds as many of them, else 0
// (the nodes are then found as without the setting: ranks sharing memory).
int64_t ProcessSetLocalSize(const std::vector<int>& ranks, int64_t world_local_size) {
  if (world_local_size <= 0) return 0;
  std::map<int64_t, int64_t> per_node;
  for (int r : ranks) ++per_node[r / world_local_size];
  const int64_t each = per_node.begin()->second;
  for (const auto& kv : per_node) {
    if (kv.second != each) return 0;
  }
  return each;
}

// A process set's runtime: collective over MPI's world (every rank passes the same sorted
// ranks), or over the set's ranks only with `members_only` (torch.distributed's new_group:
// only the members create it; they pass the same `tag`); null for the ranks outside the set.
// The set's runtime writes no timeline and tunes nothing (those write files the global
// runtime's rank 0 writes).
std::unique_ptr<Runtime> MakeProcessSetRuntime(const std::vector<int>& ranks,
                                               const std::map<std::string, std::string>& overrides, bool members_only,
                                               int tag, const py::object& store, int world_rank,
                                               const std::string& prefix, double timeout) {
  if (ranks.empty()) throw InvalidArgument("a process set needs at least one rank");
  if (!std::is_sorted(ranks.begin(), ranks.end()) || std::adjacent_find(ranks.begin(), ranks.end()) != ranks.end()) {
    throw InvalidArgument("a process set's ranks must be sorted and distinct");
  }
  RuntimeOptions options;
  options.settings = Settings::FromMap(EnvironmentWith(overrides));
  options.settings.timeline.clear();
  options.settings.autotune = false;
  options.settings.autotune_log.clear();
  options.settings.local_size = ProcessSetLocalSize(ranks, options.settings.local_size);
  if (!store.is_none()) {
    // A world without MPI: the set's members connect a TCP world of their own through the store.
    const auto mine = std::find(ranks.begin(), ranks.end(), world_rank);
    if (mine == ranks.end()) return nullptr;
    const StoreWorld where{store, static_cast<int>(mine - ranks.begin()), static_cast<int>(ranks.size()), prefix,
                           timeout};
    py::gil_scoped_release release;  // collective: let other Python threads run
    options.world = ConnectThrough(where, options.settings);
    options.rank_names = ranks;
    return std::make_unique<Runtime>(std::move(options));
  }
  py::gil_scoped_release release;  // collective: let other Python threads run
  options.world = members_only ? CreateMpiGroupWorld(ranks, tag) : CreateMpiSubworld(ranks);
  if (options.world == nullptr) return nullptr;
  options.world_is_mpi = true;
  options.rank_names = ranks;  // messages name the set's ranks by their rank in MPI's world
  return std::make_unique<Runtime>(std::move(options));
}

// Every buffer is (address, dtype code, shape); `keep` owns the memory until completion.
PyHandle AllreduceAsync(Runtime& rt, uintptr_t input, uintptr_t output, int dtype, const std::vector<int64_t>& shape,
                        const std::string& name, int op, double pre, double post, const py::object& compression,
                        py::object keep, int device, uintptr_t stream, int32_t priority) {
  const std::string what = "allreduce of '" + name + "'";
  const DataType dt = DtypeFromInt(dtype, what);
  const std::optional<CompressionSpec> spec = SpecFrom(compression);
  const Where where(device, stream, what);
  auto h = rt.Allreduce(name, dt, shape, Ptr(input), MutablePtr(output), ReduceOpFromInt(op), pre, post,
                        spec ? &*spec : nullptr, where.placement(), priority);
  return PyHandle{h, std::move(keep)};
}

std::vector<PyHandle> GroupedAllreduceAsync(Runtime& rt, const std::vector<uintptr_t>& buffers, int dtype,
                                            const std::vector<std::vector<int64_t>>& shapes,
                                            const std::vector<std::string>& names, int op, double pre, double post,
                                            const py::object& compression, py::object keep, int device,
                                            uintptr_t stream, int32_t priority) {
  if (buffers.size() != names.size() || buffers.size() != shapes.size() || buffers.empty()) {
    throw InvalidArgument("grouped allreduce needs one name and shape per tensor (and at least one tensor)");
  }
  const DataType dt = DtypeFromInt(dtype, "grouped allreduce of '" + names[0] + "'");
  std::vector<const void*> ins;
  std::vector<void*> outs;
  for (uintptr_t b : buffers) {
    ins.push_back(Ptr(b));
    outs.push_back(MutablePtr(b));
  }
  const std::optional<CompressionSpec> spec = SpecFrom(compression);
  const Where where(device, stream, "grouped allreduce of '" + names[0] + "'");
  auto hs = rt.GroupedAllreduce(names, dt, shapes, ins, outs, ReduceOpFromInt(op), pre, post,
                                spec ? &*spec : nullptr, {where.placement()}, priority);
  std::vector<PyHandle> out;
  for (auto& h : hs) out.push_back(PyHandle{h, keep});
  return out;
}

py::dict StatsDict(const Runtime& rt) {
  const RuntimeStats s = rt.stats();
  py::dict d;
  d["cycles"] = s.cycles;
  d["cache_hits"] = s.cache_hits;
  d["scheduling_deferrals"] = s.scheduling_deferrals;
  d["batch_waits"] = s.batch_waits;
  d["coordinator_responses"] = s.coordinator_responses;
  d["executed_responses"] = s.executed_responses;
  d["executed_tensors"] = s.executed_tensors;
  d["compressed_bytes_in"] = s.compressed_bytes_in;
  d["compressed_bytes_on_wire"] = s.compressed_bytes_on_wire;
  d["uncompressed_sra_responses"] = s.uncompressed_sra_responses;
  d["uncompressed_sra_bytes_on_wire"] = s.uncompressed_sra_bytes_on_wire;
  d["nonfinite_memory_skips"] = s.nonfinite_memory_skips;
  d["auto_choices"] = s.auto_choices;
  d["fusion_threshold_mb"] = s.fusion_threshold_mb;
  d["cycle_time_ms"] = s.cycle_time_ms;
  d["autotune_done"] = s.autotune_done;
  d["queued_operations"] = s.queued_operations;
  d["negotiating_tensors"] = s.negotiating_tensors;
  d["cache_entries"] = s.cache_entries;
  d["compression_memories"] = s.compression_memories;
  d["auto_tensors"] = s.auto_tensors;
  d["timeline_rows"] = s.timeline_rows;
  d["timeline_queued"] = s.timeline_queued;
  d["background_cpu_seconds"] = rt.BackgroundCpuSeconds();
  return d;
}

// A group's messages, over MPI (PointToPoint) or TCP (TcpPointToPoint): the same methods.
template <typename Messages>
void BindMessages(py::class_<Messages>& cls) {
  cls.def("rank", &Messages::rank)
      .def("size", &Messages::size)
      .def("max_tag", &Messages::max_tag)
      .def("send",
           [](Messages& p, uintptr_t address, size_t bytes, int peer, int tag) {
             return p.Send(Ptr(address), bytes, peer, tag);
           })
      .def("recv", [](Messages& p, uintptr_t address, size_t bytes, int peer, int tag) {
        return p.Receive(MutablePtr(address), bytes, peer, tag);
      }, "peer -1: from any rank");
}

// torch.distributed's send and recv: posted requests and a group's point-to-point messages.
void BindPointToPoint(py::module& m) {
  py::class_<PointToPointRequest>(m, "PointToPointRequest", "A posted send or receive (keep its buffer alive)")
      .def("test", &PointToPointRequest::Test, "True once complete; raises its error")
      .def("wait",
           [](PointToPointRequest& r, double timeout) {
             py::gil_scoped_release nogil;
             const auto start = std::chrono::steady_clock::now();
             Poller poller;
             while (!r.Test()) {
               if (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= timeout) {
                 return false;
               }
               poller.Pause(false);
             }
             return true;
           },
           py::arg("timeout"), "waits up to `timeout` seconds; True once complete (raises its error)")
      .def("cancel_receive", &PointToPointRequest::CancelReceive)
      .def("source", &PointToPointRequest::source);
  py::class_<PointToPoint> mpi(m, "PointToPoint",
                               "Point-to-point messages of a group (torch.distributed's send and recv), on an MPI "
                               "communicator of their own");
  mpi.def(py::init<const std::vector<int>&, int>(), py::arg("ranks"), py::arg("tag") = 0,
          "Collective over MPI's world (`ranks` empty) or over the sorted world `ranks` only, which pass the "
          "same `tag`");
  BindMessages(mpi);
  py::class_<TcpPointToPoint> tcp(m, "TcpPointToPoint",
                                  "Point-to-point messages of a group in a world without MPI, on TCP connections of "
                                  "their own");
  tcp.def(py::init([](const py::object& store, int rank, int size, const std::string& prefix, double timeout) {
            const StoreWorld where{store, rank, size, prefix, timeout};
            py::gil_scoped_release release;  // collective: let other Python threads run
            return std::make_unique<TcpPointToPoint>(ConnectThrough(where, Settings::FromMap(EnvironmentWith({}))));
          }),
          py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("prefix"), py::arg("timeout") = 300.0,
          "Collective over the group's `size` ranks, which connect through `store` under `prefix`");
  BindMessages(tcp);
}

void BindHandle(py::module& m) {
  py::class_<PyHandle>(m, "Handle", "An enqueued operation: poll() never blocks, wait() rethrows its error")
      .def("poll", &PyHandle::poll)
      .def("wait", &PyHandle::wait)
      .def("output_bytes", &PyHandle::output_bytes,
           "the bytes of the result the runtime allocated (allgather, alltoall, reducescatter)")
      .def("output_on_device", &PyHandle::output_on_device)
      .def("copy_output_to",
           [](const PyHandle& h, uintptr_t address, size_t bytes, int device, uintptr_t stream) {
             h.CopyOutputTo(MutablePtr(address), bytes, device, stream);
           },
           py::arg("address"), py::arg("bytes"), py::arg("device") = -1, py::arg("stream") = 0,
           "copies the runtime-allocated output to a buffer on `device` (-1: host) and waits")
      .def("output_shape", &PyHandle::output_shape)
      .def("aux", &PyHandle::aux, "alltoall: rows received per rank; join: [last rank to join]");
}

// The runtime's collectives: each enqueues and returns a Handle.
void BindCollectives(py::class_<Runtime>& cls) {
  cls.def("allreduce_async",
           &AllreduceAsync,
           py::arg("input"), py::arg("output"), py::arg("dtype"), py::arg("shape"), py::arg("name"), py::arg("op"),
           py::arg("prescale"), py::arg("postscale"), py::arg("compression"), py::arg("keep"), py::arg("device") = -1,
           py::arg("stream") = 0, py::arg("priority") = 0,
           "device: -1 for host memory, else the GPU ordinal; stream: its cudaStream_t; priority: lower runs first")
      .def("grouped_allreduce_async",
           &GroupedAllreduceAsync,
           py::arg("buffers"), py::arg("dtype"), py::arg("shapes"), py::arg("names"), py::arg("op"),
           py::arg("prescale"), py::arg("postscale"), py::arg("compression"), py::arg("keep"), py::arg("device") = -1,
           py::arg("stream") = 0, py::arg("priority") = 0,
           "In-place allreduce of every buffer, negotiated as one group")
      .def(
          "allgather_async",
          [](Runtime& rt, uintptr_t input, int dtype, const std::vector<int64_t>& shape, const std::string& name,
             py::object keep, int device, uintptr_t stream, const py::object& compression, uintptr_t output,
             size_t output_bytes) {
            const std::string what = "allgather of '" + name + "'";
            const Where where(device, stream, what);
            const std::optional<CompressionSpec> spec = SpecFrom(compression);
            auto h = rt.Allgather(name, DtypeFromInt(dtype, what), shape, Ptr(input), spec ? &*spec : nullptr,
                                  where.placement(), OutputBuffer{MutablePtr(output), output_bytes});
            return PyHandle{h, std::move(keep)};
          },
          py::arg("input"), py::arg("dtype"), py::arg("shape"), py::arg("name"), py::arg("keep"),
          py::arg("device") = -1, py::arg("stream") = 0, py::arg("compression") = py::none(), py::arg("output") = 0,
          py::arg("output_bytes") = 0,
          "compression: None (the settings' GRADCOMP_ALLGATHER_COMPRESSION and layer filter) or a spec dict; "
          "output: 0 (the handle holds the result) or a host buffer of output_bytes for it")
      .def(
          "broadcast_async",
          [](Runtime& rt, uintptr_t buffer, int dtype, const std::vector<int64_t>& shape, int root,
             const std::string& name, py::object keep, int device, uintptr_t stream) {
            const std::string what = "broadcast of '" + name + "'";
            const Where where(device, stream, what);
            auto h = rt.Broadcast(name, DtypeFromInt(dtype, what), shape, MutablePtr(buffer), root, where.placement());
            return PyHandle{h, std::move(keep)};
          },
          py::arg("buffer"), py::arg("dtype"), py::arg("shape"), py::arg("root"), py::arg("name"), py::arg("keep"),
          py::arg("device") = -1, py::arg("stream") = 0)
      .def_property_readonly(
          "cuda_data_path",
          [](const Runtime& rt) { return GRADCOMP_HAVE_CUDA_KERNELS == 1 && rt.settings().cuda_data_path; },
          "whether GPU tensors are handed to the runtime in GPU memory (a CUDA build, GRADCOMP_CUDA_DATA_PATH=1)")
      .def(
          "alltoall_async",
          [](Runtime& rt, uintptr_t input, int dtype, const std::vector<int64_t>& shape,
             const std::vector<int64_t>& splits, const std::string& name, py::object keep, int device,
             uintptr_t stream) {
            const std::string what = "alltoall of '" + name + "'";
            const Where where(device, stream, what);
            auto h = rt.Alltoall(name, DtypeFromInt(dtype, what), shape, Ptr(input), splits, where.placement());
            return PyHandle{h, std::move(keep)};
          },
          py::arg("input"), py::arg("dtype"), py::arg("shape"), py::arg("splits"), py::arg("name"), py::arg("keep"),
          py::arg("device") = -1, py::arg("stream") = 0)
      .def(
          "reducescatter_async",
          [](Runtime& rt, uintptr_t input, int dtype, const std::vector<int64_t>& shape, const std::string& name,
             int op, double pre, double post, py::object keep, int device, uintptr_t stream,
             const py::object& compression, uintptr_t output, size_t output_bytes) {
            const std::string what = "reducescatter of '" + name + "'";
            const Where where(device, stream, what);
            const std::optional<CompressionSpec> spec = SpecFrom(compression);
            auto h = rt.Reducescatter(name, DtypeFromInt(dtype, what), shape, Ptr(input), ReduceOpFromInt(op), pre,
                                      post, spec ? &*spec : nullptr, where.placement(),
                                      OutputBuffer{MutablePtr(output), output_bytes});
            return PyHandle{h, std::move(keep)};
          },
          py::arg("input"), py::arg("dtype"), py::arg("shape"), py::arg("name"), py::arg("op"), py::arg("prescale"),
          py::arg("postscale"), py::arg("keep"), py::arg("device") = -1, py::arg("stream") = 0,
          py::arg("compression") = py::none(), py::arg("output") = 0, py::arg("output_bytes") = 0,
          "compression: None (the settings' GRADCOMP_COMPRESSION and layer filter) or a spec dict; "
          "output: 0 (the handle holds the result) or a host buffer of output_bytes for it")
      .def("barrier_async", [](Runtime& rt) { return PyHandle{rt.Barrier(), py::none()}; })
      .def("join_async", [](Runtime& rt) { return PyHandle{rt.Join(), py::none()}; });
}

// What a caller reads of a running runtime: its settings, counters, timeline and auto's choices.
void BindInspection(py::class_<Runtime>& cls) {
  cls.def_property_readonly(
          "scheduling_credit_mb", [](const Runtime& rt) { return rt.settings().scheduling_credit_mb; },
          "GRADCOMP_SCHEDULING_CREDIT_MB: MB of prioritized tensors a cycle runs (0: no limit)")
      .def("default_compression",
           [](const Runtime& rt) { return py::make_tuple(SpecDict(rt.settings().compression), rt.settings().min_size); },
           "(the settings' compression spec, the layer filter's minimum size)")
      .def("forget_compression_state", &Runtime::ForgetCompressionState,
           "Drops error-feedback and DGC state kept for these tensor names (local)")
      .def("start_timeline", &Runtime::StartTimeline)
      .def("stop_timeline", &Runtime::StopTimeline)
      .def("stats", &StatsDict)
      .def("compression_choices", [](const Runtime& rt) {
        py::dict out;
        for (const auto& [name, rep] : rt.CompressionChoices()) {
          py::dict d;
          d["setting"] = rep.setting;
          d["choice"] = rep.choice;
          d["measured_at"] = rep.measured_at;
          d["relative_error"] = rep.relative_error;
          d["relative_error_ef"] = rep.relative_error_ef;
          d["estimated_seconds"] = rep.estimated_seconds;
          d["critical"] = rep.critical;
          d["budget_bits"] = rep.budget_bits;
          d["norm_change"] = rep.norm_change;
          out[py::str(name)] = d;
        }
        return out;
      })
      .def("auto_link", [](const Runtime& rt) {
        const LinkCost link = rt.AutoLink();
        return py::make_tuple(link.latency, link.per_byte);
      }, "auto compression's cost model: the link as last probed, (latency seconds, seconds per byte); 0s before");
}

}  // namespace

void BindRuntime(py::module& m) {
  m.def("process_set_runtime", &MakeProcessSetRuntime, py::arg("ranks"),
        py::arg("settings") = std::map<std::string, std::string>{}, py::arg("members_only") = false,
        py::arg("tag") = 0, py::arg("store") = py::none(), py::arg("world_rank") = -1, py::arg("prefix") = "",
        py::arg("timeout") = 300.0,
        "Collective over MPI's world (over `ranks` only with members_only, whose members pass the same `tag`): a "
        "runtime over `ranks` (sorted, the same on every rank) for its members, None for the other ranks. With a "
        "`store` (a world without MPI), the members connect through it under `prefix`, `world_rank` being this "
        "rank's");
  m.def("cuda_data_path", [] {
    // Every setting is parsed (a bad value named) in CPU-only builds as well.
    const bool wanted = Settings::FromMap(EnvironmentWith({})).cuda_data_path;
    return GRADCOMP_HAVE_CUDA_KERNELS == 1 && wanted;
  }, "Whether GPU tensors stay in GPU memory (a CUDA build and GRADCOMP_CUDA_DATA_PATH=1), without a runtime");
  m.def("abandon_mpi_at_exit", &AbandonMpiAtExit,
        "This process skips MPI's collective teardown at exit (MPI_Win_free, MPI_Finalize): it is leaving a job "
        "whose other ranks may never reach theirs; the launcher ends the job");
  BindPointToPoint(m);
  BindHandle(m);
  py::class_<Runtime> cls(m, "Runtime",
                          "gradcomp's runtime over the world (MPI's, or a TCP world connected through a store), or "
                          "over a process set's ranks");
  cls
      .def(py::init(&MakeRuntime), py::arg("settings") = std::map<std::string, std::string>{},
           py::arg("store") = py::none(), py::arg("rank") = -1, py::arg("size") = 0, py::arg("prefix") = "",
           py::arg("timeout") = 300.0,
           "Collective: starts gradcomp with settings from the environment, overridden by `settings`, on MPI's "
           "world, or with a `store` (set(key, bytes), get(key, timeout) -> bytes or None) on a TCP world of "
           "`size` ranks connected through it under `prefix` (an env:// launch)")
      .def("shutdown", [](Runtime& rt) {
        py::gil_scoped_release release;
        rt.Shutdown();
      })
      .def_property_readonly("running", &Runtime::running)
      .def("rank", &Runtime::rank)
      .def("size", &Runtime::size)
      .def("local_rank", &Runtime::local_rank)
      .def("local_size", &Runtime::local_size)
      .def("cross_rank", &Runtime::cross_rank)
      .def("cross_size", &Runtime::cross_size)
      .def("is_homogeneous", &Runtime::homogeneous);
  BindCollectives(cls);
  BindInspection(cls);
}

}  // namespace gradcomp
