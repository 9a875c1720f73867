// Adaptive compression's pieces without a runtime: candidate parsing, the error measurement
// (sampled and whole) and the dynamic program against brute force.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>

#include "ops/common/enforce.h"
#include "ops/compression/auto_select.h"

namespace gradcomp {
namespace {

CompressionSpec Auto(const std::string& candidates) {
  CompressionSpec s;
  s.codec = "auto";
  s.auto_candidates = candidates;
  return s;
}

std::string ErrorOf(const CompressionSpec& spec) {
  try {
    ValidateSpec(spec, "GRADCOMP_COMPRESSION=auto");
  } catch (const InvalidArgument& e) {
    return e.what();
  }
  return "";
}

TEST(AutoSelect, CandidatesInheritTheAutoSpecsOptions) {
  CompressionSpec a = Auto(" none, fp16 ,maxmin2,MAXMIN8,topk0.001,maxmin2");
  a.bucket_size = 128;
  a.error_feedback = true;
  a.stochastic = true;
  a.topk_momentum = 0.9;
  const auto c = AutoCandidates(a);
  ASSERT_EQ(c.size(), 5u) << "duplicates are dropped";
  EXPECT_EQ(CandidateToken(c[0]), "none");
  EXPECT_EQ(CandidateToken(c[1]), "fp16");
  EXPECT_EQ(CandidateToken(c[2]), "maxmin2");
  EXPECT_EQ(CandidateToken(c[3]), "maxmin8");
  EXPECT_EQ(CandidateToken(c[4]), "topk0.001");
  for (const auto& s : c) {
    EXPECT_EQ(s.bucket_size, 128);
    EXPECT_TRUE(s.error_feedback);
    EXPECT_TRUE(s.stochastic);
    EXPECT_EQ(s.topk_momentum, 0.0) << "no DGC momentum inside auto";
  }
  EXPECT_EQ(c[4].topk_ratio, 0.001);
  const CompressionSpec ref = AutoReference(a);
  EXPECT_EQ(ref.codec, "maxmin");
  EXPECT_EQ(ref.bits, 4);
  EXPECT_EQ(ref.bucket_size, 128);
  EXPECT_EQ(a.Describe(), "auto(bits=4, bucket=128, stochastic, candidates= none, fp16 ,maxmin2,MAXMIN8,topk0.001,"
                          "maxmin2, interval=25, relaxed_bits=2, critical_change=0.5, normalized)+ef");
}

TEST(AutoSelect, BadCandidatesAreNamed) {
  EXPECT_NE(ErrorOf(Auto("none,maxmin9")).find("'maxmin9' is not a candidate"), std::string::npos)
      << ErrorOf(Auto("none,maxmin9"));
  EXPECT_NE(ErrorOf(Auto("topk0")).find("'topk0' is not a candidate"), std::string::npos);
  EXPECT_NE(ErrorOf(Auto("gzip")).find("GRADCOMP_COMPRESSION=auto: candidates: 'gzip'"), std::string::npos)
      << ErrorOf(Auto("gzip"));
  EXPECT_NE(ErrorOf(Auto(" , ")).find("candidates is empty"), std::string::npos) << ErrorOf(Auto(" , "));
  CompressionSpec a = Auto("maxmin4");
  a.auto_interval = 0;
  EXPECT_NE(ErrorOf(a).find("interval must be at least 1 step, got 0"), std::string::npos) << ErrorOf(a);
  a.auto_interval = 5;
  a.bits = 11;
  EXPECT_NE(ErrorOf(a).find("the reference"), std::string::npos) << ErrorOf(a);
  EXPECT_NE(ErrorOf(a).find("bits=11"), std::string::npos) << ErrorOf(a);
  a.bits = 4;
  EXPECT_EQ(ErrorOf(a), "");
}

std::vector<float> Normal(size_t n, uint32_t seed) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (auto& x : v) x = d(gen);
  return v;
}

TEST(AutoSelect, MeasuredErrorsFollowTheBitsAndTheSampleEstimatesTheWhole) {
  const auto x = Normal(1 << 20, 7);
  const auto c = AutoCandidates(Auto("none,fp16,maxmin2,maxmin4,maxmin8,topk0.01"));
  const CandidateErrors whole = MeasureCandidates(x.data(), x.size(), c, 1, x.size());
  const CandidateErrors sampled = MeasureCandidates(x.data(), x.size(), c);
  double norm2 = 0;
  for (float v : x) norm2 += double(v) * v;
  EXPECT_NEAR(whole.norm2 / norm2, 1.0, 1e-9);
  EXPECT_NEAR(sampled.norm2 / norm2, 1.0, 0.02);
  EXPECT_EQ(whole.err2[0], 0.0) << "none is exact";
  EXPECT_LT(whole.err2[1], whole.err2[4]) << "fp16 beats 8-bit buckets";
  EXPECT_LT(whole.err2[4], whole.err2[3]);
  EXPECT_LT(whole.err2[3], whole.err2[2]);
  for (size_t k = 1; k < c.size(); ++k) {
    EXPECT_NEAR(sampled.err2[k] / whole.err2[k], 1.0, 0.05) << CandidateToken(c[k]);
  }
  // 4-bit max-min of a Gaussian in 512-value buckets: about 0.1 relative L2 error; top 1%
  // keeps ~ 10% of the energy.
  EXPECT_NEAR(std::sqrt(whole.err2[3] / whole.norm2), 0.11, 0.03);
  EXPECT_NEAR(whole.err2[5] / whole.norm2, 0.9, 0.05);
}

// Brute force: least bytes over every assignment whose total error is at most `budget`.
double BestBytes(const std::vector<std::vector<double>>& err, const std::vector<std::vector<double>>& bytes,
                 double budget) {
  const size_t t = err.size(), c = err[0].size();
  size_t total = 1;
  for (size_t i = 0; i < t; ++i) total *= c;
  double best = std::numeric_limits<double>::infinity();
  for (size_t code = 0; code < total; ++code) {
    double e = 0, b = 0;
    for (size_t i = 0, k = code; i < t; ++i, k /= c) {
      e += err[i][k % c];
      b += bytes[i][k % c];
    }
    if (e <= budget) best = std::min(best, b);
  }
  return best;
}

TEST(AutoSelect, TheProgramMatchesBruteForceWithinItsDiscretization) {
  std::mt19937 gen(3);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int trial = 0; trial < 200; ++trial) {
    const size_t tensors = 2 + trial % 5, candidates = 2 + trial % 4;
    std::vector<std::vector<double>> err(tensors), bytes(tensors);
    std::vector<double> ref_err(tensors), ref_bytes(tensors);
    for (size_t t = 0; t < tensors; ++t) {
      // Candidates ordered from exact and big to lossy and small, as bit widths are; tensors
      // differ in scale by orders of magnitude.
      const double scale = std::pow(10.0, 4 * u(gen)), size = 1000 * (1 + 10 * u(gen));
      double e = 0, b = size * 4;
      for (size_t c = 0; c < candidates; ++c) {
        err[t].push_back(e);
        bytes[t].push_back(b);
        e += scale * u(gen);
        b *= 0.3 + 0.6 * u(gen);
      }
      const size_t r = 1 + trial % (candidates - 1);
      ref_err[t] = err[t][r];
      ref_bytes[t] = bytes[t][r];
    }
    const size_t levels = 1000;
    const AutoChoice ch = ChooseCandidates(err, bytes, ref_err, ref_bytes, levels);
    double budget = 0;
    for (double e : ref_err) budget += e;
    const double slack = static_cast<double>(tensors) / levels;
    EXPECT_LE(ch.err2, budget * (1 + slack) + 1e-9) << "trial " << trial;
    EXPECT_LE(ch.bytes, ch.ref_bytes + 1e-9) << "never more than the reference: trial " << trial;
    EXPECT_LE(ch.bytes, BestBytes(err, bytes, budget * (1 - slack)) + 1e-9) << "trial " << trial;
    double e = 0, b = 0;
    for (size_t t = 0; t < tensors; ++t) {
      e += err[t][ch.index[t]];
      b += bytes[t][ch.index[t]];
    }
    EXPECT_DOUBLE_EQ(e, ch.err2);
    EXPECT_DOUBLE_EQ(b, ch.bytes);
  }
}

TEST(AutoSelect, ExactTensorsTakeTheSmallestExactSetting) {
  // Every candidate exact (a gradient of zeros, or constant buckets): the least bytes, whatever
  // the budget; and a budget of zero leaves only exact candidates.
  const AutoChoice zeros = ChooseCandidates({{0, 0, 0}}, {{400, 200, 50}}, {0}, {100});
  EXPECT_EQ(zeros.index[0], 2u);
  const AutoChoice tight = ChooseCandidates({{0, 1, 2}, {0, 0, 0}}, {{400, 200, 50}, {400, 200, 50}}, {0, 0},
                                            {100, 100});
  EXPECT_EQ(tight.index[0], 0u);
  EXPECT_EQ(tight.index[1], 2u);
}

TEST(AutoSelect, TheLinkIsTheLineThroughTwoTimings) {
  const LinkCost c = LinkCost::Fit(1 << 16, 0.001, 4 << 20, 0.033);
  EXPECT_NEAR(c.per_byte, 0.032 / ((4 << 20) - (1 << 16)), 1e-15);
  EXPECT_NEAR(c.latency, 0.001 - (1 << 16) * c.per_byte, 1e-12);
  EXPECT_NEAR(c.Seconds(4 << 20, 0), 0.033, 1e-12);
  EXPECT_NEAR(c.Seconds(1 << 20, 0.01), c.latency + (1 << 20) * c.per_byte + 0.02, 1e-12) << "codec twice";
  // Timings that do not grow with size (noise): no cost per byte, never a negative latency.
  const LinkCost flat = LinkCost::Fit(1 << 16, 0.002, 4 << 20, 0.001);
  EXPECT_EQ(flat.per_byte, 0.0);
  EXPECT_EQ(flat.latency, 0.002);
  // At memory speed the small size is bound by bandwidth and noise can put the intercept under
  // zero: the timed one-value allreduce is the latency's floor.
  const LinkCost steep = LinkCost::Fit(1 << 16, 0.0001, 4 << 20, 0.0070, 2e-6);
  EXPECT_EQ(steep.latency, 2e-6);
  EXPECT_GT(steep.per_byte, 0.0);
  EXPECT_NEAR(LinkCost::Fit(1 << 16, 0.001, 4 << 20, 0.033, 2e-6).latency, c.latency, 1e-15) << "a floor only";
  EXPECT_FALSE(LinkCost{}.known());
}

TEST(AutoSelect, MismatchedInputsAreRejected) {
  EXPECT_THROW(ChooseCandidates({{0, 1}}, {{1}}, {0}, {1}), Error);
  EXPECT_THROW(ChooseCandidates({{0, 1}}, {{1, 2}}, {0, 1}, {1}), Error);
}

}  // namespace
}  // namespace gradcomp
