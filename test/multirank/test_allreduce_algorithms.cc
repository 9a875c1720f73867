// The compressed allreduce's table of algorithms (ops/collectives/allreduce_algorithms.h) over
// thread ranks: the row each codec, topology and setting gets, a test-only row added through the
// table and run, and the rows' estimates of their bytes against what they sent; the reduce-
// scatter's and allgather's table (compressed and not); the uncompressed allreduce's table (uncompressed_algorithms.h): the row each op,
// topology and hierarchy gets, and FusedAllreduce running it.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <mutex>
#include <set>

#include "ops/collectives/allreduce_algorithms.h"
#include "ops/collectives/shard_algorithms.h"
#include "ops/collectives/uncompressed_algorithms.h"
#include "ops/common/enforce.h"
#include "ops/compression/codec.h"
#include "test/support/harness.h"
#include "test/support/sra_reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

AllreduceCase CaseFor(Topology& topo, AllreducePlanner& planner, const char* codec, size_t count) {
  AllreduceCase c;
  c.codec = &FindCodec(codec);
  c.topo = &topo;
  c.count = count;
  c.params.bits = 4;
  c.params.bucket_size = 512;
  c.params.topk_ratio = 0.01;
  c.planner = &planner;
  return c;
}

struct Choice {
  AlgorithmSettings settings;
  const char* codec = "maxmin";
  bool hierarchy = false;
  bool host_memory = true;
};

// What every rank of `world` ranks in nodes of `local` (0: one node) chooses; fails the test
// where ranks disagree.
std::string Agreed(int world, int local, const std::function<std::string(Topology&)>& choose) {
  std::mutex m;
  std::set<std::string> names;
  const auto errors = RunTopology(world, local, [&](Topology& topo) {
    const std::string name = choose(topo);
    std::lock_guard<std::mutex> lock(m);
    names.insert(name);
    return std::string();
  });
  EXPECT_EQ(Failures(errors), "");
  EXPECT_EQ(names.size(), 1u) << "the ranks chose different rows";
  return names.empty() ? "" : *names.begin();
}

// The allreduce's row.
std::string Chosen(int world, int local, const Choice& choice) {
  return Agreed(world, local, [&](Topology& topo) {
    AllreducePlanner planner(choice.settings);
    AllreduceCase c = CaseFor(topo, planner, choice.codec, 1 << 12);
    c.hierarchy = choice.hierarchy;
    c.host_memory = choice.host_memory;
    return std::string(planner.Choose(c).name);
  });
}

Choice Named(const char* algorithm) {
  Choice c;
  c.settings.algorithm = algorithm;
  return c;
}

TEST(AllreduceTable, ListsTheBuiltInRowsInTheOrderTheyAreTried) {
  std::vector<std::string> names;
  for (const AllreduceAlgorithm& row : AllreduceAlgorithms()) names.push_back(row.name);
  EXPECT_EQ(names, (std::vector<std::string>{"sparse", "hierarchical", "sra2d", "sra"}));
  EXPECT_EQ(LookupAllreduceAlgorithm("ring"), nullptr);
  ASSERT_NE(LookupAllreduceAlgorithm("sra2d"), nullptr);
  EXPECT_EQ(LookupAllreduceAlgorithm("sra2d")->min_ranks, 4);
}

TEST(AllreduceTable, SparseCodecsTakeTheAllgatherWhateverTheSetting) {
  Choice topk;
  topk.codec = "topk";
  EXPECT_EQ(Chosen(4, 1, topk), "sparse");
  topk.settings.algorithm = "sra2d";
  topk.hierarchy = true;
  EXPECT_EQ(Chosen(4, 2, topk), "sparse");
}

TEST(AllreduceTable, FlatSraUntilTheGridPaysOrIsAskedFor) {
  EXPECT_EQ(Chosen(4, 1, Choice{}), "sra");  // auto: a grid from 32 ranks on
  EXPECT_EQ(Chosen(4, 1, Named("sra2d")), "sra2d");
  EXPECT_EQ(Chosen(3, 1, Named("sra2d")), "sra");  // under 4 ranks: no grid
  EXPECT_EQ(Chosen(5, 1, Named("sra2d")), "sra");  // a prime number of ranks: one row
  Choice small_grids;
  small_grids.settings.grid_min_ranks = 6;
  EXPECT_EQ(Chosen(6, 1, small_grids), "sra2d");
  EXPECT_EQ(Chosen(4, 1, small_grids), "sra");
  EXPECT_EQ(Chosen(4, 0, Named("sra2d")), "sra2d");  // one node: the most square grid
}

TEST(AllreduceTable, NodesOfSeveralRanksTakeNodeRowsUnlessFlatOrHierarchicalIsAsked) {
  EXPECT_EQ(Chosen(4, 2, Choice{}), "sra2d");
  EXPECT_EQ(Chosen(4, 2, Named("sra")), "sra");
  Choice hierarchy;
  hierarchy.hierarchy = true;
  EXPECT_EQ(Chosen(4, 2, hierarchy), "hierarchical");
  EXPECT_EQ(Chosen(4, 0, hierarchy), "sra");  // one node: nothing to cross
  EXPECT_EQ(Chosen(4, 1, hierarchy), "sra");  // nodes of one rank
}

TEST(UncompressedTable, ListsTheRowsInTheOrderTheyAreTried) {
  std::vector<std::string> names;
  for (const UncompressedAllreduceAlgorithm& row : UncompressedAllreduceAlgorithms()) names.push_back(row.name);
  EXPECT_EQ(names, (std::vector<std::string>{"adasum_nodes", "adasum", "hierarchical", "node", "communicator"}));
  EXPECT_EQ(LookupUncompressedAllreduce("sra"), nullptr);  // the compressed table's, with the exact codec
  ASSERT_NE(LookupUncompressedAllreduce("node"), nullptr);
  EXPECT_TRUE(LookupUncompressedAllreduce("node")->one_node);
  EXPECT_EQ(std::string(CommunicatorAllreduce().name), "communicator");
}

// The uncompressed row every rank of `world` ranks in nodes of `local` (0: one node) chooses.
std::string UncompressedChosen(int world, int local, ReduceOp op, bool hierarchy) {
  return Agreed(world, local, [&](Topology& topo) {
    return std::string(ChooseUncompressedAllreduce({&topo, op, DataType::kFloat32, 1 << 12, hierarchy}).name);
  });
}

TEST(UncompressedTable, TheOpTheHierarchyAndTheNodesChooseTheRow) {
  EXPECT_EQ(UncompressedChosen(4, 0, ReduceOp::kSum, false), "node");  // one node: its communicator
  EXPECT_EQ(UncompressedChosen(4, 2, ReduceOp::kSum, false), "communicator");
  EXPECT_EQ(UncompressedChosen(4, 1, ReduceOp::kAverage, false), "communicator");
  EXPECT_EQ(UncompressedChosen(4, 2, ReduceOp::kMax, true), "hierarchical");
  EXPECT_EQ(UncompressedChosen(4, 2, ReduceOp::kAdasum, false), "adasum");
  EXPECT_EQ(UncompressedChosen(4, 2, ReduceOp::kAdasum, true), "adasum_nodes");
  EXPECT_EQ(UncompressedChosen(4, 0, ReduceOp::kAdasum, false), "adasum");  // Adasum's tree on one node too
}

// FusedAllreduce runs the row it returns: two tensors summed over 2 nodes of 2 ranks, flat and
// hierarchical, give every rank the sum; the rows estimate a ring's messages.
TEST(UncompressedTable, FusedAllreduceRunsTheChosenRow) {
  for (bool hierarchy : {false, true}) {
    const auto errors = RunTopology(4, 2, [&](Topology& topo) {
      std::vector<float> a(3001, static_cast<float>(topo.rank() + 1)), b(517, static_cast<float>(10 * topo.rank()));
      const std::vector<BufferPiece> pieces{{a.data(), a.data(), a.size()}, {b.data(), b.data(), b.size()}};
      AllreduceOptions o;
      o.dtype = DataType::kFloat32;
      o.op = ReduceOp::kSum;
      o.name = "pair";
      std::vector<char> fusion;
      const UncompressedAllreduceAlgorithm& row = FusedAllreduce(topo, hierarchy, pieces, o, fusion);
      if (std::string(row.name) != (hierarchy ? "hierarchical" : "communicator")) return std::string(row.name);
      for (float v : a) {
        if (v != 10.0f) return "a holds " + std::to_string(v);
      }
      for (float v : b) {
        if (v != 60.0f) return "b holds " + std::to_string(v);
      }
      const UncompressedCase c{&topo, o.op, o.dtype, a.size() + b.size(), hierarchy};
      // A ring over the 4 ranks: 6 messages; the node's two halves (2) and the ring across 2 nodes (2).
      const size_t messages = row.cost(c).messages;
      if (messages != (hierarchy ? 4u : 6u)) return "estimated " + std::to_string(messages) + " messages";
      return std::string();
    });
    EXPECT_EQ(Failures(errors), "") << (hierarchy ? "hierarchical" : "flat");
  }
}

TEST(AllreduceTable, AnUnknownSettingNamesItselfAndTheRows) {
  AlgorithmSettings s;
  s.algorithm = "ring";
  try {
    AllreducePlanner planner(s);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(),
                 "GRADCOMP_COMPRESSED_ALGORITHM='ring': no such allreduce algorithm (auto, sparse, hierarchical, "
                 "sra2d, sra)");
  }
  try {
    ParseUncompressedAlgorithm("ring");
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "GRADCOMP_UNCOMPRESSED_ALGORITHM='ring': auto, mpi or sra");
  }
  EXPECT_EQ(ParseUncompressedAlgorithm("mpi"), UncompressedAlgorithm::kCommunicator);
}

// The sharded collectives' row.
std::string ShardChosen(int world, int local, const char* algorithm, bool host_memory = true,
                        UncompressedAlgorithm uncompressed = UncompressedAlgorithm::kAuto, bool compressed = true) {
  AlgorithmSettings settings;
  settings.algorithm = algorithm;
  settings.uncompressed = uncompressed;
  return Agreed(world, local, [&](Topology& topo) {
    const AllreducePlanner planner(settings);
    ShardCase c;
    c.topo = &topo;
    c.flat = topo.world.get();
    c.host_memory = host_memory;
    c.planner = &planner;
    c.compressed = compressed;
    return std::string(ChooseShardAlgorithm(c).name);
  });
}

TEST(ShardTable, NodesOfSeveralRanksGoNodeFirstInHostMemoryUnlessFlatIsAsked) {
  std::vector<std::string> names;
  for (const ShardAlgorithm& row : ShardAlgorithms()) names.push_back(row.name);
  EXPECT_EQ(names, (std::vector<std::string>{"node_first", "flat"}));
  EXPECT_EQ(ShardChosen(4, 2, "auto"), "node_first");
  EXPECT_EQ(ShardChosen(4, 2, "sra2d"), "node_first");
  EXPECT_EQ(ShardChosen(4, 2, "sra"), "flat");
  EXPECT_EQ(ShardChosen(4, 2, "auto", false), "flat");  // a device's buffers
  EXPECT_EQ(ShardChosen(4, 1, "auto"), "flat");
  EXPECT_EQ(ShardChosen(4, 0, "auto"), "flat");
  // The uncompressed forms: flat only where GRADCOMP_UNCOMPRESSED_ALGORITHM=mpi asks (not sra's setting).
  const auto kAuto = UncompressedAlgorithm::kAuto, kMpi = UncompressedAlgorithm::kCommunicator;
  EXPECT_EQ(ShardChosen(4, 2, "sra", true, kAuto, false), "node_first");
  EXPECT_EQ(ShardChosen(4, 2, "auto", true, kMpi, false), "flat");
  EXPECT_EQ(ShardChosen(4, 2, "auto", true, kMpi, true), "node_first");
  EXPECT_EQ(ShardChosen(4, 2, "auto", false, kAuto, false), "flat");  // a device's buffers
  EXPECT_EQ(ShardChosen(4, 1, "auto", true, kAuto, false), "flat");
}

// A test-only row: every rank's raw float32 values allgathered and summed in rank order on every
// rank, in host memory only, chosen only where the setting names it.
constexpr const char* kToy = "toy_allgather";

bool ToyNamed(const AllreduceCase& c) { return c.planner->settings().algorithm == kToy; }

AlgorithmCost ToyCost(const AllreduceCase& c) {
  const auto peers = static_cast<size_t>(c.topo->world->size() - 1);
  return {peers, peers * c.count * sizeof(float)};
}

CompressedAllreduceStats ToyRun(const AllreduceCase& c, const CompressedAllreduceOptions& o) {
  Communicator& comm = *c.topo->world;
  const auto n = static_cast<size_t>(comm.size());
  std::vector<float> all(n * o.count);
  comm.Allgatherv(o.input, all.data(), std::vector<size_t>(n, o.count * sizeof(float)));
  auto* out = static_cast<float*>(o.output);
  const float scale = o.op == ReduceOp::kAverage ? 1.0f / static_cast<float>(n) : 1.0f;
  for (size_t i = 0; i < o.count; ++i) {
    float sum = 0;
    for (size_t r = 0; r < n; ++r) sum += all[r * o.count + i];
    out[i] = sum * scale;
  }
  CompressedAllreduceStats st;
  st.bytes_sent = ToyCost(c).wire_bytes;
  return st;
}

class ToyRow : public ::testing::Test {
 protected:
  void SetUp() override {
    RegisterAllreduceAlgorithm(
        {kToy, "allgather and sum (test only)", CodecKind::kDense, false, 1, true, ToyNamed, ToyCost, ToyRun});
  }
  void TearDown() override { UnregisterAllreduceAlgorithm(kToy); }
};

TEST_F(ToyRow, IsAddedThroughTheTableAndRunsWhereItsNeedsHoldAndTheSettingNamesIt) {
  EXPECT_EQ(AllreduceAlgorithms().front().name, std::string(kToy));
  EXPECT_THROW(RegisterAllreduceAlgorithm(AllreduceAlgorithms().front()), InvalidArgument);
  EXPECT_EQ(Chosen(3, 1, Choice{}), "sra");  // not named: the rows it goes ahead of
  EXPECT_EQ(Chosen(3, 1, Named(kToy)), kToy);
  Choice on_device = Named(kToy);
  on_device.host_memory = false;
  EXPECT_EQ(Chosen(3, 1, on_device), "sra");  // its needs: host memory
  Choice topk = Named(kToy);
  topk.codec = "topk";
  EXPECT_EQ(Chosen(3, 1, topk), "sparse");  // and a dense codec

  // Run through the table: the exact average, on every rank.
  const int world = 3;
  const size_t count = 3000;
  std::vector<std::vector<float>> parts(world, std::vector<float>(count));
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) parts[r][i] = std::sin(0.01f * static_cast<float>(i + 7 * r));
  }
  const std::vector<double> exact = ExactSum(parts, 1.0 / world);
  const auto errors = RunTopology(world, 1, [&](Topology& topo) {
    AllreducePlanner planner(Named(kToy).settings);
    std::vector<float> out(count);
    const CompressedAllreduceOptions o = AverageWith(parts[static_cast<size_t>(topo.rank())], out, "maxmin");
    const CompressedAllreduceStats st = planner.Run(CaseFor(topo, planner, "maxmin", count), o);
    if (st.bytes_sent != 2 * count * sizeof(float)) return "sent " + std::to_string(st.bytes_sent);
    for (size_t i = 0; i < count; ++i) {
      if (std::fabs(out[i] - exact[i]) > 1e-6) return "value " + std::to_string(i) + ": " + std::to_string(out[i]);
    }
    return std::string();
  });
  EXPECT_EQ(Failures(errors), "");
}

// What each dense row sent against its estimate, and its estimated messages.
TEST(AllreduceTable, EstimatesTheBytesTheRowsSend) {
  const size_t count = size_t{1} << 18;
  for (const char* algorithm : {"sra", "sra2d"}) {
    SCOPED_TRACE(algorithm);
    const auto errors = RunTopology(4, 1, [&](Topology& topo) {
      AllreducePlanner planner(Named(algorithm).settings);
      std::vector<float> in(count), out(count);
      for (size_t i = 0; i < count; ++i) in[i] = std::cos(0.001f * static_cast<float>(i) + topo.rank());
      const CompressedAllreduceOptions o = AverageWith(in, out, "maxmin", 4, 512);
      const AllreduceCase c = CaseFor(topo, planner, "maxmin", count);
      const AllreduceAlgorithm& row = planner.Choose(c);
      const CompressedAllreduceStats st = planner.Run(c, o);
      const AlgorithmCost cost = row.cost(c);
      const size_t messages = row.name == std::string("sra") ? 6 : 4;  // 2 (n - 1); 2 (2 + 2 - 2)
      if (cost.messages != messages) return "messages " + std::to_string(cost.messages);
      const double ratio = static_cast<double>(cost.wire_bytes) / static_cast<double>(st.bytes_sent);
      if (ratio < 0.97 || ratio > 1.03) {
        return "estimated " + std::to_string(cost.wire_bytes) + " bytes, sent " + std::to_string(st.bytes_sent);
      }
      return std::string();
    });
    EXPECT_EQ(Failures(errors), "");
  }
}

}  // namespace
}  // namespace gradcomp
