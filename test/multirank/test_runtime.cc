// The coordinator runtime over thread ranks: negotiation, cache hits / misses /
// invalidation, fusion, ordering, join, barrier, every error path, idle CPU, re-init.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <numeric>
#include <sstream>
#include <thread>
#include <tuple>

#include "core/runtime.h"
#include "gradcomp/config.h"
#include "ops/common/enforce.h"
#include "test/support/harness.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;
using Shape = std::vector<int64_t>;

RuntimeOptions Options(Communicator& comm, Settings settings = Settings::FromMap({})) {
  RuntimeOptions o;
  o.settings = settings;
  o.world = comm.Split(0, comm.rank());
  return o;
}

std::vector<float> Iota(size_t n, float base) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = base + static_cast<float>(i);
  return v;
}

// Runs `fn(runtime)` on `world` thread ranks, each with its own Runtime.
std::vector<std::string> WithRuntimes(int world, const std::function<std::string(Runtime&)>& fn,
                                      Settings settings = Settings::FromMap({})) {
  return RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, settings));
    return fn(rt);
  });
}

std::string ErrorOf(const std::shared_ptr<Handle>& h) {
  try {
    h->Wait();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "";
}

// The settings that put every byte between thread ranks on gradcomp's TCP connections: each
// rank its own node, the data between nodes over tcp (the controller's mesh).
std::map<std::string, std::string> AllOverTcp(std::map<std::string, std::string> more = {}) {
  more.insert({{"GRADCOMP_LOCAL_SIZE", "1"}, {"GRADCOMP_CROSS_COMMUNICATOR", "tcp"}});
  return more;
}

// (world size, transport): negotiating over the world itself (auto: in-process ranks have no
// MPI world, so no TCP), over TCP connections between the thread ranks (tcp_communicator.h),
// or everything over them, data included ("tcpdata").
class RuntimeWorld : public ::testing::TestWithParam<std::tuple<int, const char*>> {
 protected:
  std::vector<std::string> WithRuntimes(int world, const std::function<std::string(Runtime&)>& fn) {
    const std::string which = std::get<1>(GetParam());
    const auto settings =
        which == "tcpdata" ? AllOverTcp() : std::map<std::string, std::string>{{"GRADCOMP_CONTROLLER", which}};
    return gradcomp::WithRuntimes(world, [&](Runtime& rt) -> std::string {
      if (which == "tcpdata" && world > 1 && rt.cross_communicator_kind() != std::string("tcp")) {
        return std::string("between nodes over ") + rt.cross_communicator_kind() + ", not tcp";
      }
      return fn(rt);
    }, Settings::FromMap(settings));
  }
};

TEST_P(RuntimeWorld, AsyncAllreducesOfManyTensorsAcrossSteps) {
  const int world = std::get<0>(GetParam());
  const auto results = WithRuntimes(world, [&](Runtime& rt) -> std::string {
    for (int step = 0; step < 5; ++step) {
      std::vector<std::vector<float>> bufs;
      std::vector<std::shared_ptr<Handle>> handles;
      for (int t = 0; t < 20; ++t) bufs.push_back(Iota(static_cast<size_t>(t * 37 + 1), float(rt.rank() + step)));
      for (int t = 0; t < 20; ++t) {
        handles.push_back(rt.Allreduce("grad." + std::to_string(t), DataType::kFloat32,
                                       {static_cast<int64_t>(bufs[t].size())}, bufs[t].data(), bufs[t].data(),
                                       ReduceOp::kAverage));
      }
      for (int t = 0; t < 20; ++t) {
        handles[t]->Wait();
        const float mean_rank = (world - 1) / 2.0f;
        for (size_t i = 0; i < bufs[t].size(); ++i) {
          if (bufs[t][i] != mean_rank + step + float(i)) return "wrong average in tensor " + std::to_string(t);
        }
      }
    }
    const RuntimeStats s = rt.stats();
    // Step 0 is negotiated by the coordinator; steps 1-4 come from the response cache.
    if (s.coordinator_responses != 20) return "coordinator answered " + std::to_string(s.coordinator_responses);
    if (s.cache_hits != 80) return "cache hits " + std::to_string(s.cache_hits);
    if (s.executed_tensors != 100) return "executed " + std::to_string(s.executed_tensors);
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST_P(RuntimeWorld, EveryCollective) {
  const int world = std::get<0>(GetParam());
  const auto results = WithRuntimes(world, [&](Runtime& rt) -> std::string {
    const int me = rt.rank();
    // allgather: rank r contributes r + 1 rows of 3.
    std::vector<int32_t> rows(static_cast<size_t>((me + 1) * 3), me);
    auto g = rt.Allgather("gather", DataType::kInt32, {me + 1, 3}, rows.data());
    // broadcast from the last rank.
    std::vector<double> b(5, me);
    auto bc = rt.Broadcast("bcast", DataType::kFloat64, {5}, b.data(), world - 1);
    // alltoall: one row of 2 to every rank, valued sender * 100 + receiver.
    std::vector<int64_t> a;
    for (int p = 0; p < world; ++p) a.insert(a.end(), {me * 100 + p, me * 100 + p});
    auto at = rt.Alltoall("a2a", DataType::kInt64, {world, 2}, a.data(), std::vector<int64_t>(world, 1));
    // reducescatter of (2 * world + 1) x 2 ones.
    std::vector<float> ones(static_cast<size_t>((2 * world + 1) * 2), 1.0f);
    auto rs = rt.Reducescatter("rs", DataType::kFloat32, {2 * world + 1, 2}, ones.data(), ReduceOp::kSum);
    auto bar = rt.Barrier();
    g->Wait();
    bc->Wait();
    at->Wait();
    rs->Wait();
    bar->Wait();
    const int64_t total_rows = int64_t(world) * (world + 1) / 2;
    if (g->output_shape() != Shape{total_rows, 3}) return "allgather shape";
    const auto* gv = reinterpret_cast<const int32_t*>(g->output().data());
    size_t k = 0;
    for (int r = 0; r < world; ++r) {
      for (int i = 0; i < (r + 1) * 3; ++i, ++k) {
        if (gv[k] != r) return "allgather value";
      }
    }
    for (double v : b) {
      if (v != world - 1) return "broadcast value";
    }
    const auto* av = reinterpret_cast<const int64_t*>(at->output().data());
    for (int p = 0; p < world; ++p) {
      if (av[2 * p] != p * 100 + me || at->aux()[static_cast<size_t>(p)] != 1) return "alltoall value";
    }
    const int64_t my_rows = 2 + (me == 0 ? 1 : 0);
    if (rs->output_shape() != Shape{my_rows, 2}) return "reducescatter shape";
    const auto* rv = reinterpret_cast<const float*>(rs->output().data());
    for (int64_t i = 0; i < my_rows * 2; ++i) {
      if (rv[i] != float(world)) return "reducescatter value";
    }
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST_P(RuntimeWorld, RanksSubmittingInDifferentOrdersAgree) {
  const int world = std::get<0>(GetParam());
  const auto results = WithRuntimes(world, [&](Runtime& rt) -> std::string {
    std::vector<std::vector<int64_t>> bufs(10, std::vector<int64_t>(100, rt.rank() + 1));
    std::vector<std::shared_ptr<Handle>> handles(10);
    for (int k = 0; k < 10; ++k) {
      const int t = rt.rank() % 2 ? 9 - k : k;  // odd ranks submit in reverse
      handles[t] = rt.Allreduce("t" + std::to_string(t), DataType::kInt64, {100}, bufs[t].data(), bufs[t].data(),
                                ReduceOp::kSum);
      if (k == 4) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (int t = 0; t < 10; ++t) {
      handles[t]->Wait();
      if (bufs[t][0] != int64_t(world) * (world + 1) / 2) return "wrong sum";
    }
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, RuntimeWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4), ::testing::Values("auto", "tcp", "tcpdata")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& p) {
                           return std::string(std::get<1>(p.param)) + std::to_string(std::get<0>(p.param));
                         });

// GRADCOMP_UNCOMPRESSED_ALGORITHM=sra: uncompressed float32 allreduces as the none codec's
// scatter-reduce-allgather (what auto picks across nodes), unstriped and striped, single and
// fused tensors, sums exact, averages and scale factors applied once.
// Over the in-process world, and with each rank a node whose data travels over TCP.
TEST(Runtime, UncompressedScatterReduceAllgatherGivesTheExactSums) {
  for (const bool tcp : {false, true}) {
    for (const char* stripes : {"1", "4"}) {
      for (int world : {2, 3, 4}) {
        const std::map<std::string, std::string> base = {{"GRADCOMP_UNCOMPRESSED_ALGORITHM", "sra"},
                                                         {"GRADCOMP_PIPELINE_STRIPES", stripes}};
        const Settings settings = Settings::FromMap(tcp ? AllOverTcp(base) : base);
        const auto results = WithRuntimes(world, [&](Runtime& rt) -> std::string {
          const std::vector<size_t> sizes = {1, 7, 4097, size_t{1} << 20, 3};
          std::vector<std::vector<float>> bufs;
          for (size_t n : sizes) {
            std::vector<float> v(n);
            for (size_t i = 0; i < n; ++i) v[i] = float((rt.rank() + 1) * static_cast<int>(i % 7));
            bufs.push_back(v);
          }
          std::vector<std::shared_ptr<Handle>> handles;
          for (size_t t = 0; t < sizes.size(); ++t) {
            const ReduceOp op = t % 2 == 0 ? ReduceOp::kSum : ReduceOp::kAverage;
            handles.push_back(rt.Allreduce("t" + std::to_string(t), DataType::kFloat32,
                                           {static_cast<int64_t>(sizes[t])}, bufs[t].data(), bufs[t].data(), op,
                                           t == 2 ? 2.0 : 1.0, t == 2 ? 0.5 : 1.0));
          }
          const float ranks_sum = float(world * (world + 1) / 2);
          for (size_t t = 0; t < sizes.size(); ++t) {
            handles[t]->Wait();
            for (size_t i = 0; i < sizes[t]; ++i) {
              const float sum = ranks_sum * float(i % 7);
              const float want = t % 2 == 0 ? sum : sum / float(world);
              if (std::fabs(bufs[t][i] - want) > 1e-6f * std::fabs(want)) {
                return "tensor " + std::to_string(t) + " [" + std::to_string(i) + "] = " + std::to_string(bufs[t][i]) +
                       ", want " + std::to_string(want);
              }
            }
          }
          const RuntimeStats st = rt.stats();
          if (st.uncompressed_sra_responses == 0) return std::string("the scatter-reduce-allgather did not run");
          if (st.compressed_bytes_in != 0) return std::string("uncompressed bytes counted as compressed");
          return std::string();
        }, settings);
        EXPECT_EQ(Failures(results), "") << "world " << world << " stripes " << stripes << (tcp ? " over tcp" : "");
      }
    }
  }
}

// Chosen automatically on nodes of several ranks, the uncompressed SRA reduces inside each node
// first: only the node-sum shards cross nodes (a flat SRA would send local_size times more).
// Also with the traffic between nodes over TCP (the world stays in-process: the nodes' own ranks
// share it).
TEST(Runtime, AutomaticUncompressedSraGoesHierarchicalOnNodesOfSeveralRanks) {
  for (const char* cross : {"mpi", "tcp"}) {
    const Settings settings =
        Settings::FromMap({{"GRADCOMP_LOCAL_SIZE", "2"}, {"GRADCOMP_CROSS_COMMUNICATOR", cross}});  // 2 nodes x 2 ranks
    constexpr size_t kCount = size_t{1} << 20;  // 4 MB: over auto's 1 MB
    const auto results = WithRuntimes(4, [&](Runtime& rt) -> std::string {
      if (rt.cross_communicator_kind() != std::string(cross == std::string("tcp") ? "tcp" : "inproc")) {
        return std::string("between nodes over ") + rt.cross_communicator_kind();
      }
      std::vector<float> v(kCount);
      for (size_t i = 0; i < kCount; ++i) v[i] = float((rt.rank() + 1) * static_cast<int>(i % 5));
      rt.Allreduce("raw", DataType::kFloat32, {static_cast<int64_t>(kCount)}, v.data(), v.data(), ReduceOp::kSum)
          ->Wait();
      for (size_t i = 0; i < kCount; ++i) {
        if (v[i] != 10.0f * float(i % 5)) return "[" + std::to_string(i) + "] = " + std::to_string(v[i]);
      }
      const RuntimeStats st = rt.stats();
      if (st.uncompressed_sra_responses != 1) return std::string("the scatter-reduce-allgather did not run");
      // Hierarchical: an SRA of this rank's half of the node sum with the other node's rank:
      // half of that half out in the scatter, half back in the gather. Flat would be 6 * kCount.
      const uint64_t want = 2 * kCount;
      if (st.uncompressed_sra_bytes_on_wire != want) {
        return "sent " + std::to_string(st.uncompressed_sra_bytes_on_wire) + " bytes, want " + std::to_string(want);
      }
      return std::string();
    }, settings);
    EXPECT_EQ(Failures(results), "") << "GRADCOMP_CROSS_COMMUNICATOR=" << cross;
  }
}

TEST(Runtime, ShapeChangeInvalidatesTheCacheEntryOnEveryRank) {
  const auto results = WithRuntimes(2, [&](Runtime& rt) -> std::string {
    for (int step = 0; step < 6; ++step) {
      const size_t n = step < 3 ? 10 : 20;  // the shape changes at step 3
      std::vector<float> v(n, 1.0f);
      rt.Allreduce("w", DataType::kFloat32, {static_cast<int64_t>(n)}, v.data(), v.data(), ReduceOp::kSum)->Wait();
      if (v[n - 1] != 2.0f) return "wrong sum at step " + std::to_string(step) + ": " + std::to_string(v[n - 1]);
    }
    const RuntimeStats s = rt.stats();
    // Steps 0 and 3 go through the coordinator, the others hit the cache.
    if (s.coordinator_responses != 2 || s.cache_hits != 4) {
      return "coordinator " + std::to_string(s.coordinator_responses) + " hits " + std::to_string(s.cache_hits);
    }
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(Runtime, ACacheSmallerThanAStepEvictsPendingHitsWithoutLosingThem) {
  // Three cache positions for seven tensors a step, submitted in a different order on each
  // rank and in batches: hits wait on some ranks while other tensors' responses evict their
  // positions; those hits must go to the coordinator and every tensor still completes.
  const Settings settings = Settings::FromMap({{"GRADCOMP_CACHE_CAPACITY", "3"}});
  const auto start = std::chrono::steady_clock::now();
  const auto results = WithRuntimes(3, [&](Runtime& rt) -> std::string {
    for (int step = 0; step < 6; ++step) {
      std::vector<std::vector<float>> bufs(7);
      std::vector<std::shared_ptr<Handle>> handles(7);
      for (int k = 0; k < 7; ++k) {
        const int t = (k * (rt.rank() + 1) + step) % 7;  // a permutation per rank and step
        bufs[t] = Iota(static_cast<size_t>(t + 3), float(rt.rank() * 10 + step));
        handles[t] = rt.Allreduce("evict." + std::to_string(t), DataType::kFloat32, {t + 3}, bufs[t].data(),
                                  bufs[t].data(), ReduceOp::kSum);
        if (k % 3 == 2) std::this_thread::sleep_for(std::chrono::milliseconds(2));
      }
      for (int t = 0; t < 7; ++t) {
        handles[t]->Wait();
        for (size_t i = 0; i < bufs[t].size(); ++i) {
          if (bufs[t][i] != 30.0f + 3.0f * (step + float(i))) return "wrong sum in tensor " + std::to_string(t);
        }
      }
    }
    const RuntimeStats s = rt.stats();
    if (s.executed_tensors != 42) return "executed " + std::to_string(s.executed_tensors);
    return "";
  }, settings);
  EXPECT_EQ(Failures(results), "");
  // A lost pending hit is only recovered when it has waited 5 s (the cache stall time) and
  // goes to the coordinator; handled evictions never wait for that (the test takes ~30 ms).
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count(), 4.5);
}

TEST(Runtime, SmallTensorsAreFusedAndIncompatibleOnesAreNot) {
  const auto results = WithRuntimes(2, [&](Runtime& rt) -> std::string {
    std::vector<std::vector<float>> f(40, std::vector<float>(256, 1.0f));
    std::vector<std::vector<double>> d(10, std::vector<double>(256, 1.0));
    std::vector<std::shared_ptr<Handle>> hs;
    // Group them so both ranks negotiate all 50 in one cycle.
    std::vector<std::string> fnames;
    std::vector<Shape> fshapes;
    std::vector<const void*> fin;
    std::vector<void*> fout;
    for (int i = 0; i < 40; ++i) {
      fnames.push_back("f" + std::to_string(i));
      fshapes.push_back({256});
      fin.push_back(f[i].data());
      fout.push_back(f[i].data());
    }
    hs = rt.GroupedAllreduce(fnames, DataType::kFloat32, fshapes, fin, fout, ReduceOp::kSum);
    for (int i = 0; i < 10; ++i) {
      hs.push_back(rt.Allreduce("d" + std::to_string(i), DataType::kFloat64, {256}, d[i].data(), d[i].data(),
                                i % 2 ? ReduceOp::kMax : ReduceOp::kSum));
    }
    for (auto& h : hs) h->Wait();
    for (auto& v : f) {
      if (v[0] != 2.0f) return "float sum";
    }
    for (int i = 0; i < 10; ++i) {
      if (d[i][0] != (i % 2 ? 1.0 : 2.0)) return "double result";
    }
    const RuntimeStats s = rt.stats();
    // 50 tensors, at most: 1 float32 group, 1 float64 sum group, 1 float64 max group per cycle.
    if (s.executed_tensors != 50) return "executed " + std::to_string(s.executed_tensors);
    if (s.executed_responses > 12) return "not fused: " + std::to_string(s.executed_responses) + " responses";
    if (s.executed_responses < 3) return "incompatible tensors were fused";
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

// Priorities with a scheduling credit: tensors ready together run most urgent first, a credit's
// worth a cycle, so an urgent tensor enqueued while a backlog runs overtakes the rest of it
// (what DistributedOptimizer's overlap_forward relies on). Without the credit the backlog runs
// in the cycle that found it ready, and the urgent tensor after all of it.
TEST(Runtime, AnUrgentTensorOvertakesABacklogOfLessUrgentOnesUnderTheSchedulingCredit) {
  constexpr int kLow = 16;
  constexpr size_t kCount = 256 * 1024;  // 1 MB of float32 each
  for (const double credit_mb : {1.0, 0.0}) {
    Settings settings = Settings::FromMap({{"GRADCOMP_SCHEDULING_CREDIT_MB", std::to_string(credit_mb)}});
    const auto results = WithRuntimes(3, [&](Runtime& rt) -> std::string {
      const float me = static_cast<float>(rt.rank());
      std::vector<std::vector<float>> low(kLow);
      std::vector<float> urgent;
      for (int step = 0; step < 3; ++step) {  // the first step fills the response cache
        std::vector<std::string> names;
        std::vector<Shape> shapes;
        std::vector<const void*> ins;
        std::vector<void*> outs;
        for (int i = 0; i < kLow; ++i) {
          low[i].assign(kCount, me + static_cast<float>(i));
          names.push_back("low." + std::to_string(i));
          shapes.push_back({static_cast<int64_t>(kCount)});
          ins.push_back(low[i].data());
          outs.push_back(low[i].data());
        }
        auto lows = rt.GroupedAllreduce(names, DataType::kFloat32, shapes, ins, outs, ReduceOp::kSum, 1.0, 1.0,
                                        nullptr, {}, /*priority=*/5);
        lows[0]->Wait();
        urgent.assign(kCount, 10.0f * me);
        auto h = rt.Allreduce("urgent", DataType::kFloat32, {static_cast<int64_t>(kCount)}, urgent.data(),
                              urgent.data(), ReduceOp::kSum, 1.0, 1.0, nullptr, {}, /*priority=*/1);
        h->Wait();
        const bool backlog_left = !lows[kLow - 1]->Poll();
        for (auto& l : lows) l->Wait();
        if (urgent[kCount - 1] != 30.0f) return "urgent sum " + std::to_string(urgent[kCount - 1]);
        for (int i = 0; i < kLow; ++i) {
          if (low[i][0] != 3.0f + 3.0f * static_cast<float>(i)) return "low." + std::to_string(i) + " sum";
        }
        if (step == 0) continue;
        if (credit_mb > 0 && !backlog_left) {
          return "step " + std::to_string(step) + ": the urgent tensor waited for the whole backlog";
        }
        if (credit_mb == 0 && backlog_left) return "without a credit the backlog should run in one cycle";
      }
      const uint64_t deferrals = rt.stats().scheduling_deferrals;
      if ((credit_mb > 0) != (deferrals > 0)) return "scheduling deferrals " + std::to_string(deferrals);
      return "";
    }, settings);
    EXPECT_EQ(Failures(results), "") << "credit " << credit_mb << " MB";
  }
}

// Batching (GRADCOMP_BATCH_MIN_KB): small cached tensors that become ready one at a time, the
// way a backward pass of many small layers produces them, wait for one another while no caller
// blocks, and run as a few collectives; a caller blocking on one releases them at once; a
// caller that only polls still gets them (after at most Controller::kMaxBatchCycles cycles).
// With batching off, each runs in its own collective.
TEST(Runtime, SmallReadyTensorsRunTogetherUntilACallerBlocksAndPollersStillGetThem) {
  constexpr int kTensors = 24, kSteps = 4;
  constexpr size_t kCount = 256;  // 1 KB of float32 each: 24 KB a step, under the 256 KB default
  for (const char* batch_kb : {"256", "0"}) {
    Settings settings = Settings::FromMap({{"GRADCOMP_BATCH_MIN_KB", batch_kb}});
    const auto results = WithRuntimes(
        3,
        [&](Runtime& rt) -> std::string {
          const float me = static_cast<float>(rt.rank());
          std::vector<std::vector<float>> grads(kTensors);
          uint64_t responses = 0;
          for (int step = 0; step < kSteps; ++step) {  // the first step fills the response cache
            const uint64_t before = rt.stats().executed_responses;
            std::vector<std::shared_ptr<Handle>> handles;
            for (int i = 0; i < kTensors; ++i) {
              grads[i].assign(kCount, me + static_cast<float>(i + step));
              handles.push_back(rt.Allreduce("g." + std::to_string(i), DataType::kFloat32,
                                             {static_cast<int64_t>(kCount)}, grads[i].data(), grads[i].data(),
                                             ReduceOp::kSum));
              std::this_thread::sleep_for(std::chrono::milliseconds(2));  // a layer's backward
            }
            if (step == kSteps - 1) {
              // Only polling: the batch must still run.
              const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
              while (!handles.back()->Poll()) {
                if (std::chrono::steady_clock::now() > deadline) return "a polled batch never ran";
                std::this_thread::sleep_for(std::chrono::microseconds(200));
              }
            }
            for (auto& h : handles) h->Wait();
            for (int i = 0; i < kTensors; ++i) {
              const float want = 3.0f * static_cast<float>(i + step) + 3.0f;  // ranks 0 + 1 + 2
              if (grads[i][kCount - 1] != want) {
                return "step " + std::to_string(step) + " g." + std::to_string(i) + ": " +
                       std::to_string(grads[i][kCount - 1]) + " != " + std::to_string(want);
              }
            }
            if (step > 0 && step < kSteps - 1) responses += rt.stats().executed_responses - before;
          }
          const uint64_t steps = kSteps - 2, waits = rt.stats().batch_waits;
          if (std::string(batch_kb) == "0") {
            // 2 ms apart, a 1 ms cycle: most tensors go alone.
            if (responses < steps * kTensors / 2)
              return "unbatched: only " + std::to_string(responses) + " collectives";
            return waits == 0 ? "" : "batch waits with batching off";
          }
          // The whole step's tensors, 24 KB, wait for one another until the caller blocks (or
          // kMaxBatchCycles cycles of 4 cycle times pass: at most a few collectives a step).
          if (responses > steps * 4)
            return "batched: " + std::to_string(responses) + " collectives in " + std::to_string(steps) + " steps";
          return waits > 0 ? "" : "no batch waits";
        },
        settings);
    EXPECT_EQ(Failures(results), "") << "GRADCOMP_BATCH_MIN_KB " << batch_kb;
  }
}

TEST(Runtime, JoinedRanksContributeZerosAndJoinReturnsTheLastRank) {
  const auto results = WithRuntimes(3, [&](Runtime& rt) -> std::string {
    const int me = rt.rank();
    // Rank r has r + 1 batches; ranks that run out join while the others continue.
    for (int step = 0; step <= me; ++step) {
      std::vector<float> g(8, 1.0f);
      rt.Allreduce("grad", DataType::kFloat32, {8}, g.data(), g.data(), ReduceOp::kSum)->Wait();
      const float expected = float(3 - step);  // ranks with more than `step` batches contribute
      if (g[0] != expected) return "step " + std::to_string(step) + ": " + std::to_string(g[0]);
    }
    auto join = rt.Join();
    join->Wait();
    if (join->aux().size() != 1 || join->aux()[0] != 2) return "join returned wrong last rank";
    // After everyone joined, normal operation resumes.
    std::vector<float> g(4, 1.0f);
    rt.Allreduce("after", DataType::kFloat32, {4}, g.data(), g.data(), ReduceOp::kSum)->Wait();
    return g[0] == 3.0f ? "" : "after join";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(RuntimeErrors, MismatchesFailEveryRankNamingTensorFieldAndValues) {
  const auto results = WithRuntimes(2, [&](Runtime& rt) -> std::string {
    const int me = rt.rank();
    std::vector<double> buf(6, 1.0);
    auto dtype = rt.Allreduce("x", me == 0 ? DataType::kFloat32 : DataType::kFloat64, {2}, buf.data(), buf.data(),
                              ReduceOp::kSum);
    auto shape = rt.Allreduce("y", DataType::kFloat32, me == 0 ? Shape{2, 3} : Shape{3, 2}, buf.data(), buf.data(),
                              ReduceOp::kSum);
    auto op = rt.Allreduce("z", DataType::kFloat32, {2}, buf.data(), buf.data(),
                           me == 0 ? ReduceOp::kSum : ReduceOp::kMax);
    auto root = rt.Broadcast("r", DataType::kFloat32, {2}, buf.data(), me);
    auto priority = rt.Allreduce("p", DataType::kFloat32, {2}, buf.data(), buf.data(), ReduceOp::kSum, 1.0, 1.0,
                                 nullptr, {}, me == 0 ? 3 : 7);
    auto kind = me == 0 ? rt.Allreduce("k", DataType::kFloat32, {2}, buf.data(), buf.data(), ReduceOp::kSum)
                        : rt.Allgather("k", DataType::kFloat32, {2}, buf.data());
    const std::pair<std::shared_ptr<Handle>, std::string> want[] = {
        {dtype, "mismatched dtype for allreduce of tensor 'x': rank 0 float32, rank 1 float64"},
        {shape, "mismatched shape for allreduce of tensor 'y': rank 0 [2, 3], rank 1 [3, 2]"},
        {op, "mismatched op for allreduce of tensor 'z': rank 0 sum, rank 1 max"},
        {root, "mismatched root rank for broadcast of tensor 'r': rank 0 0, rank 1 1"},
        {priority, "mismatched priority for allreduce of tensor 'p': rank 0 3, rank 1 7"},
        {kind, "mismatched operation for allreduce of tensor 'k': rank 0 allreduce, rank 1 allgather"},
    };
    for (const auto& [h, text] : want) {
      try {
        h->Wait();
        return "no error for: " + text;
      } catch (const InvalidArgument& e) {
        return std::string("mismatch raised InvalidArgument: ") + e.what();
      } catch (const Error& e) {
        if (std::string(e.what()) != text) return std::string("got: ") + e.what();
      }
    }
    // The runtime keeps working after errors.
    float ok = 1;
    rt.Allreduce("ok", DataType::kFloat32, {1}, &ok, &ok, ReduceOp::kSum)->Wait();
    return ok == 2.0f ? "" : "runtime broken after errors";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(RuntimeErrors, UnnamedCallsOutOfStepFailOnEveryRankInsteadOfWaiting) {
  // Rank 0 is one unnamed allreduce ahead of the others (as if a call had been lost on the
  // others): its "allreduce.noname.5" and their "allreduce.noname.4" could never meet.
  const auto results = WithRuntimes(3, [&](Runtime& rt) -> std::string {
    std::vector<float> buf(4, 1.0f);
    const std::string name = rt.rank() == 0 ? "allreduce.noname.5" : "allreduce.noname.4";
    const auto start = std::chrono::steady_clock::now();
    const std::string error =
        ErrorOf(rt.Allreduce(name, DataType::kFloat32, {4}, buf.data(), buf.data(), ReduceOp::kSum));
    const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const std::string want = "unnamed collectives out of step between ranks: ranks [0] submitted "
                             "'allreduce.noname.5' while ranks [1, 2] submitted 'allreduce.noname.4'";
    if (error.find(want) == std::string::npos) return "got: " + error;
    if (waited > 20) return "took " + std::to_string(waited) + " s";
    // Named tensors and ranks that agree are not affected.
    rt.Allreduce("after", DataType::kFloat32, {4}, buf.data(), buf.data(), ReduceOp::kSum)->Wait();
    return buf[0] == 3.0f ? "" : "runtime broken after the error";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(RuntimeErrors, DuplicateNameBadArgumentsAndUseAfterShutdown) {
  const auto results = WithRuntimes(2, [&](Runtime& rt) -> std::string {
    float a = 1, b = 1;
    auto first = rt.Allreduce("dup", DataType::kFloat32, {1}, &a, &a, ReduceOp::kSum);
    try {
      rt.Allreduce("dup", DataType::kFloat32, {1}, &b, &b, ReduceOp::kSum);
      return "duplicate accepted";
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("an allreduce of tensor 'dup' is already pending on rank") == std::string::npos) {
        return std::string("duplicate message: ") + e.what();
      }
    }
    first->Wait();
    const std::pair<std::function<void()>, std::string> bad[] = {
        {[&] { rt.Broadcast("b", DataType::kFloat32, {1}, &a, 2); }, "root rank 2 is outside 0..1"},
        {[&] { rt.Alltoall("s", DataType::kFloat32, {3}, &a, {1, 1}); }, "splits sum to 2 but the first dimension is 3"},
        {[&] { rt.Allgather("g", DataType::kFloat32, {}, &a); }, "needs a tensor with at least one dimension"},
        {[&] { rt.Allreduce("", DataType::kFloat32, {1}, &a, &a, ReduceOp::kSum); }, "needs a tensor name"},
    };
    for (const auto& [call, text] : bad) {
      try {
        call();
        return "accepted: " + text;
      } catch (const InvalidArgument& e) {
        if (std::string(e.what()).find(text) == std::string::npos) return std::string("message: ") + e.what();
      }
    }
    rt.Barrier()->Wait();  // every rank is done with the calls above before any shuts down
    rt.Shutdown();
    try {
      rt.Allreduce("late", DataType::kFloat32, {1}, &a, &a, ReduceOp::kSum);
      return "enqueue after shutdown accepted";
    } catch (const InvalidArgument&) {
      return "after shutdown: wrong type";
    } catch (const Error& e) {
      if (std::string(e.what()).find("gradcomp is not running") == std::string::npos) return e.what();
    }
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(RuntimeErrors, StalledTensorIsReportedThenStopsEveryRank) {
  std::ostringstream logs;
  std::mutex logs_mu;
  Settings s = Settings::FromMap({{"GRADCOMP_STALL_CHECK_TIME_SECONDS", "0.3"},
                                  {"GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS", "1"}});
  const auto results = RunRanks(3, [&](Communicator& comm) -> std::string {
    RuntimeOptions o = Options(comm, s);
    if (comm.rank() == 0) o.log_sink = std::make_shared<spdlog::sinks::ostream_sink_mt>(logs);
    Runtime rt(std::move(o));
    float x = 1;
    std::shared_ptr<Handle> h;
    if (rt.rank() != 2) h = rt.Allreduce("lonely", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (rt.running() && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    if (rt.running()) return "still running after the stall shutdown time";
    const std::string expect = "s for other ranks: submitted by ranks [0, 1], missing ranks [2]";
    if (h) {
      const std::string err = ErrorOf(h);
      if (err.find("gradcomp stopped after GRADCOMP_STALL_SHUTDOWN_TIME_SECONDS=1: tensor 'lonely' (allreduce) "
                   "has waited 1.") == std::string::npos ||
          err.find(expect) == std::string::npos) {
        return "pending tensor error: " + err;
      }
    }
    try {
      rt.Allreduce("next", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum);
      return "enqueue accepted after the stall shutdown";
    } catch (const Error& e) {
      if (std::string(e.what()).find("missing ranks [2]") == std::string::npos) return e.what();
    }
    return "";
  });
  EXPECT_EQ(Failures(results), "");
  std::lock_guard<std::mutex> lock(logs_mu);
  EXPECT_NE(logs.str().find("[gradcomp rank 0] [warning] tensor 'lonely' (allreduce) has waited 0."), std::string::npos)
      << logs.str();
  EXPECT_NE(logs.str().find("s for other ranks: submitted by ranks [0, 1], missing ranks [2]"), std::string::npos)
      << logs.str();
}

TEST(RuntimeErrors, AnExceptionOnOneRankReachesEveryRank) {
  const auto results = RunRanks(3, [&](Communicator& comm) -> std::string {
    RuntimeOptions o = Options(comm);
    if (comm.rank() == 1) {
      o.fault_injector = [](const std::string& name) {
        if (name == "bad") throw std::runtime_error("simulated out-of-memory while staging 'bad'");
      };
    }
    Runtime rt(std::move(o));
    float x = 1, y = 1;
    auto bad = rt.Allreduce("bad", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum);
    const std::string err = ErrorOf(bad);
    if (err != "rank 1: simulated out-of-memory while staging 'bad'") return "got: " + err;
    rt.Allreduce("good", DataType::kFloat32, {1}, &y, &y, ReduceOp::kSum)->Wait();
    return y == 3.0f ? "" : "later operation failed";
  });
  EXPECT_EQ(Failures(results), "");
}

// A rank stuck between taking its tensors from the queue and the agreement to run them (here
// the fault injector stalls in its local preparation): the others' agreement times out, and
// their callers waiting for those tensors must hear it (a Python exception they can act on)
// before the watchdog ends the process. The handles had left the queue, so only the watchdog
// step can fail them. The process exits, so this runs as a death test.
TEST(RuntimeErrorsDeathTest, ATimedOutAgreementFailsTheWaitingCallers) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const auto body = [] {
    Settings s = Settings::FromMap({{"GRADCOMP_COLLECTIVE_TIMEOUT_SECONDS", "1"}});
    RunRanks(2, [&](Communicator& comm) -> std::string {
      RuntimeOptions o = Options(comm, s);
      if (comm.rank() == 1) {
        o.fault_injector = [](const std::string&) { std::this_thread::sleep_for(std::chrono::seconds(60)); };
      }
      Runtime rt(std::move(o));
      float x = 1;
      auto h = rt.Allreduce("stuck", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum);
      if (comm.rank() == 0) {
        const std::string err = ErrorOf(h);
        std::fprintf(stderr, "caller heard: %s\n", err.c_str());
        std::fflush(stderr);
        std::_Exit(3);
      }
      std::this_thread::sleep_for(std::chrono::seconds(60));
      return "";
    });
  };
  EXPECT_EXIT(body(), ::testing::ExitedWithCode(3),
              "caller heard: rank 0: the agreement that every rank is ready to run the allreduce of 'stuck' has not "
              "completed after 1 s");
}

TEST(Runtime, IdleBackgroundThreadUsesAlmostNoCpu) {
  const auto results = WithRuntimes(2, [&](Runtime& rt) -> std::string {
    float x = 1;
    rt.Allreduce("warm", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum)->Wait();
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let the heartbeat back off
    const double before = rt.BackgroundCpuSeconds();
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const double used = rt.BackgroundCpuSeconds() - before;
    std::printf("rank %d: background thread used %.4f CPU s in 2 s idle (%.3f%%)\n", rt.rank(), used, used / 2 * 100);
    return used < 0.02 ? "" : "idle background thread used " + std::to_string(used) + " s of CPU in 2 s";
  });
  EXPECT_EQ(Failures(results), "");
}

// Users find which thread takes a core (top -H, ps -L) by its name.
TEST(Runtime, BackgroundThreadsAreNamed) {
  const auto results = WithRuntimes(2, [&](Runtime& rt) -> std::string {
    float x = 1;
    rt.Allreduce("before", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum)->Wait();  // both have started
    int named = 0;
    for (const auto& task : std::filesystem::directory_iterator("/proc/self/task")) {
      std::ifstream comm(task.path() / "comm");
      std::string name;
      if (std::getline(comm, name) && name == "gc-background") ++named;
    }
    rt.Allreduce("after", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum)->Wait();  // neither has stopped
    return named == 2 ? "" : std::to_string(named) + " threads named gc-background, expected one per runtime";
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(Runtime, ShutdownAndInitAgainInTheSameThreads) {
  const auto results = RunRanks(2, [&](Communicator& comm) -> std::string {
    for (int round = 0; round < 3; ++round) {
      Runtime rt(Options(comm));
      float x = float(round);
      rt.Allreduce("x", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum)->Wait();
      if (x != 2.0f * round) return "round " + std::to_string(round);
      rt.Shutdown();
      if (rt.running()) return "still running";
    }
    return "";
  });
  EXPECT_EQ(Failures(results), "");
}

// nccl is for tensors in GPU memory: a build with NCCL takes the setting and keeps CPU tensors
// on the host transports; a build without refuses it, naming the setting.
TEST(Runtime, NcclCommunicatorSettingsNeedABuildWithNccl) {
  for (const auto& [var, value] : std::vector<std::pair<std::string, std::string>>{
           {"GRADCOMP_INNER_COMMUNICATOR", "nccl"}, {"CGX_CROSS_COMMUNICATOR_TYPE", "NCCL"}}) {
#if GRADCOMP_HAVE_NCCL_COMMUNICATOR
    const auto results = RunRanks(2, [&, var = var, value = value](Communicator& comm) -> std::string {
      Runtime rt(Options(comm, Settings::FromMap({{var, value}})));
      float x = 1.0f;
      rt.Allreduce("cpu", DataType::kFloat32, {1}, &x, &x, ReduceOp::kSum)->Wait();
      return x == 2.0f ? "" : "CPU tensor allreduce gave " + std::to_string(x);
    });
    EXPECT_EQ(Failures(results), "") << var;
#else
    try {
      RunRanks(1, [&, var = var, value = value](Communicator& comm) -> std::string {
        Runtime rt(Options(comm, Settings::FromMap({{var, value}})));
        return "";
      });
      FAIL() << var << " accepted";
    } catch (const InvalidArgument& e) {
      const std::string want = var == "GRADCOMP_INNER_COMMUNICATOR"
                                   ? "GRADCOMP_INNER_COMMUNICATOR (CGX_INNER_COMMUNICATOR_TYPE)=nccl needs a build with"
                                   : "GRADCOMP_CROSS_COMMUNICATOR (CGX_CROSS_COMMUNICATOR_TYPE)=nccl needs a build with";
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
#endif
  }
}

TEST(Runtime, SettingsMustAgreeAcrossRanks) {
  try {
    RunRanks(2, [&](Communicator& comm) -> std::string {
      Settings s = Settings::FromMap({{"GRADCOMP_FUSION_THRESHOLD_MB", comm.rank() == 0 ? "64" : "32"}});
      Runtime rt(Options(comm, s));
      return "";
    });
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank 0 has GRADCOMP_FUSION_THRESHOLD_MB=64.000000 but rank 1 has "
                                         "GRADCOMP_FUSION_THRESHOLD_MB=32.000000"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gradcomp
