// Throughput of the CUDA codec kernels on 256 MB of float32, as a fraction of the device's own
// copy bandwidth measured in the same run (cudaMemcpy device to device). CUDA events, median
// of --reps runs. Needs a CUDA device.
//   build/examples/cuda_codec_bench [--mb 256] [--reps 20]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "ops/compression/cuda/codec_cuda.h"
#include "ops/compression/maxmin_math.h"
#include "ops/device/cuda_device.h"

namespace {

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "cuda_codec_bench: %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

/// Median milliseconds of `reps` runs of `fn`, timed with events on the default stream.
double MedianMs(int reps, const std::function<void()>& fn) {
  cudaEvent_t start, stop;
  Check(cudaEventCreate(&start), "event");
  Check(cudaEventCreate(&stop), "event");
  fn();  // warm-up
  std::vector<float> ms;
  for (int r = 0; r < reps; ++r) {
    Check(cudaEventRecord(start), "record");
    fn();
    Check(cudaEventRecord(stop), "record");
    Check(cudaEventSynchronize(stop), "synchronize");
    float t = 0;
    Check(cudaEventElapsedTime(&t, start, stop), "elapsed");
    ms.push_back(t);
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  size_t mb = 256;
  int reps = 20;
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--mb")) mb = std::strtoul(argv[i + 1], nullptr, 10);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoi(argv[i + 1]);
  }
  const size_t n = mb * (1u << 20) / 4;
  std::vector<float> host(n);
  std::mt19937 rng(1);
  std::normal_distribution<float> g;
  for (auto& x : host) x = g(rng);
  float *in = nullptr, *out = nullptr;
  uint8_t* wire = nullptr;
  Check(cudaMalloc(&in, n * 4), "malloc");
  Check(cudaMalloc(&out, n * 4), "malloc");
  Check(cudaMalloc(&wire, gradcomp::maxmin::WireBytes(n, 8, 512, false)), "malloc");
  Check(cudaMemcpy(in, host.data(), n * 4, cudaMemcpyHostToDevice), "upload");

  cudaDeviceProp prop{};
  Check(cudaGetDeviceProperties(&prop, 0), "properties");
  const double bytes = static_cast<double>(n) * 4;
  const double copy_ms = MedianMs(reps, [&] { Check(cudaMemcpy(out, in, n * 4, cudaMemcpyDeviceToDevice), "copy"); });
  std::printf("device: %s; %zu MB float32, median of %d runs\n", prop.name, mb, reps);
  std::printf("%-34s %10s %12s %10s\n", "kernel", "ms", "GB/s (in)", "vs copy");
  std::printf("%-34s %10.3f %12.1f %9.0f%%\n", "cudaMemcpy device to device", copy_ms, bytes / copy_ms / 1e6, 100.0);
  for (int bits : {8, 4, 2, 1}) {
    gradcomp::codec_kernels::MaxMinArgs a{bits, 512, false, false, 0, 0, 0};
    const double enc = MedianMs(reps, [&] { gradcomp::cuda::MaxMinEncode(in, gradcomp::DataType::kFloat32, n, a, wire, nullptr); });
    const double dec = MedianMs(reps, [&] {
      gradcomp::cuda::MaxMinDecode(wire, n, a, gradcomp::DataType::kFloat32, out, false, nullptr);
    });
    const double acc = MedianMs(reps, [&] {
      gradcomp::cuda::MaxMinDecode(wire, n, a, gradcomp::DataType::kFloat32, out, true, nullptr);
    });
    const std::string b = std::to_string(bits) + "-bit";
    std::printf("%-34s %10.3f %12.1f %9.0f%%\n", ("maxmin " + b + " encode").c_str(), enc, bytes / enc / 1e6,
                100.0 * copy_ms / enc);
    std::printf("%-34s %10.3f %12.1f %9.0f%%\n", ("maxmin " + b + " decode").c_str(), dec, bytes / dec / 1e6,
                100.0 * copy_ms / dec);
    std::printf("%-34s %10.3f %12.1f %9.0f%%\n", ("maxmin " + b + " decode-accumulate").c_str(), acc,
                bytes / acc / 1e6, 100.0 * copy_ms / acc);
  }
  cudaFree(in);
  cudaFree(out);
  cudaFree(wire);
  return 0;
}
