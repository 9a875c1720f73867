// gradcomp._core.Runtime and Handle over numpy buffers: the native half of gradcomp.numpy
// (gradcomp.torch reuses it with tensors' buffers). Buffers are kept alive by the Python
// handle object until the operation completes; waiting releases the GIL.
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "ops/common/enforce.h"

namespace py = pybind11;

namespace gradcomp {
namespace {

DataType DtypeOf(const py::array& a, const std::string& what) {
  const py::dtype dt = a.dtype();
  if (dt.is(py::dtype::of<float>())) return DataType::kFloat32;
  if (dt.is(py::dtype::of<double>())) return DataType::kFloat64;
  if (dt.is(py::dtype::of<int32_t>())) return DataType::kInt32;
  if (dt.is(py::dtype::of<int64_t>())) return DataType::kInt64;
  if (dt.is(py::dtype::of<uint8_t>())) return DataType::kUInt8;
  if (dt.is(py::dtype::of<int8_t>())) return DataType::kInt8;
  if (dt.is(py::dtype::of<bool>())) return DataType::kBool;
  if (dt.kind() == 'f' && dt.itemsize() == 2) return DataType::kFloat16;
  throw InvalidArgument(what + ": dtype " + py::str(static_cast<const py::handle&>(dt)).cast<std::string>() +
                        " is not supported (uint8, int8, int32, int64, float16, float32, float64, bool)");
}

std::vector<int64_t> ShapeOf(const py::array& a) {
  return std::vector<int64_t>(a.shape(), a.shape() + a.ndim());
}

void RequireContiguous(const py::array& a, const std::string& what) {
  if (!(a.flags() & py::array::c_style)) throw InvalidArgument(what + ": the array must be C-contiguous");
}

/// A native handle plus the Python objects its buffers belong to.
struct PyHandle {
  std::shared_ptr<Handle> handle;
  std::vector<py::object> keep_alive;
  py::dtype dtype;  // of the result
  bool poll() const { return handle->Poll(); }
  void wait() const {
    py::gil_scoped_release release;
    handle->Wait();
  }
  /// The runtime-allocated output (allgather, alltoall, reducescatter) as a new array.
  py::array output() const {
    wait();
    const std::vector<int64_t>& shape = handle->output_shape();
    py::array out(dtype, std::vector<py::ssize_t>(shape.begin(), shape.end()));
    std::memcpy(out.mutable_data(), handle->output().data(), handle->output().size());
    return out;
  }
  std::vector<int64_t> aux() const {
    wait();
    return handle->aux();
  }
};

// None: the settings' policy; otherwise a dict with "codec" and optional bits, bucket_size,
// stochastic, skip_incomplete_buckets, error_feedback, ratio.
std::optional<CompressionSpec> SpecFrom(const py::object& obj) {
  if (obj.is_none()) return std::nullopt;
  const py::dict d = obj.cast<py::dict>();
  CompressionSpec spec;
  for (auto item : d) {
    const std::string key = item.first.cast<std::string>();
    if (key == "codec") {
      spec.codec = item.second.cast<std::string>();
    } else if (key == "bits") {
      spec.bits = item.second.cast<int32_t>();
    } else if (key == "bucket_size") {
      spec.bucket_size = item.second.cast<int64_t>();
    } else if (key == "stochastic") {
      spec.stochastic = item.second.cast<bool>();
    } else if (key == "skip_incomplete_buckets") {
      spec.skip_incomplete_buckets = item.second.cast<bool>();
    } else if (key == "error_feedback") {
      spec.error_feedback = item.second.cast<bool>();
    } else if (key == "ratio") {
      spec.topk_ratio = item.second.cast<double>();
    } else {
      throw InvalidArgument("unknown compression field '" + key +
                            "' (codec, bits, bucket_size, stochastic, skip_incomplete_buckets, error_feedback, ratio)");
    }
  }
  return spec;
}

std::map<std::string, std::string> EnvironmentWith(const std::map<std::string, std::string>& overrides) {
  std::map<std::string, std::string> vars;
  for (char** env = environ; env && *env; ++env) {
    const std::string kv = *env;
    const size_t eq = kv.find('=');
    if (eq != std::string::npos && (kv.rfind("GRADCOMP_", 0) == 0 || kv.rfind("CGX_", 0) == 0)) {
      vars[kv.substr(0, eq)] = kv.substr(eq + 1);
    }
  }
  for (const auto& kv : overrides) vars[kv.first] = kv.second;
  return vars;
}

std::unique_ptr<Runtime> MakeRuntime(const std::map<std::string, std::string>& overrides) {
  RuntimeOptions options;
  options.settings = Settings::FromMap(EnvironmentWith(overrides));
  py::gil_scoped_release release;  // construction is collective: let other Python threads run
  return std::make_unique<Runtime>(std::move(options));
}

}  // namespace

void BindRuntime(py::module& m) {
  py::class_<PyHandle>(m, "Handle", "An enqueued operation: poll() never blocks, wait() rethrows its error")
      .def("poll", &PyHandle::poll)
      .def("wait", &PyHandle::wait)
      .def("output", &PyHandle::output, "the result the runtime allocated (allgather, alltoall, reducescatter)")
      .def("aux", &PyHandle::aux, "alltoall: rows received per rank; join: [last rank to join]");

  py::class_<Runtime>(m, "Runtime", "gradcomp's runtime over MPI's world (one per process)")
      .def(py::init(&MakeRuntime), py::arg("settings") = std::map<std::string, std::string>{},
           "Collective: starts gradcomp with settings from the environment, overridden by `settings`")
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
      .def("allreduce_async",
           [](Runtime& rt, py::array input, py::array output, const std::string& name, int op, double pre,
              double post, const py::object& compression) {
             RequireContiguous(input, "allreduce of '" + name + "'");
             RequireContiguous(output, "allreduce of '" + name + "'");
             const DataType dt = DtypeOf(input, "allreduce of '" + name + "'");
             if (DtypeOf(output, name) != dt || output.size() != input.size()) {
               throw InvalidArgument("allreduce of '" + name + "': output must match the input's dtype and size");
             }
             const std::optional<CompressionSpec> spec = SpecFrom(compression);
             auto h = rt.Allreduce(name, dt, ShapeOf(input), input.data(), output.mutable_data(),
                                   ReduceOpFromInt(op), pre, post, spec ? &*spec : nullptr);
             return PyHandle{h, {input, output}, input.dtype()};
           },
           py::arg("input"), py::arg("output"), py::arg("name"), py::arg("op"), py::arg("prescale"),
           py::arg("postscale"), py::arg("compression") = py::none())
      .def("grouped_allreduce_async",
           [](Runtime& rt, std::vector<py::array> arrays, const std::vector<std::string>& names, int op, double pre,
              double post, const py::object& compression) {
             if (arrays.size() != names.size() || arrays.empty()) {
               throw InvalidArgument("grouped allreduce needs one name per array (and at least one array)");
             }
             const DataType dt = DtypeOf(arrays[0], "grouped allreduce of '" + names[0] + "'");
             std::vector<std::vector<int64_t>> shapes;
             std::vector<const void*> ins;
             std::vector<void*> outs;
             for (size_t i = 0; i < arrays.size(); ++i) {
               RequireContiguous(arrays[i], "grouped allreduce of '" + names[i] + "'");
               if (DtypeOf(arrays[i], names[i]) != dt) {
                 throw InvalidArgument("grouped allreduce: '" + names[i] + "' has another dtype than '" + names[0] + "'");
               }
               shapes.push_back(ShapeOf(arrays[i]));
               ins.push_back(arrays[i].data());
               outs.push_back(arrays[i].mutable_data());
             }
             const std::optional<CompressionSpec> spec = SpecFrom(compression);
             auto hs = rt.GroupedAllreduce(names, dt, shapes, ins, outs, ReduceOpFromInt(op), pre, post,
                                           spec ? &*spec : nullptr);
             std::vector<PyHandle> out;
             for (size_t i = 0; i < hs.size(); ++i) out.push_back(PyHandle{hs[i], {arrays[i]}, arrays[i].dtype()});
             return out;
           },
           py::arg("arrays"), py::arg("names"), py::arg("op"), py::arg("prescale"), py::arg("postscale"),
           py::arg("compression") = py::none(), "In-place allreduce of every array, negotiated as one group")
      .def("allgather_async",
           [](Runtime& rt, py::array input, const std::string& name) {
             RequireContiguous(input, "allgather of '" + name + "'");
             auto h = rt.Allgather(name, DtypeOf(input, "allgather of '" + name + "'"), ShapeOf(input), input.data());
             return PyHandle{h, {input}, input.dtype()};
           })
      .def("broadcast_async",
           [](Runtime& rt, py::array buffer, int root, const std::string& name) {
             RequireContiguous(buffer, "broadcast of '" + name + "'");
             auto h = rt.Broadcast(name, DtypeOf(buffer, "broadcast of '" + name + "'"), ShapeOf(buffer),
                                   buffer.mutable_data(), root);
             return PyHandle{h, {buffer}, buffer.dtype()};
           })
      .def("alltoall_async",
           [](Runtime& rt, py::array input, std::vector<int64_t> splits, const std::string& name) {
             RequireContiguous(input, "alltoall of '" + name + "'");
             auto h = rt.Alltoall(name, DtypeOf(input, "alltoall of '" + name + "'"), ShapeOf(input), input.data(),
                                  splits);
             return PyHandle{h, {input}, input.dtype()};
           })
      .def("reducescatter_async",
           [](Runtime& rt, py::array input, const std::string& name, int op, double pre, double post) {
             RequireContiguous(input, "reducescatter of '" + name + "'");
             auto h = rt.Reducescatter(name, DtypeOf(input, "reducescatter of '" + name + "'"), ShapeOf(input),
                                       input.data(), ReduceOpFromInt(op), pre, post);
             return PyHandle{h, {input}, input.dtype()};
           })
      .def("barrier_async", [](Runtime& rt) { return PyHandle{rt.Barrier(), {}, py::dtype::of<uint8_t>()}; })
      .def("join_async", [](Runtime& rt) { return PyHandle{rt.Join(), {}, py::dtype::of<uint8_t>()}; })
      .def("start_timeline", &Runtime::StartTimeline)
      .def("stop_timeline", &Runtime::StopTimeline)
      .def("stats", [](const Runtime& rt) {
        const RuntimeStats s = rt.stats();
        py::dict d;
        d["cycles"] = s.cycles;
        d["cache_hits"] = s.cache_hits;
        d["coordinator_responses"] = s.coordinator_responses;
        d["executed_responses"] = s.executed_responses;
        d["executed_tensors"] = s.executed_tensors;
        d["compressed_bytes_in"] = s.compressed_bytes_in;
        d["compressed_bytes_on_wire"] = s.compressed_bytes_on_wire;
        d["background_cpu_seconds"] = rt.BackgroundCpuSeconds();
        return d;
      });
}

}  // namespace gradcomp
