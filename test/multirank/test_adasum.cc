// Adasum over thread ranks (ops/collectives/adasum.h): every floating dtype, world sizes 1-8
// (powers of two and the fold beyond them), fused tensors of several sizes, against a float64
// tree written from the formula; its defining properties; the same bits on every rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "ops/collectives/adasum.h"
#include "ops/common/enforce.h"
#include "ops/common/half.h"
#include "test/support/harness.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;
using Vec = std::vector<double>;

// a (+) b on whole float64 vectors, straight from the definition.
Vec Combine(const Vec& a, const Vec& b) {
  double ab = 0, aa = 0, bb = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    ab += a[i] * b[i];
    aa += a[i] * a[i];
    bb += b[i] * b[i];
  }
  const double ca = aa == 0 ? 1 : 1 - ab / (2 * aa), cb = bb == 0 ? 1 : 1 - ab / (2 * bb);
  Vec out(a.size());
  for (size_t i = 0; i < a.size(); ++i) out[i] = ca * a[i] + cb * b[i];
  return out;
}

// The tree over ranks' vectors: ranks beyond the largest power of two p fold into rank - p,
// then pairs (2i, 2i+1), pairs of pairs, ... (Horovod's order).
Vec Tree(std::vector<Vec> v) {
  size_t p = 1;
  while (2 * p <= v.size()) p *= 2;
  for (size_t r = p; r < v.size(); ++r) v[r - p] = Combine(v[r - p], v[r]);
  v.resize(p);
  while (v.size() > 1) {
    std::vector<Vec> next;
    for (size_t i = 0; i < v.size(); i += 2) next.push_back(Combine(v[i], v[i + 1]));
    v = std::move(next);
  }
  return v[0];
}

double Get(DataType dt, const char* p, size_t i) {
  switch (dt) {
    case DataType::kFloat16: return HalfBitsToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kBFloat16: return BFloat16BitsToFloat(reinterpret_cast<const uint16_t*>(p)[i]);
    case DataType::kFloat32: return reinterpret_cast<const float*>(p)[i];
    default: return reinterpret_cast<const double*>(p)[i];
  }
}

void Put(DataType dt, char* p, size_t i, double v) {
  switch (dt) {
    case DataType::kFloat16: reinterpret_cast<uint16_t*>(p)[i] = FloatToHalfBits(static_cast<float>(v)); return;
    case DataType::kBFloat16:
      reinterpret_cast<uint16_t*>(p)[i] = FloatToBFloat16Bits(static_cast<float>(v));
      return;
    case DataType::kFloat32: reinterpret_cast<float*>(p)[i] = static_cast<float>(v); return;
    default: reinterpret_cast<double*>(p)[i] = v;
  }
}

// Relative L2 error bound of one tensor: a few roundings to the dtype per tree level.
double Bound(DataType dt) {
  switch (dt) {
    case DataType::kFloat16: return 4e-3;
    case DataType::kBFloat16: return 3e-2;
    case DataType::kFloat32: return 1e-6;
    default: return 1e-12;
  }
}

// Rank r's tensor t: a component every rank shares plus one of its own, so that the
// coefficients are far from both 1 (orthogonal) and 1/2 (equal), and the norms differ by rank.
Vec MakeVector(size_t count, int rank, size_t tensor, double own) {
  std::mt19937_64 shared_rng(1000 + tensor), own_rng(77 * (rank + 1) + tensor);
  std::normal_distribution<double> normal;
  Vec v(count);
  for (size_t i = 0; i < count; ++i) {
    const double s = normal(shared_rng);
    v[i] = s + own * (1 + 0.25 * rank) * normal(own_rng);
  }
  return v;
}

struct Case {
  DataType dtype;
  std::vector<size_t> counts;
  double prescale = 1.0, postscale = 1.0;
  int joined = -1;  // this rank passes null inputs (a zero vector)
};

// The ranks' vectors averaged within each node of `nodes` (consecutive ranks) before the tree.
std::vector<Vec> NodeAverages(const std::vector<Vec>& per_rank, const std::vector<int>& nodes) {
  std::vector<Vec> out;
  size_t r = 0;
  for (int size : nodes) {
    Vec avg(per_rank[r].size(), 0.0);
    for (int i = 0; i < size; ++i, ++r) {
      for (size_t j = 0; j < avg.size(); ++j) avg[j] += per_rank[r][j] / size;
    }
    out.push_back(std::move(avg));
  }
  return out;
}

// This rank's topology of nodes of `nodes` consecutive ranks, of equal sizes or not.
Topology NodesOf(Communicator& comm, const std::vector<int>& nodes) {
  int node = 0, first = 0;
  while (comm.rank() >= first + nodes[static_cast<size_t>(node)]) first += nodes[static_cast<size_t>(node++)];
  if (std::all_of(nodes.begin(), nodes.end(), [&](int n) { return n == nodes[0]; })) {
    return BuildTopology(comm.Split(0, comm.rank()), nodes[0], LocalTransport::kSharedMemory);
  }
  Topology topo;
  topo.world = comm.Split(0, comm.rank());
  topo.local = comm.Split(node, comm.rank());
  topo.cross = comm.Split(comm.rank() - first, comm.rank());
  topo.homogeneous = false;
  return topo;
}

// Adasum over `world` ranks, or, with `nodes` (their sizes, summing to world), of the nodes'
// averages, against the float64 tree; the same bits on every rank.
std::string RunCase(const Case& c, int world, const std::vector<int>& nodes = {}) {
  const size_t esize = DataTypeSize(c.dtype);
  // The inputs as the dtype stores them, and the reference on those rounded values.
  std::vector<std::vector<std::vector<char>>> inputs(world);
  std::vector<Vec> expected(c.counts.size());
  for (size_t t = 0; t < c.counts.size(); ++t) {
    std::vector<Vec> per_rank;
    for (int r = 0; r < world; ++r) {
      Vec v = MakeVector(c.counts[t], r, t, t % 2 == 0 ? 0.7 : 2.0);
      std::vector<char> bytes(c.counts[t] * esize);
      for (size_t i = 0; i < v.size(); ++i) {
        Put(c.dtype, bytes.data(), i, v[i]);
        v[i] = r == c.joined ? 0.0 : Get(c.dtype, bytes.data(), i) * c.prescale;
      }
      inputs[r].push_back(std::move(bytes));
      per_rank.push_back(std::move(v));
    }
    expected[t] = Tree(nodes.empty() ? per_rank : NodeAverages(per_rank, nodes));
    for (double& x : expected[t]) x *= c.postscale;
  }
  std::vector<std::vector<std::vector<char>>> outputs(world);
  const auto results = RunRanks(world, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<BufferPiece> pieces;
    for (size_t t = 0; t < c.counts.size(); ++t) {
      outputs[r].emplace_back(c.counts[t] * esize);
      pieces.push_back({r == c.joined ? nullptr : inputs[r][t].data(), outputs[r][t].data(), c.counts[t]});
    }
    AllreduceOptions o;
    o.dtype = c.dtype;
    o.op = ReduceOp::kAdasum;
    o.prescale = c.prescale;
    o.postscale = c.postscale;
    o.name = "adasum_test";
    std::vector<char> scratch;
    if (nodes.empty()) {
      AdasumAllreduce(comm, pieces, o, scratch);
    } else {
      NodeAdasumAllreduce(NodesOf(comm, nodes), pieces, o, scratch);
    }
    for (size_t t = 0; t < c.counts.size(); ++t) {
      double err = 0, norm = 0;
      for (size_t i = 0; i < c.counts[t]; ++i) {
        const double d = Get(c.dtype, outputs[r][t].data(), i) - expected[t][i];
        err += d * d;
        norm += expected[t][i] * expected[t][i];
      }
      const double rel = norm > 0 ? std::sqrt(err / norm) : std::sqrt(err);
      if (!(rel <= Bound(c.dtype))) {
        return "tensor " + std::to_string(t) + " (" + std::to_string(c.counts[t]) + " elements, " +
               DataTypeName(c.dtype) + "): relative L2 error " + std::to_string(rel) + " from the tree";
      }
    }
    return std::string();
  });
  std::string failures = Failures(results);
  for (int r = 1; r < world && failures.empty(); ++r) {
    for (size_t t = 0; t < c.counts.size(); ++t) {
      if (outputs[r][t] != outputs[0][t]) failures = "rank " + std::to_string(r) + " differs from rank 0 in tensor " +
                                                      std::to_string(t);
    }
  }
  return failures;
}

class AdasumWorld : public ::testing::TestWithParam<int> {};

TEST_P(AdasumWorld, FusedTensorsEqualTheTreeForEveryDtype) {
  const int world = GetParam();
  for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
    // Sizes that split unevenly at every level, an empty tensor and one smaller than the world.
    EXPECT_EQ(RunCase({dt, {4097, 0, 1, 3, 100003, 64}}, world), "") << DataTypeName(dt) << " world " << world;
  }
}

TEST_P(AdasumWorld, ScaleFactorsAndAZeroRank) {
  const int world = GetParam();
  EXPECT_EQ(RunCase({DataType::kFloat32, {5000, 17}, 0.5, 3.0}, world), "");
  if (world > 1) {
    EXPECT_EQ(RunCase({DataType::kFloat32, {5000, 17}, 1.0, 1.0, world - 1}, world), "");
  }
}

INSTANTIATE_TEST_SUITE_P(WorldSizes, AdasumWorld, ::testing::Range(1, 9));

// Horovod's Adasum of GPU tensors: the tree over the nodes' averages. Nodes of equal sizes
// (each rank of a node runs the tree on its shard, the coefficients of the whole vectors): 2 to 4
// nodes (3 folds) of 2 to 4 ranks, one node (the average), nodes of one rank (the flat tree); and
// nodes of different sizes (each node's first rank runs it).
TEST(Adasum, NodeAveragesEqualTheTreeOverNodes) {
  const std::vector<std::vector<int>> layouts = {{2, 2}, {2, 2, 2}, {2, 2, 2, 2}, {4, 4}, {3, 3}, {4},
                                                 {1, 1, 1}, {2, 1, 3}, {1, 2}, {3, 1, 1, 2}};
  for (const std::vector<int>& nodes : layouts) {
    int world = 0;
    for (int n : nodes) world += n;
    std::string layout;
    for (int n : nodes) layout += std::to_string(n) + " ";
    for (DataType dt : {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16, DataType::kBFloat16}) {
      // Tensors that straddle the node's shards, an empty one and one smaller than a node.
      EXPECT_EQ(RunCase({dt, {4097, 0, 1, 3, 100003, 64}}, world, nodes), "")
          << DataTypeName(dt) << ", nodes of " << layout;
    }
    EXPECT_EQ(RunCase({DataType::kFloat32, {5000, 17}, 0.5, 3.0, world - 1}, world, nodes), "")
        << "scale factors and a zero rank, nodes of " << layout;
  }
}

TEST(Adasum, MillionElementModelOnFourRanks) {
  EXPECT_EQ(RunCase({DataType::kFloat32, {1 << 20, 4096, 1000, 1 << 18}}, 4), "");
}

// The defining properties, on 4 ranks: equal vectors give that vector, orthogonal ones their sum.
TEST(Adasum, EqualVectorsAverageOrthogonalVectorsAdd) {
  const size_t n = 4096;
  std::vector<std::vector<float>> in(4, std::vector<float>(n, 0.0f)), out(4, std::vector<float>(n));
  const auto results = RunRanks(4, [&](Communicator& comm) {
    const int r = comm.rank();
    // Tensor 0: the same on every rank. Tensor 1 (second half): rank r owns coordinates r mod 4.
    for (size_t i = 0; i < n / 2; ++i) in[r][i] = std::sin(0.01f * static_cast<float>(i));
    for (size_t i = n / 2; i < n; ++i) in[r][i] = (i % 4 == static_cast<size_t>(r)) ? 1.5f + r : 0.0f;
    AllreduceOptions o;
    o.op = ReduceOp::kAdasum;
    o.name = "properties";
    std::vector<BufferPiece> pieces = {{in[r].data(), out[r].data(), n / 2},
                                       {in[r].data() + n / 2, out[r].data() + n / 2, n / 2}};
    std::vector<char> scratch;
    AdasumAllreduce(comm, pieces, o, scratch);
    for (size_t i = 0; i < n / 2; ++i) {
      if (std::fabs(out[r][i] - in[r][i]) > 1e-6f) return "equal vectors: element " + std::to_string(i) + " moved";
    }
    for (size_t i = n / 2; i < n; ++i) {
      const float sum = 1.5f + static_cast<float>(i % 4);
      if (out[r][i] != sum) return "orthogonal vectors: element " + std::to_string(i) + " is not their sum";
    }
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
}

TEST(Adasum, IntegerTensorsAreRefusedNamingTheOp) {
  const auto results = RunRanks(2, [&](Communicator& comm) {
    std::vector<int32_t> x(8, 1);
    AllreduceOptions o;
    o.dtype = DataType::kInt32;
    o.op = ReduceOp::kAdasum;
    o.name = "counts";
    std::vector<char> scratch;
    try {
      AdasumAllreduce(comm, {{x.data(), x.data(), x.size()}}, o, scratch);
    } catch (const InvalidArgument& e) {
      const std::string what = e.what();
      if (what.find("adasum") != std::string::npos && what.find("int32") != std::string::npos &&
          what.find("counts") != std::string::npos) {
        return std::string();
      }
      return "unclear message: " + what;
    }
    return std::string("an int32 Adasum was accepted");
  });
  EXPECT_EQ(Failures(results), "");
}

}  // namespace
}  // namespace gradcomp
