// gradcomp._core: the native module behind the pure-Python package. It carries no
// framework types beyond numpy buffers; gradcomp.codec, gradcomp.numpy and gradcomp.torch
// build on it. Errors: gradcomp::InvalidArgument -> ValueError, gradcomp::Error ->
// gradcomp.GradcompError (a RuntimeError).
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>
#include <vector>

#include "core/settings.h"
#include "gradcomp/config.h"
#if GRADCOMP_HAVE_NCCL_COMMUNICATOR
#include "ops/comm/nccl_communicator.h"
#endif
#include "ops/collectives/compressed_allreduce.h"
#include "ops/comm/communicator.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "ops/compression/codec_on_device.h"
#include "ops/compression/topk.h"
#include "placement.h"

namespace py = pybind11;

namespace gradcomp {
void BindRuntime(py::module& m);  // runtime_bindings.cc

namespace {

DataType CodecDtypeFromName(const std::string& name) {
  if (name == "float32") return DataType::kFloat32;
  if (name == "float16") return DataType::kFloat16;
  if (name == "bfloat16") return DataType::kBFloat16;
  throw InvalidArgument("dtype '" + name + "' is not a codec dtype (float32, float16 or bfloat16)");
}

CodecParams MakeParams(int bits, size_t bucket_size, bool stochastic, uint64_t seed, uint64_t step,
                       bool skip_incomplete_buckets, double ratio, double sample_ratio, const std::string& value_dtype) {
  CodecParams p;
  p.bits = bits;
  p.bucket_size = bucket_size;
  p.stochastic = stochastic;
  p.seed = seed;
  p.step = step;
  p.skip_incomplete_buckets = skip_incomplete_buckets;
  p.topk_ratio = ratio;
  p.topk_sample_ratio = sample_ratio;
  p.topk_value_dtype = CodecDtypeFromName(value_dtype);
  return p;
}

// Arguments shared by every codec call, in Python keyword form.
#define GC_CODEC_KWARGS                                                                          \
  py::arg("bits") = 4, py::arg("bucket_size") = 512, py::arg("stochastic") = false,             \
  py::arg("seed") = 0, py::arg("step") = 0, py::arg("skip_incomplete_buckets") = false,        \
  py::arg("ratio") = 0.01, py::arg("sample_ratio") = 0.01, py::arg("value_dtype") = "float32"

py::bytes Encode(py::buffer array, const std::string& codec_name, const std::string& dtype, uint64_t first_index,
                 int bits, size_t bucket_size, bool stochastic, uint64_t seed, uint64_t step, bool skip,
                 double ratio, double sample_ratio, const std::string& value_dtype) {
  const Codec& codec = FindCodec(codec_name);
  const CodecParams p = MakeParams(bits, bucket_size, stochastic, seed, step, skip, ratio, sample_ratio, value_dtype);
  py::buffer_info info = array.request();
  const DataType dt = CodecDtypeFromName(dtype);
  if (static_cast<size_t>(info.itemsize) != DataTypeSize(dt)) {
    throw InvalidArgument("array items are " + std::to_string(info.itemsize) + " bytes but dtype " + dtype +
                          " needs " + std::to_string(DataTypeSize(dt)));
  }
  const size_t n = static_cast<size_t>(info.size);
  std::string wire(codec.MaxWireSize(n, p), '\0');
  size_t used;
  {
    py::gil_scoped_release release;
    used = codec.Encode(info.ptr, dt, n, p, first_index, wire.data());
  }
  wire.resize(used);
  return py::bytes(wire);
}

void Decode(py::bytes wire, py::buffer out, const std::string& codec_name, const std::string& dtype, bool accumulate,
            int bits, size_t bucket_size, bool stochastic, uint64_t seed, uint64_t step, bool skip, double ratio,
            double sample_ratio, const std::string& value_dtype) {
  const Codec& codec = FindCodec(codec_name);
  const CodecParams p = MakeParams(bits, bucket_size, stochastic, seed, step, skip, ratio, sample_ratio, value_dtype);
  py::buffer_info info = out.request(true);
  const DataType dt = CodecDtypeFromName(dtype);
  if (static_cast<size_t>(info.itemsize) != DataTypeSize(dt)) {
    throw InvalidArgument("output items are " + std::to_string(info.itemsize) + " bytes but dtype " + dtype +
                          " needs " + std::to_string(DataTypeSize(dt)));
  }
  const std::string_view bytes = wire;
  const size_t n = static_cast<size_t>(info.size);
  py::gil_scoped_release release;
  if (accumulate) {
    codec.DecodeAccumulate(bytes.data(), bytes.size(), n, p, dt, info.ptr);
  } else {
    codec.Decode(bytes.data(), bytes.size(), n, p, dt, info.ptr);
  }
}

// The same codecs on a framework's tensor memory, in place: `in` / `out` / `wire` are addresses
// on `device` (-1: host memory; else that GPU, the work ordered on `stream`). What the DDP hook
// uses so a GPU bucket is encoded and decoded on the GPU.
size_t EncodeAt(uintptr_t in, const std::string& dtype, size_t n, uintptr_t out, size_t out_capacity,
                const std::string& codec_name, uint64_t first_index, int device, uintptr_t stream, int bits,
                size_t bucket_size, bool stochastic, uint64_t seed, uint64_t step, bool skip, double ratio,
                double sample_ratio, const std::string& value_dtype) {
  const Codec& codec = FindCodec(codec_name);
  const CodecParams p = MakeParams(bits, bucket_size, stochastic, seed, step, skip, ratio, sample_ratio, value_dtype);
  const DataType dt = CodecDtypeFromName(dtype);
  const size_t need = codec.MaxWireSize(n, p);
  if (out_capacity < need) {
    throw InvalidArgument("codec_encode_at: " + std::to_string(n) + " values need " + std::to_string(need) +
                          " output bytes with codec '" + codec_name + "', the output has " +
                          std::to_string(out_capacity));
  }
  Where where(device, stream, "codec_encode_at");
  py::gil_scoped_release release;
  return EncodeOn(where.device(), codec, reinterpret_cast<const void*>(in), dt, n, p, first_index,
                  reinterpret_cast<void*>(out), where.stream());
}

void DecodeAt(uintptr_t wire, size_t wire_bytes, size_t n, uintptr_t out, const std::string& dtype,
              const std::string& codec_name, bool accumulate, int device, uintptr_t stream, int bits,
              size_t bucket_size, bool stochastic, uint64_t seed, uint64_t step, bool skip, double ratio,
              double sample_ratio, const std::string& value_dtype) {
  const Codec& codec = FindCodec(codec_name);
  const CodecParams p = MakeParams(bits, bucket_size, stochastic, seed, step, skip, ratio, sample_ratio, value_dtype);
  const DataType dt = CodecDtypeFromName(dtype);
  Where where(device, stream, "codec_decode_at");
  py::gil_scoped_release release;
  DecodeOn(where.device(), codec, reinterpret_cast<const void*>(wire), wire_bytes, n, p, dt,
           reinterpret_cast<void*>(out), accumulate, where.stream());
}

void BindCodecs(py::module& m) {
  m.def("codecs", [] {
    std::vector<std::pair<std::string, std::string>> out;
    for (const Codec* c : AllCodecs()) out.emplace_back(c->name(), c->description());
    return out;
  }, "(name, description) of every codec");
  m.def("codec_info", [] {
    py::dict out;
    const CompressionSpec spec;
    for (const Codec* c : AllCodecs()) {
      py::list fields;
      CompressionSpec::ForEachField(
          [&](const SpecField& f, const auto&) {
            if (f.bit != 0 && (c->fields() & f.bit) != 0) fields.append(f.key);
          },
          spec);
      py::dict d;
      d["description"] = c->description();
      d["sparse"] = c->sparse();
      d["fields"] = fields;
      out[c->name()] = d;
    }
    return out;
  }, "{codec name: {description, sparse, fields (the spec keys it reads)}}");
  m.def("even_split", &EvenSplit, py::arg("count"), py::arg("parts"),
        "Values of each part when `count` values are cut into `parts` (the first count % parts get one more): "
        "SRA's chunks");
  m.def("sra_stream_seeds", [](uint64_t seed, int rank) {
    CodecParams p;
    p.seed = seed;
    return py::make_tuple(SraScatterParams(p, rank).seed, SraGatherParams(p, rank).seed);
  }, py::arg("seed"), py::arg("rank"), "(scatter seed, gather seed) rank `rank` rounds with in SRA");
  m.def("codec_encode", &Encode, py::arg("array"), py::arg("codec"), py::arg("dtype"), py::arg("first_index") = 0,
        GC_CODEC_KWARGS, "Encodes a contiguous buffer as one segment; returns the wire bytes");
  m.def("codec_decode", &Decode, py::arg("wire"), py::arg("out"), py::arg("codec"), py::arg("dtype"),
        py::arg("accumulate") = false, GC_CODEC_KWARGS, "Decodes (or decode-accumulates) into `out`");
  m.def("codec_encode_at", &EncodeAt, py::arg("input"), py::arg("dtype"), py::arg("n"), py::arg("output"),
        py::arg("output_bytes"), py::arg("codec"), py::arg("first_index") = 0, py::arg("device") = -1,
        py::arg("stream") = 0, GC_CODEC_KWARGS,
        "Encodes n values at address `input` into `output` on `device` (-1: host); returns the bytes written");
  m.def("codec_decode_at", &DecodeAt, py::arg("wire"), py::arg("wire_bytes"), py::arg("n"), py::arg("output"),
        py::arg("dtype"), py::arg("codec"), py::arg("accumulate") = false, py::arg("device") = -1,
        py::arg("stream") = 0, GC_CODEC_KWARGS, "Decodes (or decode-accumulates) at addresses on `device`");
  m.def("codec_wire_size", [](size_t n, const std::string& codec, int bits, size_t bucket_size, bool stochastic,
                              uint64_t seed, uint64_t step, bool skip, double ratio, double sample_ratio,
                              const std::string& value_dtype) {
    return FindCodec(codec).MaxWireSize(
        n, MakeParams(bits, bucket_size, stochastic, seed, step, skip, ratio, sample_ratio, value_dtype));
  }, py::arg("n"), py::arg("codec"), GC_CODEC_KWARGS, "Encoded bytes of n values (an upper bound for topk)");
}

void BindSettings(py::module& m) {
  m.def("settings_table", &SettingsMarkdownTable, "Every setting as a Markdown table");
  m.def("describe_settings", [] {
    std::vector<py::dict> out;
    for (const SettingInfo& s : DescribeSettings()) {
      py::dict d;
      d["name"] = s.name;
      d["alias"] = s.alias;
      d["type"] = s.type;
      d["default"] = s.default_value;
      d["allowed"] = s.allowed;
      d["help"] = s.help;
      out.push_back(d);
    }
    return out;
  }, "Every setting of the registry as a dict");
}

}  // namespace
}  // namespace gradcomp

PYBIND11_MODULE(_core, m) {
  using namespace gradcomp;
  m.doc() = "gradcomp native core (codecs, settings; the runtime binds here too)";
  // The module holds the exception type; the translator keeps a borrowed pointer to it (pybind11
  // 2.12 deprecated calling a static py::exception, which would also outlive the interpreter).
  static PyObject* const gradcomp_error =
      py::exception<Error>(m, "GradcompError", PyExc_RuntimeError).ptr();
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const InvalidArgument& e) {
      PyErr_SetString(PyExc_ValueError, e.what());
    } catch (const Error& e) {
      PyErr_SetString(gradcomp_error, e.what());
    }
  });

  // The codes the bindings take, by name, so the Python side never retypes them.
  py::dict dtypes;
  for (int code = 0; code < kNumDataTypes; ++code) dtypes[DataTypeName(static_cast<DataType>(code))] = code;
  m.attr("dtypes") = dtypes;
  py::dict reduce_ops;  // the user-facing ones (kBitwiseAnd is internal)
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAverage, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct,
                      ReduceOp::kAdasum}) {
    reduce_ops[ReduceOpName(op)] = static_cast<int>(op);
  }
  m.attr("reduce_ops") = reduce_ops;

  BindCodecs(m);
  BindRuntime(m);
  m.def("build_info", [] {
    py::dict d;
    d["version"] = GRADCOMP_VERSION;
    d["cuda_toolkit_found"] = GRADCOMP_HAVE_CUDA == 1;
    d["nccl_found"] = GRADCOMP_HAVE_NCCL == 1;
    // The GPU data path (the CUDA device and its kernels) and the NCCL communicator, as built;
    // neither has run on a GPU yet (docs/design.md "Devices").
    d["cuda_kernels"] = GRADCOMP_HAVE_CUDA_KERNELS == 1;
    d["cuda"] = GRADCOMP_HAVE_CUDA_KERNELS == 1;
    d["nccl"] = GRADCOMP_HAVE_NCCL_COMMUNICATOR == 1;
#if GRADCOMP_HAVE_NCCL_COMMUNICATOR
    d["nccl_version"] = NcclVersionCode();
#else
    d["nccl_version"] = 0;
#endif
    return d;
  }, "What this build of gradcomp contains");
  BindSettings(m);
}
