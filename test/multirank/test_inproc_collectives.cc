// Allgather, broadcast, alltoall, reducescatter (flat and node first), barrier, split and point-to-point over
// thread ranks, world sizes 1-8, every dtype, counts including 0; over the in-process
// communicator and over TCP connections between the threads (tcp_communicator.h).
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <functional>
#include <tuple>

#include "ops/collectives/allgather.h"
#include "ops/collectives/alltoall.h"
#include "ops/collectives/barrier.h"
#include "ops/collectives/broadcast.h"
#include "ops/collectives/reducescatter.h"
#include "ops/common/enforce.h"
#include "test/support/harness.h"
#include "test/support/reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

// Elements rank r contributes to allgather case `base`: differs per rank, sometimes 0.
size_t GatherCount(size_t base, int r) { return (base == 0 || r % 3 == 2) ? 0 : base + static_cast<size_t>(r); }

// (world size, transport)
class Collectives : public ::testing::TestWithParam<std::tuple<int, RankTransport>> {
 protected:
  std::vector<std::string> RunRanks(int world, const std::function<std::string(Communicator&)>& fn) {
    return testing::RunRanks(world, fn, std::get<1>(GetParam()));
  }
};

// Each test runs its cases inside one world (one set of connections over TCP).
TEST_P(Collectives, AllgatherWithDifferentCountsPerRank) {
  const int world = std::get<0>(GetParam());
  const auto results = RunRanks(world, [&](Communicator& comm) {
    for (DataType dt : AllDataTypes()) {
      for (size_t base : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}}) {
        std::vector<char> expected;
        for (int r = 0; r < world; ++r) {
          std::vector<char> part = MakeInput(dt, ReduceOp::kSum, GatherCount(base, r), r);
          expected.insert(expected.end(), part.begin(), part.end());
        }
        const size_t mine = GatherCount(base, comm.rank());
        std::vector<char> in = MakeInput(dt, ReduceOp::kSum, mine, comm.rank());
        AllgatherOptions o;
        o.input = in.data();
        o.count = mine;
        o.counts = AllgatherCounts(comm, mine);
        o.dtype = dt;
        std::vector<char> out(expected.size());
        o.output = out.data();
        Allgather(comm, o);
        if (out != expected) return std::string("allgather ") + DataTypeName(dt) + " base " + std::to_string(base) + " differs";
      }
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST_P(Collectives, BroadcastFromEveryRoot) {
  const int world = std::get<0>(GetParam());
  const auto results = RunRanks(world, [&](Communicator& comm) {
    for (DataType dt : AllDataTypes()) {
      for (size_t count : {size_t{0}, size_t{1}, size_t{7}, size_t{4097}, size_t{1} << 20}) {
        for (int root = 0; root < world; root += (count > 4097 ? world : 1)) {
          const std::vector<char> expected = MakeInput(dt, ReduceOp::kSum, count, root);
          std::vector<char> buf = MakeInput(dt, ReduceOp::kSum, count, comm.rank());
          BroadcastOptions o;
          o.buffer = buf.data();
          o.count = count;
          o.dtype = dt;
          o.root = root;
          Broadcast(comm, o);
          if (buf != expected) {
            return std::string("broadcast ") + DataTypeName(dt) + " count " + std::to_string(count) + " root " +
                   std::to_string(root) + " differs";
          }
        }
      }
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

// Elements rank `src` sends to rank `dst` in alltoall case `scale`.
size_t Split(int src, int dst, size_t scale) { return static_cast<size_t>((src + 2 * dst) % 4) * scale; }

TEST_P(Collectives, AlltoallWithSplits) {
  const int world = std::get<0>(GetParam());
  for (DataType dt : AllDataTypes()) {
    for (size_t scale : {size_t{0}, size_t{1}, size_t{1000}}) {
      const auto results = RunRanks(world, [&](Communicator& comm) {
        const int me = comm.rank();
        // Rank src's send buffer: its input, split consecutively by destination.
        auto send_buffer = [&](int src, std::vector<size_t>* splits) {
          size_t total = 0;
          for (int d = 0; d < world; ++d) {
            splits->push_back(Split(src, d, scale));
            total += splits->back();
          }
          return MakeInput(dt, ReduceOp::kSum, total, src);
        };
        AlltoallOptions o;
        std::vector<char> in = send_buffer(me, &o.send_counts);
        o.input = in.data();
        o.recv_counts = AlltoallRecvCounts(comm, o.send_counts);
        std::vector<char> expected;
        const size_t esize = DataTypeSize(dt);
        for (int src = 0; src < world; ++src) {
          std::vector<size_t> splits;
          std::vector<char> theirs = send_buffer(src, &splits);
          const size_t offset = Offsets(splits)[static_cast<size_t>(me)] * esize;
          expected.insert(expected.end(), theirs.begin() + static_cast<long>(offset),
                          theirs.begin() + static_cast<long>(offset + splits[static_cast<size_t>(me)] * esize));
          if (o.recv_counts[static_cast<size_t>(src)] != splits[static_cast<size_t>(me)]) return std::string("counts");
        }
        std::vector<char> out(expected.size());
        o.output = out.data();
        o.dtype = dt;
        Alltoall(comm, o);
        return out == expected ? std::string() : std::string("alltoall differs");
      });
      ASSERT_EQ(Failures(results), "") << DataTypeName(dt) << " scale " << scale;
    }
  }
}

TEST_P(Collectives, ReducescatterEveryDtypeAndOp) {
  const int world = std::get<0>(GetParam());
  const auto results = RunRanks(world, [&](Communicator& comm) {
    for (const ReduceCase& c : AllReduceCases({0, 1, 7, 4097, 100000})) {
      const std::vector<size_t> counts = EvenSplit(c.count, world);
      const std::vector<size_t> offsets = Offsets(counts);
      const size_t me = static_cast<size_t>(comm.rank());
      std::vector<char> in = MakeInput(c.dtype, c.op, c.count, comm.rank());
      std::vector<char> out(counts[me] * DataTypeSize(c.dtype));
      Reducescatter(comm, ToReducescatterOptions(c, in.data(), out.data(), counts));
      const std::string wrong =
          CompareReduction(c, world, out.data(), ExpectedReduction(c, world, offsets[me], counts[me]));
      if (!wrong.empty()) return c.Describe() + ": " + wrong;
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

// The node-first forms over thread ranks grouped into nodes (world, ranks per node): the flat
// forms' results, every dtype and op, counts that differ per rank (some zero).
class NodeFirstShards : public ::testing::TestWithParam<std::tuple<int, int>> {};

TEST_P(NodeFirstShards, ReducescatterAndAllgatherGiveTheFlatResults) {
  // Plain names, not a structured binding: C++17 lambdas cannot capture bindings (clang).
  const int world = std::get<0>(GetParam());
  const int local = std::get<1>(GetParam());
  const auto results = RunTopology(world, local, [&](Topology& topo) {
    const size_t me = static_cast<size_t>(topo.rank());
    for (const ReduceCase& c : AllReduceCases({0, 7, 4097, 100000})) {
      const std::vector<size_t> counts = EvenSplit(c.count, world);
      const std::vector<size_t> offsets = Offsets(counts);
      std::vector<char> in = MakeInput(c.dtype, c.op, c.count, topo.rank());
      std::vector<char> out(counts[me] * DataTypeSize(c.dtype));
      HierarchicalReducescatter(topo, ToReducescatterOptions(c, in.data(), out.data(), counts));
      const std::string wrong =
          CompareReduction(c, world, out.data(), ExpectedReduction(c, world, offsets[me], counts[me]));
      if (!wrong.empty()) return "reducescatter " + c.Describe() + ": " + wrong;
    }
    for (DataType dt : AllDataTypes()) {
      for (size_t base : {size_t{0}, size_t{1}, size_t{4097}}) {
        std::vector<char> expected;
        std::vector<size_t> counts;
        for (int r = 0; r < world; ++r) {
          std::vector<char> part = MakeInput(dt, ReduceOp::kSum, GatherCount(base, r), r);
          expected.insert(expected.end(), part.begin(), part.end());
          counts.push_back(GatherCount(base, r));
        }
        std::vector<char> in = MakeInput(dt, ReduceOp::kSum, counts[me], topo.rank());
        AllgatherOptions o;
        o.input = in.data();
        o.count = counts[me];
        o.counts = counts;
        o.dtype = dt;
        std::vector<char> out(expected.size());
        o.output = out.data();
        HierarchicalAllgather(topo, o);
        if (out != expected) return std::string("allgather ") + DataTypeName(dt) + " base " + std::to_string(base) + " differs";
      }
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

INSTANTIATE_TEST_SUITE_P(Nodes, NodeFirstShards,
                         ::testing::Values(std::make_tuple(4, 2), std::make_tuple(6, 3), std::make_tuple(6, 2)),
                         [](const ::testing::TestParamInfo<std::tuple<int, int>>& p) {
                           return "world" + std::to_string(std::get<0>(p.param)) + "_local" +
                                  std::to_string(std::get<1>(p.param));
                         });

TEST_P(Collectives, BarrierSeparatesPhases) {
  const int world = std::get<0>(GetParam());
  std::atomic<int> arrived{0};
  const auto results = RunRanks(world, [&](Communicator& comm) {
    for (int round = 1; round <= 50; ++round) {
      arrived.fetch_add(1);
      Barrier(comm);
      if (arrived.load() < round * world) return std::string("passed the barrier early in round ") + std::to_string(round);
      Barrier(comm);
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST_P(Collectives, SplitOrdersByKeyAndPointToPointStaysOrdered) {
  const int world = std::get<0>(GetParam());
  const auto results = RunRanks(world, [&](Communicator& comm) {
    auto half = comm.Split(comm.rank() % 2, world - comm.rank());  // reversed order inside a color
    const int same_color = (world + 1 - comm.rank() % 2) / 2;
    if (half->size() != same_color) return std::string("wrong split size");
    // Highest world rank of the color gets new rank 0.
    int higher = 0;
    for (int r = comm.rank() + 2; r < world; r += 2) ++higher;
    if (half->rank() != higher) return std::string("wrong split rank");
    // Ring of messages: send two to the next rank, receive two from the previous, in order.
    const int next = (comm.rank() + 1) % world, prev = (comm.rank() + world - 1) % world;
    for (int k = 0; k < 2; ++k) {
      const int v = comm.rank() * 10 + k;
      int got = -1;
      comm.SendRecv(&v, sizeof v, next, &got, sizeof got, prev, 5);
      if (got != prev * 10 + k) return std::string("point-to-point out of order");
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, Collectives,
                         ::testing::Combine(::testing::Range(1, 9),
                                            ::testing::Values(RankTransport::kInProcess, RankTransport::kTcp)),
                         [](const ::testing::TestParamInfo<std::tuple<int, RankTransport>>& p) {
                           return (std::get<1>(p.param) == RankTransport::kTcp ? "tcp" : "inproc") +
                                  std::to_string(std::get<0>(p.param));
                         });

template <typename Fn>
std::string ErrorOf(int world, Fn fn) {
  try {
    RunRanks(world, [&](Communicator& comm) {
      fn(comm);
      return std::string();
    });
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(CollectiveErrors, MessagesNameTheValueAtFault) {
  std::string msg = ErrorOf(2, [](Communicator& comm) {
    float x = 0;
    BroadcastOptions o;
    o.buffer = &x;
    o.count = 1;
    o.root = 5;
    o.name = "w";
    Broadcast(comm, o);
  });
  EXPECT_NE(msg.find("broadcast root rank 5 is outside 0..1 [broadcast of tensor 'w']"), std::string::npos) << msg;

  msg = ErrorOf(3, [](Communicator& comm) {
    float x = 0;
    AllgatherOptions o;
    o.input = &x;
    o.count = 1;
    o.counts = {1, 1};
    o.output = &x;
    o.name = "emb";
    Allgather(comm, o);
  });
  EXPECT_NE(msg.find("allgather needs one count per rank: got 2 for 3 ranks"), std::string::npos) << msg;

  msg = ErrorOf(2, [](Communicator& comm) {
    std::vector<float> in(4), out(4);
    AlltoallOptions o;
    o.input = in.data();
    o.output = out.data();
    o.send_counts = {2, 2};
    o.recv_counts = comm.rank() == 0 ? std::vector<size_t>{2, 1} : std::vector<size_t>{2, 2};
    o.name = "tokens";
    Alltoall(comm, o);
  });
  EXPECT_NE(msg.find("expects 4 bytes from rank 1 but rank 1 sends 8"), std::string::npos) << msg;
}

}  // namespace
}  // namespace gradcomp
