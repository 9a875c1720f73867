// Compressed allreduce through the runtime against raw MPI_Allreduce, float32, for a range of
// sizes. Meant for examples/benchmarks/emulated_cluster.sh, which runs it across network
// namespaces joined by a rate-limited link; it works on any MPI job.
//
//   mpirun -np 2 build/examples/compressed_bench [--sizes-mb 1,4,16,64,256] [--reps 3]
//          [--variants mpi,none,fp16,maxmin8,maxmin4,maxmin2,topk1]
//
// Prints one line per (variant, size): "RESULT <variant> <MB> <seconds> <wire bytes/rank>",
// seconds being the median over repetitions of the slowest rank's time.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/runtime.h"

namespace {

std::vector<std::string> Split(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(item);
  return out;
}

double Slowest(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

// The compression of a variant name; "none" is uncompressed through the runtime.
gradcomp::CompressionSpec SpecOf(const std::string& v) {
  gradcomp::CompressionSpec s;
  if (v == "fp16" || v == "bf16" || v == "none") {
    s.codec = v;
  } else if (v.rfind("maxmin", 0) == 0) {
    s.codec = "maxmin";
    s.bits = std::atoi(v.c_str() + 6);
  } else if (v.rfind("topk", 0) == 0) {
    s.codec = "topk";
    s.topk_ratio = std::atof(v.c_str() + 4) / 100.0;
  } else {
    std::fprintf(stderr, "compressed_bench: unknown variant %s\n", v.c_str());
    std::exit(2);
  }
  return s;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes = "1,4,16,64,256", variants = "mpi,none,fp16,maxmin8,maxmin4,maxmin2,topk1";
  int reps = 3;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes-mb") {
      sizes = argv[i + 1];
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (flag == "--variants") {
      variants = argv[i + 1];
    } else {
      std::fprintf(stderr, "compressed_bench: unknown flag %s (--sizes-mb, --reps, --variants)\n", flag.c_str());
      return 2;
    }
  }
  gradcomp::Runtime rt{gradcomp::RuntimeOptions{}};
  const int n = rt.size();
  if (rt.rank() == 0) {
    std::printf("compressed_bench: %d ranks (%d per node x %d nodes), hierarchical %d, %d reps\n", n, rt.local_size(),
                rt.cross_size(), rt.settings().hierarchical ? 1 : 0, reps);
    std::fflush(stdout);
  }
  for (const std::string& mb_text : Split(sizes)) {
    const size_t mb = static_cast<size_t>(std::atoi(mb_text.c_str()));
    const size_t count = mb * (size_t{1} << 20) / sizeof(float);
    std::vector<float> grad(count), out(count);
    std::mt19937 rng(static_cast<unsigned>(rt.rank()) + 1);
    std::normal_distribution<float> g(0.0f, 1e-3f);
    for (float& v : grad) v = g(rng);
    const std::vector<int64_t> shape = {static_cast<int64_t>(count / 1024), 1024};
    for (const std::string& v : Split(variants)) {
      std::vector<double> times;
      uint64_t wire_before = 0, wire_after = 0;
      for (int r = 0; r <= reps; ++r) {  // repetition 0 warms up (negotiation, buffers)
        MPI_Barrier(MPI_COMM_WORLD);
        wire_before = rt.stats().compressed_bytes_on_wire;
        const auto t0 = std::chrono::steady_clock::now();
        if (v == "mpi") {
          MPI_Allreduce(grad.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
        } else {
          const gradcomp::CompressionSpec spec = SpecOf(v);
          rt.Allreduce(v + "." + mb_text, gradcomp::DataType::kFloat32, shape, grad.data(), out.data(),
                       gradcomp::ReduceOp::kAverage, 1.0, 1.0, &spec)
              ->Wait();
        }
        const double dt = Slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        wire_after = rt.stats().compressed_bytes_on_wire;
        if (r > 0) times.push_back(dt);
      }
      std::sort(times.begin(), times.end());
      // Bytes this rank sent: measured for compressed variants, the ring's 2 (n-1)/n S otherwise.
      uint64_t wire = wire_after - wire_before;
      if (v == "mpi" || v == "none") wire = static_cast<uint64_t>(2.0 * (n - 1) / n * double(count * sizeof(float)));
      if (rt.rank() == 0) {
        std::printf("RESULT %s %zu %.6f %llu\n", v.c_str(), mb, times[times.size() / 2],
                    static_cast<unsigned long long>(wire));
        std::fflush(stdout);
      }
    }
  }
  rt.Shutdown();
  return 0;
}
