// The mpirun suite (registered with ctest at -np 2, 3, 4 and 4 with GRADCOMP_LOCAL_SIZE=2):
// the collectives over real MPI processes, the MPI-3 shared-memory window communicator
// (with a tiny staging area so every operation takes many rounds) and hierarchy.
#include <gtest/gtest.h>
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <functional>
#include <thread>

#include "ops/common/enforce.h"
#include "core/settings.h"
#include "ops/collectives/allgather.h"
#include "ops/collectives/allreduce.h"
#include "ops/collectives/uncompressed_algorithms.h"
#include "ops/collectives/alltoall.h"
#include "ops/collectives/broadcast.h"
#include "ops/collectives/compressed_allreduce.h"
#include "ops/collectives/reducescatter.h"
#include "ops/comm/inprocess_communicator.h"
#include "ops/comm/mpi_environment.h"
#include "ops/comm/shm_mpi_window.h"
#include "test/support/device_comm.h"
#include "test/support/device_twin.h"
#include "test/support/harness.h"
#include "test/support/reference.h"
#include "test/support/sra_reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
// Under a sanitizer the sweeps stop at 256K values: 1M took most of the suite's minutes there.
// Both are above kPolledCollectiveBytes for every dtype of 2 bytes or more (MPI's blocking path)
// and fit one staging area of the shared-memory window (SharedMemoryWindowInManyRounds sweeps
// areas smaller than a tensor).
const std::vector<size_t> kCounts = {0, 1, 7, 4097, size_t{1} << 18};
#else
const std::vector<size_t> kCounts = {0, 1, 7, 4097, size_t{1} << 20};
#endif

// Runs every allreduce case through `run` and checks it against the float64 reference.
template <typename Run>
void SweepAllreduce(int world, int rank, const std::vector<size_t>& counts, Run run) {
  for (const ReduceCase& c : AllReduceCases(counts)) {
    std::vector<char> in = MakeInput(c.dtype, c.op, c.count, rank);
    std::vector<char> out(in.size());
    run(ToAllreduceOptions(c, in.data(), out.data()));
    ASSERT_EQ(CompareReduction(c, world, out.data(), ExpectedReduction(c, world, 0, c.count)), "");
  }
}

TEST(Mpi, FlatAllreduceEveryDtypeOpAndCount) {
  auto world = CreateMpiWorld();
  SweepAllreduce(world->size(), world->rank(), kCounts, [&](const AllreduceOptions& o) { Allreduce(*world, o); });
}

TEST(Mpi, HierarchicalAllreduceOverSharedMemoryAndOverMessages) {
  const Settings settings = Settings::FromEnvironment();
  for (LocalTransport transport : {LocalTransport::kSharedMemory, LocalTransport::kMessages}) {
    Topology topo = BuildTopology(CreateMpiWorld(), static_cast<int>(settings.local_size), transport);
    if (settings.local_size > 0) {
      ASSERT_EQ(topo.local_size(), settings.local_size);
      ASSERT_EQ(topo.cross_size(), topo.size() / settings.local_size);
    }
    ASSERT_STREQ(topo.local->kind(), transport == LocalTransport::kSharedMemory ? "shm" : "mpi");
    SweepAllreduce(topo.size(), topo.rank(), kCounts, [&](const AllreduceOptions& o) { HierarchicalAllreduce(topo, o); });
  }
}

TEST(Mpi, TopologyPassesTheStagingSizeToTheWindow) {
  // GRADCOMP_SHM_BUFFER_MB reaches the window through BuildTopology: 256-byte areas make the
  // node-local steps of a 4097-element hierarchical allreduce take many rounds.
  const Settings settings = Settings::FromEnvironment();
  Topology topo = BuildTopology(CreateMpiWorld(), static_cast<int>(settings.local_size),
                                LocalTransport::kSharedMemory, 256);
  SweepAllreduce(topo.size(), topo.rank(), {4097}, [&](const AllreduceOptions& o) { HierarchicalAllreduce(topo, o); });
}

TEST(Mpi, SharedMemoryWindowInManyRounds) {
  // 256-byte staging areas: a 4097-element buffer takes dozens of rounds per operation.
  const auto node = MakeMpiShmCommunicator(MPI_COMM_WORLD, 256);
  Communicator& shm = *node;
  const int world = shm.size(), rank = shm.rank();
  SweepAllreduce(world, rank, {0, 1, 7, 4097}, [&](const AllreduceOptions& o) { Allreduce(shm, o); });
  for (const ReduceCase& c : AllReduceCases({0, 5, 4097})) {
    const std::vector<size_t> counts = EvenSplit(c.count, world);
    const size_t me = static_cast<size_t>(rank);
    std::vector<char> in = MakeInput(c.dtype, c.op, c.count, rank);
    std::vector<char> out(counts[me] * DataTypeSize(c.dtype));
    Reducescatter(shm, ToReducescatterOptions(c, in.data(), out.data(), counts));
    ASSERT_EQ(CompareReduction(c, world, out.data(), ExpectedReduction(c, world, Offsets(counts)[me], counts[me])), "");
  }
  std::vector<size_t> bytes;
  std::vector<char> expected;
  for (int r = 0; r < world; ++r) {
    std::vector<char> part = MakeInput(DataType::kUInt8, ReduceOp::kSum, 300 + 211 * static_cast<size_t>(r), r);
    bytes.push_back(part.size());
    expected.insert(expected.end(), part.begin(), part.end());
  }
  std::vector<char> mine = MakeInput(DataType::kUInt8, ReduceOp::kSum, bytes[static_cast<size_t>(rank)], rank);
  std::vector<char> gathered(expected.size());
  shm.Allgatherv(mine.data(), gathered.data(), bytes);
  EXPECT_EQ(gathered, expected);
  for (int root = 0; root < world; ++root) {
    std::vector<char> buf = MakeInput(DataType::kFloat32, ReduceOp::kSum, 1000, rank);
    shm.Broadcast(buf.data(), buf.size(), root);
    EXPECT_EQ(buf, MakeInput(DataType::kFloat32, ReduceOp::kSum, 1000, root)) << "root " << root;
  }
}

// Cuts `count` elements into pieces of uneven lengths (some empty) over `in` and `out`.
std::vector<BufferPiece> CutIntoPieces(const char* in, char* out, size_t count, size_t esize) {
  static const size_t kLengths[] = {0, 1, 3, 0, 1000, 17, 4096, 5};
  std::vector<BufferPiece> pieces;
  for (size_t at = 0, k = 0; at < count || pieces.empty(); ++k) {
    const size_t n = std::min(kLengths[k % 8], count - at);
    pieces.push_back(BufferPiece{in + at * esize, out + at * esize, n});
    at += n;
    if (count == 0) break;
  }
  return pieces;
}

TEST(Mpi, FusedAllreduceOfPiecesEqualsTheReference) {
  // The runtime's fused path: tensors reduced where they lie. On one node through the
  // shared-memory window (with 256-byte areas: many rounds, slices cutting through pieces),
  // across forced nodes through the world's collective or the hierarchical algorithm.
  const Settings settings = Settings::FromEnvironment();
  for (size_t staging : {size_t{256}, size_t{1} << 20}) {
    Topology topo = BuildTopology(CreateMpiWorld(), static_cast<int>(settings.local_size),
                                  LocalTransport::kSharedMemory, staging);
    for (bool hierarchical : {false, true}) {
      if (hierarchical && topo.cross_size() == 1) continue;
      std::vector<char> fusion;
      for (const ReduceCase& c : AllReduceCases({0, 1, 700, 5000})) {
        std::vector<char> in = MakeInput(c.dtype, c.op, c.count, topo.rank());
        std::vector<char> out(in.size());
        const auto pieces = CutIntoPieces(in.data(), out.data(), c.count, DataTypeSize(c.dtype));
        FusedAllreduce(topo, hierarchical, pieces, ToAllreduceOptions(c, nullptr, nullptr), fusion);
        ASSERT_EQ(CompareReduction(c, topo.size(), out.data(), ExpectedReduction(c, topo.size(), 0, c.count)), "")
            << "staging " << staging << (hierarchical ? " hierarchical" : " flat");
      }
      // In place, as the runtime reduces most gradients.
      for (const ReduceCase& c : AllReduceCases({5000})) {
        std::vector<char> buf = MakeInput(c.dtype, c.op, c.count, topo.rank());
        const auto pieces = CutIntoPieces(buf.data(), buf.data(), c.count, DataTypeSize(c.dtype));
        FusedAllreduce(topo, hierarchical, pieces, ToAllreduceOptions(c, nullptr, nullptr), fusion);
        ASSERT_EQ(CompareReduction(c, topo.size(), buf.data(), ExpectedReduction(c, topo.size(), 0, c.count)), "");
      }
    }
  }
}

TEST(Mpi, FusedAllreduceOfPiecesWithoutInputsOrOutputs) {
  // A rank that joined has no tensor: it contributes zeros and keeps no result.
  const Settings settings = Settings::FromEnvironment();
  for (size_t staging : {size_t{256}, size_t{1} << 20}) {
    Topology topo = BuildTopology(CreateMpiWorld(), static_cast<int>(settings.local_size),
                                  LocalTransport::kSharedMemory, staging);
    const int n = topo.size(), me = topo.rank();
    const std::vector<size_t> counts = {3000, 0, 5, 20000};
    std::vector<std::vector<int32_t>> in, out;
    std::vector<BufferPiece> pieces;
    for (size_t k = 0; k < counts.size(); ++k) {
      in.emplace_back(counts[k], me + 1);
      out.emplace_back(counts[k], -7);
    }
    for (size_t k = 0; k < counts.size(); ++k) {
      const bool absent = me == 0 && k == 3;  // rank 0 lacks the last tensor
      pieces.push_back(BufferPiece{absent ? nullptr : in[k].data(), absent ? nullptr : out[k].data(), counts[k]});
    }
    AllreduceOptions o;
    o.dtype = DataType::kInt32;
    o.op = ReduceOp::kSum;
    std::vector<char> fusion;
    FusedAllreduce(topo, false, pieces, o, fusion);
    const int32_t all = n * (n + 1) / 2;
    for (size_t k = 0; k < counts.size(); ++k) {
      const bool absent = me == 0 && k == 3;
      const int32_t want = absent ? -7 : k == 3 ? all - 1 : all;
      for (size_t i = 0; i < counts[k]; ++i) ASSERT_EQ(out[k][i], want) << "tensor " << k << " element " << i;
    }
  }
}

TEST(Mpi, NonblockingSendsAndReceivesArriveInOrderPerTag) {
  // Every rank sends two messages per tag to every other rank, receives posted before the
  // sends and completed by polling; on the world and on the shared-memory communicator.
  std::vector<std::unique_ptr<Communicator>> comms;
  comms.push_back(CreateMpiWorld());
  comms.push_back(MakeMpiShmCommunicator(MPI_COMM_WORLD, 256));
  for (auto& comm : comms) {
    const int n = comm->size(), me = comm->rank();
    const auto message = [](int from, int to, int k) {
      return MakeInput(DataType::kUInt8, ReduceOp::kSum, 50000 + 1000 * static_cast<size_t>(from) + static_cast<size_t>(k),
                       from * 64 + to * 4 + k);
    };
    std::vector<std::vector<char>> got, sent;
    std::vector<std::unique_ptr<PendingTransfer>> transfers;
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k < 4; ++k) {
        if (p == me) continue;
        got.emplace_back(message(p, me, k).size());
        transfers.push_back(comm->Irecv(got.back().data(), got.back().size(), p, 7 + k % 2));
      }
    }
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k < 4; ++k) {
        if (p == me) continue;
        sent.push_back(message(me, p, k));
      }
    }
    for (size_t i = 0, j = 0; i < sent.size(); ++j) {
      for (int k = 0; k < 4; ++k, ++i) {
        const int peer = static_cast<int>(j) < me ? static_cast<int>(j) : static_cast<int>(j) + 1;
        transfers.push_back(comm->Isend(sent[i].data(), sent[i].size(), peer, 7 + k % 2));
      }
    }
    PollUntil([&] {
      bool done = true;
      for (auto& t : transfers) done = t->Test() && done;
      return done;
    });
    size_t i = 0;
    for (int p = 0; p < n; ++p) {
      for (int k = 0; k < 4; ++k) {
        if (p == me) continue;
        EXPECT_EQ(got[i++], message(p, me, k)) << comm->kind() << " from " << p << " message " << k;
      }
    }
    // A receive of the wrong size is an error naming both sizes.
    if (n >= 2) {
      const int peer = me ^ 1;
      if (peer < n) {
        std::vector<char> small(10), big(20);
        auto r = comm->Irecv(small.data(), small.size(), peer, 99);
        auto s = comm->Isend(big.data(), big.size(), peer, 99);
        std::string error;
        try {
          PollUntil([&] { return r->Test() && s->Test(); });
        } catch (const Error& e) {
          error = e.what();
        }
        // MPI reports the truncation; the message names this rank and the failing call.
        EXPECT_NE(error.find("rank " + std::to_string(me)), std::string::npos) << comm->kind() << ": " << error;
        EXPECT_NE(error.find("MPI_Test"), std::string::npos) << comm->kind() << ": " << error;
        EXPECT_NE(error.find("truncat"), std::string::npos) << comm->kind() << ": " << error;
      }
    }
  }
}

// Small allreduces (the negotiation's bit masks every cycle, small fused tensors) run as a
// polled MPI_Iallreduce: exact masks and sums, in place and not, with a rank arriving late.
TEST(Mpi, PolledAllreduceGivesExactMasksAndSums) {
  auto world = CreateMpiWorld();
  const int me = world->rank(), n = world->size();
  for (int round = 0; round < 20; ++round) {
    if (me == round % n) std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a late rank
    const auto bit = [&](int rank, size_t i) { return int64_t{1} << ((rank + round + static_cast<int>(i)) % 63); };
    std::vector<int64_t> masks(5), expect_masks(5, ~int64_t{0});
    for (size_t i = 0; i < masks.size(); ++i) {
      masks[i] = ~bit(me, i);
      for (int r = 0; r < n; ++r) expect_masks[i] &= ~bit(r, i);
    }
    if (round % 2 == 0) {
      world->Allreduce(masks.data(), masks.data(), masks.size(), DataType::kInt64, ReduceOp::kBitwiseAnd);
    } else {
      auto t = world->Iallreduce(masks.data(), masks.data(), masks.size(), DataType::kInt64, ReduceOp::kBitwiseAnd);
      PollUntil([&] { return t->Test(); });
    }
    EXPECT_EQ(masks, expect_masks) << "round " << round;
    const std::vector<double> mine = {1.0 * me, 0.5 * round, -2.0};
    std::vector<double> sums(mine.size());
    auto u = world->Iallreduce(mine.data(), sums.data(), mine.size(), DataType::kFloat64, ReduceOp::kSum);
    PollUntil([&] { return u->Test(); });
    EXPECT_EQ(sums, (std::vector<double>{n * (n - 1) / 2.0, 0.5 * round * n, -2.0 * n})) << "round " << round;
  }
  // More than MPI's int count cannot start (checked before the buffers are touched).
  const size_t too_many = size_t{1} << 31;
  std::string error;
  try {
    world->Iallreduce(nullptr, nullptr, too_many, DataType::kFloat32, ReduceOp::kSum);
  } catch (const Error& e) {
    error = e.what();
  }
  EXPECT_NE(error.find("Iallreduce takes at most 2147483647 elements, got 2147483648"), std::string::npos) << error;
}


TEST(Mpi, SmallCollectivesWaitForALateRankWithoutHoldingACore) {
  // A rank that arrives first waits out its peers' skew: the shared-memory allreduce's syncs at
  // every call during a backward pass, the coordinator's gather and broadcast on every slow
  // path. Inside MPI's blocking calls that wait spins on a core training needs; polled, it naps,
  // and on ShmBarrier's futex it sleeps.
  auto world = CreateMpiWorld();
  const auto node = MakeMpiShmCommunicator(MPI_COMM_WORLD, 1 << 16);
  Communicator& shm = *node;
  const int me = world->rank(), n = world->size();
  constexpr double kLate = 0.3;  // seconds rank 0 arrives after the others
  std::vector<float> in(1 << 16, 1.0f), out(in.size());
  std::vector<char> fusion;
  std::vector<uint64_t> gathered(static_cast<size_t>(n));
  uint64_t word = 0;
  // Each operation, and whether every other rank waits for rank 0 in it (in a gather only the
  // root, rank 1, does).
  struct Op {
    const char* what;
    std::function<void()> run;
    bool all_wait = true;
  };
  const std::vector<Op> ops = {
      {"Barrier", [&] { world->Barrier(); }},
      {"shared-memory allreduce",
       [&] {
         shm.AllreducePieces({BufferPiece{in.data(), out.data(), in.size()}}, DataType::kFloat32, ReduceOp::kSum,
                             1.0, nullptr, fusion);
         EXPECT_EQ(out[12345], static_cast<float>(n));
       }},
      {"Gatherv",
       [&] {
         const uint64_t mine = 100 + static_cast<uint64_t>(me);
         world->Gatherv(&mine, gathered.data(), std::vector<size_t>(static_cast<size_t>(n), sizeof mine), 1);
         if (me == 1) {
           EXPECT_EQ(gathered.back(), static_cast<uint64_t>(99 + n));
         }
       },
       false},
      {"Broadcast",
       [&] {
         word = me == 0 ? 42 : 0;
         world->Broadcast(&word, sizeof word, 0);
         EXPECT_EQ(word, 42u);
       }},
  };
  for (const auto& [what, op, all_wait] : ops) {
    world->Barrier();
    if (me == 0) std::this_thread::sleep_for(std::chrono::duration<double>(kLate));
    const double cpu = ThreadCpuSeconds();
    const auto start = std::chrono::steady_clock::now();
    op();
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double used = ThreadCpuSeconds() - cpu;
    if (me == 0 || (!all_wait && me != 1)) continue;
    EXPECT_GT(waited, 0.8 * kLate) << what << ": rank " << me << " did not wait for rank 0";
    EXPECT_LT(used, 0.25 * waited) << what << ": rank " << me << " used " << used << " s of CPU waiting "
                                   << waited << " s for a late rank";
  }
}

TEST(Mpi, AllgatherBroadcastAlltoallReducescatter) {
  auto world = CreateMpiWorld();
  const int n = world->size(), me = world->rank();
  for (DataType dt : AllDataTypes()) {
    // Allgather with a different first dimension per rank (rank 1 contributes nothing).
    const auto count_of = [](int r) { return r == 1 ? size_t{0} : size_t{1000} + static_cast<size_t>(r) * 37; };
    AllgatherOptions g;
    std::vector<char> in = MakeInput(dt, ReduceOp::kSum, count_of(me), me);
    g.input = in.data();
    g.count = count_of(me);
    g.counts = AllgatherCounts(*world, g.count);
    g.dtype = dt;
    std::vector<char> expected;
    for (int r = 0; r < n; ++r) {
      auto part = MakeInput(dt, ReduceOp::kSum, count_of(r), r);
      expected.insert(expected.end(), part.begin(), part.end());
    }
    std::vector<char> out(expected.size());
    g.output = out.data();
    Allgather(*world, g);
    EXPECT_EQ(out, expected) << DataTypeName(dt);

    // Broadcast from the last rank.
    BroadcastOptions b;
    std::vector<char> buf = MakeInput(dt, ReduceOp::kSum, 4097, me);
    b.buffer = buf.data();
    b.count = 4097;
    b.dtype = dt;
    b.root = n - 1;
    Broadcast(*world, b);
    EXPECT_EQ(buf, MakeInput(dt, ReduceOp::kSum, 4097, n - 1)) << DataTypeName(dt);

    // Alltoall: rank s sends (s + d + 1) elements to rank d, all equal to s * 10 + d.
    AlltoallOptions a;
    std::vector<char> send;
    for (int d = 0; d < n; ++d) {
      a.send_counts.push_back(static_cast<size_t>(me + d + 1));
      std::vector<char> part(a.send_counts.back() * DataTypeSize(dt));
      for (size_t i = 0; i < a.send_counts.back(); ++i) StoreAt(part.data(), dt, i, (me * 10 + d) % 100);
      send.insert(send.end(), part.begin(), part.end());
    }
    a.input = send.data();
    a.recv_counts = AlltoallRecvCounts(*world, a.send_counts);
    size_t total = 0;
    for (size_t c : a.recv_counts) total += c;
    std::vector<char> recv(total * DataTypeSize(dt));
    a.output = recv.data();
    a.dtype = dt;
    Alltoall(*world, a);
    size_t k = 0;
    for (int s = 0; s < n; ++s) {
      ASSERT_EQ(a.recv_counts[static_cast<size_t>(s)], static_cast<size_t>(s + me + 1));
      for (int i = 0; i <= s + me; ++i, ++k) {
        char tmp[8];
        StoreAt(tmp, dt, 0, (s * 10 + me) % 100);
        ASSERT_EQ(ValueAt(recv.data(), dt, k), ValueAt(tmp, dt, 0)) << DataTypeName(dt) << " from " << s;
      }
    }
  }
  for (const ReduceCase& c : AllReduceCases({0, 7, 4097, 100000})) {
    const std::vector<size_t> counts = EvenSplit(c.count, n);
    const size_t r = static_cast<size_t>(me);
    std::vector<char> in = MakeInput(c.dtype, c.op, c.count, me);
    std::vector<char> out(counts[r] * DataTypeSize(c.dtype));
    Reducescatter(*world, ToReducescatterOptions(c, in.data(), out.data(), counts));
    ASSERT_EQ(CompareReduction(c, n, out.data(), ExpectedReduction(c, n, Offsets(counts)[r], counts[r])), "");
  }
}

// Every rank's output bytes must equal rank 0's.
bool SameOnEveryRank(Communicator& comm, const std::vector<float>& out) {
  std::vector<float> zero = out;
  comm.Broadcast(zero.data(), zero.size() * sizeof(float), 0);
  int32_t same = testing::SameBytes(zero.data(), out.data(), out.size() * sizeof(float));
  comm.Allreduce(&same, &same, 1, DataType::kInt32, ReduceOp::kMin);
  return same == 1;
}

// Each compressed allreduce runs on the host and again through the separate-memory device,
// which must give the same bytes (test/support/device_twin.h).
TEST(Mpi, CompressedAllreduceFlatHierarchicalLeaderOnlyAndSparse) {
  const Settings settings = Settings::FromEnvironment();
  Topology topo = BuildTopology(CreateMpiWorld(), static_cast<int>(settings.local_size),
                                LocalTransport::kSharedMemory);
  const int world = topo.size();
  const size_t count = 100003;
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < world; ++r) parts.push_back(Gradient(count, r, 1e4));
  const std::vector<double> exact = ExactSum(parts, 1.0 / world);
  const std::vector<float>& in = parts[static_cast<size_t>(topo.rank())];
  for (int bits : {2, 4, 8}) {
    std::vector<float> out(count);
    const CompressedAllreduceOptions o = AverageWith(in, out, "maxmin", bits);
    OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
      CompressedAllreduce(device_comm ? *DeviceMemoryCommunicator(*topo.world, TestDevice()) : *topo.world, q);
    });
    ASSERT_TRUE(SameOnEveryRank(*topo.world, out)) << "flat, bits " << bits;
    const std::vector<double> bound = SraBound(parts, 1.0 / world, bits, 512, false);
    for (size_t i = 0; i < count; ++i) ASSERT_LE(std::fabs(out[i] - exact[i]), bound[i]) << "flat " << i;
    if (topo.homogeneous && topo.local_size() > 1 && topo.cross_size() > 1) {
      for (bool leader_only : {false, true}) {
        std::fill(out.begin(), out.end(), 0.0f);
        OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
          if (!device_comm) {
      HierarchicalCompressedAllreduce(topo, q, leader_only);
      return;
    }
          Topology on_device;  // the cross-node communicator on device memory, the node's on the host
          on_device.world = DeviceMemoryCommunicator(*topo.world, TestDevice());
          on_device.local = topo.local->Split(0, topo.local->rank());
          on_device.cross = DeviceMemoryCommunicator(*topo.cross, TestDevice());
          on_device.homogeneous = topo.homogeneous;
          HierarchicalCompressedAllreduce(on_device, q, leader_only);
        });
        ASSERT_TRUE(SameOnEveryRank(*topo.world, out)) << "hierarchical, leader only " << leader_only;
        double num = 0, den = 0;
        for (size_t i = 0; i < count; ++i) {
          num += (out[i] - exact[i]) * (out[i] - exact[i]);
          den += exact[i] * exact[i];
        }
        EXPECT_LT(std::sqrt(num / den), bits == 2 ? 0.8 : 0.2) << "hierarchical, bits " << bits;
      }
      // The grid whose rows are the nodes (the runtime's default here): the row's copy of the
      // shared-memory node communicator is its MPI point-to-point one.
      const Grid node_grid = MakeNodeGrid(topo);
      std::fill(out.begin(), out.end(), 0.0f);
      CompressedAllreduce2d(node_grid, o);
      ASSERT_TRUE(SameOnEveryRank(*topo.world, out)) << "node rows, bits " << bits;
      const std::vector<double> node_bound = NestedSraBound(parts, 1.0 / world, bits, 512, false, {topo.local_size()});
      for (size_t i = 0; i < count; ++i) ASSERT_LE(std::fabs(out[i] - exact[i]), node_bound[i]) << "node rows " << i;
    }
  }
  std::vector<float> out(count);
  CompressedAllreduceOptions sparse = AverageWith(in, out, "topk");
  sparse.params.topk_ratio = 1.0;
  OnHostAndDevice(sparse, [&](const CompressedAllreduceOptions& q, bool device_comm) {
    SparseAllreduce(device_comm ? *DeviceMemoryCommunicator(*topo.world, TestDevice()) : *topo.world, q);
  });
  ASSERT_TRUE(SameOnEveryRank(*topo.world, out));
  for (size_t i = 0; i < count; ++i) ASSERT_NEAR(out[i], exact[i], 1e-5) << "topk ratio 1, element " << i;
}

TEST(Mpi, PipelinedCompressedAllreduceGivesTheSameBytesOverMpi) {
  // Stripes encoded and decoded on a helper thread while this thread waits yielding (the
  // helper needs the core): the same result as one stripe, over real MPI processes, on the
  // host and through the separate-memory device.
  auto world = CreateMpiWorld();
  const size_t count = (size_t{1} << 20) + 4097;
  const std::vector<float> in = Gradient(count, world->rank(), 1e4);
  std::vector<float> results[2];
  for (size_t stripes : {size_t{1}, size_t{4}}) {
    std::vector<float>& out = results[stripes > 1];
    out.assign(count, 0.0f);
    CompressedAllreduceOptions o = AverageWith(in, out, "maxmin");
    o.segments = {1000, count - 1000};
    o.pipeline_stripes = stripes;
    OnHostAndDevice(o, [&](const CompressedAllreduceOptions& q, bool device_comm) {
      CompressedAllreduce(device_comm ? *DeviceMemoryCommunicator(*world, TestDevice()) : *world, q);
    });
    ASSERT_TRUE(SameOnEveryRank(*world, out)) << "stripes " << stripes;
  }
  EXPECT_EQ(results[1], results[0]);
}

// CUDA-aware MPI (Open MPI built with CUDA) gets GPU buffers directly: the communicator for a
// device is made exactly when the library says so, takes that device's memory, and leaves
// 16-bit reductions (gradcomp's own host operation) to the staged path. Debian's Open MPI is
// not CUDA-aware; an in-process communicator never is.
TEST(Mpi, CudaAwareMpiCommunicatorOnlyWhereMpiTakesGpuMemory) {
  auto world = CreateMpiWorld();
  std::unique_ptr<Communicator> on_device = CudaAwareMpiCommunicator(*world, TestDevice());
  ASSERT_EQ(on_device != nullptr, MpiIsCudaAware());
  if (on_device) {
    EXPECT_EQ(on_device->device_memory(), &TestDevice());
    EXPECT_TRUE(on_device->reduces(DataType::kFloat32));
    EXPECT_FALSE(on_device->reduces(DataType::kFloat16));
  }
  EXPECT_EQ(world->device_memory(), nullptr);
  EXPECT_TRUE(world->reduces(DataType::kFloat16));
  auto threads = CreateInProcessWorld(1);
  EXPECT_EQ(CudaAwareMpiCommunicator(*threads[0], TestDevice()), nullptr);
}

TEST(Mpi, ErrorsNameRankOperationAndTensor) {
  auto world = CreateMpiWorld();
  float x = 1;
  BroadcastOptions b;
  b.buffer = &x;
  b.count = 1;
  b.root = world->size();
  b.name = "fc.weight";
  try {
    Broadcast(*world, b);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast root rank " + std::to_string(world->size()) + " is outside"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find("tensor 'fc.weight'"), std::string::npos);
  }
  // A receive whose size disagrees with the message is reported with the rank.
  if (world->size() >= 2 && world->rank() < 2) {
    const int peer = 1 - world->rank();
    int big[2] = {1, 2}, one = 0;
    if (world->rank() == 0) world->Send(big, sizeof big, peer, 9);
    if (world->rank() == 1) {
      try {
        world->Recv(&one, sizeof one, peer, 9);
        FAIL() << "no error";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("rank 1"), std::string::npos) << e.what();
      }
    }
  }
  world->Barrier();
}

// On ranks other than 0, prints only failures, each tagged with the rank.
class FailurePrinter : public ::testing::EmptyTestEventListener {
 public:
  explicit FailurePrinter(int rank) : rank_(rank) {}
  void OnTestPartResult(const ::testing::TestPartResult& result) override {
    if (result.failed()) {
      std::fprintf(stderr, "[rank %d] %s:%d: failure\n%s\n", rank_, result.file_name() ? result.file_name() : "?",
                   result.line_number(), result.summary());
    }
  }

 private:
  int rank_;
};

}  // namespace
}  // namespace gradcomp

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  gradcomp::EnsureMpiInitialized();
  int rank = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &rank);
  if (rank != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
    listeners.Append(new gradcomp::FailurePrinter(rank));
  }
  int failed = RUN_ALL_TESTS() != 0 ? 1 : 0;
  int any_failed = 0;
  MPI_Allreduce(&failed, &any_failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
  if (rank == 0 && any_failed && !failed) std::fprintf(stderr, "a test failed on another rank (see its output)\n");
  return any_failed;
}
