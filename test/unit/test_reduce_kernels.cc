// Reduction kernels: every dtype and op against a per-element reference, and the AVX2 and
// scalar variants bit-identical (including NaN and tails shorter than a vector).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "ops/common/half.h"
#include "ops/common/enforce.h"
#include "ops/reduce/reduce.h"
#include "test/support/reference.h"

namespace gradcomp {
namespace {

using testing::AllDataTypes;
using testing::MakeInput;
using testing::StoreAt;
using testing::ValueAt;

const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax, ReduceOp::kProduct};

double Apply(DataType dt, ReduceOp op, double a, double b) {
  if (dt == DataType::kBool) {
    const bool is_or = op == ReduceOp::kSum || op == ReduceOp::kMax;
    return is_or ? ((a != 0) || (b != 0)) : ((a != 0) && (b != 0));
  }
  switch (op) {
    case ReduceOp::kSum: return a + b;
    case ReduceOp::kProduct: return a * b;
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    default: return 0;
  }
}

TEST(ReduceKernels, MatchPerElementReference) {
  for (DataType dt : AllDataTypes()) {
    for (ReduceOp op : kOps) {
      for (size_t n : {0, 1, 7, 8, 9, 31, 33, 1000}) {
        std::vector<char> a = MakeInput(dt, op, n, 0), b = MakeInput(dt, op, n, 1);
        std::vector<char> expected(a.size());
        for (size_t i = 0; i < n; ++i) {
          // The kernel rounds once into the dtype: so does storing the float64 result.
          StoreAt(expected.data(), dt, i, Apply(dt, op, ValueAt(a.data(), dt, i), ValueAt(b.data(), dt, i)));
        }
        for (Isa isa : {Isa::kScalar, BestIsa()}) {
          std::vector<char> out = a;
          ReduceInto(out.data(), b.data(), n, dt, op, isa);
          ASSERT_TRUE(testing::SameBytes(out.data(), expected.data(), out.size()))
              << DataTypeName(dt) << " " << ReduceOpName(op) << " n=" << n << " " << IsaName(isa);
          // Three operands: a and b untouched, the result in a third buffer.
          std::vector<char> third(a.size(), '\x5a');
          const std::vector<char> a_before = a, b_before = b;
          ReduceTwo(third.data(), a.data(), b.data(), n, dt, op, isa);
          ASSERT_TRUE(testing::SameBytes(third.data(), expected.data(), third.size()))
              << "ReduceTwo " << DataTypeName(dt) << " " << ReduceOpName(op) << " n=" << n << " " << IsaName(isa);
          ASSERT_EQ(a, a_before);
          ASSERT_EQ(b, b_before);
        }
      }
    }
  }
}

TEST(ReduceKernels, VectorAndScalarAgreeOnSpecialValues) {
  const float specials[] = {0.0f, -0.0f, 1e-40f, -1e-40f, 65504.0f, 70000.0f, -70000.0f, 3.0e38f,
                            INFINITY, -INFINITY, NAN, 1.0f / 3.0f, -2.5f, 1e-8f, 6.1e-5f, 1.0f};
  const size_t n = sizeof(specials) / sizeof(specials[0]);
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<uint16_t> a(n * n), b(n * n);
    for (size_t i = 0; i < n; ++i) {
      for (size_t j = 0; j < n; ++j) {
        StoreAt(a.data(), dt, i * n + j, specials[i]);
        StoreAt(b.data(), dt, i * n + j, specials[j]);
      }
    }
    for (ReduceOp op : kOps) {
      std::vector<uint16_t> scalar = a, vec = a;
      ReduceInto(scalar.data(), b.data(), a.size(), dt, op, Isa::kScalar);
      ReduceInto(vec.data(), b.data(), a.size(), dt, op, BestIsa());
      EXPECT_EQ(scalar, vec) << DataTypeName(dt) << " " << ReduceOpName(op);
    }
    std::vector<uint16_t> scalar = a, vec = a;
    ScaleInPlace(scalar.data(), a.size(), dt, 0.37, Isa::kScalar);
    ScaleInPlace(vec.data(), a.size(), dt, 0.37, BestIsa());
    EXPECT_EQ(scalar, vec) << "scale " << DataTypeName(dt);
  }
}

TEST(ReduceKernels, ScaleEveryDtype) {
  for (DataType dt : AllDataTypes()) {
    std::vector<char> buf = MakeInput(dt, ReduceOp::kSum, 37, 3);
    const std::vector<char> orig = buf;
    ScaleInPlace(buf.data(), 37, dt, 0.5);
    for (size_t i = 0; i < 37; ++i) {
      const double x = ValueAt(orig.data(), dt, i);
      const double want = dt == DataType::kBool ? x : (IsFloatingPoint(dt) ? x * 0.5 : std::trunc(x * 0.5));
      EXPECT_EQ(ValueAt(buf.data(), dt, i), want) << DataTypeName(dt) << " element " << i;
    }
  }
}

TEST(ReduceKernels, IntegerSumWrapsInsteadOfUndefinedBehaviour) {
  int8_t a[2] = {127, -128}, b[2] = {1, -1};
  ReduceInto(a, b, 2, DataType::kInt8, ReduceOp::kSum);
  EXPECT_EQ(a[0], -128);
  EXPECT_EQ(a[1], 127);
}

TEST(ReduceKernels, ReduceManyKeepsRankOrderAndFinishAverages) {
  std::vector<float> r0 = {1, 2, 3}, r1 = {10, 20, 30}, r2 = {100, 200, 300};
  std::vector<float> out(3);
  ReduceMany(out.data(), {r0.data(), r1.data(), r2.data()}, sizeof(float), 2, DataType::kFloat32, ReduceOp::kSum);
  EXPECT_EQ(out[0], 222.0f);
  EXPECT_EQ(out[1], 333.0f);
  std::vector<int32_t> ints = {7, -7, 9};
  FinishReduction(ints.data(), 3, DataType::kInt32, ReduceOp::kAverage, 1.0, 2);
  EXPECT_EQ(ints, (std::vector<int32_t>{3, -3, 4}));  // integer average truncates toward zero
  std::vector<int32_t> thirds = {9};
  FinishReduction(thirds.data(), 1, DataType::kInt32, ReduceOp::kAverage, 1.0, 3);
  EXPECT_EQ(thirds[0], 3);  // exact division, not 9 * (1/3) = 2.999...
}

TEST(ReduceKernels, FloatAverageIsATrueDivision) {
  // Horovod divides the sum (torch's div_); multiplying by 1/3 rounds differently, e.g. 71.
  std::vector<float> f(1000);
  for (size_t i = 0; i < f.size(); ++i) f[i] = static_cast<float>(i) * 0.37f - 100.0f;
  std::vector<float> got = f;
  FinishReduction(got.data(), got.size(), DataType::kFloat32, ReduceOp::kAverage, 1.0, 3);
  for (size_t i = 0; i < f.size(); ++i) ASSERT_EQ(got[i], f[i] / 3.0f) << "element " << i;
  std::vector<double> d = {71.0, -5.5};
  FinishReduction(d.data(), 2, DataType::kFloat64, ReduceOp::kAverage, 2.0, 3);
  EXPECT_EQ(d[0], 71.0 / 3.0 * 2.0);
  EXPECT_EQ(d[1], -5.5 / 3.0 * 2.0);
  for (DataType dt : {DataType::kFloat16, DataType::kBFloat16}) {
    std::vector<char> buf = MakeInput(dt, ReduceOp::kSum, 37, 1);
    const std::vector<char> orig = buf;
    FinishReduction(buf.data(), 37, dt, ReduceOp::kAverage, 1.0, 3);
    std::vector<char> want(buf.size());
    for (size_t i = 0; i < 37; ++i) {
      StoreAt(want.data(), dt, i, static_cast<float>(ValueAt(orig.data(), dt, i)) / 3.0f);
    }
    EXPECT_EQ(buf, want) << DataTypeName(dt);
  }
}

TEST(ReduceKernels, AverageIsRejectedByTheKernelEntry) {
  float a = 1, b = 2;
  EXPECT_THROW(ReduceInto(&a, &b, 1, DataType::kFloat32, ReduceOp::kAverage), Error);
}

}  // namespace
}  // namespace gradcomp
