// The data plane's allreduces on a simulated cluster: built against SimGrid's SMPI
// (cmake -DGRADCOMP_SIMULATION=ON) and run by examples/benchmarks/simulate.py, which writes the
// platform and the host file and starts smpirun. Every rank runs the real algorithm and the real
// codecs; SMPI advances each rank's clock by the CPU time measured between MPI calls, and by the
// network's simulated transfers (ops/common/simulation.h says what else is simulated).
//
//   smpirun -no-privatize -platform P.xml -hostfile H -np N build-sim/.../sim_allreduce
//       [--sizes-mb 64] [--variants mpi,sra:maxmin4,hier:maxmin4] [--reps 3] [--local-size 8]
//       [--stripes 0] [--warmup 1] [--grid-columns C1[,C2...]]
//
// A variant is "mpi" (MPI_Allreduce of float32, SMPI's collective selection) or
// "<algorithm>:<codec>": algorithm sra (flat), sra2d (2-D SRA over the most square grid),
// sra2dnode (2-D SRA whose rows are the nodes: --local-size columns, flat SRA across nodes),
// sra3d (rows are the nodes, the 2-D SRA across nodes on the grid of the nodes the runtime
// chooses, GridShape, nested again where it says: MakeNodeGrid; what the runtime runs on nodes
// of several ranks from 32 nodes on), hier
// (--local-size consecutive ranks per node, reduced inside the node, flat SRA across nodes) or
// hier2d (the same with the 2-D SRA across nodes); codec none, fp16, bf16 or maxmin<bits>.
// --stripes 0 uses the runtime's choice across nodes (kAutoPipelineStripes). --warmup 0 skips
// the untimed first repetition (it warms buffers; at 1024 ranks it doubles the wall time).
// The grids' shapes are the runtime's (GridShape; GRADCOMP_GRID_MIN_RANKS at its default):
// --grid-columns C1,C2,... gives them instead, one row length per level (MakeNestedGrid): sra2d's
// over the world's ranks, sra3d's and hier2d's across nodes (simulate.py's --compose runs the
// rows of a large grid on a world of two rows, and its columns on grids of their own).
//
// Prints, on rank 0, one line per (variant, size):
//   RESULT <variant> <MB> <seconds> <bytes sent per rank> <codec seconds> <communicate seconds>
//          <charged seconds>
// seconds: the median over repetitions of the slowest rank's simulated time; codec seconds: the
// CPU time encoding and decoding took on this machine (mean over ranks); charged seconds: the
// codec time the simulation charged (included in seconds: codec seconds scaled, or what
// GRADCOMP_SIM_CODEC_PROFILE prices the work at; simulation.h); communicate seconds: simulated
// time in the algorithm's exchanges (mean over ranks).
// Buffers of at least GRADCOMP_SIM_SHARED_MB are shared by all ranks (their contents are then
// meaningless): set it when the ranks' memory would not fit.
#include <mpi.h>
#include <pmmintrin.h>
#include <xmmintrin.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "ops/collectives/compressed_allreduce.h"
#include "ops/comm/mpi_communicator.h"
#include "ops/comm/topology.h"
#include "ops/common/enforce.h"
#include "ops/common/simulation.h"
#include "ops/compression/codec.h"
#include "ops/device/device.h"

namespace {

using gradcomp::CodecParams;

std::vector<std::string> SplitList(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, sep);) out.push_back(item);
  return out;
}

struct Variant {
  std::string name, algorithm;
  const gradcomp::Codec* codec = nullptr;
  CodecParams params;
};

Variant ParseVariant(const std::string& text) {
  Variant v;
  v.name = text;
  if (text == "mpi") {
    v.algorithm = "mpi";
    return v;
  }
  const std::vector<std::string> parts = SplitList(text, ':');
  GC_ENFORCE(parts.size() == 2 && (parts[0] == "sra" || parts[0] == "sra2d" || parts[0] == "sra2dnode" ||
                                    parts[0] == "sra3d" || parts[0] == "hier" || parts[0] == "hier2d"),
             "sim_allreduce: variant '", text, "' is not mpi or <sra|sra2d|sra2dnode|sra3d|hier|hier2d>:<codec>");
  v.algorithm = parts[0];
  std::string codec = parts[1];
  if (codec.rfind("maxmin", 0) == 0) {
    v.params.bits = std::atoi(codec.c_str() + 6);
    GC_ENFORCE(v.params.bits >= 1 && v.params.bits <= 8, "sim_allreduce: variant '", text,
               "' has bits outside 1..8");
    codec = "maxmin";
  }
  v.codec = &gradcomp::FindCodec(codec);
  GC_ENFORCE(!v.codec->sparse(), "sim_allreduce: variant '", text, "': sparse codecs are not simulated yet");
  return v;
}

// GRADCOMP_GRID_MIN_RANKS's default: from this many ranks on a column runs a grid of its own.
constexpr int kGridMinRanks = 32;

// "rows x columns", a nested column's grid in brackets: "64 x 8 [8 x 8]"; empty for no grid.
std::string Shape(const gradcomp::Grid& g) {
  std::string s = std::to_string(g.rows()) + " x " + std::to_string(g.columns());
  return g.column_grid ? s + " [" + Shape(*g.column_grid) + "]" : s;
}

std::string Describe(const char* label, const gradcomp::Grid* g) { return g ? label + Shape(*g) : std::string(); }

double Slowest(double t) {
  double m = 0;
  MPI_Allreduce(&t, &m, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
  return m;
}

double Mean(double t, int n) {
  double s = 0;
  MPI_Allreduce(&t, &s, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);
  return s / n;
}

// Host memory for one rank's buffer, shared among ranks above GRADCOMP_SIM_SHARED_MB.
class Buffer {
 public:
  explicit Buffer(size_t count)
      : bytes_(count * sizeof(float)), data_(static_cast<float*>(gradcomp::HostDevice().Allocate(bytes_))) {}
  ~Buffer() { gradcomp::HostDevice().Free(data_, bytes_); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  float* data() { return data_; }

 private:
  size_t bytes_;
  float* data_;
};

int Run(int argc, char** argv) {
  std::string sizes = "64", variants = "mpi,sra:maxmin4";
  int reps = 3, local_size = 1, stripes = 0, warmup = 1;
  std::vector<int> grid_columns;  // empty: the runtime's shapes
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string flag = argv[i];
    if (flag == "--sizes-mb") {
      sizes = argv[i + 1];
    } else if (flag == "--variants") {
      variants = argv[i + 1];
    } else if (flag == "--reps") {
      reps = std::atoi(argv[i + 1]);
    } else if (flag == "--local-size") {
      local_size = std::atoi(argv[i + 1]);
    } else if (flag == "--stripes") {
      stripes = std::atoi(argv[i + 1]);
    } else if (flag == "--warmup") {
      warmup = std::atoi(argv[i + 1]);
    } else if (flag == "--grid-columns") {
      for (const std::string& c : SplitList(argv[i + 1], ',')) grid_columns.push_back(std::atoi(c.c_str()));
    } else {
      GC_THROW("sim_allreduce: unknown flag ", flag,
               " (--sizes-mb, --variants, --reps, --local-size, --stripes, --warmup, --grid-columns)");
    }
  }
  GC_ENFORCE(reps >= 1, "sim_allreduce: --reps must be at least 1, got ", reps);
  std::vector<Variant> parsed;
  for (const std::string& v : SplitList(variants, ',')) parsed.push_back(ParseVariant(v));

  gradcomp::Topology topo = gradcomp::BuildTopology(std::make_unique<gradcomp::MpiCommunicator>(MPI_COMM_WORLD),
                                                    local_size, gradcomp::LocalTransport::kMessages);
  const int n = topo.size(), rank = topo.rank();
  const auto uses = [&](const char* algorithm) {
    return std::any_of(parsed.begin(), parsed.end(), [&](const Variant& v) { return v.algorithm == algorithm; });
  };
  // One row length per level, each at least 2 and dividing the column the level above leaves.
  const auto shape_over = [&](int ranks, int per_node, const char* what) {
    if (grid_columns.empty()) return gradcomp::GridShape(ranks, per_node, kGridMinRanks);
    int left = ranks;
    for (int c : grid_columns) {
      GC_ENFORCE(c >= 2 && left % c == 0, "sim_allreduce: --grid-columns ", c, " is not at least 2 dividing the ",
                 left, " ", what, " its level spans");
      left /= c;
    }
    return grid_columns;
  };
  // Only the grids the variants run on (collective: every rank parses the same variants).
  std::unique_ptr<gradcomp::Grid> world_grid, cross_grid, node_grid, nested_grid;
  if (uses("sra2d")) {
    world_grid = std::make_unique<gradcomp::Grid>(gradcomp::MakeNestedGrid(*topo.world, shape_over(n, 1, "ranks")));
  }
  const int nodes = topo.cross_size();
  if (uses("hier2d")) {
    cross_grid = std::make_unique<gradcomp::Grid>(
        gradcomp::MakeNestedGrid(*topo.cross, shape_over(nodes, topo.local_size(), "nodes")));
  }
  if (uses("sra2dnode")) node_grid = std::make_unique<gradcomp::Grid>(gradcomp::MakeNodeGrid(topo));
  if (uses("sra3d")) {
    nested_grid = std::make_unique<gradcomp::Grid>(
        gradcomp::MakeNodeGrid(topo, shape_over(nodes, topo.local_size(), "nodes")));
  }
  if (rank == 0) {
    std::printf("sim_allreduce: %d ranks, %d per node x %d nodes, %d reps; grids:%s%s%s%s\n", n, topo.local_size(),
                nodes, reps, Describe(" world ", world_grid.get()).c_str(),
                Describe(" across nodes ", cross_grid.get()).c_str(), Describe(" node rows ", node_grid.get()).c_str(),
                Describe(" nested ", nested_grid.get()).c_str());
    std::fflush(stdout);
  }
  gradcomp::CompressionWorkspace ws;
  for (const std::string& mb_text : SplitList(sizes, ',')) {
    const double mb = std::atof(mb_text.c_str());
    const size_t count = static_cast<size_t>(mb * 1048576.0) / sizeof(float);
    Buffer in(count), out(count);
    {
      // Gaussian gradients, different on every rank (shared buffers: rank 0's, for all).
      std::mt19937 rng(static_cast<unsigned>(rank) + 1);
      std::normal_distribution<float> g(0.0f, 1e-3f);
      const bool shared = std::getenv("GRADCOMP_SIM_SHARED_MB") != nullptr;
      if (shared) {
        // Every shared buffer is the same memory: encodings land on the values, and floats
        // read from there are arbitrary bit patterns, 1 in 256 of them denormal, which the
        // codecs' arithmetic takes ~100x longer on. Flushed to zero, they cost what real
        // gradients do (64 simulated ranks: codec 59 ms a rank instead of 17).
        _MM_SET_FLUSH_ZERO_MODE(_MM_FLUSH_ZERO_ON);
        _MM_SET_DENORMALS_ZERO_MODE(_MM_DENORMALS_ZERO_ON);
      }
      if (!shared || rank == 0) {
        for (size_t i = 0; i < count; ++i) in.data()[i] = g(rng);
      }
    }
    for (const Variant& v : parsed) {
      std::vector<double> times;
      double codec_seconds = 0, charged_seconds = 0, comm_seconds = 0;
      size_t bytes_sent = 0;
      for (int r = warmup > 0 ? 0 : 1; r <= reps; ++r) {  // repetition 0 warms up (buffers, connections)
        MPI_Barrier(MPI_COMM_WORLD);
        const double t0 = MPI_Wtime(), charged0 = gradcomp::sim::CodecCharged();
        gradcomp::CompressedAllreduceStats st;
        if (v.algorithm == "mpi") {
          MPI_Allreduce(in.data(), out.data(), static_cast<int>(count), MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
          st.bytes_sent = static_cast<size_t>(2.0 * (n - 1) / n * static_cast<double>(count * sizeof(float)));
        } else {
          gradcomp::CompressedAllreduceOptions o;
          o.input = in.data();
          o.output = out.data();
          o.count = count;
          o.op = gradcomp::ReduceOp::kAverage;
          o.codec = v.codec;
          o.params = v.params;
          o.params.step = static_cast<uint64_t>(r) + 1;
          o.workspace = &ws;
          o.pipeline_stripes = stripes > 0 ? static_cast<size_t>(stripes) : gradcomp::kAutoPipelineStripes;
          o.name = v.name;
          if (v.algorithm == "hier" || v.algorithm == "hier2d") {
            st = gradcomp::HierarchicalCompressedAllreduce(topo, o, false,
                                                           v.algorithm == "hier2d" ? cross_grid.get() : nullptr);
          } else if (v.algorithm == "sra2d") {
            st = gradcomp::CompressedAllreduce2d(*world_grid, o);
          } else if (v.algorithm == "sra2dnode") {
            st = gradcomp::CompressedAllreduce2d(*node_grid, o);
          } else if (v.algorithm == "sra3d") {
            st = gradcomp::CompressedAllreduce2d(*nested_grid, o);
          } else {
            st = gradcomp::CompressedAllreduce(*topo.world, o);
          }
        }
        const double dt = Slowest(MPI_Wtime() - t0);
        if (r > 0) {
          times.push_back(dt);
          codec_seconds += Mean(st.compress_seconds + st.decompress_seconds, n) / reps;
          charged_seconds += Mean(gradcomp::sim::CodecCharged() - charged0, n) / reps;
          comm_seconds += Mean(st.communicate_seconds, n) / reps;
          bytes_sent = st.bytes_sent;
        }
      }
      std::sort(times.begin(), times.end());
      if (rank == 0) {
        std::printf("RESULT %s %s %.6f %zu %.6f %.6f %.6f\n", v.name.c_str(), mb_text.c_str(),
                    times[times.size() / 2], bytes_sent, codec_seconds, comm_seconds, charged_seconds);
        std::fflush(stdout);
      }
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int rc = 0;
  try {
    rc = Run(argc, argv);
  } catch (const std::exception& e) {
    int rank = 0;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    std::fprintf(stderr, "sim_allreduce rank %d: %s\n", rank, e.what());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  MPI_Finalize();
  return rc;
}
