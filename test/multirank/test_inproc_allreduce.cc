// Allreduce over thread ranks: every dtype and op (with prescale/postscale variants) at
// counts {0, 1, 7, 4097, 1<<20}, world sizes 1-8, flat and hierarchical, against float64.
#include <gtest/gtest.h>

#include <cstring>

#include "ops/collectives/allreduce.h"
#include "ops/common/enforce.h"
#include "test/support/harness.h"
#include "test/support/reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

const std::vector<size_t> kCounts = {0, 1, 7, 4097, size_t{1} << 20};

class FlatAllreduce : public ::testing::TestWithParam<int> {};

TEST_P(FlatAllreduce, EveryDtypeOpAndCount) {
  const int world = GetParam();
  for (const ReduceCase& c : AllReduceCases(kCounts)) {
    const std::vector<double> expected = ExpectedReduction(c, world, 0, c.count);
    const auto results = RunRanks(world, [&](Communicator& comm) {
      std::vector<char> in = MakeInput(c.dtype, c.op, c.count, comm.rank());
      std::vector<char> out(in.size());
      Allreduce(comm, ToAllreduceOptions(c, in.data(), out.data()));
      std::string err = CompareReduction(c, world, out.data(), expected);
      if (!err.empty()) return err;
      Allreduce(comm, ToAllreduceOptions(c, in.data(), in.data()));  // in place
      if (!SameBytes(in.data(), out.data(), in.size())) return c.Describe() + ": in-place result differs";
      return std::string();
    });
    ASSERT_EQ(Failures(results), "") << c.Describe();
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, FlatAllreduce, ::testing::Range(1, 9));

struct HierarchyShape {
  int world;
  int local;
};

class HierarchicalAllreduceTest : public ::testing::TestWithParam<HierarchyShape> {};

TEST_P(HierarchicalAllreduceTest, EqualsTheReference) {
  // Plain names, not a structured binding: C++17 lambdas cannot capture one.
  const int world = GetParam().world, local = GetParam().local;
  for (const ReduceCase& c : AllReduceCases({0, 1, 7, 4097, 65537})) {
    const std::vector<double> expected = ExpectedReduction(c, world, 0, c.count);
    const auto results = RunTopology(world, local, [&](Topology& topo) {
      if (topo.local_size() != local || topo.cross_size() != world / local) {
        return std::string("unexpected topology ") + std::to_string(topo.local_size()) + "x" +
               std::to_string(topo.cross_size());
      }
      std::vector<char> in = MakeInput(c.dtype, c.op, c.count, topo.rank());
      std::vector<char> out(in.size());
      HierarchicalAllreduce(topo, ToAllreduceOptions(c, in.data(), out.data()));
      return CompareReduction(c, world, out.data(), expected);
    });
    ASSERT_EQ(Failures(results), "") << c.Describe() << " world=" << world << " local=" << local;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, HierarchicalAllreduceTest,
                         ::testing::Values(HierarchyShape{2, 1}, HierarchyShape{2, 2}, HierarchyShape{4, 2},
                                           HierarchyShape{6, 2}, HierarchyShape{6, 3}, HierarchyShape{8, 2},
                                           HierarchyShape{8, 4}),
                         [](const ::testing::TestParamInfo<HierarchyShape>& shape) {
                           return "world" + std::to_string(shape.param.world) + "_local" +
                                  std::to_string(shape.param.local);
                         });

TEST(AllreduceErrors, AverageOfBoolNamesTheTensor) {
  const auto run = [] {
    RunRanks(2, [](Communicator& comm) {
      bool b[3] = {true, false, true};
      AllreduceOptions o;
      o.input = b;
      o.output = b;
      o.count = 3;
      o.dtype = DataType::kBool;
      o.op = ReduceOp::kAverage;
      o.name = "mask";
      Allreduce(comm, o);
      return std::string();
    });
  };
  try {
    run();
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("average is not defined for bool"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("[allreduce of tensor 'mask']"), std::string::npos) << e.what();
  }
}

TEST(Topology, ForcedLocalSizeMustDivideTheWorld) {
  try {
    RunTopology(4, 3, [](Topology&) { return std::string(); });
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("GRADCOMP_LOCAL_SIZE=3 does not divide the world size 4"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gradcomp
