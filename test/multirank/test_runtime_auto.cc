// Adaptive compression through the runtime (GRADCOMP_COMPRESSION=auto): fewer bytes than the
// uniform reference at no more error, the same choices and bit-identical results on every
// rank, several settings inside one fused response, an error-feedback residual sent when a
// tensor moves to none, the cost model; and the autotune of fusion threshold and cycle time.
#include <gtest/gtest.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
#include <random>

#include "core/runtime.h"
#include "ops/common/enforce.h"
#include "test/support/harness.h"
#include "test/support/runtime_options.h"
#include "test/support/sra_reference.h"

namespace gradcomp {
namespace {

using namespace gradcomp::testing;

// Gradients whose tensors need different bit widths for the same error: Gaussian, heavy
// tailed (cubes), piecewise constant (exact at any width) and growing along the tensor.
struct Layer {
  std::string name;
  std::vector<int64_t> shape;
};
const std::vector<Layer> kLayers = {
    {"gauss", {256, 256}}, {"tails", {128, 256}}, {"flat", {64, 512}}, {"ramp", {512, 256}}};

std::vector<float> Values(size_t layer, size_t n, int rank, int step) {
  std::mt19937 gen(static_cast<unsigned>(1000 * step + 10 * rank + layer));
  std::normal_distribution<float> d;
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) {
    const float x = d(gen);
    switch (layer) {
      case 0: v[i] = x; break;
      case 1: v[i] = x * x * x; break;
      case 2: v[i] = static_cast<float>((i / 2048) % 7) - 3.0f; break;
      default: v[i] = x * static_cast<float>(i) / static_cast<float>(n); break;
    }
  }
  return v;
}

struct Trained {
  std::vector<std::vector<std::vector<float>>> out;  // [rank][step * layers + layer]
  std::vector<uint64_t> wire_after_first_choice;      // per rank
  std::vector<std::map<std::string, AutoTensorReport>> choices;
  std::vector<uint64_t> auto_choices;
};

using Gradients = std::function<std::vector<float>(size_t layer, size_t n, int rank, int step)>;

// `steps` grouped allreduces of the layers (one fused response each) on `world` ranks.
Trained Train(int world, int steps, const std::map<std::string, std::string>& vars, int first_choice_step,
              const Gradients& values = Values) {
  Trained run;
  run.out.resize(world);
  run.wire_after_first_choice.resize(world);
  run.choices.resize(world);
  run.auto_choices.resize(world);
  const auto results = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, vars));
    const int r = rt.rank();
    uint64_t wire_before = 0;
    for (int s = 0; s < steps; ++s) {
      if (s + 1 == first_choice_step) wire_before = rt.stats().compressed_bytes_on_wire;
      std::vector<std::string> names;
      std::vector<std::vector<int64_t>> shapes;
      std::vector<const void*> in;
      std::vector<void*> out;
      std::vector<std::vector<float>> data;
      for (size_t l = 0; l < kLayers.size(); ++l) {
        names.push_back(kLayers[l].name);
        shapes.push_back(kLayers[l].shape);
        data.push_back(values(l, static_cast<size_t>(kLayers[l].shape[0] * kLayers[l].shape[1]), r, s));
      }
      for (auto& d : data) {
        in.push_back(d.data());
        out.push_back(d.data());
      }
      for (auto& h : rt.GroupedAllreduce(names, DataType::kFloat32, shapes, in, out, ReduceOp::kSum, 1, 1, nullptr)) {
        h->Wait();
      }
      for (auto& d : data) run.out[r].push_back(std::move(d));
    }
    run.wire_after_first_choice[r] = rt.stats().compressed_bytes_on_wire - wire_before;
    run.choices[r] = rt.CompressionChoices();
    run.auto_choices[r] = rt.stats().auto_choices;
    return std::string();
  });
  EXPECT_EQ(Failures(results), "");
  return run;
}

// Rank 0's squared error in `layer` at step `s` (relative: over the exact result's norm).
double LayerError(const Trained& run, int world, int s, const std::string& layer, bool relative = false) {
  size_t l = 0;
  while (kLayers[l].name != layer) ++l;
  const size_t n = static_cast<size_t>(kLayers[l].shape[0] * kLayers[l].shape[1]);
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < world; ++r) parts.push_back(Values(l, n, r, s));
  const std::vector<double> exact = ExactSum(parts, 1.0);
  const std::vector<float>& got = run.out[0][static_cast<size_t>(s) * kLayers.size() + l];
  double e = 0, norm = 0;
  for (size_t i = 0; i < n; ++i) {
    e += (got[i] - exact[i]) * (got[i] - exact[i]);
    norm += exact[i] * exact[i];
  }
  return relative ? e / norm : e;
}

// The candidate token of a setting CompressionSpec::Describe wrote: "maxmin4" for
// "maxmin(bits=4, ...)", "fp16" for "fp16", as AutoTensorReport's maps key them.
std::string CandidateToken(const std::string& setting) {
  std::string token = setting.substr(0, setting.find('('));
  if (token == "maxmin") token += setting.substr(setting.find("bits=") + 5, 1);
  return token;
}

// Sum over the steps from `from` and the layers of the squared error of rank 0's results.
double SquaredError(const Trained& run, int world, int from, int steps) {
  double e = 0;
  for (int s = from; s < steps; ++s) {
    for (const Layer& l : kLayers) e += LayerError(run, world, s, l.name);
  }
  return e;
}

TEST(RuntimeAuto, FewerBytesThanTheReferenceAtNoMoreErrorTheSameOnEveryRank) {
  const int world = 3, steps = 9, interval = 2;
  // Measured on steps 2, 4, 6, 8; chosen at the start of steps 3, 5, 7, 9.
  const Trained ref = Train(world, steps, {{"GRADCOMP_COMPRESSION", "maxmin"}, {"GRADCOMP_BITS", "4"}}, 3);
  const Trained ad = Train(world, steps,
                       {{"GRADCOMP_COMPRESSION", "auto"},
                        {"GRADCOMP_BITS", "4"},
                        {"GRADCOMP_AUTO_CANDIDATES", "fp16,maxmin8,maxmin6,maxmin5,maxmin4,maxmin3,maxmin2"},
                        {"GRADCOMP_AUTO_INTERVAL", std::to_string(interval)},
                        // The reference's budget at every choice, absolute errors (L-GreCo's program).
                        {"GRADCOMP_AUTO_RELAXED_BITS", "0"},
                        {"GRADCOMP_AUTO_NORMALIZED", "0"}},
                       3);
  for (int r = 0; r < world; ++r) {
    EXPECT_EQ(ad.auto_choices[r], 4u) << "rank " << r;
    EXPECT_EQ(ad.out[r], ad.out[0]) << "rank " << r << "'s results differ from rank 0's";
    ASSERT_EQ(ad.choices[r].size(), kLayers.size());
    for (const auto& [name, rep] : ad.choices[r]) {
      EXPECT_EQ(rep.setting, ad.choices[0].at(name).setting) << name << " on rank " << r;
      EXPECT_EQ(rep.choice, 4u);
      EXPECT_EQ(rep.measured_at, 8u);
    }
  }
  // The piecewise-constant layer is exact at any width: it takes the fewest bits; the heavy
  // tails carry most of the error, so they get more bits than the reference's.
  EXPECT_EQ(ad.choices[0].at("flat").setting, "maxmin(bits=2, bucket=512)");
  const auto bits = [&](const std::string& name) {
    const std::string& s = ad.choices[0].at(name).setting;
    return s == "fp16" ? 16 : std::stoi(s.substr(s.find("bits=") + 5));
  };
  EXPECT_GT(bits("tails"), 4) << ad.choices[0].at("tails").setting;
  EXPECT_LT(bits("gauss"), 4) << ad.choices[0].at("gauss").setting;
  // The relative errors measured for the last choice (step 8) predict what the reference's
  // allreduce of the same step gave, second quantization included.
  for (const std::string name : {"gauss", "tails", "ramp"}) {
    const auto& measured = ad.choices[0].at(name).relative_error;
    EXPECT_EQ(measured.at("reference"), measured.at("maxmin4"));
    EXPECT_LT(measured.at("fp16"), 1e-3);
    const double seen = std::sqrt(LayerError(ref, world, 7, name, true));
    EXPECT_NEAR(measured.at("reference") / seen, 1.0, 0.2) << name << ": measured " << measured.at("reference")
                                                          << ", the reference's allreduce " << seen;
  }

  const double e_ref = SquaredError(ref, world, 2, steps), e_auto = SquaredError(ad, world, 2, steps);
  const double bytes_ratio = double(ad.wire_after_first_choice[0]) / double(ref.wire_after_first_choice[0]);
  std::printf("auto after its first choice: %.3f of the reference's bytes, %.3f of its squared error\n",
              bytes_ratio, e_auto / e_ref);
  EXPECT_LT(bytes_ratio, 0.8);
  EXPECT_LT(e_auto, 1.1 * e_ref);
}

// Critical regimes (GRADCOMP_AUTO_RELAXED_BITS): every layer's gradient is a fixed direction
// times a scale that halves every step until step 5, then stays, and is 4x larger from step 11
// on, plus noise. The choices (every 2 steps, at steps 2, 4, 6, 8, ...) compare the gradient
// summed over the two steps before them: it shrinks by 75% at step 6 (critical: the
// reference's budget, 4 bits), by 33% at step 8 and not at all at step 10 (calm: the budget
// steps down to maxmin3's, then to maxmin2's, far fewer bytes), and grows 2.5x at step 12
// (critical again: back to the reference's).
TEST(RuntimeAuto, RegimesKeepTheReferencesBudgetWhileTheGradientMovesAndStepDownToTheRelaxedOneAfter) {
  const int world = 3;
  const Gradients moving = [](size_t layer, size_t n, int rank, int step) {
    std::vector<float> v = Values(layer, n, rank, step);  // the noise, different every step
    std::vector<float> base = Values(layer, n, 0, 1000);  // the direction, the same at every step
    const float scale = std::ldexp(1.0f, -std::min(step, 5) + (step >= 11 ? 2 : 0));
    for (size_t i = 0; i < n; ++i) v[i] = scale * (base[i] + 0.1f * v[i]);
    return v;
  };
  const std::map<std::string, std::string> vars = {
      {"GRADCOMP_COMPRESSION", "auto"},
      {"GRADCOMP_BITS", "4"},
      {"GRADCOMP_AUTO_CANDIDATES", "fp16,maxmin8,maxmin6,maxmin5,maxmin4,maxmin3,maxmin2"},
      {"GRADCOMP_AUTO_INTERVAL", "2"},
      {"GRADCOMP_AUTO_RELAXED_BITS", "2"}};
  // The last choice at step 6 (the third), 8, 10 and 12; the bytes counted are those of that
  // last step, which runs it.
  const Trained at6 = Train(world, 7, vars, 7, moving), at8 = Train(world, 9, vars, 9, moving),
                at10 = Train(world, 11, vars, 11, moving), at12 = Train(world, 13, vars, 13, moving);
  const auto bits = [](const std::string& s) { return s == "fp16" ? 16 : std::stoi(s.substr(s.find("bits=") + 5)); };
  // Per choice: critical, its budget's bits, the norm's change.
  const std::vector<std::tuple<const Trained*, bool, int, double>> expected = {
      {&at6, true, 4, 0.75}, {&at8, false, 3, 1.0 / 3}, {&at10, false, 2, 0.0}, {&at12, true, 4, 1.5}};
  for (int r = 0; r < world; ++r) {
    for (const auto& [run, critical, budget, change] : expected) {
      EXPECT_EQ(run->out[r], run->out[0]) << "rank " << r << "'s results differ from rank 0's";
      for (const Layer& l : kLayers) {
        const AutoTensorReport& rep = run->choices[r].at(l.name);
        EXPECT_EQ(rep.critical, critical) << l.name << " on rank " << r << " at choice " << rep.choice;
        EXPECT_EQ(rep.budget_bits, budget) << l.name << " on rank " << r << " at choice " << rep.choice;
        EXPECT_NEAR(rep.norm_change, change, 0.05) << l.name << " at choice " << rep.choice;
        EXPECT_EQ(rep.setting, run->choices[0].at(l.name).setting) << l.name << " on rank " << r;
        // The relaxed setting's error is measured and reported with the rest (the flat layer
        // is exact at any width).
        if (l.name != "flat") {
          EXPECT_GT(rep.relative_error.at("relaxed"), rep.relative_error.at("reference")) << l.name;
        }
      }
    }
  }
  // The total squared error of a choice's settings and of uniform maxmin at 4 (the reference),
  // 3 and 2 bits (the relaxed), from the relative errors measured on step `measured` (every
  // rank's norms summed).
  const auto totals = [&](const Trained& run, int measured) {
    std::array<double, 4> e{};  // chosen, reference, maxmin3, relaxed
    for (size_t l = 0; l < kLayers.size(); ++l) {
      const size_t n = static_cast<size_t>(kLayers[l].shape[0] * kLayers[l].shape[1]);
      double norm2 = 0;
      for (int r = 0; r < world; ++r) {
        for (float v : moving(l, n, r, measured)) norm2 += double(v) * v;
      }
      const AutoTensorReport& rep = run.choices[0].at(kLayers[l].name);
      const std::string s = rep.setting;
      const std::string token = s == "fp16" ? s : "maxmin" + std::to_string(bits(s));
      const double err[4] = {rep.relative_error.at(token), rep.relative_error.at("reference"),
                             rep.relative_error.at("maxmin3"), rep.relative_error.at("relaxed")};
      for (int k = 0; k < 4; ++k) e[k] += err[k] * err[k] * norm2;
    }
    return e;
  };
  // Critical (measured on step 5, and 11): within the reference's budget, the heavy tails above
  // 2 bits.
  for (const auto& [run, measured] : {std::pair<const Trained*, int>{&at6, 5}, {&at12, 11}}) {
    const auto critical = totals(*run, measured);
    EXPECT_LE(critical[0], 1.02 * critical[1]) << "measured on step " << measured;
    EXPECT_GT(bits(run->choices[0].at("tails").setting), 2) << run->choices[0].at("tails").setting;
  }
  // First calm choice (step 7): one bit down, maxmin3's budget, more than the reference's.
  const auto calm = totals(at8, 7);
  EXPECT_LE(calm[0], 1.02 * calm[2]);
  EXPECT_GT(calm[0], 1.5 * calm[1]);
  // Second (step 9): the relaxed budget, spent: every layer at 2 bits, the fewest candidates.
  const auto calmer = totals(at10, 9);
  EXPECT_LE(calmer[0], 1.02 * calmer[3]);
  EXPECT_GT(calmer[0], 2 * calmer[2]);
  for (const Layer& l : kLayers) {
    EXPECT_EQ(at10.choices[0].at(l.name).setting, "maxmin(bits=2, bucket=512)") << l.name;
  }
  EXPECT_LT(at8.wire_after_first_choice[0], at6.wire_after_first_choice[0]);
  EXPECT_LT(at10.wire_after_first_choice[0], at8.wire_after_first_choice[0]);
}

// Normalized (GRADCOMP_AUTO_NORMALIZED): four Gaussian gradients, one 100x larger than the
// others. The absolute error lets the small ones take fewer bits and pays with more bits for
// the large one, whose error dominates the total; per value over each tensor's mean square (what
// an update normalized per coordinate, as Adam's, loses) every tensor loses alike at the same
// width, and no mix of widths beats the reference's 4 bits everywhere.
TEST(RuntimeAuto, NormalizedErrorsWeighEveryTensorByItsOwnScale) {
  const int world = 2;
  const Gradients scaled = [](size_t layer, size_t n, int rank, int step) {
    std::mt19937 gen(static_cast<unsigned>(1000 * step + 10 * rank + layer));
    std::normal_distribution<float> d;
    std::vector<float> v(n);
    for (float& x : v) x = d(gen) * (layer == 0 ? 100.0f : 1.0f);
    return v;
  };
  const auto bits = [](const std::string& s) { return std::stoi(s.substr(s.find("bits=") + 5)); };
  for (const bool normalized : {false, true}) {
    const Trained run = Train(world, 3, {{"GRADCOMP_COMPRESSION", "auto"},
                                         {"GRADCOMP_BITS", "4"},
                                         {"GRADCOMP_AUTO_CANDIDATES", "maxmin8,maxmin6,maxmin5,maxmin4,maxmin3,maxmin2"},
                                         {"GRADCOMP_AUTO_INTERVAL", "2"},
                                         {"GRADCOMP_AUTO_NORMALIZED", normalized ? "1" : "0"}},
                              3, scaled);
    ASSERT_EQ(run.auto_choices[0], 1u);
    EXPECT_EQ(run.out[1], run.out[0]);
    const auto& chose = run.choices[0];
    if (normalized) {
      for (const Layer& l : kLayers) EXPECT_EQ(bits(chose.at(l.name).setting), 4) << l.name;
    } else {
      EXPECT_GT(bits(chose.at("gauss").setting), 4) << chose.at("gauss").setting;
      for (const Layer& l : kLayers) {
        if (l.name != "gauss") {
          EXPECT_LT(bits(chose.at(l.name).setting), 4) << l.name;
        }
      }
    }
  }
}

// Relaxed bits must be fewer than the reference's, and the threshold positive.
TEST(RuntimeAuto, BadRegimeSettingsAreNamed) {
  for (const auto& [key, value, says] :
       std::vector<std::tuple<std::string, std::string, std::string>>{
           {"GRADCOMP_AUTO_RELAXED_BITS", "4", "relaxed_bits must be 0 (off) or from 1 to fewer than the reference's 4"},
           {"GRADCOMP_AUTO_RELAXED_BITS", "9", "GRADCOMP_AUTO_RELAXED_BITS"},
           {"GRADCOMP_AUTO_CRITICAL_CHANGE", "0", "GRADCOMP_AUTO_CRITICAL_CHANGE"}}) {
    try {
      Settings::FromMap({{"GRADCOMP_COMPRESSION", "auto"}, {"GRADCOMP_BITS", "4"}, {key, value}});
      ADD_FAILURE() << key << "=" << value << " accepted";
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  }
}

// With error feedback each candidate is measured twice: on the gradient, and on the gradient
// plus the residual the tensor carries (what the step compresses). The first measurement
// (step 1) has no residual yet, so both agree exactly; later ones differ. Without error
// feedback there is nothing to add, and no such errors.
TEST(RuntimeAuto, WithErrorFeedbackErrorsAreAlsoMeasuredOnTheCompensatedGradient) {
  const int world = 2;
  const size_t n = 256 * 64;
  for (const bool ef : {true, false}) {
    std::vector<std::vector<std::map<std::string, AutoTensorReport>>> reports(world);
    const auto results = RunRanks(world, [&](Communicator& comm) {
      Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "auto"},
                                {"GRADCOMP_BITS", "4"},
                                {"GRADCOMP_ERROR_FEEDBACK", ef ? "1" : "0"},
                                {"GRADCOMP_AUTO_CANDIDATES", "maxmin8,maxmin4,maxmin2"},
                                {"GRADCOMP_AUTO_INTERVAL", "1"}}));
      std::vector<float> out(n);
      for (int s = 0; s < 5; ++s) {
        const std::vector<float> g = Gradient(n, rt.rank(), 0.3, static_cast<unsigned>(s + 1));
        rt.Allreduce("w", DataType::kFloat32, {256, 64}, g.data(), out.data(), ReduceOp::kSum)->Wait();
        reports[static_cast<size_t>(rt.rank())].push_back(rt.CompressionChoices());
      }
      return std::string();
    });
    ASSERT_EQ(Failures(results), "");
    for (int r = 0; r < world; ++r) {
      const auto& steps = reports[static_cast<size_t>(r)];
      EXPECT_TRUE(steps[0].empty()) << "a choice before the second step";
      for (size_t s = 1; s < steps.size(); ++s) {
        const AutoTensorReport& rep = steps[s].at("w");
        EXPECT_EQ(rep.choice, s);
        EXPECT_EQ(rep.measured_at, s);
        if (!ef) {
          EXPECT_TRUE(rep.relative_error_ef.empty());
          continue;
        }
        ASSERT_EQ(rep.relative_error_ef.size(), rep.relative_error.size());
        const auto& e = rep.relative_error_ef;
        EXPECT_LT(e.at("maxmin8"), e.at("maxmin4"));
        EXPECT_LT(e.at("maxmin4"), e.at("maxmin2"));
        EXPECT_EQ(e.at("reference"), e.at("maxmin4"));
        for (const auto& [token, plain] : rep.relative_error) {
          if (s == 1) {
            EXPECT_EQ(e.at(token), plain) << token << ": the first measurement has no residual to add";
          } else {
            EXPECT_NE(e.at(token), plain) << token << " at step " << s << ": the residual was not added";
          }
        }
      }
    }
  }
}

TEST(RuntimeAuto, AResidualIsSentWhenATensorMovesToNone) {
  // 2-bit error feedback until the first choice, then none: the residual left by the
  // compressed steps travels once, so the sum of the results over the steps is the sum of the
  // gradients, and no memory is left.
  const int world = 2, steps = 6;
  const size_t n = 128 * 64;
  std::vector<double> total(n, 0.0), exact(n, 0.0);
  std::vector<uint64_t> memories(world);
  const auto results = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "auto"},
                              {"GRADCOMP_BITS", "2"},
                              {"GRADCOMP_ERROR_FEEDBACK", "1"},
                              {"GRADCOMP_AUTO_CANDIDATES", "none"},
                              {"GRADCOMP_AUTO_INTERVAL", "3"}}));
    std::vector<float> out(n);
    for (int s = 0; s < steps; ++s) {
      const std::vector<float> g = Gradient(n, rt.rank(), 0.3, static_cast<unsigned>(s + 1));
      rt.Allreduce("w", DataType::kFloat32, {128, 64}, g.data(), out.data(), ReduceOp::kSum)->Wait();
      if (rt.rank() == 0) {
        for (size_t i = 0; i < n; ++i) total[i] += out[i];
      }
    }
    memories[static_cast<size_t>(rt.rank())] = rt.stats().compression_memories;
    if (rt.CompressionChoices().at("w").setting != "none+ef") return "setting " + rt.CompressionChoices().at("w").setting;
    return std::string();
  });
  ASSERT_EQ(Failures(results), "");
  for (int s = 0; s < steps; ++s) {
    for (int r = 0; r < world; ++r) {
      const std::vector<float> g = Gradient(n, r, 0.3, static_cast<unsigned>(s + 1));
      for (size_t i = 0; i < n; ++i) exact[i] += g[i];
    }
  }
  std::vector<float> got(total.begin(), total.end());
  EXPECT_LT(RelativeL2(got, exact), 1e-5) << "the residual of the 2-bit steps was not sent";
  EXPECT_EQ(memories[0], 0u);
  EXPECT_EQ(memories[1], 0u);
}

TEST(RuntimeAuto, TheCostModelLeavesOutWhatIsSlowerThanNone) {
  // Thread ranks exchange at memory speed: the probe measures that link, and every choice is
  // one the model estimates no slower than sending the tensor raw.
  const int world = 2;
  std::map<std::string, AutoTensorReport> report;
  LinkCost link;
  const auto results = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "auto"}, {"GRADCOMP_AUTO_INTERVAL", "2"}}));
    std::vector<float> g(512 * 256), out(g.size());
    for (int s = 0; s < 3; ++s) {
      g = Values(0, g.size(), rt.rank(), s);
      rt.Allreduce("w", DataType::kFloat32, {512, 256}, g.data(), out.data(), ReduceOp::kSum)->Wait();
    }
    if (rt.rank() == 0) {
      report = rt.CompressionChoices();
      link = rt.AutoLink();
    }
    return std::string();
  });
  ASSERT_EQ(Failures(results), "");
  EXPECT_GT(link.per_byte, 0.0);
  EXPECT_GT(link.latency, 0.0);
  const AutoTensorReport& w = report.at("w");
  ASSERT_EQ(w.estimated_seconds.size(), 11u) << "9 candidates, the relaxed setting and the reference";
  const double none = w.estimated_seconds.at("none");
  EXPECT_DOUBLE_EQ(none, link.Seconds(512 * 256 * 4, 0));
  EXPECT_LE(w.estimated_seconds.at(CandidateToken(w.setting)), none) << w.setting;
  for (const auto& [candidate, seconds] : w.estimated_seconds) {
    if (candidate != "none") {
      EXPECT_GT(seconds, link.latency) << candidate << ": codec time counts";
    }
  }
}

TEST(RuntimeAuto, WithoutTheCostModelNothingIsProbed) {
  LinkCost link;
  std::map<std::string, AutoTensorReport> report;
  RunRanks(2, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "auto"},
                              {"GRADCOMP_AUTO_INTERVAL", "1"},
                              {"GRADCOMP_AUTO_COST_MODEL", "0"}}));
    std::vector<float> g = Values(1, 128 * 128, rt.rank(), 0);
    for (int s = 0; s < 2; ++s) {
      rt.Allreduce("w", DataType::kFloat32, {128, 128}, g.data(), g.data(), ReduceOp::kSum)->Wait();
    }
    if (rt.rank() == 0) {
      link = rt.AutoLink();
      report = rt.CompressionChoices();
    }
    return std::string();
  });
  EXPECT_FALSE(link.known());
  EXPECT_TRUE(report.at("w").estimated_seconds.empty());
  EXPECT_EQ(report.at("w").choice, 1u);
}

TEST(RuntimeAuto, ARankThatJoinedMeasuresZerosAndTheChoiceGoesOn) {
  // Rank 1 runs out of batches after 2 steps and joins; rank 0 goes on through measurements
  // (step 2, 4) and choices (3, 5), with rank 1 contributing zeros (and no statistics).
  std::vector<float> last(64 * 64);
  uint64_t choices = 0;
  std::map<std::string, AutoTensorReport> report;
  const auto results = RunRanks(2, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "auto"}, {"GRADCOMP_AUTO_INTERVAL", "2"}}));
    const int steps = rt.rank() == 0 ? 6 : 2;
    std::vector<float> g(64 * 64);
    for (int s = 0; s < steps; ++s) {
      g = Values(0, g.size(), rt.rank(), s);
      rt.Allreduce("w", DataType::kFloat32, {64, 64}, g.data(), g.data(), ReduceOp::kSum)->Wait();
    }
    rt.Join()->Wait();
    if (rt.rank() == 0) {
      last = g;
      choices = rt.stats().auto_choices;
      report = rt.CompressionChoices();
    }
    return std::string();
  });
  ASSERT_EQ(Failures(results), "");
  EXPECT_EQ(choices, 2u);
  // The last step is rank 0's gradient alone, within the chosen setting's error: what the last
  // measurement (step 4, the same values) found for it, with room for another rounding draw.
  // Which setting wins depends on the codecs' measured times (a slower build picks fewer bits).
  const AutoTensorReport& w = report.at("w");
  const std::string token = CandidateToken(w.setting);
  const double bound = token == "none" ? 1e-6 : std::max(0.2, 1.5 * w.relative_error.at(token));
  const std::vector<float> mine = Values(0, last.size(), 0, 5);
  EXPECT_LT(RelativeL2(last, std::vector<double>(mine.begin(), mine.end())), bound) << w.setting;
}

TEST(RuntimeAuto, NamesThatStopComingAreForgotten) {
  // Unnamed allreduces get a new name every call: what auto keeps for them stays bounded.
  uint64_t tracked = 0;
  const auto results = RunRanks(2, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_COMPRESSION", "auto"}, {"GRADCOMP_AUTO_COST_MODEL", "0"}}));
    std::vector<float> g(64 * 64, 1.0f);
    for (int i = 0; i < 6000; ++i) {
      rt.Allreduce("noname." + std::to_string(i), DataType::kFloat32, {64, 64}, g.data(), g.data(), ReduceOp::kAverage)
          ->Wait();
    }
    if (rt.rank() == 0) tracked = rt.stats().auto_tensors;
    return std::string();
  });
  ASSERT_EQ(Failures(results), "");
  EXPECT_GT(tracked, 0u);
  EXPECT_LE(tracked, 4096u + 1024u);
}

TEST(RuntimeAutotune, EveryRankEndsOnRankZerosBestSettingAndResultsStayExact) {
  const int world = 3;
  const std::string log = ::testing::TempDir() + "gradcomp_autotune.csv";
  std::vector<double> fusion(world), cycle(world);
  std::vector<int> steps(world);
  const auto results = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_AUTOTUNE", "1"},
                              {"GRADCOMP_AUTOTUNE_WINDOW_SECONDS", "0.02"},
                              {"GRADCOMP_AUTOTUNE_LOG", log}}));
    const int r = rt.rank();
    const size_t n = 1 << 14;  // 8 tensors of 64 KB a step
    for (int step = 0;; ++step) {
      std::vector<std::vector<float>> data(8, std::vector<float>(n));
      std::vector<std::string> names;
      std::vector<std::vector<int64_t>> shapes(8, {static_cast<int64_t>(n)});
      std::vector<const void*> in;
      std::vector<void*> out;
      for (int t = 0; t < 8; ++t) {
        for (size_t i = 0; i < n; ++i) data[t][i] = static_cast<float>(r + t + (i % 7));
        names.push_back("t" + std::to_string(t));
        in.push_back(data[t].data());
        out.push_back(data[t].data());
      }
      for (auto& h : rt.GroupedAllreduce(names, DataType::kFloat32, shapes, in, out, ReduceOp::kSum, 1, 1, nullptr)) {
        h->Wait();
      }
      for (int t = 0; t < 8; ++t) {
        for (size_t i = 0; i < n; i += 97) {
          const float want = static_cast<float>(0 + 1 + 2 + 3 * (t + static_cast<int>(i % 7)));
          if (data[t][i] != want) return "step " + std::to_string(step) + ": wrong sum";
        }
      }
      // Stop together, once rank 0's search has ended (and one more step applied its word).
      int32_t done = rt.stats().autotune_done ? 1 : 0, all = 0;
      comm.Allreduce(&done, &all, 1, DataType::kInt32, ReduceOp::kMax);
      if (all == 1 || step > 20000) {
        steps[static_cast<size_t>(r)] = step;
        break;
      }
    }
    int32_t token = 0, sink = 0;
    rt.Allreduce("last", DataType::kInt32, {1}, &token, &sink, ReduceOp::kSum)->Wait();
    fusion[static_cast<size_t>(r)] = rt.stats().fusion_threshold_mb;
    cycle[static_cast<size_t>(r)] = rt.stats().cycle_time_ms;
    return std::string();
  });
  ASSERT_EQ(Failures(results), "");
  EXPECT_LT(steps[0], 20000) << "the search never ended";
  for (int r = 1; r < world; ++r) {
    EXPECT_EQ(fusion[r], fusion[0]) << "rank " << r;
    EXPECT_EQ(cycle[r], cycle[0]) << "rank " << r;
  }
  // Rank 0's log: 6 thresholds at the settings' cycle time, then 4 more cycle times at the
  // best threshold; the choice is the best score.
  std::ifstream f(log);
  std::string line;
  std::getline(f, line);
  EXPECT_EQ(line, "fusion_threshold_mb,cycle_time_ms,bytes_per_second");
  double best = -1, best_fusion = 0, best_cycle = 0;
  int rows = 0;
  while (std::getline(f, line)) {
    std::stringstream ss(line);
    double fu = 0, cy = 0, score = 0;
    char comma = 0;
    ss >> fu >> comma >> cy >> comma >> score;
    EXPECT_GT(score, 0) << line;
    if (rows < 6) {
      EXPECT_EQ(cy, 1.0) << line;
    }
    if (score > best) {
      best = score;
      best_fusion = fu;
      best_cycle = cy;
    }
    ++rows;
  }
  EXPECT_EQ(rows, 10);
  EXPECT_EQ(fusion[0], best_fusion);
  EXPECT_EQ(cycle[0], best_cycle);
  std::remove(log.c_str());
}

// A reducescatter given auto explicitly (what compress_fsdp gives an FSDP2 module's gradients):
// each named tensor gets a setting of its own, measured and chosen as an allreduced tensor's,
// the same on every rank; an allgather refuses auto, naming it.
TEST(RuntimeAuto, ANamedReducescatterTakesASettingOfItsOwn) {
  const int world = 3, steps = 5;
  std::vector<std::map<std::string, AutoTensorReport>> choices(world);
  std::vector<std::vector<float>> flat_shards(world);
  const auto results = RunRanks(world, [&](Communicator& comm) {
    Runtime rt(Options(comm, {{"GRADCOMP_AUTO_COST_MODEL", "0"}}));
    CompressionSpec spec;
    spec.codec = "auto";
    spec.auto_candidates = "fp16,maxmin8,maxmin4,maxmin2";
    spec.auto_interval = 2;
    spec.auto_relaxed_bits = 0;
    spec.auto_normalized = false;
    const int r = rt.rank();
    // Refused where it is enqueued, before any rank can finish and shut the others down.
    float w[4] = {1, 2, 3, 4};
    try {
      rt.Allgather("weights", DataType::kFloat32, {1, 4}, w, &spec);
      return std::string("an allgather took auto");
    } catch (const InvalidArgument& e) {
      if (std::string(e.what()).find("allgather of 'weights' with compression auto") == std::string::npos ||
          std::string(e.what()).find("a per-tensor choice compresses allreduces and reducescatters only") ==
              std::string::npos) {
        return std::string("allgather: ") + e.what();
      }
    }
    for (int s = 0; s < steps; ++s) {
      for (size_t l : {size_t{1}, size_t{2}}) {  // the heavy tails, the piecewise constant layer
        const size_t n = static_cast<size_t>(kLayers[l].shape[0] * kLayers[l].shape[1]);
        const std::vector<float> g = Values(l, n, r, s);
        auto h = rt.Reducescatter(kLayers[l].name, DataType::kFloat32, kLayers[l].shape, g.data(), ReduceOp::kSum, 1,
                                  1, &spec);
        h->Wait();
        if (l == 2 && s + 1 == steps) {
          flat_shards[r].resize(h->output().size() / sizeof(float));
          std::memcpy(flat_shards[r].data(), h->output().data(), h->output().size());
        }
      }
    }
    choices[r] = rt.CompressionChoices();
    return std::string();
  });
  ASSERT_EQ(Failures(results), "");
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(choices[r].size(), 2u) << "rank " << r;
    for (const auto& [name, rep] : choices[r]) {
      EXPECT_EQ(rep.setting, choices[0].at(name).setting) << name << " on rank " << r;
      EXPECT_EQ(rep.measured_at, 4u) << name;
    }
  }
  // The piecewise-constant layer is exact at any width: it takes the fewest bits, the heavy
  // tails more; its shards are exact.
  EXPECT_EQ(choices[0].at("flat").setting, "maxmin(bits=2, bucket=512)");
  EXPECT_NE(choices[0].at("tails").setting, "maxmin(bits=2, bucket=512)");
  const size_t n = static_cast<size_t>(kLayers[2].shape[0] * kLayers[2].shape[1]);
  std::vector<std::vector<float>> parts;
  for (int r = 0; r < world; ++r) parts.push_back(Values(2, n, r, steps - 1));
  const std::vector<double> exact = ExactSum(parts, 1.0);
  const size_t row = static_cast<size_t>(kLayers[2].shape[1]), rows = static_cast<size_t>(kLayers[2].shape[0]);
  size_t from = 0;  // ranks below rows % world hold one row more
  for (int r = 0; r < world; ++r) {
    ASSERT_EQ(flat_shards[r].size(), (rows / world + (static_cast<size_t>(r) < rows % world ? 1 : 0)) * row);
    for (size_t i = 0; i < flat_shards[r].size(); ++i) {
      ASSERT_EQ(flat_shards[r][i], exact[from + i]) << "rank " << r << ", value " << i;
    }
    from += flat_shards[r].size();
  }
  EXPECT_EQ(from, n);
}

TEST(RuntimeAuto, BadSettingsAndSpecsAreNamed) {
  try {
    Settings::FromMap({{"GRADCOMP_COMPRESSION", "auto"}, {"GRADCOMP_AUTO_CANDIDATES", "none,maxmin12"}});
    ADD_FAILURE() << "maxmin12 accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("GRADCOMP_AUTO_CANDIDATES"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'maxmin12' is not a candidate"), std::string::npos) << e.what();
  }
  RunRanks(1, [&](Communicator& comm) {
    Runtime rt(Options(comm, {}));
    CompressionSpec bad;
    bad.codec = "auto";
    bad.auto_candidates = "maxmin4,lz4";
    float f[4] = {1, 2, 3, 4};
    try {
      rt.Allreduce("layer.w", DataType::kFloat32, {2, 2}, f, f, ReduceOp::kSum, 1, 1, &bad);
      return std::string("lz4 accepted");
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("allreduce of 'layer.w'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("'lz4' is not a candidate"), std::string::npos) << e.what();
    }
    return std::string();
  });
}

}  // namespace
}  // namespace gradcomp
