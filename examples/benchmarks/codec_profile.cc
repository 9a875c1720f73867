// What a device's encoding, decoding and copies take per call, by the call's size: the profile a
// simulation prices codec work from instead of this machine's clock (GRADCOMP_SIM_CODEC_PROFILE,
// simulate.py --codec-profile; ops/common/simulation.h). Run once on a GPU, it gives simulated
// clusters that GPU's codec time.
//
//   build/examples/codec_profile [--device host|cuda] [--codecs none,fp16,bf16,maxmin1,...,maxmin8]
//       [--mb 64] [--sizes 1024,4096,...,16777216] [--reps 3] [--out FILE]
//
// Each size n is timed the way the data path calls the device: back-to-back calls of n values
// through a --mb buffer of Gaussian float32 on the device (so a pass streams from memory, as the
// data path's pieces of a large gradient do), the stream synchronized once at the end; the median
// of --reps passes, divided by the calls. Work of no codec: copy (Device::Copy), elementwise
// (Device::Reduce: the sums, scales and differences between codec calls), to_host and from_host
// (a staged buffer to and from its host copy: the wire of a transport that reads host memory; no
// copy on the host device). Every row: "OP CODEC VALUES SECONDS" (CODEC "-" for work of no codec;
// VALUES counts float32 values, bytes / 4 for the copies), after a "device NAME" line.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "gradcomp/config.h"
#include "ops/common/enforce.h"
#include "ops/compression/auto_select.h"
#include "ops/compression/codec.h"
#include "ops/compression/codec_on_device.h"
#include "ops/device/device.h"
#include "ops/device/staging.h"
#include "ops/reduce/reduce.h"
#if GRADCOMP_HAVE_CUDA_KERNELS
#include "ops/device/cuda_device.h"
#endif

namespace {

using gradcomp::DataType;
using gradcomp::Device;

struct Options {
  std::string device = "host";
  std::string codecs = "none,fp16,bf16,maxmin1,maxmin2,maxmin3,maxmin4,maxmin5,maxmin6,maxmin7,maxmin8";
  size_t mb = 64;
  std::vector<size_t> sizes = {1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216};
  int reps = 3;
  std::string out;
};

[[noreturn]] void Usage(const std::string& why) {
  std::fprintf(stderr,
               "codec_profile: %s\nusage: codec_profile [--device host|cuda] [--codecs LIST] [--mb MB] "
               "[--sizes N1,N2,...] [--reps R] [--out FILE]\n",
               why.c_str());
  std::exit(2);
}

size_t Positive(const std::string& flag, const std::string& text) {
  char* end = nullptr;
  const unsigned long long v = std::strtoull(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || v == 0) Usage(flag + " takes a positive integer, got '" + text + "'");
  return static_cast<size_t>(v);
}

Options Parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) Usage(flag + " needs a value");
    const std::string value = argv[++i];
    if (flag == "--device") {
      o.device = value;
    } else if (flag == "--codecs") {
      o.codecs = value;
    } else if (flag == "--mb") {
      o.mb = Positive(flag, value);
    } else if (flag == "--reps") {
      o.reps = static_cast<int>(Positive(flag, value));
    } else if (flag == "--out") {
      o.out = value;
    } else if (flag == "--sizes") {
      o.sizes.clear();
      std::stringstream list(value);
      for (std::string n; std::getline(list, n, ',');) o.sizes.push_back(Positive(flag, n));
    } else {
      Usage("unknown option " + flag);
    }
  }
  if (o.device != "host" && o.device != "cuda") Usage("--device is host or cuda, got '" + o.device + "'");
  return o;
}

std::string HostName() {
  std::ifstream cpuinfo("/proc/cpuinfo");
  for (std::string line; std::getline(cpuinfo, line);) {
    if (line.rfind("model name", 0) == 0) return "host (" + line.substr(line.find(':') + 2) + ", one thread)";
  }
  return "host (one thread)";
}

Device& Open(const Options& o, std::string* name) {
  if (o.device == "host") {
    *name = HostName();
    return gradcomp::HostDevice();
  }
#if GRADCOMP_HAVE_CUDA_KERNELS
  if (gradcomp::CudaDeviceCount() == 0) Usage("--device cuda: no CUDA device here");
  Device& d = gradcomp::CudaDevice(0);
  *name = d.name();
  return d;
#else
  Usage("--device cuda: this build has no CUDA kernels (GRADCOMP_HAVE_CUDA_KERNELS is 0)");
#endif
}

// Device memory that frees itself.
struct Buffer {
  Buffer(Device& d, size_t bytes) : device(d), size(bytes), ptr(d.Allocate(bytes)) {}
  ~Buffer() { device.Free(ptr, size); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  template <typename T>
  T* as() const {
    return static_cast<T*>(ptr);
  }
  Device& device;
  size_t size;
  void* ptr;
};

// Seconds a call: the median pass of `calls` calls of `call(i)`, the stream synchronized once.
double PerCall(int reps, size_t calls, gradcomp::Stream& stream, const std::function<void(size_t)>& call) {
  std::vector<double> passes;
  for (int r = 0; r <= reps; ++r) {  // pass 0 warms up (first touch, lazy allocations)
    const auto t0 = std::chrono::steady_clock::now();
    for (size_t i = 0; i < calls; ++i) call(i);
    stream.Synchronize();
    const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) passes.push_back(t);
  }
  std::sort(passes.begin(), passes.end());
  return passes[passes.size() / 2] / static_cast<double>(calls);
}

}  // namespace

int main(int argc, char** argv) {
  const Options o = Parse(argc, argv);
  std::vector<gradcomp::CompressionSpec> specs;
  try {
    gradcomp::CompressionSpec list;
    list.auto_candidates = o.codecs;
    specs = gradcomp::AutoCandidates(list, "--codecs");
  } catch (const std::exception& e) {
    Usage(e.what());
  }
  std::string name;
  Device& d = Open(o, &name);
  std::unique_ptr<gradcomp::Stream> stream = d.NewStream();
  const size_t total = o.mb * (size_t{1} << 18);  // float32 values
  for (size_t n : o.sizes) {
    if (n > total)
      Usage("--sizes " + std::to_string(n) + " is more values than --mb " + std::to_string(o.mb) + " holds");
  }

  Buffer in(d, total * sizeof(float)), out(d, total * sizeof(float)), other(d, total * sizeof(float));
  {
    std::vector<float> host(total);
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 1e-3f);
    for (float& x : host) x = g(rng);
    d.CopyFromHost(in.ptr, host.data(), total * sizeof(float), *stream);
    d.CopyFromHost(other.ptr, host.data(), total * sizeof(float), *stream);
    stream->Synchronize();
  }

  std::ostringstream rows;
  rows << "# gradcomp codec profile (examples/benchmarks/codec_profile): seconds one call of VALUES float32 values\n"
       << "# takes, streaming through " << o.mb << " MB, median of " << o.reps << " passes\n"
       << "device " << name << "\n";
  const auto row = [&](const char* op, const std::string& codec, size_t n, double seconds) {
    rows << op << " " << codec << " " << n << " " << seconds << "\n";
  };
  for (const gradcomp::CompressionSpec& spec : specs) {
    const gradcomp::Codec& codec = gradcomp::FindCodec(spec.codec);
    const gradcomp::CodecParams p = gradcomp::ParamsOf(spec);
    const std::string key = gradcomp::CandidateToken(spec);
    for (size_t n : o.sizes) {
      const size_t calls = total / n, max_wire = codec.MaxWireSize(n, p);
      Buffer wire(d, calls * max_wire);
      auto* w = wire.as<uint8_t>();
      std::vector<size_t> used(calls);
      const float* x = in.as<float>();
      const double encode = PerCall(o.reps, calls, *stream, [&](size_t i) {
        used[i] = EncodeOn(d, codec, x + i * n, DataType::kFloat32, n, p, i * n, w + i * max_wire, *stream);
      });
      float* y = out.as<float>();
      const auto decode = [&](bool accumulate) {
        return PerCall(o.reps, calls, *stream, [&](size_t i) {
          DecodeOn(d, codec, w + i * max_wire, used[i], n, p, DataType::kFloat32, y + i * n, accumulate, *stream);
        });
      };
      row("encode", key, n, encode);
      row("decode", key, n, decode(false));
      row("decode_acc", key, n, decode(true));
    }
  }
  gradcomp::StagedBuffer staged;
  staged.Reserve(d, total * sizeof(float), false);
  for (size_t n : o.sizes) {
    const size_t calls = total / n, bytes = n * sizeof(float);
    auto* y = out.as<uint8_t>();
    const auto* x = in.as<uint8_t>();
    row("copy", "-", n,
        PerCall(o.reps, calls, *stream, [&](size_t i) { d.Copy(y + i * bytes, x + i * bytes, bytes, *stream); }));
    row("elementwise", "-", n, PerCall(o.reps, calls, *stream, [&](size_t i) {
          d.Reduce(out.as<float>() + i * n, in.as<float>() + i * n, other.as<float>() + i * n, n, DataType::kFloat32,
                   gradcomp::ReduceOp::kSum, *stream);
        }));
    row("to_host", "-", n,
        PerCall(o.reps, calls, *stream, [&](size_t i) { staged.ToWire(i * bytes, bytes, *stream); }));
    row("from_host", "-", n,
        PerCall(o.reps, calls, *stream, [&](size_t i) { staged.FromWire(i * bytes, bytes, *stream); }));
  }

  std::fputs(rows.str().c_str(), stdout);
  if (!o.out.empty()) {
    std::ofstream f(o.out);
    f << rows.str();
    if (!f.flush()) {
      std::fprintf(stderr, "codec_profile: cannot write --out %s\n", o.out.c_str());
      return 1;
    }
  }
  return 0;
}
