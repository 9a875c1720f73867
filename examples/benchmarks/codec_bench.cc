// Codec throughput on one core: encode, decode and decode-accumulate of 64 MB of float32
// (Gaussian values), in bytes of float32 input per second, next to memcpy of the same buffer.
//
//   build/examples/codec_bench                            # Google Benchmark table
//   /usr/bin/python3 examples/benchmarks/codec_bench.py   # + torch-ops peer and ratios
//
// CODEC_BENCH_INPUT=file.f32 makes it read its 64 MB of float32 from a raw file (the Python
// driver uses this so both implementations see the same data).
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "ops/compression/codec.h"

namespace {

constexpr size_t kBytes = size_t{64} << 20;
constexpr size_t kCount = kBytes / sizeof(float);

const std::vector<float>& Input() {
  static const std::vector<float> data = [] {
    std::vector<float> v(kCount);
    if (const char* path = std::getenv("CODEC_BENCH_INPUT")) {
      std::FILE* f = std::fopen(path, "rb");
      if (f == nullptr || std::fread(v.data(), sizeof(float), kCount, f) != kCount) {
        std::fprintf(stderr, "codec_bench: cannot read %zu float32 values from %s\n", kCount, path);
        std::exit(2);
      }
      std::fclose(f);
      return v;
    }
    std::mt19937 rng(1);
    std::normal_distribution<float> g(0.0f, 1e-3f);
    for (float& x : v) x = g(rng);
    return v;
  }();
  return data;
}

gradcomp::CodecParams Params(int bits, double ratio) {
  gradcomp::CodecParams p;
  p.bits = bits;
  p.bucket_size = 512;
  p.topk_ratio = ratio;
  return p;
}

void Memcpy(benchmark::State& state) {
  const std::vector<float>& in = Input();
  std::vector<float> out(kCount, 1.0f);
  for (auto _ : state) {
    std::memcpy(out.data(), in.data(), kBytes);
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
}

enum class Op { kEncode, kDecode, kDecodeAccumulate };

void Codec(benchmark::State& state, const std::string& name, int bits, double ratio, Op op) {
  const gradcomp::Codec& codec = gradcomp::FindCodec(name);
  const gradcomp::CodecParams p = Params(bits, ratio);
  const std::vector<float>& in = Input();
  std::vector<uint8_t> wire(codec.MaxWireSize(kCount, p));
  const size_t used = codec.Encode(in.data(), gradcomp::DataType::kFloat32, kCount, p, 0, wire.data());
  std::vector<float> out(kCount, 0.0f);
  for (auto _ : state) {
    switch (op) {
      case Op::kEncode:
        benchmark::DoNotOptimize(codec.Encode(in.data(), gradcomp::DataType::kFloat32, kCount, p, 0, wire.data()));
        break;
      case Op::kDecode:
        codec.Decode(wire.data(), used, kCount, p, gradcomp::DataType::kFloat32, out.data());
        break;
      case Op::kDecodeAccumulate:
        codec.DecodeAccumulate(wire.data(), used, kCount, p, gradcomp::DataType::kFloat32, out.data());
        break;
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * kBytes));
  state.counters["wire_ratio"] = static_cast<double>(kBytes) / static_cast<double>(used);
}

void Register() {
  benchmark::RegisterBenchmark("memcpy", Memcpy)->Unit(benchmark::kMillisecond);
  struct Variant {
    std::string label, codec;
    int bits;
    double ratio;
  };
  const std::vector<Variant> variants = {
      {"maxmin1", "maxmin", 1, 0}, {"maxmin2", "maxmin", 2, 0},    {"maxmin4", "maxmin", 4, 0},
      {"maxmin8", "maxmin", 8, 0}, {"fp16", "fp16", 0, 0},         {"bf16", "bf16", 0, 0},
      {"topk1%", "topk", 0, 0.01}, {"topk0.1%", "topk", 0, 0.001},
  };
  const std::pair<const char*, Op> ops[] = {
      {"encode", Op::kEncode}, {"decode", Op::kDecode}, {"decode_acc", Op::kDecodeAccumulate}};
  for (const Variant& v : variants) {
    for (const auto& [op_name, op] : ops) {
      benchmark::RegisterBenchmark((v.label + "/" + op_name).c_str(),
                                   [v, op = op](benchmark::State& s) { Codec(s, v.codec, v.bits, v.ratio, op); })
          ->Unit(benchmark::kMillisecond);
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  Register();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
