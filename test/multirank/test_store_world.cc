// A world without MPI (ops/comm/store_communicator.h): thread ranks that share only a store
// connect the TCP mesh through it; nodes (forced by GRADCOMP_LOCAL_SIZE, or the host) exchange
// through POSIX shared memory; a runtime runs on it compressed and exact; a rank that never
// comes is named, on every rank that waited for it, within the timeout.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <functional>
#include <map>
#include <mutex>
#include <thread>

#include "core/runtime.h"
#include "ops/comm/store_communicator.h"
#include "ops/comm/tcp_point_to_point.h"
#include "ops/comm/topology.h"
#include "ops/common/enforce.h"

namespace gradcomp {
namespace {

// What torch's TCPStore is to the ranks of a job, for threads.
class MemoryStore final : public Store {
 public:
  void Set(const std::string& key, const std::string& value) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      values_[key] = value;
    }
    changed_.notify_all();
  }
  std::optional<std::string> Get(const std::string& key, double timeout_seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    const bool there = changed_.wait_for(lock, std::chrono::duration<double>(timeout_seconds),
                                         [&] { return values_.count(key) > 0; });
    if (!there) return std::nullopt;
    return values_[key];
  }

 private:
  std::mutex mu_;
  std::condition_variable changed_;
  std::map<std::string, std::string> values_;
};

// Runs fn(rank) on `world` threads; returns each rank's failure text ("" when it passed).
std::vector<std::string> OnThreads(int world, const std::function<std::string(int)>& fn) {
  std::vector<std::string> out(static_cast<size_t>(world));
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      try {
        out[static_cast<size_t>(r)] = fn(r);
      } catch (const std::exception& e) {
        out[static_cast<size_t>(r)] = std::string("threw: ") + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

std::string Joined(const std::vector<std::string>& results) {
  std::string all;
  for (size_t r = 0; r < results.size(); ++r) {
    if (!results[r].empty()) all += "rank " + std::to_string(r) + ": " + results[r] + "\n";
  }
  return all;
}

TEST(StoreWorld, TheBootstrapsCollectivesGiveEveryRankTheSameAnswers) {
  MemoryStore store;
  const int world = 3;
  const auto results = OnThreads(world, [&](int r) -> std::string {
    StoreCommunicator comm(store, "boot", r, world, 10);
    std::vector<int> all(world);
    comm.Allgatherv(&r, all.data(), std::vector<size_t>(world, sizeof(int)));
    if (all != std::vector<int>{0, 1, 2}) return "allgather";
    double x = r + 0.5;
    comm.Allreduce(&x, &x, 1, DataType::kFloat64, ReduceOp::kSum);
    if (x != 4.5) return "allreduce gave " + std::to_string(x);
    int64_t token = r == 1 ? 77 : 0;
    comm.Broadcast(&token, sizeof token, 1);
    if (token != 77) return "broadcast";
    std::vector<int> send(world), recv(world);
    for (int p = 0; p < world; ++p) send[static_cast<size_t>(p)] = 10 * r + p;
    comm.Alltoallv(send.data(), std::vector<size_t>(world, sizeof(int)), recv.data(),
                   std::vector<size_t>(world, sizeof(int)));
    for (int p = 0; p < world; ++p) {
      if (recv[static_cast<size_t>(p)] != 10 * p + r) return "alltoall";
    }
    const int next = (r + 1) % world, prev = (r + world - 1) % world;
    int got = -1;
    comm.SendRecv(&r, sizeof r, next, &got, sizeof got, prev, 5);
    if (got != prev) return "sendrecv";
    comm.Barrier();
    return "";
  });
  EXPECT_EQ(Joined(results), "");
}

TEST(StoreWorld, ARuntimeRunsOnTheTcpMeshWithSharedMemoryInsideEachNode) {
  MemoryStore store;
  const int world = 4;
  const size_t n = size_t{1} << 20;  // 4 MB: several staging rounds and stripes
  const auto results = OnThreads(world, [&](int r) -> std::string {
    RuntimeOptions o;
    o.settings = Settings::FromMap({{"GRADCOMP_LOCAL_SIZE", "2"}, {"GRADCOMP_SHM_BUFFER_MB", "1"}});
    o.world = ConnectStoreWorld(store, "world", r, world, 30, TcpOptions{});
    if (std::string(o.world->kind()) != "tcp") return std::string("world is ") + o.world->kind();
    Runtime rt(std::move(o));
    if (rt.local_size() != 2 || rt.cross_size() != 2 || rt.rank() != r) return std::string("topology");
    std::vector<float> exact(n), compressed(n);
    for (size_t i = 0; i < n; ++i) exact[i] = compressed[i] = std::sin(0.001f * static_cast<float>(i) + r);
    CompressionSpec maxmin;
    maxmin.codec = "maxmin";
    maxmin.bits = 8;
    auto a = rt.Allreduce("exact", DataType::kFloat32, {int64_t(n)}, exact.data(), exact.data(), ReduceOp::kSum);
    auto b = rt.Allreduce("maxmin8", DataType::kFloat32, {int64_t(n)}, compressed.data(), compressed.data(),
                          ReduceOp::kSum, 1, 1, &maxmin);
    a->Wait();
    b->Wait();
    double worst = 0;
    for (size_t i = 0; i < n; ++i) {
      double want = 0;
      for (int q = 0; q < world; ++q) want += std::sin(0.001f * static_cast<float>(i) + q);
      if (std::fabs(exact[i] - want) > 1e-5) return "exact allreduce wrong at " + std::to_string(i);
      worst = std::max(worst, std::fabs(compressed[i] - want));
    }
    // 8 bits over a range of 2 per rank, 4 ranks, 2 quantizations: well under 0.1.
    if (worst > 0.1 || worst == 0) return "maxmin8's worst error " + std::to_string(worst);
    const RuntimeStats s = rt.stats();
    if (s.compressed_bytes_on_wire == 0 || s.compressed_bytes_on_wire > s.compressed_bytes_in / 2) {
      return "bytes on the wire " + std::to_string(s.compressed_bytes_on_wire);
    }
    rt.Barrier()->Wait();  // no rank shuts down while another still needs it
    return "";
  });
  EXPECT_EQ(Joined(results), "");
}

TEST(StoreWorld, ARankThatNeverComesIsNamedOnEveryRankWithinTheTimeout) {
  MemoryStore store;
  const int world = 3;
  const auto start = std::chrono::steady_clock::now();
  const auto results = OnThreads(world - 1, [&](int r) -> std::string {
    try {
      ConnectStoreWorld(store, "late", r, world, 1.0, TcpOptions{});
      return "connected without rank 2";
    } catch (const Error& e) {
      const std::string what = e.what();
      if (what.find("waited 1 s for rank 2 to join the world") == std::string::npos) return what;
    }
    return "";
  });
  EXPECT_EQ(Joined(results), "");
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 5.0);
}

TEST(StoreWorld, BadPlacesAndTwoJobsOnOnePrefixAreNamed) {
  MemoryStore store;
  try {
    StoreCommunicator comm(store, "bad", 3, 2, 1);
    ADD_FAILURE() << "rank 3 of 2 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("a world of 2 ranks has no rank 3 (RANK and WORLD_SIZE)"), std::string::npos)
        << e.what();
  }
  // Rank 1's part of the first exchange has another size than rank 0 expects (another job's).
  store.Set("shared/0/1", std::string(3, 'x'));
  StoreCommunicator comm(store, "shared", 0, 2, 1);
  int mine = 0, all[2];
  try {
    comm.Allgatherv(&mine, all, {sizeof(int), sizeof(int)});
    ADD_FAILURE() << "a 3-byte part accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 gave 3 bytes for the world's first exchanges where 4 were expected "
                                         "(store key 'shared/0/1'): two jobs share one store prefix?"),
              std::string::npos)
        << e.what();
  }
  try {
    comm.Split(0, 0);
    ADD_FAILURE() << "a split of the bootstrap accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("the store communicator only bootstraps a world"), std::string::npos);
  }
}

TEST(StoreWorld, PointToPointRefusesRanksOutsideTheGroupAndNegativeTags) {
  MemoryStore store;
  const auto results = OnThreads(2, [&](int r) -> std::string {
    TcpPointToPoint p2p(ConnectStoreWorld(store, "p2p", r, 2, 30, TcpOptions{}));
    float x = 0;
    const std::pair<std::function<void()>, std::string> bad[] = {
        {[&] { p2p.Send(&x, 4, 2, 0); }, "send of 4 bytes to rank 2 (tag 0): the rank must be in 0..1"},
        {[&] { p2p.Receive(&x, 4, 0, -1); }, "receive of 4 bytes from rank 0 (tag -1): the rank must be in 0..1 and "
                                              "the tag at least 0"},
        {[&] { p2p.Receive(&x, 4, -2, 0); }, "receive of 4 bytes from rank -2 (tag 0)"},
    };
    for (const auto& [call, text] : bad) {
      try {
        call();
        return "accepted: " + text;
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find(text) == std::string::npos) return std::string("message: ") + e.what();
      }
    }
    // And a message from whichever rank sends, as MPI_ANY_SOURCE.
    const float out = static_cast<float>(r + 1);
    float in = 0;
    auto s = p2p.Send(&out, sizeof out, 1 - r, 7);
    auto q = p2p.Receive(&in, sizeof in, -1, 7);
    while (!s->Test() || !q->Test()) std::this_thread::yield();
    if (q->source() != 1 - r || in != static_cast<float>(2 - r)) return "any-source receive got " + std::to_string(in);
    return "";
  });
  EXPECT_EQ(Joined(results), "");
}

TEST(StoreWorld, MpiSettingsOnAWorldWithoutMpiAreNamed) {
  MemoryStore store;
  const auto results = OnThreads(2, [&](int r) -> std::string {
    RuntimeOptions o;
    o.settings = Settings::FromMap({{"GRADCOMP_CONTROLLER", "mpi"}});
    o.world = ConnectStoreWorld(store, "mpi", r, 2, 30, TcpOptions{});
    try {
      Runtime rt(std::move(o));
      return "GRADCOMP_CONTROLLER=mpi accepted";
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("GRADCOMP_CONTROLLER=mpi needs an MPI world") == std::string::npos) return e.what();
    }
    return "";
  });
  EXPECT_EQ(Joined(results), "");
}

}  // namespace
}  // namespace gradcomp
