// Uncompressed allreduce throughput: gradcomp's flat and hierarchical allreduce against raw
// MPI_Allreduce on the same buffers, float32, from 4 KB to 256 MB.
//
//   mpirun -np 4 build/examples/allreduce_bench [--min-kb 4] [--max-mb 256] [--seconds 1]
//   GRADCOMP_LOCAL_SIZE=2 mpirun -np 4 ...   # hierarchical with two forced "nodes"
//
// For each size the three variants run interleaved (one call each per repetition, the first
// one rotating), each call timed as the slowest rank's time; the table shows the median.
#include <mpi.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "core/settings.h"
#include "ops/collectives/allreduce.h"
#include "ops/collectives/uncompressed_algorithms.h"
#include "ops/comm/mpi_environment.h"

namespace {

struct Args {
  size_t min_bytes = 4 << 10;
  size_t max_bytes = size_t{256} << 20;
  double seconds = 1.0;  // measuring time per variant and size
};

Args ParseArgs(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string flag = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "allreduce_bench: %s needs a value\n", flag.c_str());
      std::exit(2);
    }
    const double v = std::atof(argv[++i]);
    if (flag == "--min-kb") {
      a.min_bytes = static_cast<size_t>(v * 1024);
    } else if (flag == "--max-mb") {
      a.max_bytes = static_cast<size_t>(v * 1024 * 1024);
    } else if (flag == "--seconds") {
      a.seconds = v;
    } else {
      std::fprintf(stderr, "allreduce_bench: unknown flag %s (known: --min-kb, --max-mb, --seconds)\n", flag.c_str());
      std::exit(2);
    }
  }
  return a;
}

// Runs `fn` once on every rank; returns the slowest rank's time in seconds.
template <typename Fn>
double TimeOnce(Fn fn) {
  MPI_Barrier(MPI_COMM_WORLD);
  const double t0 = MPI_Wtime();
  fn();
  double dt = MPI_Wtime() - t0, slowest = 0;
  MPI_Allreduce(&dt, &slowest, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return slowest;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

std::string HumanSize(size_t bytes) {
  char buf[32];
  if (bytes >= (size_t{1} << 20)) {
    std::snprintf(buf, sizeof buf, "%zu MB", bytes >> 20);
  } else {
    std::snprintf(buf, sizeof buf, "%zu KB", bytes >> 10);
  }
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  const Args args = ParseArgs(argc, argv);
  const gradcomp::Settings settings = gradcomp::Settings::FromEnvironment();
  gradcomp::Topology topo = gradcomp::BuildTopology(gradcomp::CreateMpiWorld(),
                                                    static_cast<int>(settings.local_size),
                                                    gradcomp::LocalTransport::kSharedMemory);
  const int rank = topo.rank();
  if (rank == 0) {
    std::printf("allreduce_bench: %d ranks, %d per node x %d nodes%s, float32, median of interleaved runs\n",
                topo.size(), topo.local_size(), topo.cross_size(),
                settings.local_size > 0 ? " (forced by GRADCOMP_LOCAL_SIZE)" : "");
    std::printf("%8s | %14s | %14s | %9s | %14s | %9s\n", "size", "MPI MB/s", "flat MB/s", "flat/MPI", "hier MB/s",
                "hier/MPI");
    std::printf("---------|----------------|----------------|-----------|----------------|----------\n");
  }
  for (size_t bytes = args.min_bytes; bytes <= args.max_bytes; bytes *= 4) {
    const size_t count = bytes / sizeof(float);
    std::vector<float> in(count), out(count);
    for (size_t i = 0; i < count; ++i) in[i] = static_cast<float>((i * 7 + static_cast<size_t>(rank)) % 101) * 0.01f;
    gradcomp::AllreduceOptions o;
    o.input = in.data();
    o.output = out.data();
    o.count = count;
    o.dtype = gradcomp::DataType::kFloat32;
    o.op = gradcomp::ReduceOp::kSum;
    const auto run_mpi = [&] { MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD); };
    // What the runtime runs for an unfused tensor (flat: the node's shared memory when the
    // world is one node).
    const std::vector<gradcomp::BufferPiece> pieces = {{in.data(), out.data(), count}};
    std::vector<char> fusion;
    const auto run_flat = [&] { gradcomp::FusedAllreduce(topo, false, pieces, o, fusion); };
    const auto run_hier = [&] { gradcomp::HierarchicalAllreduce(topo, o); };
    // Warm up every path, then estimate how many repetitions fit in the time budget.
    const double probe = TimeOnce(run_mpi) + TimeOnce(run_flat) + TimeOnce(run_hier);
    const int reps = std::max(3, std::min(2000, static_cast<int>(3 * args.seconds / std::max(probe, 1e-6))));
    std::vector<double> t_mpi, t_flat, t_hier;
    for (int r = 0; r < reps; ++r) {
      // Rotate which variant goes first so none always runs on the warmest caches.
      for (int k = 0; k < 3; ++k) {
        switch ((r + k) % 3) {
          case 0: t_mpi.push_back(TimeOnce(run_mpi)); break;
          case 1: t_flat.push_back(TimeOnce(run_flat)); break;
          default: t_hier.push_back(TimeOnce(run_hier)); break;
        }
      }
    }
    if (rank == 0) {
      const double mb = static_cast<double>(bytes) / 1e6;
      const double bw_mpi = mb / Median(t_mpi), bw_flat = mb / Median(t_flat), bw_hier = mb / Median(t_hier);
      std::printf("%8s | %14.1f | %14.1f | %8.3fx | %14.1f | %8.3fx\n", HumanSize(bytes).c_str(), bw_mpi, bw_flat,
                  bw_flat / bw_mpi, bw_hier, bw_hier / bw_mpi);
      std::fflush(stdout);
    }
  }
  return 0;
}
