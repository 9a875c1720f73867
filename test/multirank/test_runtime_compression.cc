// Compression through the runtime: the per-tensor policy (settings, layer filter, per-call
// override), fusion by spec, error feedback and DGC memories kept per tensor name,
// hierarchical selection, and the bytes that travel.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "core/runtime.h"
#include "ops/collectives/compressed_allreduce.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "test/support/harness.h"
#include "test/support/runtime_options.h"
#include "test/support/sra_reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

std::vector<double> ExactAverage(int world, size_t n, double noise) {
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < world; ++r) parts.push_back(Gradient(n, r, noise));
  return ExactSum(parts, 1.0 / world);
}

TEST(RuntimeCompression, PolicyFilterAndOverride) {
  const int world = 3;
  std::vector<std::vector<float>> weight(world), bias(world), small(world), forced(world), kept(world);
  RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "4"}}));
    const size_t r = static_cast<size_t>(rt.rank());
    weight[r] = Gradient(64 * 64, rt.rank(), 1e4);
    bias[r] = Gradient(4096, rt.rank(), 1e4);
    small[r] = Gradient(12, rt.rank(), 1e4);
    forced[r] = Gradient(4096, rt.rank(), 1e4);
    kept[r] = Gradient(64 * 64, rt.rank(), 1e4);
    CompressionSpec maxmin2;
    maxmin2.codec = "maxmin";
    maxmin2.bits = 2;
    CompressionSpec none;
    std::vector<std::shared_ptr<Handle>> hs = {
        rt.Allreduce("w", DataType::kFloat32, {64, 64}, weight[r].data(), weight[r].data(), ReduceOp::kAverage),
        rt.Allreduce("b", DataType::kFloat32, {4096}, bias[r].data(), bias[r].data(), ReduceOp::kAverage),
        rt.Allreduce("s", DataType::kFloat32, {3, 4}, small[r].data(), small[r].data(), ReduceOp::kAverage),
        rt.Allreduce("f", DataType::kFloat32, {4096}, forced[r].data(), forced[r].data(), ReduceOp::kAverage, 1, 1,
                     &maxmin2),
        rt.Allreduce("k", DataType::kFloat32, {64, 64}, kept[r].data(), kept[r].data(), ReduceOp::kAverage, 1, 1,
                     &none)};
    for (auto& h : hs) h->Wait();
    if (rt.CompressionFor(DataType::kInt32, {64, 64}, ReduceOp::kSum).codec != "none") return std::string("int");
    if (rt.CompressionFor(DataType::kFloat32, {64, 64}, ReduceOp::kMax).codec != "none") return std::string("max");
    const RuntimeStats s = rt.stats();
    if (s.compressed_bytes_in != (64 * 64 + 4096) * 4) return "compressed bytes in " + std::to_string(s.compressed_bytes_in);
    return std::string();
  });
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(weight[r], weight[0]) << "compressed results differ between ranks";
    EXPECT_EQ(forced[r], forced[0]);
  }
  const double e_weight = RelativeL2(weight[0], ExactAverage(world, 64 * 64, 1e4));
  EXPECT_GT(e_weight, 1e-3) << "the 2-D weight was not compressed";
  EXPECT_LT(e_weight, 0.2);
  EXPECT_LT(RelativeL2(bias[0], ExactAverage(world, 4096, 1e4)), 1e-6) << "1-D tensors stay exact";
  EXPECT_LT(RelativeL2(small[0], ExactAverage(world, 12, 1e4)), 1e-6) << "tensors under the minimum size stay exact";
  EXPECT_LT(RelativeL2(kept[0], ExactAverage(world, 64 * 64, 1e4)), 1e-6) << "an explicit none is exact";
  const double e_forced = RelativeL2(forced[0], ExactAverage(world, 4096, 1e4));
  EXPECT_GT(e_forced, e_weight) << "2-bit override of a 1-D tensor";
}

TEST(RuntimeCompression, OverridesThatCannotApplyAreRejected) {
  RunRanks(1, [&](Communicator& comm) {
    Runtime rt(Options(comm, {}));
    CompressionSpec bad;
    bad.codec = "maxmin";
    bad.bits = 12;
    int32_t x[4] = {1, 2, 3, 4};
    float f[4] = {1, 2, 3, 4};
    try {
      rt.Allreduce("i", DataType::kInt32, {2, 2}, x, x, ReduceOp::kSum, 1, 1, &bad);
      return std::string("int accepted");
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("dtype int32 cannot be compressed"), std::string::npos) << e.what();
    }
    try {
      rt.Allreduce("f", DataType::kFloat32, {2, 2}, f, f, ReduceOp::kSum, 1, 1, &bad);
      return std::string("bits 12 accepted");
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("maxmin: bits=12 is outside 1..8"), std::string::npos) << e.what();
    }
    return std::string();
  });
}

TEST(RuntimeCompression, ErrorFeedbackPerTensorAcrossSteps) {
  const int world = 4, steps = 100;
  const size_t n = 128 * 64;
  std::vector<double> mean(n, 0.0);
  RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "2"},
                              {"GRADCOMP_ERROR_FEEDBACK", "1"}}));
    const std::vector<float> g = Gradient(n, rt.rank(), 0.3);
    std::vector<float> out(n);
    for (int s = 0; s < steps; ++s) {
      rt.Allreduce("w", DataType::kFloat32, {128, 64}, g.data(), out.data(), ReduceOp::kAverage)->Wait();
      if (rt.rank() == 0) {
        for (size_t i = 0; i < n; ++i) mean[i] += out[i] / steps;
      }
    }
    return std::string();
  });
  std::vector<float> m(mean.begin(), mean.end());
  EXPECT_LT(RelativeL2(m, ExactAverage(world, n, 0.3)), 0.01);
}

TEST(RuntimeCompression, TopkWithDgcMomentumAndFusionBySpec) {
  const int world = 2;
  RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "topk"}, {"GRADCOMP_TOPK_RATIO", "0.01"},
                              {"GRADCOMP_TOPK_MOMENTUM", "0.9"}}));
    std::vector<float> a = Gradient(100 * 100, rt.rank(), 1e4), b = Gradient(50 * 50, rt.rank() + 7, 1e4);
    std::vector<float> c(50 * 50, 1.0f);
    for (int step = 0; step < 3; ++step) {
      std::vector<float> oa(a.size()), ob(b.size()), oc(c.size());
      auto ha = rt.Allreduce("a", DataType::kFloat32, {100, 100}, a.data(), oa.data(), ReduceOp::kSum);
      auto hb = rt.Allreduce("b", DataType::kFloat32, {50, 50}, b.data(), ob.data(), ReduceOp::kSum);
      CompressionSpec none;
      auto hc = rt.Allreduce("c", DataType::kFloat32, {50, 50}, c.data(), oc.data(), ReduceOp::kSum, 1, 1, &none);
      ha->Wait();
      hb->Wait();
      hc->Wait();
      size_t nonzero = 0;
      for (float v : oa) nonzero += v != 0.0f;
      if (nonzero < 100 || nonzero > 2 * 130) return "step " + std::to_string(step) + ": " + std::to_string(nonzero) + " values";
      if (oc[0] != 2.0f) return std::string("uncompressed tensor fused with compressed ones");
    }
    return std::string();
  });
}

TEST(RuntimeCompression, HierarchicalAndLeaderOnlyAreBitIdenticalAcrossRanks) {
  for (const char* leader : {"0", "1"}) {
    const int world = 4;
    std::vector<std::vector<float>> outs(world);
    RunRanks(world, [&](Communicator& comm) {
      Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_HIERARCHICAL", "1"},
                                {"GRADCOMP_LOCAL_SIZE", "2"}, {"GRADCOMP_INTRA_BROADCAST", leader}}));
      if (rt.local_size() != 2 || rt.cross_size() != 2) return std::string("topology");
      std::vector<float> g = Gradient(256 * 16, rt.rank(), 1e4);
      rt.Allreduce("w", DataType::kFloat32, {256, 16}, g.data(), g.data(), ReduceOp::kAverage)->Wait();
      outs[static_cast<size_t>(rt.rank())] = g;
      return std::string();
    });
    for (int r = 1; r < world; ++r) EXPECT_EQ(outs[r], outs[0]) << "intra broadcast " << leader;
    const double e = RelativeL2(outs[0], ExactAverage(world, 256 * 16, 1e4));
    EXPECT_GT(e, 1e-4);
    EXPECT_LT(e, 0.2);
  }
}

// Reducescatter and allgather through the runtime (executor_sharded.cc): GRADCOMP_COMPRESSION
// quantizes the reducescatter's pieces, GRADCOMP_ALLGATHER_COMPRESSION the allgather's rows, flat
// and on 2 nodes x 2 (summed and gathered inside the node first); integer tensors, rows under
// GRADCOMP_MIN_SIZE and an explicit none stay exact; sparse codecs are refused by name.
TEST(RuntimeCompression, ReducescatterAndAllgatherFollowTheSettings) {
  for (const char* local : {"2", "0"}) {
    const int world = 4;
    const size_t rows = 64, row = 1024, mine = rows / world * row;
    std::vector<std::vector<float>> reduced(world), gathered(world), exact_gathered(world);
    std::vector<RuntimeStats> stats(world);
    RunRanks(world, [&](Communicator& comm) {
      Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "4"},
                                {"GRADCOMP_ALLGATHER_COMPRESSION", "maxmin"}, {"GRADCOMP_LOCAL_SIZE", local}}));
      const size_t r = static_cast<size_t>(rt.rank());
      const std::vector<float> g = Gradient(rows * row, rt.rank(), 1e4);
      // Refused at the call, before any collective (a rank that returns ends its runtime: the others'
      // later calls would find it shut down).
      CompressionSpec topk;
      topk.codec = "topk";
      try {
        rt.Reducescatter("sparse", DataType::kFloat32, {4, 64}, g.data(), ReduceOp::kSum, 1, 1, &topk);
        return std::string("topk was accepted");
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find("reducescatter of 'sparse' with compression") == std::string::npos ||
            std::string(e.what()).find("compresses allreduces only") == std::string::npos) {
          return std::string("topk: ") + e.what();
        }
      }
      auto rs = rt.Reducescatter("grad", DataType::kFloat32, {int64_t(rows), int64_t(row)}, g.data(), ReduceOp::kAverage);
      const std::vector<float> w(g.begin(), g.begin() + static_cast<long>(mine));
      auto ag = rt.Allgather("weight", DataType::kFloat32, {int64_t(rows / world), int64_t(row)}, w.data());
      CompressionSpec none;
      auto exact = rt.Allgather("exact", DataType::kFloat32, {int64_t(rows / world), int64_t(row)}, w.data(), &none);
      const std::vector<int32_t> ints(rows * 4, rt.rank() + 1);
      auto is = rt.Reducescatter("ints", DataType::kInt32, {int64_t(rows), 4}, ints.data(), ReduceOp::kSum);
      const auto floats = [](const Handle& h) {
        std::vector<float> v(h.output().size() / sizeof(float));
        std::memcpy(v.data(), h.output().data(), h.output().size());
        return v;
      };
      rs->Wait();
      ag->Wait();
      exact->Wait();
      is->Wait();
      reduced[r] = floats(*rs);
      gathered[r] = floats(*ag);
      exact_gathered[r] = floats(*exact);
      std::vector<int32_t> summed(rows / world * 4);
      std::memcpy(summed.data(), is->output().data(), summed.size() * sizeof(int32_t));
      if (summed != std::vector<int32_t>(summed.size(), world * (world + 1) / 2)) return std::string("int sums");
      stats[r] = rt.stats();
      return std::string();
    });
    const std::string where = std::string("local size ") + local;
    std::vector<std::vector<float>> parts;
    for (int r = 0; r < world; ++r) parts.push_back(Gradient(rows * row, r, 1e4));
    const std::vector<double> exact = ExactSum(parts, 1.0 / world);
    std::vector<float> all_reduced;
    for (const auto& part : reduced) all_reduced.insert(all_reduced.end(), part.begin(), part.end());
    const double e = RelativeL2(all_reduced, exact);
    EXPECT_GT(e, 1e-3) << where << ": the reducescatter was not compressed";
    EXPECT_LT(e, 0.2) << where;
    for (int r = 0; r < world; ++r) {
      EXPECT_EQ(gathered[r], gathered[0]) << where << ": rank " << r << "'s gathered weights differ";
      EXPECT_EQ(exact_gathered[r], exact_gathered[0]) << where;
      // 4 bits of the reducescatter's peers' shards and 8 of the allgather's rows, with their metadata.
      EXPECT_GT(stats[r].compressed_bytes_on_wire, 0u) << where;
      EXPECT_LT(stats[r].compressed_bytes_on_wire, stats[r].compressed_bytes_in / 3) << where;
    }
    std::vector<double> weights(exact_gathered[0].begin(), exact_gathered[0].end());
    const double ew = RelativeL2(gathered[0], weights);
    EXPECT_GT(ew, 1e-5) << where << ": the allgather was not compressed";
    EXPECT_LT(ew, 0.01) << where;
  }
}

// Each rank's results of a compressed and an exact reducescatter and allgather, into the handle
// or (`into`) into buffers of the caller's; a buffer 4 bytes short on rank `short_rank` (-1:
// none) stays as it was and its operation fails there with the message kept in `errors`.
struct ShardResults {
  std::vector<std::vector<std::vector<float>>> outputs;  // [rank][operation]
  std::vector<std::string> errors;                       // [rank]
};

ShardResults ShardsThroughRuntime(int world, const char* local, bool into, int short_rank) {
  const size_t rows = 64, row = 1024, shard = rows / static_cast<size_t>(world) * row;
  ShardResults out{std::vector<std::vector<std::vector<float>>>(world), std::vector<std::string>(world)};
  const auto results = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "4"},
                              {"GRADCOMP_ALLGATHER_COMPRESSION", "maxmin"}, {"GRADCOMP_LOCAL_SIZE", local}}));
    const int me = rt.rank();
    const std::vector<float> g = Gradient(rows * row, me, 1e4);
    CompressionSpec none;
    std::vector<std::vector<float>>& mine = out.outputs[static_cast<size_t>(me)];
    mine.assign(4, std::vector<float>());
    std::vector<std::shared_ptr<Handle>> handles;
    for (size_t op = 0; op < 4; ++op) {
      const bool gather = op >= 2;
      const CompressionSpec* spec = op % 2 == 0 ? nullptr : &none;
      const size_t count = gather ? rows * row : shard;
      mine[op].assign(count, -7.0f);  // what a refused buffer still holds
      OutputBuffer buffer;
      if (into) buffer = {mine[op].data(), count * sizeof(float) - (me == short_rank && gather ? 4 : 0)};
      const std::string name = std::string(gather ? "weight" : "grad") + (spec ? ".exact" : "");
      handles.push_back(gather ? rt.Allgather(name, DataType::kFloat32, {int64_t(rows) / world, int64_t(row)},
                                              g.data(), spec, {}, buffer)
                               : rt.Reducescatter(name, DataType::kFloat32, {int64_t(rows), int64_t(row)}, g.data(),
                                                  ReduceOp::kAverage, 1.0, 1.0, spec, {}, buffer));
    }
    for (size_t op = 0; op < 4; ++op) {
      try {
        handles[op]->Wait();
      } catch (const InvalidArgument& e) {
        out.errors[static_cast<size_t>(me)] += e.what();
        continue;
      }
      if (into) continue;
      if (handles[op]->output().size() != mine[op].size() * sizeof(float)) return std::string("output size");
      std::memcpy(mine[op].data(), handles[op]->output().data(), handles[op]->output().size());
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
  return out;
}

// OutputBuffer (allgather_async's and reducescatter_async's `output`, FSDP's unsharded
// parameters): the caller's buffers receive the bytes the handle would hold, compressed (decoded
// there) and exact, flat and on 2 nodes x 2; a buffer of the wrong size fails only its rank's
// operation, naming both sizes, and is left as it was.
TEST(RuntimeCompression, CallersBuffersReceiveTheResultsAndOneOfAnotherSizeFailsOnlyItsRank) {
  for (const char* local : {"2", "0"}) {
    const ShardResults held = ShardsThroughRuntime(4, local, false, -1);
    const ShardResults given = ShardsThroughRuntime(4, local, true, -1);
    EXPECT_EQ(given.outputs, held.outputs) << "local size " << local;
    for (const std::string& e : held.errors) EXPECT_EQ(e, "");
    for (const std::string& e : given.errors) EXPECT_EQ(e, "");
    const ShardResults wrong = ShardsThroughRuntime(4, local, true, 1);
    for (size_t r = 0; r < 4; ++r) {
      for (size_t op = 0; op < 4; ++op) {
        if (r == 1 && op >= 2) {
          EXPECT_EQ(wrong.outputs[r][op], std::vector<float>(wrong.outputs[r][op].size(), -7.0f)) << op;
        } else {
          EXPECT_EQ(wrong.outputs[r][op], held.outputs[r][op]) << "rank " << r << ", operation " << op;
        }
      }
      if (r != 1) {
        EXPECT_EQ(wrong.errors[r], "") << r;
      }
    }
    EXPECT_NE(wrong.errors[1].find("allgather of 'weight': the output buffer holds 262140 bytes, the result "
                                   "[64, 1024] of float32 is 262144"),
              std::string::npos)
        << wrong.errors[1];
    EXPECT_NE(wrong.errors[1].find("allgather of 'weight.exact'"), std::string::npos) << wrong.errors[1];
  }
}

// Every rank's result of one max-min allreduce of a 256 x 64 gradient through the runtime with
// the settings `vars`.
std::vector<std::vector<float>> ThroughRuntime(int world, const std::map<std::string, std::string>& vars) {
  std::vector<std::vector<float>> outs(static_cast<size_t>(world));
  RunRanks(world, [&](Communicator& comm) {
    std::map<std::string, std::string> all = vars;
    all["GRADCOMP_COMPRESSION"] = "maxmin";
    Runtime rt(Options(comm, all));
    std::vector<float> g = Gradient(256 * 64, rt.rank(), 1e4);
    rt.Allreduce("w", DataType::kFloat32, {256, 64}, g.data(), g.data(), ReduceOp::kAverage)->Wait();
    outs[static_cast<size_t>(rt.rank())] = g;
    return std::string();
  });
  return outs;
}

// GRADCOMP_COMPRESSED_ALGORITHM: the runtime's bytes are those of the 2-D SRA over the world's
// grid (2 rows x 4 here) when asked for, or when auto and the world reaches GRADCOMP_GRID_MIN_RANKS,
// and flat SRA's otherwise (the 2-D SRA quantizes the row sums once more: other bytes).
TEST(RuntimeCompression, CompressedAlgorithmPicksTheGridFromItsSizeOn) {
  const int world = 8;
  const auto direct = [&](bool grid) {
    std::vector<std::vector<float>> outs(world);
    RunRanks(world, [&](Communicator& comm) {
      const std::vector<float> g = Gradient(256 * 64, comm.rank(), 1e4);
      std::vector<float> out(g.size());
      if (grid) {
        CompressedAllreduce2d(MakeGrid(comm), AverageWith(g, out));
      } else {
        CompressedAllreduce(comm, AverageWith(g, out));
      }
      outs[static_cast<size_t>(comm.rank())] = out;
      return std::string();
    });
    return outs;
  };
  const auto grid = direct(true), flat = direct(false);
  ASSERT_NE(grid[0], flat[0]);
  EXPECT_EQ(ThroughRuntime(world, {{"GRADCOMP_COMPRESSED_ALGORITHM", "sra2d"}}), grid);
  EXPECT_EQ(ThroughRuntime(world, {{"GRADCOMP_GRID_MIN_RANKS", "8"}}), grid);
  EXPECT_EQ(ThroughRuntime(world, {}), flat);  // auto: 8 ranks are below the default 32
  EXPECT_EQ(ThroughRuntime(world, {{"GRADCOMP_COMPRESSED_ALGORITHM", "sra"}, {"GRADCOMP_GRID_MIN_RANKS", "4"}}), flat);
}

// Every rank's result of one max-min allreduce of a 256 x 64 gradient on `local` ranks a node:
// on the grid whose rows are the nodes, its columns across nodes on the nested grid of `cross`
// (MakeNodeGrid), or with `node_rows` false flat SRA over the world.
std::vector<std::vector<float>> OnNodeGrid(int world, int local, bool node_rows, const std::vector<int>& cross = {}) {
  std::vector<std::vector<float>> outs(static_cast<size_t>(world));
  RunTopology(world, local, [&](Topology& topo) {
    const std::vector<float> g = Gradient(256 * 64, topo.rank(), 1e4);
    std::vector<float> out(g.size());
    if (node_rows) {
      CompressedAllreduce2d(MakeNodeGrid(topo, cross), AverageWith(g, out));
    } else {
      CompressedAllreduce(*topo.world, AverageWith(g, out));
    }
    outs[static_cast<size_t>(topo.rank())] = out;
    return std::string();
  });
  return outs;
}

// On nodes of several ranks the runtime's grid has the nodes as rows (whatever the world's
// size), and its columns across the nodes run a grid of their own once they reach
// GRADCOMP_GRID_MIN_RANKS; GRADCOMP_COMPRESSED_ALGORITHM=sra is flat SRA: 8 nodes of 2 ranks.
TEST(RuntimeCompression, OnNodesOfSeveralRanksTheGridsRowsAreTheNodes) {
  const int world = 16, local = 2;
  const auto on_nodes = [&](std::map<std::string, std::string> vars) {
    vars["GRADCOMP_LOCAL_SIZE"] = std::to_string(local);
    return ThroughRuntime(world, vars);
  };
  const auto nested = OnNodeGrid(world, local, true, {0}), flat_across = OnNodeGrid(world, local, true),
             flat = OnNodeGrid(world, local, false);
  ASSERT_NE(nested[0], flat_across[0]);
  ASSERT_NE(flat[0], flat_across[0]);
  EXPECT_EQ(on_nodes({}), flat_across);  // 16 ranks, 8 nodes: below 32, node rows all the same
  EXPECT_EQ(on_nodes({{"GRADCOMP_GRID_MIN_RANKS", "8"}}), nested);  // 8 nodes: a grid across
  EXPECT_EQ(on_nodes({{"GRADCOMP_COMPRESSED_ALGORITHM", "sra2d"}}), nested);
  EXPECT_EQ(on_nodes({{"GRADCOMP_COMPRESSED_ALGORITHM", "sra"}}), flat);
}

// The grid across nodes keeps a node's messages in a row step under GRADCOMP_GRID_NODE_MESSAGES
// (rows of at most that over the ranks a node) and nests its columns by the same rule (GridShape):
// 16 nodes of 2 ranks with at most 4 messages a node run rows of 2 nodes at three levels across
// them (16 = 2 x 8, 8 = 2 x 4, 4 = 2 x 2), four grid levels in all (five quantizations); at the
// default, the most square 4 x 4.
TEST(RuntimeCompression, GridsAcrossNodesNestAsTheNodesMessagesBoundSays) {
  const int world = 32, local = 2;
  const auto on_nodes = [&](std::map<std::string, std::string> vars) {
    vars["GRADCOMP_LOCAL_SIZE"] = std::to_string(local);
    vars["GRADCOMP_GRID_MIN_RANKS"] = "4";
    return ThroughRuntime(world, vars);
  };
  const auto deepest = OnNodeGrid(world, local, true, {2, 2, 2}), square = OnNodeGrid(world, local, true, {4});
  ASSERT_NE(deepest[0], square[0]);
  EXPECT_EQ(on_nodes({{"GRADCOMP_GRID_NODE_MESSAGES", "4"}}), deepest);
  EXPECT_EQ(on_nodes({}), square);
}

TEST(RuntimeCompression, FourBitSendsAboutAnEighthOfTheBytes) {
  RunRanks(2, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"CGX_COMPRESSION_QUANTIZATION_BITS", "4"}}));
    std::vector<float> g = Gradient(1 << 16, rt.rank(), 1e4);
    rt.Allreduce("w", DataType::kFloat32, {256, 256}, g.data(), g.data(), ReduceOp::kAverage)->Wait();
    const RuntimeStats s = rt.stats();
    const double ratio = double(s.compressed_bytes_in) / double(s.compressed_bytes_on_wire);
    // 2 ranks: each sends half the tensor encoded, then its encoded half: 2 * (1/2) / 7.76.
    EXPECT_NEAR(ratio, 7.76, 0.05) << s.compressed_bytes_in << " in, " << s.compressed_bytes_on_wire << " on the wire";
    return std::string();
  });
}

}  // namespace
}  // namespace gradcomp
