// Compressed reduce-scatter and allgather (ops/collectives/compressed_shards.h) over thread
// ranks: within their analytic bounds against float64, bit-identical gathers, the same bytes on
// the host and through the separate-memory device, the hierarchical forms, error feedback, and
// the reduce-scatter then the allgather giving the compressed allreduce's bits (SRA's halves).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "ops/collectives/compressed_allreduce.h"
#include "ops/collectives/compressed_shards.h"
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

constexpr int kBits = 4;
constexpr size_t kBucket = 512;

// Shards of `count` values the way the runtime cuts a reducescatter's rows: `rows` rows of
// count / rows values, ranks below rows % world one row more.
std::vector<size_t> RowShards(size_t count, size_t rows, int world) {
  std::vector<size_t> shards;
  for (size_t r : EvenSplit(rows, world)) shards.push_back(r * (count / rows));
  return shards;
}

// The buckets of shard [begin, begin + len) of a buffer of tensors `segments`: they restart at
// the shard's start and at each tensor's (the blocks the reduction works in are whole buckets).
std::vector<std::pair<size_t, size_t>> BucketsOf(size_t begin, size_t len, const std::vector<size_t>& segments) {
  std::vector<std::pair<size_t, size_t>> buckets;
  size_t t0 = 0;
  for (size_t seg : segments) {
    const size_t a = std::max(begin, t0), b = std::min(begin + len, t0 + seg);
    for (size_t at = a; at < b; at += kBucket) buckets.emplace_back(at, std::min(b, at + kBucket));
    t0 += seg;
  }
  return buckets;
}

// Every rank's input, as RunRanks' ranks make them.
std::vector<std::vector<float>> Inputs(int world, size_t count) {
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < world; ++r) parts.push_back(Gradient(count, r, 1e4));
  return parts;
}

// Half the unit of the bucket [a, b) of `values`: range / (2^bits - 1) / 2.
double HalfUnit(const std::vector<float>& values, size_t a, size_t b) {
  float lo = values[a], hi = values[a];
  for (size_t i = a; i < b; ++i) {
    lo = std::min(lo, values[i]);
    hi = std::max(hi, values[i]);
  }
  return (static_cast<double>(hi) - lo) / ((1 << kBits) - 1) / 2;
}

// |reducescatter output - exact| <= scale * sum over the participants but the owner of half
// their bucket's unit (compressed_shards.h), plus float32's rounding of the sums. Participant p
// owns shard p.
std::vector<double> ReducescatterBound(const std::vector<std::vector<float>>& parts, const std::vector<size_t>& shards,
                                       const std::vector<size_t>& segments, double scale) {
  const size_t count = parts[0].size();
  std::vector<double> bound(count, 0.0);
  const std::vector<size_t> off = Offsets(shards);
  for (size_t o = 0; o < shards.size(); ++o) {
    for (const auto& [a, b] : BucketsOf(off[o], shards[o], segments)) {
      for (size_t p = 0; p < parts.size(); ++p) {
        if (p == o) continue;
        const double half = scale * HalfUnit(parts[p], a, b);
        for (size_t i = a; i < b; ++i) bound[i] += half;
      }
    }
  }
  for (size_t i = 0; i < count; ++i) {
    double magnitude = 0;
    for (const auto& part : parts) magnitude += std::fabs(part[i]);
    bound[i] += 1e-6 * scale * magnitude + 1e-7;
  }
  return bound;
}

std::string WithinBound(const std::vector<float>& got, size_t base, const std::vector<double>& exact,
                        const std::vector<double>& bound) {
  for (size_t i = 0; i < got.size(); ++i) {
    if (!(std::fabs(got[i] - exact[base + i]) <= bound[base + i])) {
      return "element " + std::to_string(base + i) + ": " + std::to_string(got[i]) + " vs exact " +
             std::to_string(exact[base + i]) + ", bound " + std::to_string(bound[base + i]);
    }
  }
  return "";
}

// The options of a sharded collective of `in` into `out` (maxmin, kBits, kBucket, Average).
CompressedAllreduceOptions ShardOptions(const std::vector<float>& in, std::vector<float>& out, size_t count,
                                        const std::vector<size_t>& segments) {
  CompressedAllreduceOptions o = AverageWith(in, out, "maxmin", kBits, kBucket);
  o.count = count;
  o.segments = segments;
  return o;
}

struct ShardCase {
  int world;
  size_t rows;  // the buffer's rows (0: EvenSplit of the values)
};

class ReducescatterSweep : public ::testing::TestWithParam<ShardCase> {};

TEST_P(ReducescatterSweep, WithinTheBoundOnTheHostAndTheDevice) {
  const int world = GetParam().world;
  const size_t rows = GetParam().rows, count = rows ? rows * 3001 : 400009;
  const std::vector<size_t> segments{3000, count - 3000};  // a tensor bound inside a shard
  const std::vector<size_t> shards = rows ? RowShards(count, rows, world) : EvenSplit(count, world);
  const std::vector<size_t> off = Offsets(shards);
  std::vector<std::vector<float>> outs(static_cast<size_t>(world));
  RunRanks(world, [&](Communicator& comm) {
    const size_t me = static_cast<size_t>(comm.rank());
    const std::vector<float> in = Gradient(count, comm.rank(), 1e4);
    std::vector<float> out(shards[me], -1.0f);
    OnHostAndDevice(ShardOptions(in, out, count, segments), count, shards[me],
                    [&](const CompressedAllreduceOptions& q, bool device_comm) {
                      CompressedReducescatter(device_comm ? *DeviceMemoryCommunicator(comm, TestDevice()) : comm, q,
                                              shards);
                    });
    outs[me] = out;
    return std::string();
  });
  const auto parts = Inputs(world, count);
  const std::vector<double> exact = ExactSum(parts, 1.0 / world);
  const std::vector<double> bound = ReducescatterBound(parts, shards, segments, 1.0 / world);
  for (size_t r = 0; r < outs.size(); ++r) EXPECT_EQ(WithinBound(outs[r], off[r], exact, bound), "") << "rank " << r;
}

INSTANTIATE_TEST_SUITE_P(Worlds, ReducescatterSweep,
                         ::testing::Values(ShardCase{1, 0}, ShardCase{2, 0}, ShardCase{3, 0}, ShardCase{4, 0},
                                           ShardCase{5, 0}, ShardCase{3, 131}, ShardCase{4, 2}),
                         [](const ::testing::TestParamInfo<ShardCase>& c) {
                           return "world" + std::to_string(c.param.world) +
                                  (c.param.rows ? "_rows" + std::to_string(c.param.rows) : "");
                         });

class AllgatherSweep : public ::testing::TestWithParam<ShardCase> {};

TEST_P(AllgatherSweep, BitIdenticalAndWithinHalfAUnitOfEveryShard) {
  const int world = GetParam().world;
  const size_t rows = GetParam().rows, count = rows ? rows * 3001 : 400009;
  const std::vector<size_t> segments{count - 2500, 2500};
  const std::vector<size_t> shards = rows ? RowShards(count, rows, world) : EvenSplit(count, world);
  const std::vector<size_t> off = Offsets(shards);
  // The whole buffer every rank's shard comes from; rank r holds shard r of it.
  const std::vector<float> full = Gradient(count, 7, 1e4);
  std::vector<std::vector<float>> outs(static_cast<size_t>(world));
  RunRanks(world, [&](Communicator& comm) {
    const size_t me = static_cast<size_t>(comm.rank());
    const std::vector<float> in(full.begin() + static_cast<long>(off[me]),
                                full.begin() + static_cast<long>(off[me] + shards[me]));
    std::vector<float> out(count, -1.0f);
    OnHostAndDevice(ShardOptions(in, out, count, segments), shards[me], count,
                    [&](const CompressedAllreduceOptions& q, bool device_comm) {
                      CompressedAllgather(device_comm ? *DeviceMemoryCommunicator(comm, TestDevice()) : comm, q,
                                          shards);
                    });
    outs[me] = out;
    return std::string();
  });
  for (size_t r = 1; r < outs.size(); ++r) ASSERT_EQ(outs[r], outs[0]) << "rank " << r << " differs from rank 0";
  for (size_t s = 0; s < shards.size(); ++s) {
    for (const auto& [a, b] : BucketsOf(off[s], shards[s], segments)) {
      const double half = HalfUnit(full, a, b) * (1 + 1e-6) + 1e-7;
      for (size_t i = a; i < b; ++i) {
        ASSERT_LE(std::fabs(outs[0][i] - full[i]), half) << "element " << i << " of shard " << s;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllgatherSweep,
                         ::testing::Values(ShardCase{1, 0}, ShardCase{2, 0}, ShardCase{3, 0}, ShardCase{4, 0},
                                           ShardCase{5, 0}, ShardCase{3, 131}),
                         [](const ::testing::TestParamInfo<ShardCase>& c) {
                           return "world" + std::to_string(c.param.world) +
                                  (c.param.rows ? "_rows" + std::to_string(c.param.rows) : "");
                         });

// SRA is its reduce-scatter half followed by its allgather half (ops/collectives/sra_halves.h):
// the compressed reduce-scatter of even shards, then the compressed allgather of each rank's
// reduced shard, give the bits of the compressed allreduce (one stripe) and of its first
// compression's residual, nearest and stochastic rounding alike.
TEST(CompressedShards, ReducescatterThenAllgatherIsTheCompressedAllreduce) {
  const size_t count = (size_t{1} << 20) + 7;
  const std::vector<size_t> segments{3000, count - 3000};
  for (int world : {2, 3, 5}) {
    const std::vector<size_t> shards = EvenSplit(count, world);
    for (bool stochastic : {false, true}) {
      const std::string failures = Failures(RunRanks(world, [&](Communicator& comm) {
        const std::vector<float> in = Gradient(count, comm.rank(), 1e4);
        std::vector<float> sra(count, -1.0f), sra_residual(count, 0.0f);
        CompressedAllreduceOptions a = ShardOptions(in, sra, count, segments);
        a.params.stochastic = stochastic;
        a.residual = sra_residual.data();
        CompressedAllreduce(comm, a);
        std::vector<float> shard(shards[static_cast<size_t>(comm.rank())]), halves(count, -2.0f), residual(count, 0.0f);
        CompressedAllreduceOptions rs = ShardOptions(in, shard, count, segments);
        rs.params.stochastic = stochastic;
        rs.residual = residual.data();
        CompressedReducescatter(comm, rs, shards);
        CompressedAllreduceOptions ag = ShardOptions(shard, halves, count, segments);
        ag.params.stochastic = stochastic;
        CompressedAllgather(comm, ag, shards);
        if (std::memcmp(halves.data(), sra.data(), count * sizeof(float)) != 0) {
          return std::string("the halves' result is not the allreduce's");
        }
        if (std::memcmp(residual.data(), sra_residual.data(), count * sizeof(float)) != 0) {
          return std::string("the reduce-scatter's residual is not the allreduce's");
        }
        return std::string();
      }));
      EXPECT_EQ(failures, "") << "world " << world << (stochastic ? ", stochastic" : ", nearest");
    }
  }
}

struct NodeShape {
  int world, local;
};

class HierarchicalShards : public ::testing::TestWithParam<NodeShape> {};

// Summed inside the node first, the reduce-scatter's compressed participants are the nodes
// (their float32 sums); the allgather's bytes are the flat one's (the same encodings).
TEST_P(HierarchicalShards, ReducescatterWithinTheNodeBoundAndAllgatherAsFlat) {
  const int world = GetParam().world, local = GetParam().local, nodes = world / local;
  const size_t count = 1000003;
  const std::vector<size_t> segments{200000, count - 200000};
  const std::vector<size_t> shards = EvenSplit(count, world), off = Offsets(shards);
  const std::vector<float> full = Gradient(count, 11, 1e4);
  std::vector<std::vector<float>> reduced(static_cast<size_t>(world)), gathered(static_cast<size_t>(world)),
      flat(static_cast<size_t>(world));
  RunTopology(world, local, [&](Topology& topo) {
    const size_t me = static_cast<size_t>(topo.rank());
    const std::vector<float> in = Gradient(count, topo.rank(), 1e4);
    reduced[me].assign(shards[me], -1.0f);
    HierarchicalCompressedReducescatter(topo, ShardOptions(in, reduced[me], count, segments), shards);
    const std::vector<float> mine(full.begin() + static_cast<long>(off[me]),
                                  full.begin() + static_cast<long>(off[me] + shards[me]));
    gathered[me].assign(count, -1.0f);
    flat[me].assign(count, -2.0f);
    HierarchicalCompressedAllgather(topo, ShardOptions(mine, gathered[me], count, segments), shards);
    CompressedAllgather(*topo.world, ShardOptions(mine, flat[me], count, segments), shards);
    return std::string();
  });
  const auto parts = Inputs(world, count);
  std::vector<std::vector<float>> node_sums(static_cast<size_t>(nodes), std::vector<float>(count, 0.0f));
  for (int r = 0; r < world; ++r) {
    for (size_t i = 0; i < count; ++i) node_sums[static_cast<size_t>(r / local)][i] += parts[static_cast<size_t>(r)][i];
  }
  // Each rank's shard: half a unit of every other node's float32 sum over its own buckets.
  std::vector<double> bound(count, 0.0);
  for (int r = 0; r < world; ++r) {
    const size_t q = static_cast<size_t>(r);
    for (const auto& [a, b] : BucketsOf(off[q], shards[q], segments)) {
      for (int n = 0; n < nodes; ++n) {
        if (n == r / local) continue;
        const double half = HalfUnit(node_sums[static_cast<size_t>(n)], a, b) / world;
        for (size_t i = a; i < b; ++i) bound[i] += half;
      }
    }
  }
  for (size_t i = 0; i < count; ++i) bound[i] += 1e-5;  // + the float32 node sums
  const std::vector<double> exact = ExactSum(parts, 1.0 / world);
  for (size_t r = 0; r < static_cast<size_t>(world); ++r) {
    EXPECT_EQ(WithinBound(reduced[r], off[r], exact, bound), "") << "rank " << r;
    ASSERT_EQ(gathered[r], flat[r]) << "rank " << r << ": the hierarchical allgather differs from the flat one";
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, HierarchicalShards,
                         ::testing::Values(NodeShape{4, 2}, NodeShape{6, 3}, NodeShape{6, 2}, NodeShape{8, 4}),
                         [](const ::testing::TestParamInfo<NodeShape>& s) {
                           return "world" + std::to_string(s.param.world) + "_local" + std::to_string(s.param.local);
                         });

// With error feedback each rank's encoding error is carried into its next call: the mean of the
// outputs over calls on the same gradient approaches the exact average far closer than one call.
TEST(CompressedReducescatter, ErrorFeedbackMakesTheAverageOverStepsConverge) {
  for (const bool hierarchical : {false, true}) {
    const int world = 4, steps = 40;
    const size_t count = 20000;
    const std::vector<size_t> shards = EvenSplit(count, world), off = Offsets(shards);
    std::vector<double> first_error(static_cast<size_t>(world)), mean_error(static_cast<size_t>(world));
    const auto exact = ExactSum(Inputs(world, count), 1.0 / world);
    RunTopology(world, 2, [&](Topology& topo) {
      const size_t me = static_cast<size_t>(topo.rank());
      const std::vector<float> in = Gradient(count, topo.rank(), 1e4);
      std::vector<float> out(shards[me]), residual(count, 0.0f);
      std::vector<double> sum(shards[me], 0.0);
      for (int step = 0; step < steps; ++step) {
        CompressedAllreduceOptions o = ShardOptions(in, out, count, {});
        o.residual = residual.data();
        if (hierarchical) {
          HierarchicalCompressedReducescatter(topo, o, shards);
        } else {
          CompressedReducescatter(*topo.world, o, shards);
        }
        double err = 0, mean_err = 0;
        for (size_t i = 0; i < shards[me]; ++i) {
          sum[i] += out[i];
          err += std::pow(out[i] - exact[off[me] + i], 2);
          mean_err += std::pow(sum[i] / (step + 1) - exact[off[me] + i], 2);
        }
        if (step == 0) first_error[me] = std::sqrt(err);
        mean_error[me] = std::sqrt(mean_err);
      }
      return std::string();
    });
    for (int r = 0; r < world; ++r) {
      EXPECT_LT(mean_error[static_cast<size_t>(r)], first_error[static_cast<size_t>(r)] / 8)
          << (hierarchical ? "hierarchical" : "flat") << ", rank " << r;
    }
  }
}

// float16 buffers in and out; the bytes sent are the encodings of the peers' shards only.
TEST(CompressedReducescatter, HalfTensorsAndTheBytesSent) {
  const int world = 3;
  const size_t count = 30000;
  const std::vector<size_t> shards = EvenSplit(count, world), off = Offsets(shards);
  RunRanks(world, [&](Communicator& comm) {
    const size_t me = static_cast<size_t>(comm.rank());
    const std::vector<float> in = Gradient(count, comm.rank(), 1e2);
    std::vector<uint16_t> half(count), half_out(shards[me]);
    CastBuffer(in.data(), DataType::kFloat32, count, half.data(), DataType::kFloat16, false);
    std::vector<float> as_float(count), out(shards[me]), back(shards[me]);
    CastBuffer(half.data(), DataType::kFloat16, count, as_float.data(), DataType::kFloat32, false);
    const CompressedAllreduceStats st = CompressedReducescatter(comm, ShardOptions(as_float, out, count, {}), shards);
    CompressedAllreduceOptions h = ShardOptions(as_float, out, count, {});
    h.input = half.data();
    h.output = half_out.data();
    h.dtype = DataType::kFloat16;
    CompressedReducescatter(comm, h, shards);
    CastBuffer(half_out.data(), DataType::kFloat16, shards[me], back.data(), DataType::kFloat32, false);
    for (size_t i = 0; i < shards[me]; ++i) {
      if (std::fabs(back[i] - out[i]) > 1e-3 * std::fabs(out[i]) + 1e-6) {
        return "float16 element " + std::to_string(off[me] + i) + ": " + std::to_string(back[i]) + " vs float32's " +
               std::to_string(out[i]);
      }
    }
    // 4 bits a value and each bucket's float32 min and scale, for the two peers' shards.
    size_t peers = 0;
    for (size_t q = 0; q < shards.size(); ++q) peers += q == me ? 0 : shards[q];
    const double expected = peers * 0.5 + (peers + kBucket - 1) / kBucket * 8.0;
    if (std::fabs(static_cast<double>(st.bytes_sent) - expected) > 0.01 * expected) {
      return "sent " + std::to_string(st.bytes_sent) + " bytes, expected about " + std::to_string(expected);
    }
    return std::string();
  });
}

TEST(CompressedShardsErrors, NameTheCollectiveTheTensorAndWhatIsWrong) {
  const auto message = [](const std::function<void(Communicator&)>& run) {
    std::string what;
    try {
      RunRanks(2, [&](Communicator& c) {
        run(c);
        return std::string();
      });
    } catch (const std::exception& e) {
      what = e.what();
    }
    return what;
  };
  std::vector<float> in(100, 1.0f), out(100);
  const std::string counts = message([&](Communicator& c) {
    CompressedReducescatter(c, ShardOptions(in, out, 100, {}), {40, 40});
  });
  EXPECT_NE(counts.find("compressed reducescatter"), std::string::npos) << counts;
  EXPECT_NE(counts.find("'grad'"), std::string::npos) << counts;
  EXPECT_NE(counts.find("the shards hold 80 values, the buffer 100"), std::string::npos) << counts;
  const std::string ranks = message([&](Communicator& c) {
    CompressedAllgather(c, ShardOptions(in, out, 100, {}), {100});
  });
  EXPECT_NE(ranks.find("compressed allgather"), std::string::npos) << ranks;
  EXPECT_NE(ranks.find("one shard count per rank: got 1 for 2 ranks"), std::string::npos) << ranks;
  const std::string sparse = message([&](Communicator& c) {
    CompressedAllreduceOptions o = ShardOptions(in, out, 100, {});
    o.codec = &FindCodec("topk");
    CompressedAllgather(c, o, {50, 50});
  });
  EXPECT_NE(sparse.find("needs a dense codec"), std::string::npos) << sparse;
}

}  // namespace
}  // namespace gradcomp
