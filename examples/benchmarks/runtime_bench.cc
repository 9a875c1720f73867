// Coordinator overhead: per step, 100 tensors of 16 KB float32 allreduced asynchronously then
// waited (steady state, after warm-up), against one MPI_Allreduce per tensor and one
// MPI_Allreduce of a single pre-fused buffer (the floor). Also gradcomp's own collective on
// the pre-fused buffer (what the runtime runs once the step is negotiated; on one node it is
// the shared-memory path), so the table separates the data path from the coordination. Each
// step is timed as the slowest rank's time; the table shows medians. Also the background
// thread's CPU use while idle.
//
//   mpirun -np 2 build/examples/runtime_bench [--steps 300] [--tensors 100] [--kb 16]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "core/runtime.h"
#include "ops/collectives/allreduce.h"
#include "ops/collectives/uncompressed_algorithms.h"
#include "ops/comm/mpi_environment.h"

namespace {

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// Seconds of the slowest rank.
double Slowest(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

}  // namespace

int main(int argc, char** argv) {
  int steps = 300, tensors = 100, kb = 16;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    const int v = std::atoi(argv[i + 1]);
    if (flag == "--steps") {
      steps = v;
    } else if (flag == "--tensors") {
      tensors = v;
    } else if (flag == "--kb") {
      kb = v;
    } else {
      std::fprintf(stderr, "runtime_bench: unknown flag %s (known: --steps, --tensors, --kb)\n", flag.c_str());
      return 2;
    }
  }
  gradcomp::Runtime rt{gradcomp::RuntimeOptions{}};
  const size_t count = static_cast<size_t>(kb) * 1024 / sizeof(float);
  std::vector<std::vector<float>> bufs(static_cast<size_t>(tensors), std::vector<float>(count, 1.0f));
  std::vector<float> fused(count * static_cast<size_t>(tensors), 1.0f);
  std::vector<std::string> names;
  for (int t = 0; t < tensors; ++t) names.push_back("layer" + std::to_string(t) + ".grad");

  const auto ours = [&] {
    std::vector<std::shared_ptr<gradcomp::Handle>> hs;
    for (int t = 0; t < tensors; ++t) {
      hs.push_back(rt.Allreduce(names[static_cast<size_t>(t)], gradcomp::DataType::kFloat32,
                                {static_cast<int64_t>(count)}, bufs[static_cast<size_t>(t)].data(),
                                bufs[static_cast<size_t>(t)].data(), gradcomp::ReduceOp::kSum));
    }
    for (auto& h : hs) h->Wait();
  };
  const auto per_tensor = [&] {
    for (auto& b : bufs) MPI_Allreduce(MPI_IN_PLACE, b.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  const auto prefused = [&] {
    MPI_Allreduce(MPI_IN_PLACE, fused.data(), static_cast<int>(fused.size()), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  };
  // The runtime's own collective, outside the runtime, on its own topology.
  gradcomp::Topology topo = gradcomp::BuildTopology(gradcomp::CreateMpiWorld(), 0, gradcomp::LocalTransport::kSharedMemory);
  const std::vector<gradcomp::BufferPiece> fused_piece = {{fused.data(), fused.data(), fused.size()}};
  std::vector<char> fusion;
  gradcomp::AllreduceOptions fused_opts;
  fused_opts.name = "pre-fused";
  const auto prefused_ours = [&] { gradcomp::FusedAllreduce(topo, false, fused_piece, fused_opts, fusion); };
  // Variants run in alternating blocks of consecutive steps (a training loop runs one step
  // after another); the first 20 steps of each block are warm-up (negotiation, cache, caches).
  std::vector<double> t_ours, t_per, t_floor, t_data;
  const int rounds = 3, per_block = steps / rounds + 20;
  for (int round = 0; round < rounds; ++round) {
    for (int which = 0; which < 4; ++which) {
      for (int s = 0; s < per_block; ++s) {
        MPI_Barrier(MPI_COMM_WORLD);
        const auto t0 = std::chrono::steady_clock::now();
        if (which == 0) ours();
        if (which == 1) per_tensor();
        if (which == 2) prefused();
        if (which == 3) prefused_ours();
        const double dt = Slowest(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
        if (s >= 20) (which == 0 ? t_ours : which == 1 ? t_per : which == 2 ? t_floor : t_data).push_back(dt);
      }
    }
  }
  const gradcomp::RuntimeStats stats = rt.stats();
  MPI_Barrier(MPI_COMM_WORLD);
  std::this_thread::sleep_for(std::chrono::milliseconds(500));  // let the heartbeat back off
  const double cpu0 = rt.BackgroundCpuSeconds();
  std::this_thread::sleep_for(std::chrono::seconds(5));
  const double idle_cpu = Slowest(rt.BackgroundCpuSeconds() - cpu0);
  if (rt.rank() == 0) {
    const double ours_ms = Median(t_ours) * 1e3, per_ms = Median(t_per) * 1e3, floor_ms = Median(t_floor) * 1e3;
    const double data_ms = Median(t_data) * 1e3;
    std::printf("runtime_bench: %d ranks, %d tensors x %d KB float32 per step, median of %d steps\n", rt.size(),
                tensors, kb, steps);
    std::printf("%-40s %10s %12s\n", "variant", "ms/step", "vs floor");
    std::printf("%-40s %10.3f %11.2fx\n", "gradcomp async + wait (fused, cached)", ours_ms, ours_ms / floor_ms);
    std::printf("%-40s %10.3f %11.2fx\n", "one MPI_Allreduce per tensor", per_ms, per_ms / floor_ms);
    std::printf("%-40s %10.3f %11.2fx\n", "one MPI_Allreduce, pre-fused buffer", floor_ms, 1.0);
    std::printf("%-40s %10.3f %11.2fx\n", "gradcomp collective, pre-fused buffer", data_ms, data_ms / floor_ms);
    std::printf("cache hits %llu, coordinator responses %llu, executed %llu tensors in %llu responses\n",
                static_cast<unsigned long long>(stats.cache_hits),
                static_cast<unsigned long long>(stats.coordinator_responses),
                static_cast<unsigned long long>(stats.executed_tensors),
                static_cast<unsigned long long>(stats.executed_responses));
    std::printf("idle background thread: %.4f CPU s over 5 s (%.3f%% of a core, slowest rank)\n", idle_cpu,
                idle_cpu / 5 * 100);
  }
  rt.Shutdown();
  return 0;
}
