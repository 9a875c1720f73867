// Compressed allreduce over thread ranks: SRA, 2-D SRA, hierarchical, leader-only and sparse (topk),
// against float64 and the analytic error bound, with bit-identical results on every rank.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#include "ops/collectives/allreduce.h"
#include "ops/collectives/compressed_allreduce.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "ops/reduce/reduce.h"
#include "test/support/device_comm.h"
#include "test/support/device_twin.h"
#include "test/support/harness.h"
#include "test/support/reference.h"
#include "test/support/sra_reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

CompressedAllreduceOptions Maxmin(const std::vector<float>& in, std::vector<float>& out, int bits, size_t bucket) {
  return AverageWith(in, out, "maxmin", bits, bucket);
}

// The collectives, run on the host and again through the separate-memory device, with the
// communicators staged through the host and with communicators that take device memory, which
// must all give the same bytes (test/support/device_twin.h).
void SraBoth(Communicator& comm, const CompressedAllreduceOptions& o) {
  OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
    CompressedAllreduce(device_comm ? *DeviceMemoryCommunicator(comm, TestDevice()) : comm, q);
  });
}
// `grid` with communicators that take device memory, its column's grid too (`nonblocking`
// false: without point-to-point transfers, as NCCL).
Grid OnDevice(const Grid& grid, bool nonblocking = true) {
  Grid g;
  g.row = DeviceMemoryCommunicator(*grid.row, TestDevice(), nonblocking);
  g.column = DeviceMemoryCommunicator(*grid.column, TestDevice(), nonblocking);
  if (grid.column_grid) g.column_grid = std::make_unique<Grid>(OnDevice(*grid.column_grid, nonblocking));
  g.rank = grid.rank;
  return g;
}
// The 2-D SRA over `grid`.
void GridBoth(const Grid& grid, const CompressedAllreduceOptions& o) {
  OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
    if (!device_comm) {
      CompressedAllreduce2d(grid, q);
      return;
    }
    CompressedAllreduce2d(OnDevice(grid), q);
  });
}
// The 2-D SRA over the grid of `comm` (MakeGrid; `columns` 0: the most square).
void Sra2dBoth(Communicator& comm, const CompressedAllreduceOptions& o, int columns = 0) {
  GridBoth(MakeGrid(comm, columns), o);
}
void SparseBoth(Communicator& comm, const CompressedAllreduceOptions& o) {
  OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
    SparseAllreduce(device_comm ? *DeviceMemoryCommunicator(comm, TestDevice()) : comm, q);
  });
}
// With device_comm both the node's and the cross-node communicator take device memory.
// `grid`: the 2-D SRA across nodes.
void HierarchicalBoth(const Topology& topo, const CompressedAllreduceOptions& o, bool leader_only, bool grid = false) {
  const Grid cross_grid = grid ? MakeGrid(*topo.cross) : Grid{};
  OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
    if (!device_comm) {
      HierarchicalCompressedAllreduce(topo, q, leader_only, grid ? &cross_grid : nullptr);
      return;
    }
    const Grid cross_grid_on_device = grid ? OnDevice(cross_grid) : Grid{};
    Topology on_device;
    on_device.world = DeviceMemoryCommunicator(*topo.world, TestDevice());
    on_device.local = DeviceMemoryCommunicator(*topo.local, TestDevice());
    on_device.cross = DeviceMemoryCommunicator(*topo.cross, TestDevice());
    on_device.homogeneous = topo.homogeneous;
    HierarchicalCompressedAllreduce(on_device, q, leader_only, grid ? &cross_grid_on_device : nullptr);
  });
}

// Runs `run` on every rank with rank r's input Gradient(count, r, noise); returns all outputs.
std::vector<std::vector<float>> RunAll(int world, size_t count, double noise,
                                       const std::function<void(Communicator&, const std::vector<float>&,
                                                                std::vector<float>&)>& run,
                                       RankTransport transport = RankTransport::kInProcess) {
  std::vector<std::vector<float>> outs(static_cast<size_t>(world));
  RunRanks(
      world,
      [&](Communicator& comm) {
        const std::vector<float> in = Gradient(count, comm.rank(), noise);
        std::vector<float> out(count, -1.0f);
        run(comm, in, out);
        outs[static_cast<size_t>(comm.rank())] = std::move(out);
        return std::string();
      },
      transport);
  return outs;
}

std::vector<std::vector<float>> Inputs(int world, size_t count, double noise) {
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < world; ++r) parts.push_back(Gradient(count, r, noise));
  return parts;
}

// "" when every rank's output has the same bytes as rank 0's.
std::string BitIdentical(const std::vector<std::vector<float>>& outs) {
  for (size_t r = 1; r < outs.size(); ++r) {
    if (!SameBytes(outs[r].data(), outs[0].data(), outs[0].size() * sizeof(float))) {
      return "rank " + std::to_string(r) + " differs from rank 0";
    }
  }
  return "";
}

std::string WithinBound(const std::vector<float>& got, const std::vector<double>& exact,
                        const std::vector<double>& bound) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - exact[i]) <= bound[i])) {
      return "element " + std::to_string(i) + ": " + std::to_string(got[i]) + " vs exact " +
             std::to_string(exact[i]) + ", bound " + std::to_string(bound[i]);
    }
  }
  return "";
}

class SraSweep : public ::testing::TestWithParam<int> {};

TEST_P(SraSweep, WithinTheBoundAndBitIdenticalOnEveryRank) {
  const int world = GetParam();
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{1} << 20}) {
    const auto parts = Inputs(world, count, 1e4);
    const std::vector<double> exact = ExactSum(parts, 1.0 / world);
    for (int bits : {1, 2, 4, 8}) {
      for (size_t bucket : {size_t{64}, size_t{512}}) {
        const auto outs = RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
          SraBoth(comm, Maxmin(in, out, bits, bucket));
        });
        const std::string where = " world " + std::to_string(world) + " count " + std::to_string(count) + " bits " +
                                  std::to_string(bits) + " bucket " + std::to_string(bucket);
        ASSERT_EQ(BitIdentical(outs), "") << where;
        ASSERT_EQ(WithinBound(outs[0], exact, SraBound(parts, 1.0 / world, bits, bucket, false)), "") << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, SraSweep, ::testing::Range(1, 9));

// Every codec, with and without its memories, through the host and the separate-memory
// device (same bytes, checked inside SraBoth / SparseBoth), at the sizes of the sweep above.
struct CodecCase {
  const char* codec;
  DataType dtype;
  bool feedback;
  double max_error;  // relative L2 against the exact average (topk: not checked here)
};

class CodecSweep : public ::testing::TestWithParam<int> {};

TEST_P(CodecSweep, EveryCodecOnEveryDeviceGivesTheSameBytes) {
  const int world = GetParam();
  const CodecCase cases[] = {
      // Measured: none 2e-7, fp16 8e-4, bf16 4e-3, 4-bit 0.27.
      {"none", DataType::kFloat32, false, 1e-4},  {"fp16", DataType::kFloat32, false, 2e-3},
      {"bf16", DataType::kFloat32, true, 1e-2},   {"maxmin", DataType::kFloat16, true, 0.35},
      {"maxmin", DataType::kFloat32, true, 0.35}, {"topk", DataType::kFloat32, true, 0.0},
  };
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{1} << 20}) {
    const auto parts = Inputs(world, count, 0.5);  // correlated, as gradients of one model are
    const std::vector<double> exact = ExactSum(parts, 1.0 / world);
    for (const CodecCase& c : cases) {
      const std::string where = std::string(c.codec) + " " + DataTypeName(c.dtype) + " world " +
                                std::to_string(world) + " count " + std::to_string(count);
      const Codec& codec = FindCodec(c.codec);
      std::vector<std::vector<float>> outs(static_cast<size_t>(world));
      RunRanks(world, [&](Communicator& comm) {
        const std::vector<float> g = Gradient(count, comm.rank(), 0.5);
        std::vector<uint16_t> half(count), half_out(count);
        std::vector<float> out(count, -1.0f), residual(count, 0.0f), reduced(count, 0.0f);
        std::vector<uint32_t> sent;
        CompressedAllreduceOptions o;
        if (c.dtype == DataType::kFloat32) {
          o.input = g.data();
          o.output = out.data();
        } else {
          CastBuffer(g.data(), DataType::kFloat32, count, half.data(), c.dtype, false);
          o.input = half.data();
          o.output = half_out.data();
        }
        o.count = count;
        o.dtype = c.dtype;
        o.op = ReduceOp::kAverage;
        o.codec = &codec;
        o.params.bits = 4;
        o.params.stochastic = true;
        o.params.topk_ratio = 0.01;
        o.segments = count > 3 ? std::vector<size_t>{count / 3, count - count / 3} : std::vector<size_t>{};
        o.name = "sweep";
        if (c.feedback) {
          o.residual = residual.data();
          o.reduced_residual = codec.sparse() ? nullptr : reduced.data();
          o.sent_indices = codec.sparse() ? &sent : nullptr;
        }
        for (int step = 0; step < 2; ++step) {  // the second step carries the first's residuals
          o.params.step = static_cast<uint64_t>(step);
          if (codec.sparse()) {
            SparseBoth(comm, o);
          } else {
            SraBoth(comm, o);
          }
        }
        if (c.dtype != DataType::kFloat32) CastBuffer(half_out.data(), c.dtype, count, out.data(), DataType::kFloat32, false);
        outs[static_cast<size_t>(comm.rank())] = out;
        return std::string();
      });
      ASSERT_EQ(BitIdentical(outs), "") << where;
      if (count > 1 && !codec.sparse()) {  // one value may be a sum that cancels to near zero
        ASSERT_LE(RelativeL2(outs[0], exact), c.max_error) << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, CodecSweep, ::testing::Range(1, 9));

TEST(Sra, PipelinedStripesGiveTheSameBytes) {
  const size_t count = (size_t{1} << 20) + 4097;
  for (int world : {2, 3}) {
    for (bool feedback : {false, true}) {
      std::vector<std::vector<float>> results[3], residuals[3];
      const size_t kStripes[3] = {1, 4, 48};
      for (size_t k = 0; k < 3; ++k) {
        const size_t stripes = kStripes[k];
        residuals[k].resize(static_cast<size_t>(world));
        results[k] = RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
          CompressedAllreduceOptions o = Maxmin(in, out, 4, 512);
          std::vector<float> residual(count, 0.0f), reduced(count, 0.0f);
          if (feedback) {
            o.residual = residual.data();
            o.reduced_residual = reduced.data();
          }
          o.segments = {1000, count - 1000};  // buckets of the second tensor are not aligned to chunks
          o.pipeline_stripes = stripes;
          SraBoth(comm, o);
          residual.insert(residual.end(), reduced.begin(), reduced.end());
          residuals[k][static_cast<size_t>(comm.rank())] = residual;
        });
      }
      for (size_t k = 1; k < 3; ++k) {
        EXPECT_EQ(BitIdentical(results[k]), "");
        EXPECT_EQ(results[k], results[0]) << "world " << world << " feedback " << feedback << " stripes " << kStripes[k];
        EXPECT_EQ(residuals[k], residuals[0]) << "world " << world << " feedback " << feedback << " stripes " << kStripes[k];
      }
    }
  }
}

// Over gradcomp's TCP connections (the runtime's data between nodes) the striped SRA gives the
// bytes it gives in process, and its loop waits on events: with rank 0 starting 0.3 s late the
// others' exchange threads wake a few dozen times (poll() on the sockets and the pipeline's
// eventfd; up to ~150 with other tests busy on the cores, data then arriving in more pieces),
// where a loop napping on a timer (50-500 us) would wake at least 600 times in those 0.3 s.
TEST(Sra, StripedOverTcpGivesTheSameBytesAndWaitsOnEvents) {
  const size_t count = (size_t{1} << 20) + 4097;
  const int world = 3;
  for (size_t stripes : {size_t{4}, size_t{48}}) {
    std::vector<long> switches(world, 0);
    std::vector<std::vector<float>> outs[2];
    for (const RankTransport transport : {RankTransport::kInProcess, RankTransport::kTcp}) {
      const bool tcp = transport == RankTransport::kTcp;
      outs[tcp] = RunAll(
          world, count, 1e4,
          [&](Communicator& comm, const auto& in, auto& out) {
            CompressedAllreduceOptions o = Maxmin(in, out, 4, 512);
            o.pipeline_stripes = stripes;
            comm.Barrier();
            if (comm.rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(300));
            rusage before{}, after{};
            getrusage(RUSAGE_THREAD, &before);
            CompressedAllreduce(comm, o);
            getrusage(RUSAGE_THREAD, &after);
            if (tcp) switches[static_cast<size_t>(comm.rank())] = after.ru_nvcsw - before.ru_nvcsw;
          },
          transport);
    }
    EXPECT_EQ(BitIdentical(outs[1]), "");
    EXPECT_EQ(outs[1], outs[0]) << stripes << " stripes";
    for (int r = 1; r < world; ++r) {
      EXPECT_LT(switches[static_cast<size_t>(r)], 300) << "rank " << r << ", " << stripes << " stripes";
    }
  }
}

// The none codec without error feedback sends float32 straight from the input and gathers
// straight into the output (no encode or decode copies). Blocking and striped, in place and
// not, on the host and through the separate-memory device (OnHostAndDevice), it gives the
// sums of the encode/decode path (which a residual, zero throughout, selects) bit for bit:
// the chunk owner's value plus the others' in rank order. An Average (with a postscale) ends as
// the uncompressed allreduce over MPI ends, FinishReduction's true division of those sums, on
// both paths.
TEST(Sra, RawFloat32TravelsFromAndIntoTheBuffersWithTheSameSums) {
  for (int world : {2, 3, 4}) {
    for (size_t count : {size_t{4097}, (size_t{1} << 20) + 4097}) {
      const auto parts = Inputs(world, count, 1e4);
      std::vector<float> want(count);
      const std::vector<size_t> chunks = EvenSplit(count, world);
      for (size_t c = 0, i = 0; c < chunks.size(); ++c) {
        for (const size_t end = i + chunks[c]; i < end; ++i) {
          float a = parts[c][i];
          for (size_t p = 0; p < parts.size(); ++p) {
            if (p != c) a += parts[p][i];
          }
          want[i] = a;
        }
      }
      std::vector<float> average = want;
      FinishReduction(average.data(), count, DataType::kFloat32, ReduceOp::kAverage, 0.5, world);
      for (size_t stripes : {size_t{1}, size_t{48}}) {
        for (bool in_place : {false, true}) {
          for (bool feedback : {false, true}) {
            const ReduceOp op = stripes == 1 && in_place ? ReduceOp::kSum : ReduceOp::kAverage;
            const std::string where = "world " + std::to_string(world) + " count " + std::to_string(count) +
                                      " stripes " + std::to_string(stripes) + (in_place ? " in place" : "") +
                                      (feedback ? " with a residual" : "") + " " + ReduceOpName(op);
            std::vector<std::vector<float>> residuals(static_cast<size_t>(world));
            const auto outs = RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
              std::vector<float> buffer = in, residual(count, 0.0f);
              CompressedAllreduceOptions o;
              o.input = buffer.data();
              o.output = in_place ? buffer.data() : out.data();
              o.count = count;
              o.dtype = DataType::kFloat32;
              o.op = op;
              if (op == ReduceOp::kAverage) o.postscale = 0.5;
              o.codec = &FindCodec("none");
              o.pipeline_stripes = stripes;
              o.name = "raw";
              if (feedback) o.residual = residual.data();
              SraBoth(comm, o);
              if (in_place) out = buffer;
              residuals[static_cast<size_t>(comm.rank())] = residual;
            });
            ASSERT_EQ(BitIdentical(outs), "") << where;
            ASSERT_TRUE(outs[0] == (op == ReduceOp::kSum ? want : average)) << where;
            for (const auto& r : residuals) ASSERT_TRUE(r == std::vector<float>(count, 0.0f)) << where;
          }
        }
      }
    }
  }
}

TEST(Sra, BlocksOfTheReductionKeepTheBuckets) {
  // The reduction works in cache-sized blocks cut at bucket boundaries. Each bucket of the
  // result is one decoded bucket of the final encoding, so it holds at most 2^bits distinct
  // values; a block cut inside a bucket would give its two halves different ranges.
  const size_t count = 100003;
  for (int world : {2, 3}) {
    for (size_t bucket : {size_t{3}, size_t{100}, size_t{512}, size_t{20000}}) {
      const auto outs = RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
        SraBoth(comm, Maxmin(in, out, 1, bucket));
      });
      ASSERT_EQ(BitIdentical(outs), "");
      const std::vector<size_t> chunks = EvenSplit(count, world), starts = Offsets(chunks);
      for (size_t c = 0; c < chunks.size(); ++c) {
        for (size_t b = 0; b < chunks[c]; b += bucket) {
          std::set<float> distinct;
          for (size_t i = b; i < std::min(chunks[c], b + bucket); ++i) distinct.insert(outs[0][starts[c] + i]);
          ASSERT_LE(distinct.size(), 2u) << "world " << world << " bucket " << bucket << " chunk " << c << " at " << b;
        }
      }
    }
  }
}

TEST(Sra, StochasticRoundingStaysWithinItsBound) {
  for (int world : {2, 5}) {
    const auto parts = Inputs(world, 30001, 1e4);
    const auto outs = RunAll(world, 30001, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
      CompressedAllreduceOptions o = Maxmin(in, out, 3, 128);
      o.params.stochastic = true;
      o.params.seed = 11;
      o.params.step = 4;
      SraBoth(comm, o);
    });
    EXPECT_EQ(BitIdentical(outs), "");
    EXPECT_EQ(WithinBound(outs[0], ExactSum(parts, 1.0 / world), SraBound(parts, 1.0 / world, 3, 128, true)), "");
  }
}

struct WorldGrid {
  int world, columns;
};

class Sra2dSweep : public ::testing::TestWithParam<WorldGrid> {};

TEST_P(Sra2dSweep, WithinTheBoundAndBitIdenticalOnEveryRank) {
  const int world = GetParam().world, columns = GetParam().columns;
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{1} << 18}) {
    const auto parts = Inputs(world, count, 1e4);
    const std::vector<double> exact = ExactSum(parts, 1.0 / world);
    for (int bits : {2, 4, 8}) {
      for (size_t bucket : {size_t{64}, size_t{512}}) {
        const auto outs = RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
          Sra2dBoth(comm, Maxmin(in, out, bits, bucket), columns);
        });
        const std::string where = " world " + std::to_string(world) + " columns " + std::to_string(columns) +
                                  " count " + std::to_string(count) + " bits " + std::to_string(bits) + " bucket " +
                                  std::to_string(bucket);
        ASSERT_EQ(BitIdentical(outs), "") << where;
        ASSERT_EQ(WithinBound(outs[0], exact, Sra2dBound(parts, 1.0 / world, bits, bucket, false, columns)), "")
            << where;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grids, Sra2dSweep,
                         ::testing::Values(WorldGrid{4, 2}, WorldGrid{6, 3}, WorldGrid{6, 2}, WorldGrid{8, 4},
                                           WorldGrid{9, 3}, WorldGrid{12, 4}, WorldGrid{16, 4}),
                         [](const ::testing::TestParamInfo<WorldGrid>& s) {
                           return "world" + std::to_string(s.param.world) + "_columns" +
                                  std::to_string(s.param.columns);
                         });

struct NodeGridShape {
  int world, local;
  std::vector<int> cross;  // row lengths of the grids across nodes, one per level; empty: flat SRA
};

// "2x4": the levels' row lengths; "flat" for none.
std::string Levels(const std::vector<int>& cross) {
  std::string s;
  for (int c : cross) s += (s.empty() ? "" : "x") + std::to_string(c);
  return s.empty() ? "flat" : s;
}

class NodeGridSweep : public ::testing::TestWithParam<NodeGridShape> {};

TEST_P(NodeGridSweep, WithinTheBoundAndBitIdenticalOnEveryRank) {
  // Rows are the nodes; the columns across nodes run flat SRA or a grid of their own (three
  // levels), whose columns may run a grid of their own again (four, five), every level's bound
  // composed (NestedSraBound).
  // Plain names, not a structured binding: C++17 lambdas cannot capture one.
  const int world = GetParam().world, local = GetParam().local;
  const std::vector<int>& cross = GetParam().cross;
  std::vector<int> columns = {local};
  columns.insert(columns.end(), cross.begin(), cross.end());
  for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{50001}}) {
    const auto parts = Inputs(world, count, 1e4);
    const std::vector<double> exact = ExactSum(parts, 1.0 / world);
    // Three (bits, bucket) pairs, not their product: the sweep runs under the sanitizers too.
    for (const auto& setting : {std::pair<int, size_t>{2, 64}, {4, 512}, {8, 128}}) {
      const int bits = setting.first;
      const size_t bucket = setting.second;
      std::vector<std::vector<float>> outs(static_cast<size_t>(world));
      const auto errors = RunTopology(world, local, [&](Topology& topo) {
        const Grid grid = MakeNodeGrid(topo, cross);
        // The grids nest as deep as asked: every level has two dimensions.
        size_t depth = 0;
        for (const Grid* g = grid.column_grid.get(); g; g = g->column_grid.get()) ++depth;
        if (depth != cross.size()) return "nested " + std::to_string(depth) + " levels deep";
        const std::vector<float> in = Gradient(count, topo.rank(), 1e4);
        std::vector<float> out(count, -1.0f);
        GridBoth(grid, Maxmin(in, out, bits, bucket));
        outs[static_cast<size_t>(topo.rank())] = out;
        return std::string();
      });
      const std::string where = " world " + std::to_string(world) + " local " + std::to_string(local) +
                                " across " + Levels(cross) + " count " + std::to_string(count) + " bits " +
                                std::to_string(bits) + " bucket " + std::to_string(bucket);
      ASSERT_EQ(Failures(errors), "") << where;
      ASSERT_EQ(BitIdentical(outs), "") << where;
      ASSERT_EQ(WithinBound(outs[0], exact, NestedSraBound(parts, 1.0 / world, bits, bucket, false, columns)), "")
          << where;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Grids, NodeGridSweep,
                         ::testing::Values(NodeGridShape{12, 3, {}}, NodeGridShape{8, 2, {2}},
                                           NodeGridShape{16, 2, {2}}, NodeGridShape{16, 4, {2}},
                                           NodeGridShape{18, 2, {3}}, NodeGridShape{24, 2, {3}},
                                           NodeGridShape{32, 2, {4}}, NodeGridShape{16, 2, {2, 2}},
                                           NodeGridShape{48, 2, {2, 3}}, NodeGridShape{64, 2, {2, 2, 2}}),
                         [](const ::testing::TestParamInfo<NodeGridShape>& s) {
                           return "world" + std::to_string(s.param.world) + "_local" + std::to_string(s.param.local) +
                                  "_across_" + Levels(s.param.cross);
                         });

TEST(GridShape, RowsAcrossNodesKeepANodesMessagesBoundedAndLongColumnsNest) {
  // One rank a node: the most square grid up to 128 x 128 (rows of up to 128).
  EXPECT_EQ(GridShape(1024, 1, 32), (std::vector<int>{32}));
  EXPECT_EQ(GridShape(512, 1, 32), (std::vector<int>{32}));
  EXPECT_EQ(GridShape(64, 1, 32), (std::vector<int>{8}));
  // Eight: rows of at most 16 nodes; a column longer than 16 and at least 32 nests.
  EXPECT_EQ(GridShape(1024, 8, 32), (std::vector<int>{16, 8}));
  EXPECT_EQ(GridShape(512, 8, 32), (std::vector<int>{16, 8}));
  EXPECT_EQ(GridShape(256, 8, 32), (std::vector<int>{16}));
  EXPECT_EQ(GridShape(64, 8, 32), (std::vector<int>{8}));
  EXPECT_EQ(GridShape(32, 8, 32), (std::vector<int>{8}));
  // Below GRADCOMP_GRID_MIN_RANKS a long column stays flat; a prime count makes one row.
  EXPECT_EQ(GridShape(1024, 8, 128), (std::vector<int>{16}));
  EXPECT_EQ(GridShape(31, 8, 4), (std::vector<int>{31}));
  // The bound, and a bound below two ranks a row (rows of 2).
  EXPECT_EQ(GridShape(16, 2, 4, 4), (std::vector<int>{2, 2, 2}));
  EXPECT_EQ(GridShape(16, 2, 4, 64), (std::vector<int>{4}));
  EXPECT_EQ(GridShape(64, 200, 4), (std::vector<int>{2, 2, 2, 2, 2}));
}

TEST(Sra2d, StochasticRoundingAndErrorFeedbackAndTensorBoundaries) {
  // Stochastic rounding stays within twice the nearest bound; tensors restart buckets inside
  // chunks; error feedback makes the average over steps converge to the exact average.
  const int world = 8;
  const size_t count = 3 * 4096 + 77;
  const auto parts = Inputs(world, count, 0.5);
  const auto outs = RunAll(world, count, 0.5, [&](Communicator& comm, const auto& in, auto& out) {
    CompressedAllreduceOptions o = Maxmin(in, out, 3, 128);
    o.params.stochastic = true;
    o.segments = {4096, 77, 2 * 4096};
    Sra2dBoth(comm, o, 4);
  });
  EXPECT_EQ(BitIdentical(outs), "");
  EXPECT_EQ(WithinBound(outs[0], ExactSum(parts, 1.0 / world), Sra2dBound(parts, 1.0 / world, 3, 128, true, 4)),
            "");
  const int steps = 40;
  const std::vector<double> exact = ExactSum(parts, 1.0 / world);
  std::vector<double> first_error(1), mean_error(1);
  RunAll(world, count, 0.5, [&](Communicator& comm, const auto& in, auto& out) {
    const Grid grid = MakeGrid(comm, 4);
    std::vector<float> residual(count, 0.0f), reduced(count, 0.0f);
    std::vector<double> mean(count, 0.0);
    for (int step = 0; step < steps; ++step) {
      CompressedAllreduceOptions o = Maxmin(in, out, 2, 512);
      o.residual = residual.data();
      o.reduced_residual = reduced.data();
      o.params.step = static_cast<uint64_t>(step) + 1;
      CompressedAllreduce2d(grid, o);
      for (size_t i = 0; i < count; ++i) mean[i] += out[i] / steps;
      if (step == 0 && comm.rank() == 0) first_error[0] = RelativeL2(out, exact);
    }
    if (comm.rank() == 0) mean_error[0] = RelativeL2(std::vector<float>(mean.begin(), mean.end()), exact);
  });
  std::printf("2-D SRA 2-bit with error feedback: one step %.4f, mean of %d steps %.4f\n", first_error[0], steps,
              mean_error[0]);
  EXPECT_LT(mean_error[0], first_error[0] / 8);
}

TEST(Sra2d, StripedColumnsGiveTheSameBytes) {
  // Columns of 2M values stripe (4 stripes on a helper thread, point to point); the rows decode
  // the column's encodings in its striped layout: the same bytes as one stripe.
  const int world = 4;
  const size_t count = size_t{1} << 22;
  std::vector<std::vector<float>> striped_outs;
  for (size_t stripes : {size_t{1}, size_t{4}}) {
    const auto outs = RunAll(world, count, 0.5, [&](Communicator& comm, const auto& in, auto& out) {
      CompressedAllreduceOptions o = Maxmin(in, out, 4, 512);
      o.pipeline_stripes = stripes;
      CompressedAllreduce2d(MakeGrid(comm, 2), o);
    });
    ASSERT_EQ(BitIdentical(outs), "") << stripes << " stripes";
    if (stripes == 1) {
      striped_outs = outs;
    } else {
      EXPECT_TRUE(SameBytes(outs[0].data(), striped_outs[0].data(), count * sizeof(float)));
    }
  }
}

TEST(Sra2d, OverlappedRowStepsGiveTheSameBytesAndResiduals) {
  // Large buffers with stripes overlap the row steps with the codec (RowExchange: each peer's
  // chunk sent once encoded, each chunk decoded as it lands); one stripe runs them one after the
  // other. Same bytes, residuals included, over two steps of error feedback: on a grid of rows of
  // 4 ranks (in process and over TCP), and on node rows of 2 whose 4 nodes run a 2 x 2 grid (the
  // overlapped column grid's encodings gathered by the rows above it).
  const int world = 8;
  const size_t count = (size_t{1} << 20) + 4097;
  struct Run {
    std::vector<float> out, residual, reduced;
  };
  const auto run = [&](size_t stripes, bool node_rows, RankTransport transport = RankTransport::kInProcess) {
    std::vector<Run> runs(static_cast<size_t>(world));
    const auto body = [&](int rank, const Grid& grid) {
      const std::vector<float> in = Gradient(count, rank, 0.5);
      Run& r = runs[static_cast<size_t>(rank)];
      r.out.assign(count, 0.0f);
      r.residual.assign(count, 0.0f);
      r.reduced.assign(count, 0.0f);
      for (uint64_t step = 1; step <= 2; ++step) {
        CompressedAllreduceOptions o = Maxmin(in, r.out, 4, 512);
        o.pipeline_stripes = stripes;
        o.residual = r.residual.data();
        o.reduced_residual = r.reduced.data();
        o.params.step = step;
        CompressedAllreduce2d(grid, o);
      }
    };
    const std::vector<std::string> errors =
        node_rows ? RunTopology(world, 2,
                                [&](Topology& topo) {
                                  body(topo.rank(), MakeNodeGrid(topo, {2}));
                                  return std::string();
                                })
                  : RunRanks(
                        world,
                        [&](Communicator& comm) {
                          body(comm.rank(), MakeGrid(comm, 4));
                          return std::string();
                        },
                        transport);
    EXPECT_EQ(Failures(errors), "") << stripes << " stripes";
    return runs;
  };
  // Rows of 4 also over gradcomp's TCP connections (the helper's wake-ups through the poller).
  for (int setting = 0; setting < 3; ++setting) {
    const bool node_rows = setting == 1, tcp = setting == 2;
    const std::vector<Run> one = run(1, node_rows),
                           overlapped = run(4, node_rows, tcp ? RankTransport::kTcp : RankTransport::kInProcess);
    for (size_t r = 0; r < one.size(); ++r) {
      const std::string where = std::string(node_rows ? "node rows" : tcp ? "rows of 4 over TCP" : "rows of 4") +
                                ", rank " + std::to_string(r);
      EXPECT_TRUE(SameBytes(one[r].out.data(), overlapped[r].out.data(), count * sizeof(float))) << where;
      EXPECT_TRUE(SameBytes(one[r].residual.data(), overlapped[r].residual.data(), count * sizeof(float))) << where;
      EXPECT_TRUE(SameBytes(one[r].reduced.data(), overlapped[r].reduced.data(), count * sizeof(float))) << where;
    }
    EXPECT_TRUE(SameBytes(one[0].out.data(), one[world - 1].out.data(), count * sizeof(float)));
  }
}

TEST(Sra2d, FourBitErrorAtLargeWorldsStaysNearFlatSra) {
  // The largest worlds this machine runs as thread ranks: the 2-D SRA re-quantizes once more
  // than flat SRA (the row sums), never once per level, so its error stays within the issue's
  // 0.3 and near flat SRA's at every size; nested grids (nodes of 8) once more again.
  const size_t count = size_t{1} << 16;
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // 256 and 1024 threads under a sanitizer's shadow stacks: most of the suite's time there. 64
  // ranks take every branch (nodes of 8 nest their columns); the larger worlds, longer rows.
  const std::vector<int> worlds = {16, 64};
#else
  const std::vector<int> worlds = {16, 64, 256, 1024};
#endif
  // Flat SRA's error does not grow with the world (Sra.FourBitGaussianErrorIsSmallAndDoesNotGrowWithWorldSize;
  // here 0.127 at 1024 ranks against 0.154 at 256): at 1024 ranks, where its n^2 messages take a
  // third of this test's time, the previous world's flat error is the reference, and only the
  // independent inputs run (the larger errors: the correlated ones took half the rest).
  std::map<double, double> flat_error;  // by noise: the last world's that ran flat SRA
  for (int world : worlds) {
    for (double noise : {1e4, 0.5}) {
      const bool largest = world >= 1024;
      if (largest && noise < 1) continue;
      const auto exact = ExactSum(Inputs(world, count, noise), 1.0 / world);
      if (!largest) {
        const auto flat = RunAll(world, count, noise, [&](Communicator& comm, const auto& in, auto& out) {
          CompressedAllreduce(comm, Maxmin(in, out, 4, 512));
        });
        flat_error[noise] = RelativeL2(flat[0], exact);
      }
      const auto grid = RunAll(world, count, noise, [&](Communicator& comm, const auto& in, auto& out) {
        CompressedAllreduce2d(MakeGrid(comm), Maxmin(in, out, 4, 512));
      });
      // Nodes of 8 ranks: the node rows, the columns across nodes on a grid of their own (its
      // levels' row lengths `cross`: {0}, the most square).
      const auto on_nodes = [&](const std::vector<int>& cross) {
        std::vector<std::vector<float>> outs(static_cast<size_t>(world));
        RunTopology(world, 8, [&](Topology& topo) {
          const std::vector<float> in = Gradient(count, topo.rank(), noise);
          std::vector<float> out(count);
          CompressedAllreduce2d(MakeNodeGrid(topo, cross), Maxmin(in, out, 4, 512));
          outs[static_cast<size_t>(topo.rank())] = std::move(out);
          return std::string();
        });
        return outs;
      };
      const auto nested = on_nodes({0});
      // Four levels (the grid across nodes' columns on grids of their own, as GridShape nests
      // them at 1024 nodes x 8): rows of 2 or 4 nodes on 8 and 32 nodes, of 8 on 128 (2 nodes
      // have no column to nest: the three levels again).
      const int nodes = world / 8;
      const std::vector<int> deeper_shape = nodes >= 128 ? std::vector<int>{8, 4}
                                            : nodes >= 32 ? std::vector<int>{4, 4}
                                                          : std::vector<int>{2, 2};
      const auto deeper = nodes >= 8 ? on_nodes(deeper_shape) : nested;
      const double e_flat = flat_error.at(noise), e_grid = RelativeL2(grid[0], exact),
                   e_nested = RelativeL2(nested[0], exact), e_deeper = RelativeL2(deeper[0], exact);
      std::printf("4-bit, world %d, %s inputs: relative L2 error flat SRA %.4f%s, 2-D SRA %.4f, nodes of 8 with a "
                  "2-D grid across %.4f, with nested columns across %.4f\n",
                  world, noise > 1 ? "independent" : "correlated", e_flat, largest ? " (the previous world's)" : "",
                  e_grid, e_nested, e_deeper);
      EXPECT_EQ(BitIdentical(grid), "") << "world " << world;
      EXPECT_EQ(BitIdentical(nested), "") << "world " << world;
      EXPECT_EQ(BitIdentical(deeper), "") << "world " << world;
      EXPECT_LE(e_grid, 0.3) << "world " << world;
      EXPECT_LE(e_grid, 1.5 * e_flat) << "world " << world;
      EXPECT_LE(e_nested, 0.3) << "world " << world;
      EXPECT_LE(e_nested, 1.7 * e_flat) << "world " << world;  // one quantization more than the 2-D SRA
      EXPECT_LE(e_deeper, 0.3) << "world " << world;
      EXPECT_LE(e_deeper, 2.0 * e_flat) << "world " << world;  // two more than the 2-D SRA
    }
  }
}

TEST(Sra, FourBitGaussianErrorIsSmallAndDoesNotGrowWithWorldSize) {
  const size_t count = 1 << 18;
  std::vector<double> independent, correlated;
  for (int world : {2, 4, 8}) {
    for (double noise : {1e4, 0.5}) {
      const auto outs = RunAll(world, count, noise, [&](Communicator& comm, const auto& in, auto& out) {
        SraBoth(comm, Maxmin(in, out, 4, 512));
      });
      const double e = RelativeL2(outs[0], ExactSum(Inputs(world, count, noise), 1.0 / world));
      std::printf("4-bit SRA, world %d, %s inputs: relative L2 error %.4f\n", world,
                  noise > 1 ? "independent" : "correlated", e);
      EXPECT_LE(e, 0.2);
      (noise > 1 ? independent : correlated).push_back(e);
    }
  }
  // Correlated gradients (a shared signal plus noise, as in training): flat in world size.
  EXPECT_LE(correlated[2], correlated[0] * 1.1);
  // Independent inputs: the first stage's share tends to sqrt((n-1)/n), so at most sqrt(2)
  // over world 2, never a growth per hop as a re-quantizing ring has.
  EXPECT_LE(independent[2], independent[0] * 1.42);
}

TEST(Sra, CountsSmallerThanRanksAndTensorBoundariesInsideTheBuffer) {
  // 3 values on 6 ranks: most chunks are empty. Segments restart buckets at tensor boundaries.
  const auto outs = RunAll(6, 3, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
    SraBoth(comm, Maxmin(in, out, 2, 64));
  });
  EXPECT_EQ(BitIdentical(outs), "");
  const auto parts = Inputs(6, 3, 1e4);
  EXPECT_EQ(WithinBound(outs[0], ExactSum(parts, 1.0 / 6), SraBound(parts, 1.0 / 6, 2, 64, false)), "");
  // A constant tensor next to a noisy one stays exact only if buckets restart at the boundary.
  const auto fused = RunAll(2, 200, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
    std::vector<float> x = in;
    std::fill(x.begin(), x.begin() + 50, 0.25f);  // tensor A: constant
    CompressedAllreduceOptions o = Maxmin(x, out, 2, 512);
    o.segments = {50, 150};
    SraBoth(comm, o);
  });
  for (size_t i = 0; i < 50; ++i) ASSERT_EQ(fused[0][i], 0.25f) << i;
}

TEST(Sra, Float16AndBFloat16TensorsAndFp16Codec) {
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    for (const char* codec : {"maxmin", "fp16", "bf16"}) {
      const int world = 3;
      std::vector<std::vector<uint16_t>> outs(world);
      RunRanks(world, [&](Communicator& comm) {
        const std::vector<float> g = Gradient(1000, comm.rank(), 1e4);
        std::vector<uint16_t> in(g.size()), out(g.size());
        CastBuffer(g.data(), DataType::kFloat32, g.size(), in.data(), dt, false);
        CompressedAllreduceOptions o;
        o.input = in.data();
        o.output = out.data();
        o.count = in.size();
        o.dtype = dt;
        o.op = ReduceOp::kSum;
        o.codec = &FindCodec(codec);
        o.params.bits = 8;
        SraBoth(comm, o);
        outs[static_cast<size_t>(comm.rank())] = out;
        return std::string();
      });
      EXPECT_EQ(outs[1], outs[0]) << codec;
      EXPECT_EQ(outs[2], outs[0]) << codec;
      std::vector<float> got(1000);
      CastBuffer(outs[0].data(), dt, 1000, got.data(), DataType::kFloat32, false);
      const double e = RelativeL2(got, ExactSum(Inputs(world, 1000, 1e4), 1.0));
      EXPECT_LE(e, 0.02) << DataTypeName(dt) << " " << codec;
    }
  }
}

TEST(Sra, ErrorFeedbackMakesTheAverageOverStepsConverge) {
  const int world = 4, steps = 100;
  const size_t count = 20000;
  for (bool feedback : {false, true}) {
    std::vector<std::vector<double>> sums(world, std::vector<double>(count, 0.0));
    RunRanks(world, [&](Communicator& comm) {
      const std::vector<float> in = Gradient(count, comm.rank(), 0.3);
      std::vector<float> out(count), residual(count, 0.0f), reduced(count, 0.0f);
      for (int s = 0; s < steps; ++s) {
        CompressedAllreduceOptions o = Maxmin(in, out, 2, 512);
        o.params.step = static_cast<uint64_t>(s);
        if (feedback) {
          o.residual = residual.data();
          o.reduced_residual = reduced.data();
        }
        SraBoth(comm, o);
        for (size_t i = 0; i < count; ++i) sums[static_cast<size_t>(comm.rank())][i] += out[i];
      }
      return std::string();
    });
    std::vector<float> mean(count);
    for (size_t i = 0; i < count; ++i) mean[i] = static_cast<float>(sums[0][i] / steps);
    const double e = RelativeL2(mean, ExactSum(Inputs(world, count, 0.3), 1.0 / world));
    std::printf("2-bit SRA, mean over %d steps of a fixed input, error feedback %s: relative L2 error %.5f\n", steps,
                feedback ? "on" : "off", e);
    if (feedback) {
      EXPECT_LT(e, 0.01);
    } else {
      EXPECT_GT(e, 0.05);  // without it the quantization bias stays
    }
  }
}

// A transport without point-to-point transfers (NCCL: Isend throws) runs every algorithm
// through its own collectives: requested stripes become one exchange, the 2-D SRA's rows and the
// top-k allgather take its Alltoallv / Allgatherv. The same bytes as the host's point-to-point
// run (OnHostAndDevice compares them).
TEST(CompressedAllreduce, ATransportWithoutPointToPointTakesItsOwnCollectives) {
  const size_t count = (size_t{1} << 20) + 4097;
  for (int world : {3, 4}) {
    RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
      const auto rows = world == 4 ? std::make_unique<Grid>(MakeGrid(comm, 2)) : nullptr;
      for (const char* codec : {"none", "maxmin", "topk"}) {
        CompressedAllreduceOptions o = AverageWith(in, out, codec, 4, 512);
        o.params.topk_ratio = 0.01;
        o.pipeline_stripes = 8;
        o.segments = {1000, count - 1000};
        OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
          if (q.codec->sparse()) {
            std::unique_ptr<Communicator> nccl_like = DeviceMemoryCommunicator(comm, TestDevice(), false);
            SparseAllreduce(device_comm ? *nccl_like : comm, q);
          } else if (rows && device_comm) {  // a 2-D SRA, rows of 2
            CompressedAllreduce2d(OnDevice(*rows, false), q);
          } else if (rows) {
            CompressedAllreduce2d(*rows, q);
          } else {
            std::unique_ptr<Communicator> nccl_like = DeviceMemoryCommunicator(comm, TestDevice(), false);
            CompressedAllreduce(device_comm ? *nccl_like : comm, q);
          }
        });
      }
    });
  }
}

TEST(SparseAllreduce, RatioOneEqualsTheUncompressedAllreduce) {
  for (int world : {1, 2, 3, 5}) {
    const auto sparse = RunAll(world, 3001, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
      CompressedAllreduceOptions o;
      o.input = in.data();
      o.output = out.data();
      o.count = in.size();
      o.op = ReduceOp::kAverage;
      o.codec = &FindCodec("topk");
      o.params.topk_ratio = 1.0;
      o.segments = {1000, 2001};
      SparseBoth(comm, o);
    });
    const auto dense = RunAll(world, 3001, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
      AllreduceOptions o;
      o.input = in.data();
      o.output = out.data();
      o.count = in.size();
      o.op = ReduceOp::kAverage;
      Allreduce(comm, o);
    });
    EXPECT_EQ(BitIdentical(sparse), "");
    EXPECT_EQ(sparse[0], dense[0]) << "world " << world;
  }
}

TEST(SparseAllreduce, KeepsTheLargestValuesAndFeedsBackTheRest) {
  const int world = 3;
  const size_t count = 10000;
  std::vector<std::vector<float>> residuals(world);
  std::vector<std::vector<uint32_t>> sent(world);
  const auto outs = RunAll(world, count, 1e4, [&](Communicator& comm, const auto& in, auto& out) {
    std::vector<float> residual(count, 0.0f);
    std::vector<uint32_t> indices;
    CompressedAllreduceOptions o;
    o.input = in.data();
    o.output = out.data();
    o.count = count;
    o.op = ReduceOp::kSum;
    o.codec = &FindCodec("topk");
    o.params.topk_ratio = 0.01;
    o.residual = residual.data();
    o.sent_indices = &indices;
    SparseBoth(comm, o);
    residuals[static_cast<size_t>(comm.rank())] = residual;
    sent[static_cast<size_t>(comm.rank())] = indices;
  });
  EXPECT_EQ(BitIdentical(outs), "");
  const auto parts = Inputs(world, count, 1e4);
  std::vector<double> expect(count, 0.0);
  for (int r = 0; r < world; ++r) {
    const size_t ri = static_cast<size_t>(r);
    EXPECT_GE(sent[ri].size(), 80u);
    EXPECT_LE(sent[ri].size(), 130u);
    std::vector<bool> was_sent(count, false);
    for (uint32_t i : sent[ri]) {
      was_sent[i] = true;
      expect[i] += parts[ri][i];
    }
    for (size_t i = 0; i < count; ++i) {
      // Residual holds exactly what was not sent.
      ASSERT_EQ(residuals[ri][i], was_sent[i] ? 0.0f : parts[ri][i]) << "rank " << r << " element " << i;
    }
  }
  for (size_t i = 0; i < count; ++i) ASSERT_NEAR(outs[0][i], expect[i], 1e-5) << i;
}

struct Shape2 {
  int world, local;
  bool leader_only;
  bool grid = false;  // the 2-D SRA across nodes
};

class HierarchicalCompressed : public ::testing::TestWithParam<Shape2> {};

TEST_P(HierarchicalCompressed, WithinTheCrossNodeBoundAndBitIdentical) {
  const int world = GetParam().world, local = GetParam().local;  // not bound: lambdas capture them
  const bool leader_only = GetParam().leader_only, grid = GetParam().grid;
  const size_t count = 50001;
  const int nodes = world / local;
  const auto parts = Inputs(world, count, 1e4);
  std::vector<std::vector<float>> outs(static_cast<size_t>(world));
  RunTopology(world, local, [&](Topology& topo) {
    const std::vector<float> in = Gradient(count, topo.rank(), 1e4);
    std::vector<float> out(count);
    HierarchicalBoth(topo, Maxmin(in, out, 4, 512), leader_only, grid);
    outs[static_cast<size_t>(topo.rank())] = out;
    return std::string();
  });
  ASSERT_EQ(BitIdentical(outs), "");
  // The cross-node SRA sees node sums: per node shard (or the whole buffer, leader only).
  std::vector<std::vector<float>> node_sums(static_cast<size_t>(nodes), std::vector<float>(count, 0.0f));
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) node_sums[static_cast<size_t>(r / local)][i] += parts[static_cast<size_t>(r)][i];
  }
  std::vector<double> bound(count);
  const std::vector<size_t> shards = leader_only ? std::vector<size_t>{count} : EvenSplit(count, local);
  const std::vector<size_t> soff = Offsets(shards);
  for (size_t s = 0; s < shards.size(); ++s) {
    std::vector<std::vector<float>> shard_parts;
    for (const auto& ns : node_sums) {
      shard_parts.emplace_back(ns.begin() + static_cast<long>(soff[s]), ns.begin() + static_cast<long>(soff[s] + shards[s]));
    }
    int columns = nodes;  // MakeGrid's choice: the most square grid, rows at least as long
    for (int r = 1; r * r <= nodes; ++r) {
      if (nodes % r == 0) columns = nodes / r;
    }
    const std::vector<double> b = grid ? Sra2dBound(shard_parts, 1.0 / world, 4, 512, false, columns)
                                       : SraBound(shard_parts, 1.0 / world, 4, 512, false);
    for (size_t i = 0; i < shards[s]; ++i) bound[soff[s] + i] = b[i] + 1e-5;  // + float32 node sums
  }
  EXPECT_EQ(WithinBound(outs[0], ExactSum(parts, 1.0 / world), bound), "");
}

INSTANTIATE_TEST_SUITE_P(Shapes, HierarchicalCompressed,
                         ::testing::Values(Shape2{4, 2, false}, Shape2{8, 2, false}, Shape2{8, 4, false},
                                           Shape2{6, 3, false}, Shape2{4, 2, true}, Shape2{8, 4, true},
                                           Shape2{16, 2, false, true}, Shape2{12, 2, false, true},
                                           Shape2{8, 2, true, true}),
                         [](const ::testing::TestParamInfo<Shape2>& s) {
                           return "world" + std::to_string(s.param.world) + "_local" + std::to_string(s.param.local) +
                                  (s.param.leader_only ? "_leader" : "") + (s.param.grid ? "_2d" : "");
                         });

// The node-local steps read the tensors and write the result where the local communicator reaches
// them (hierarchical_compressed.cc: no staging copy on the host device or with communicators on
// device memory). In place, through the error-feedback working copy and with float16 tensors
// they give the bytes that separate float32 buffers give (the float16 case on inputs that float16
// holds exactly, its output the float32 result rounded), on the host and on the device.
TEST(HierarchicalCompressedBuffers, InPlaceFeedbackAndHalfGiveTheFloatResult) {
  const size_t count = 30011;
  enum Kind { kSeparate, kInPlace, kFeedback, kHalf };
  for (const Shape2& shape : {Shape2{8, 2, false}, Shape2{8, 4, true}, Shape2{8, 2, false, true}}) {
    std::vector<std::vector<float>> outs[4], residuals(static_cast<size_t>(shape.world));
    for (Kind kind : {kSeparate, kInPlace, kFeedback, kHalf}) {
      outs[kind].resize(static_cast<size_t>(shape.world));
      RunTopology(shape.world, shape.local, [&](Topology& topo) {
        std::vector<float> in = Gradient(count, topo.rank(), 1e2);
        std::vector<uint16_t> half(count), half_out(count);
        CastBuffer(in.data(), DataType::kFloat32, count, half.data(), DataType::kFloat16, false);
        CastBuffer(half.data(), DataType::kFloat16, count, in.data(), DataType::kFloat32, false);
        std::vector<float> out(count, -1.0f), residual(count, 0.0f), reduced(count, 0.0f);
        CompressedAllreduceOptions o = Maxmin(in, out, 4, 512);
        if (kind == kInPlace) o.output = in.data();
        if (kind == kFeedback) {
          o.residual = residual.data();
          o.reduced_residual = reduced.data();
        }
        if (kind == kHalf) {
          o.input = half.data();
          o.output = half_out.data();
          o.dtype = DataType::kFloat16;
        }
        HierarchicalBoth(topo, o, shape.leader_only, shape.grid);
        if (kind == kInPlace) out = in;
        if (kind == kHalf) CastBuffer(half_out.data(), DataType::kFloat16, count, out.data(), DataType::kFloat32, false);
        outs[kind][static_cast<size_t>(topo.rank())] = out;
        if (kind == kFeedback) residuals[static_cast<size_t>(topo.rank())] = residual;
        return std::string();
      });
    }
    const std::string where = "world " + std::to_string(shape.world) + " local " + std::to_string(shape.local) +
                              (shape.leader_only ? " leader only" : "") + (shape.grid ? " 2-D across" : "");
    ASSERT_EQ(BitIdentical(outs[kSeparate]), "") << where;
    EXPECT_EQ(outs[kInPlace], outs[kSeparate]) << where;
    EXPECT_EQ(outs[kFeedback], outs[kSeparate]) << where;  // a zero residual changes no value
    std::vector<float> rounded(count);
    for (int r = 0; r < shape.world; ++r) {
      std::vector<uint16_t> h(count);
      CastBuffer(outs[kSeparate][static_cast<size_t>(r)].data(), DataType::kFloat32, count, h.data(),
                 DataType::kFloat16, false);
      CastBuffer(h.data(), DataType::kFloat16, count, rounded.data(), DataType::kFloat32, false);
      EXPECT_EQ(outs[kHalf][static_cast<size_t>(r)], rounded) << where << " rank " << r;
      // The feedback case ran the working copy: its quantization error is left in the residual
      // of every rank that encodes node sums (every rank, or the leaders).
      if (!shape.leader_only || r % shape.local == 0) {
        EXPECT_NE(residuals[static_cast<size_t>(r)], std::vector<float>(count, 0.0f)) << where << " rank " << r;
      }
    }
  }
}

TEST(CompressedAllreduceErrors, NameWhatIsWrong) {
  std::vector<float> x(10), y(10);
  const auto err = [&](const std::function<void(Communicator&)>& fn) -> std::string {
    try {
      RunRanks(2, [&](Communicator& c) {
        fn(c);
        return std::string();
      });
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(err([&](Communicator& c) {
              CompressedAllreduceOptions o = Maxmin(x, y, 4, 512);
              o.op = ReduceOp::kMax;
              CompressedAllreduce(c, o);
            }).find("supports sum and average, not max [compressed allreduce of tensor 'grad']"),
            std::string::npos);
  EXPECT_NE(err([&](Communicator& c) {
              CompressedAllreduceOptions o = Maxmin(x, y, 4, 512);
              o.segments = {3, 3};
              CompressedAllreduce(c, o);
            }).find("segments sum to 6, not 10"),
            std::string::npos);
  EXPECT_NE(err([&](Communicator& c) {
              CompressedAllreduceOptions o = Maxmin(x, y, 4, 512);
              o.codec = &FindCodec("topk");
              CompressedAllreduce(c, o);
            }).find("codec topk needs the sparse allreduce"),
            std::string::npos);
  EXPECT_NE(err([&](Communicator& c) {
              CompressionWorkspace on_device(TestDevice());
              CompressedAllreduceOptions o = Maxmin(x, y, 4, 512);  // host buffers
              o.workspace = &on_device;
              CompressedAllreduce(c, o);
            }).find(std::string("compressed allreduce: the buffers are on device host but the workspace is on ") +
                    TestDevice().name()),
            std::string::npos);
}

}  // namespace
}  // namespace gradcomp
