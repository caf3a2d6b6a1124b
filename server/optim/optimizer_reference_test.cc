// Checks the fp32 kernels against an independent float64 implementation of
// torch.optim 1.13's formulas, plus the API's structural promises.
//
// Accuracy checks (see kSingleStepUlps and the trajectory bounds below):
//  (a) single step: from the same fp32 state, the fp32 result of every
//      element (parameter and slots) is compared with the float64 result.
//      The bound is |x32 - x64| <= kSingleStepUlps * FLT_EPSILON * scale(x),
//      where scale(x) is the sum of the magnitudes of the terms that make up
//      x, carried through each formula in float64 (for a sum a + b it is
//      scale(a) + scale(b); for a quotient a / b, scale(a) / |b| plus
//      |a / b| times the relative conditioning of b). That is the standard
//      forward error bound of a short fp32 expression: each rounding adds at
//      most FLT_EPSILON / 2 of the magnitude it rounds, so a bound of a few
//      FLT_EPSILON holds for every element, also where terms cancel.
//  (b) trajectory: after kSteps steps the fp32 parameters are compared with a
//      pure float64 run from the same start and the same gradients.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

constexpr size_t kSize = 4099;  // Odd: exercises the vector loops' epilogues.
constexpr int64_t kSteps = 1000;

// (a): the worst measured over all cases below is 1.70 (exp_avg_sq of
// adam_amsgrad_weight_decay_maximize); the test prints every case's figure.
// The longest rounding chains (e.g. v = v * b2 + ((1 - b2) * g) * g after
// g = g + wd * p) allow about 3.
constexpr double kSingleStepUlps = 2.0;

// (b): max |p32 - p64| / max(|p64|, 1) after kSteps steps, per case (see
// Case::trajectory_bound). Rounding errors of ~FLT_EPSILON / 2 per step that
// random-walk over 1000 steps give a few 1e-6 (measured 2.1e-6 .. 5.6e-6), so
// the default bound is 1e-5. AdamW with lr * weight_decay = 1e-5 multiplies p
// by 0.99999f every step; p changes by only a few thousand ulps per step, so
// the rounding error of that multiply barely changes from one step to the
// next and adds up nearly linearly (measured 1.6e-5 .. 2.4e-5; a bare
// x = x * 0.99999f + delta loop in numpy shows the same 1.7e-5). Those cases
// get 5e-5. PyTorch's fp32 AdamW does exactly the same.
constexpr double kTrajectoryBound = 1e-5;
constexpr double kTrajectoryBoundTinyDecay = 5e-5;

// ---------------------------------------------------------------------------
// Float64 reference, written from the torch.optim 1.13 formulas.

struct Elem {
  double p = 0;
  double slot[3] = {0, 0, 0};
};

// Per-quantity magnitude scales for the single-step error bound.
struct Scale {
  double p = 0;
  double slot[3] = {0, 0, 0};
};

// PyTorch hands its scalars (lr, betas, eps, 1 - beta, step_size, ...) to
// fp32 tensor ops as Python floats, which the op rounds to fp32 first. That is
// part of the semantics, not arithmetic error (e.g. AdamW's 1 - lr * wd =
// 0.99999 rounded to fp32 is off by 2.6e-8 relative, which compounds to 2.6e-5
// over 1000 steps), so the reference rounds exactly those scalars too and
// does everything else in float64.
double F(double scalar) { return static_cast<float>(scalar); }

void RefStep(const OptimizerConfig& c, int64_t step, double grad, Elem& e, Scale& sc) {
  double g = c.maximize ? -grad : grad;
  double sg = std::fabs(g);
  const double p_old = e.p;
  const double wd = F(c.weight_decay);
  switch (c.kind) {
    case OptimizerKind::kSgd: {
      if (c.weight_decay != 0) {
        g += wd * p_old;
        sg += wd * std::fabs(p_old);
      }
      double d = g;
      double sd = sg;
      if (c.momentum != 0) {
        const double momentum = F(c.momentum);
        const double one_minus_dampening = F(1 - c.dampening);
        double& buf = e.slot[0];
        if (step == 1) {
          sc.slot[0] = sg;
          buf = g;
        } else {
          sc.slot[0] = momentum * std::fabs(buf) + std::fabs(one_minus_dampening) * sg;
          buf = momentum * buf + one_minus_dampening * g;
        }
        if (c.nesterov) {
          d = g + momentum * buf;
          sd = sg + momentum * sc.slot[0];
        } else {
          d = buf;
          sd = sc.slot[0];
        }
      }
      const double lr = F(c.lr);
      e.p = p_old - lr * d;
      sc.p = std::fabs(p_old) + lr * sd;
      return;
    }
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW: {
      double p = p_old;
      if (c.kind == OptimizerKind::kAdam && c.weight_decay != 0) {
        g += wd * p_old;
        sg += wd * std::fabs(p_old);
      }
      if (c.kind == OptimizerKind::kAdamW) p *= F(1 - c.lr * c.weight_decay);
      const double beta1 = F(c.beta1);
      const double beta2 = F(c.beta2);
      const double one_minus_beta1 = F(1 - c.beta1);
      const double one_minus_beta2 = F(1 - c.beta2);
      double& m = e.slot[0];
      double& v = e.slot[1];
      sc.slot[0] = beta1 * std::fabs(m) + one_minus_beta1 * sg;
      sc.slot[1] = beta2 * v + one_minus_beta2 * sg * sg;
      m = beta1 * m + one_minus_beta1 * g;
      v = beta2 * v + one_minus_beta2 * g * g;
      double v_hat = v;
      double s_v_hat = sc.slot[1];
      if (c.amsgrad) {
        double& vmax = e.slot[2];
        s_v_hat = std::max(vmax, sc.slot[1]);
        vmax = std::max(vmax, v);
        v_hat = vmax;
        sc.slot[2] = s_v_hat;
      }
      const double t = static_cast<double>(step);
      const double bias_correction1 = 1 - std::pow(c.beta1, t);
      const double bias_correction2 = 1 - std::pow(c.beta2, t);
      const double step_size = F(c.lr / bias_correction1);
      const double denom = std::sqrt(v_hat) / F(std::sqrt(bias_correction2)) + F(c.eps);
      const double u = m / denom;
      // denom inherits v_hat's relative conditioning (halved by the sqrt).
      const double su = sc.slot[0] / denom + std::fabs(u) * s_v_hat / v_hat;
      e.p = p - step_size * u;
      sc.p = std::fabs(p_old) + step_size * su;
      return;
    }
    case OptimizerKind::kAdagrad: {
      if (c.weight_decay != 0) {
        g += wd * p_old;
        sg += wd * std::fabs(p_old);
      }
      double& sum = e.slot[0];
      sc.slot[0] = sum + sg * sg;
      sum = sum + g * g;
      const double clr = F(c.lr / (1 + (step - 1) * c.lr_decay));
      const double std_dev = std::sqrt(sum) + F(c.eps);
      const double u = g / std_dev;
      const double su = sg / std_dev + std::fabs(u) * sc.slot[0] / sum;
      e.p = p_old - clr * u;
      sc.p = std::fabs(p_old) + clr * su;
      return;
    }
    case OptimizerKind::kLion: {
      double p = p_old;
      double sp = std::fabs(p_old);
      if (c.weight_decay != 0) {
        const double decay = F(1 - c.lr * c.weight_decay);
        p *= decay;
        sp *= decay;
      }
      const double beta1 = F(c.beta1);
      const double one_minus_beta1 = F(1 - c.beta1);
      const double beta2 = F(c.beta2);
      const double one_minus_beta2 = F(1 - c.beta2);
      double& m = e.slot[0];
      const double interpolated = beta1 * m + one_minus_beta1 * g;
      const double s_interpolated = beta1 * std::fabs(m) + one_minus_beta1 * sg;
      const double lr = F(c.lr);
      const double sign = (interpolated > 0) - (interpolated < 0);
      e.p = p - lr * sign;
      // Within rounding of zero the fp32 sign may come out the other way
      // (or zero): either is the formula's answer, so such an element may
      // differ by up to 2 lr.
      const bool ambiguous = std::fabs(interpolated) <= 4 * FLT_EPSILON * s_interpolated;
      sc.p = sp + lr + (ambiguous ? 2 * lr / FLT_EPSILON : 0.0);
      sc.slot[0] = beta2 * std::fabs(m) + one_minus_beta2 * sg;
      m = beta2 * m + one_minus_beta2 * g;
      return;
    }
    case OptimizerKind::kLamb:
    case OptimizerKind::kAdafactor:
    case OptimizerKind::kMuon:
      // Whole-tensor rules: each has its own reference test.
      ADD_FAILURE() << "no element-wise reference for optimizer kind "
                    << static_cast<int>(c.kind);
      return;
  }
}

// ---------------------------------------------------------------------------

struct Case {
  std::string name;
  OptimizerConfig config;
  double trajectory_bound = kTrajectoryBound;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  auto add = [&](std::string name, OptimizerConfig c) {
    const bool tiny_decay = c.kind == OptimizerKind::kAdamW && c.lr * c.weight_decay < 1e-4;
    double bound = tiny_decay ? kTrajectoryBoundTinyDecay : kTrajectoryBound;
    // Lion: where the interpolated momentum is within rounding of zero, the
    // float64 run and the fp32 one may step the other way once (2 lr); the
    // momentum does not depend on the parameters, so that does not grow.
    if (c.kind == OptimizerKind::kLion) bound += 4 * c.lr;
    cases.push_back({name, c, bound});
  };
  {
    OptimizerConfig c = OptimizerConfig::Sgd(0.01);
    add("sgd_plain", c);
    c.weight_decay = 0.05;
    add("sgd_weight_decay", c);
    c = OptimizerConfig::Sgd(0.01);
    c.momentum = 0.9;
    c.dampening = 0.1;
    add("sgd_momentum_dampening", c);
    c = OptimizerConfig::Sgd(0.01);
    c.momentum = 0.9;
    c.nesterov = true;
    c.weight_decay = 1e-2;
    add("sgd_nesterov_weight_decay", c);
    c = OptimizerConfig::Sgd(0.003);
    c.momentum = 0.5;
    c.maximize = true;
    add("sgd_momentum_maximize", c);
    c = OptimizerConfig::Sgd(0.02);
    c.maximize = true;
    c.weight_decay = 0.01;
    add("sgd_maximize_weight_decay", c);
  }
  for (OptimizerKind kind : {OptimizerKind::kAdam, OptimizerKind::kAdamW}) {
    const std::string k = OptimizerKindName(kind);
    OptimizerConfig base =
        kind == OptimizerKind::kAdam ? OptimizerConfig::Adam(1e-3) : OptimizerConfig::AdamW(1e-3);
    OptimizerConfig c = base;
    add(k + "_default", c);
    c.amsgrad = true;
    add(k + "_amsgrad", c);
    c = base;
    c.lr = 1e-2;
    c.weight_decay = 0.1;
    c.beta1 = 0.8;
    c.beta2 = 0.99;
    add(k + "_weight_decay", c);
    c.amsgrad = true;
    c.maximize = true;
    add(k + "_amsgrad_weight_decay_maximize", c);
    c = base;
    c.maximize = true;
    c.eps = 1e-3;
    add(k + "_maximize_eps", c);
  }
  {
    OptimizerConfig c = OptimizerConfig::Adagrad(0.1);
    add("adagrad_default", c);
    c.lr_decay = 1e-3;
    add("adagrad_lr_decay", c);
    c.weight_decay = 0.05;
    c.initial_accumulator_value = 0.1;
    add("adagrad_lr_decay_weight_decay_initial_accumulator", c);
    c = OptimizerConfig::Adagrad(0.05);
    c.maximize = true;
    c.initial_accumulator_value = 1.0;
    c.eps = 1e-6;
    add("adagrad_maximize", c);
  }
  {
    OptimizerConfig c = OptimizerConfig::Lion(1e-4);
    add("lion_default", c);
    c = OptimizerConfig::Lion(3e-4);
    c.weight_decay = 0.1;
    c.beta1 = 0.95;
    c.beta2 = 0.98;
    add("lion_weight_decay_betas", c);
    c = OptimizerConfig::Lion(1e-4);
    c.maximize = true;
    c.weight_decay = 1.0;
    add("lion_maximize_weight_decay", c);
  }
  return cases;
}

std::vector<float> Normal(std::mt19937_64& rng, size_t n) {
  std::normal_distribution<double> normal(0.0, 1.0);
  std::vector<float> v(n);
  for (float& x : v) x = static_cast<float>(normal(rng));
  return v;
}

std::unique_ptr<Optimizer> MustCreate(const OptimizerConfig& c, size_t n) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(c, n);
  EXPECT_TRUE(opt.ok()) << opt.status();
  return opt.ok() ? *std::move(opt) : nullptr;
}

// Worst figures over all cases, printed at the end.
double g_worst_single_step_ulps = 0;
double g_worst_trajectory = 0;

class ReferenceTest : public ::testing::TestWithParam<Case> {};

TEST_P(ReferenceTest, MatchesFloat64) {
  const OptimizerConfig& c = GetParam().config;
  std::unique_ptr<Optimizer> opt = MustCreate(c, kSize);
  ASSERT_NE(opt, nullptr);
  const size_t num_slots = opt->slot_names().size();
  ASSERT_LE(num_slots, 3u);

  std::mt19937_64 rng(std::hash<std::string>()(GetParam().name) ^ 0x5eed);
  std::vector<float> p32 = Normal(rng, kSize);
  std::vector<Elem> traj(kSize);  // Pure float64 trajectory.
  for (size_t i = 0; i < kSize; ++i) {
    traj[i].p = p32[i];
    for (size_t s = 0; s < num_slots; ++s) traj[i].slot[s] = opt->SlotValues(s)[i];
  }

  double worst_ulps[4] = {0, 0, 0, 0};  // params, slots
  for (int64_t step = 1; step <= kSteps; ++step) {
    const std::vector<float> g32 = Normal(rng, kSize);
    // Float64 step from the current fp32 state.
    std::vector<Elem> from32(kSize);
    std::vector<Scale> scale(kSize);
    std::vector<std::vector<float>> slots_before(num_slots);
    for (size_t s = 0; s < num_slots; ++s) slots_before[s] = opt->SlotValues(s);
    for (size_t i = 0; i < kSize; ++i) {
      from32[i].p = p32[i];
      for (size_t s = 0; s < num_slots; ++s) from32[i].slot[s] = slots_before[s][i];
      RefStep(c, step, g32[i], from32[i], scale[i]);
      Scale unused;
      RefStep(c, step, g32[i], traj[i], unused);
    }
    opt->Update(step, p32.data(), g32.data(), 0, kSize);
    std::vector<std::vector<float>> slots_after(num_slots);
    for (size_t s = 0; s < num_slots; ++s) slots_after[s] = opt->SlotValues(s);
    for (size_t i = 0; i < kSize; ++i) {
      auto check = [&](int q, double x32, double x64, double s) {
        const double err = std::fabs(x32 - x64);
        const double ulps = s > 0 ? err / (FLT_EPSILON * s) : (err == 0 ? 0 : HUGE_VAL);
        worst_ulps[q] = std::max(worst_ulps[q], ulps);
        if (!(ulps <= kSingleStepUlps)) {
          ADD_FAILURE() << "step " << step << " element " << i << " quantity " << q << ": fp32 "
                        << x32 << " float64 " << x64 << " scale " << s << " = " << ulps
                        << " FLT_EPSILON * scale";
        }
      };
      check(0, p32[i], from32[i].p, scale[i].p);
      for (size_t s = 0; s < num_slots; ++s) {
        check(1 + s, slots_after[s][i], from32[i].slot[s], scale[i].slot[s]);
      }
    }
    if (HasFailure()) return;
  }

  double traj_err = 0;
  double max_abs_p = 0;
  for (size_t i = 0; i < kSize; ++i) {
    traj_err =
        std::max(traj_err, std::fabs(p32[i] - traj[i].p) / std::max(std::fabs(traj[i].p), 1.0));
    max_abs_p = std::max(max_abs_p, std::fabs(traj[i].p));
  }
  std::printf(
      "%-50s single-step worst (x FLT_EPSILON * scale): p %.3f slots %.3f %.3f %.3f; "
      "trajectory max rel err %.3g (bound %.0e, max |p| %.3g)\n",
      GetParam().name.c_str(), worst_ulps[0], worst_ulps[1], worst_ulps[2], worst_ulps[3], traj_err,
      GetParam().trajectory_bound, max_abs_p);
  g_worst_single_step_ulps = std::max(
      {g_worst_single_step_ulps, worst_ulps[0], worst_ulps[1], worst_ulps[2], worst_ulps[3]});
  g_worst_trajectory = std::max(g_worst_trajectory, traj_err);
  EXPECT_LE(traj_err, GetParam().trajectory_bound);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, ReferenceTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

class WorstCasePrinter : public ::testing::Environment {
 public:
  void TearDown() override {
    std::printf(
        "worst single-step error: %.3f FLT_EPSILON * scale (bound %.1f); worst "
        "trajectory error: %.3g (bounds %.3g, %.3g)\n",
        g_worst_single_step_ulps, kSingleStepUlps, g_worst_trajectory, kTrajectoryBound,
        kTrajectoryBoundTinyDecay);
  }
};
const ::testing::Environment* const kPrinter =
    ::testing::AddGlobalTestEnvironment(new WorstCasePrinter);

// ---------------------------------------------------------------------------
// Splitting the range changes nothing, also with threads.

class SplitTest : public ::testing::TestWithParam<Case> {};

void ExpectBitIdentical(const Optimizer& a, const std::vector<float>& pa, const Optimizer& b,
                        const std::vector<float>& pb) {
  ASSERT_EQ(pa.size(), pb.size());
  EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);
  ASSERT_EQ(a.slot_names(), b.slot_names());
  for (size_t s = 0; s < a.slot_names().size(); ++s) {
    EXPECT_EQ(a.SlotValues(s), b.SlotValues(s)) << a.slot_names()[s];
  }
}

TEST_P(SplitTest, SplitAndConcurrentUpdatesAreBitIdentical) {
  const OptimizerConfig& c = GetParam().config;
  std::unique_ptr<Optimizer> whole = MustCreate(c, kSize);
  std::unique_ptr<Optimizer> split = MustCreate(c, kSize);
  std::unique_ptr<Optimizer> threaded = MustCreate(c, kSize);
  ASSERT_TRUE(whole && split && threaded);
  std::mt19937_64 rng(42);
  std::vector<float> p_whole = Normal(rng, kSize);
  std::vector<float> p_split = p_whole;
  std::vector<float> p_threaded = p_whole;
  for (int64_t step = 1; step <= 30; ++step) {
    const std::vector<float> g = Normal(rng, kSize);
    whole->Update(step, p_whole.data(), g.data(), 0, kSize);
    // Random boundaries, including empty and one-element pieces, out of order.
    std::vector<size_t> cuts = {0, kSize, 1, 1, kSize - 1};
    for (int k = 0; k < 5; ++k) cuts.push_back(rng() % (kSize + 1));
    std::sort(cuts.begin(), cuts.end());
    for (size_t k = cuts.size() - 1; k > 0; --k) {
      split->Update(step, p_split.data(), g.data(), cuts[k - 1], cuts[k]);
    }
    std::vector<std::thread> threads;
    for (size_t k = 1; k < cuts.size(); ++k) {
      threads.emplace_back(
          [&, k] { threaded->Update(step, p_threaded.data(), g.data(), cuts[k - 1], cuts[k]); });
    }
    for (std::thread& t : threads) t.join();
  }
  ExpectBitIdentical(*whole, p_whole, *split, p_split);
  ExpectBitIdentical(*whole, p_whole, *threaded, p_threaded);
}

INSTANTIATE_TEST_SUITE_P(AllOptimizers, SplitTest, ::testing::ValuesIn(Cases()),
                         [](const ::testing::TestParamInfo<Case>& info) {
                           return info.param.name;
                         });

// ---------------------------------------------------------------------------
// Slots, Create's errors and smaller promises.

void ExpectSlots(const OptimizerConfig& c, const std::vector<std::string>& names, float initial) {
  std::unique_ptr<Optimizer> opt = MustCreate(c, 37);
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->slot_names(), names) << c.DebugString();
  EXPECT_EQ(opt->size(), 37u);
  EXPECT_EQ(opt->state_bytes(), names.size() * 37 * sizeof(float));
  EXPECT_EQ(opt->config().kind, c.kind);
  for (size_t s = 0; s < names.size(); ++s) {
    ASSERT_EQ(opt->SlotValues(s).size(), 37u);
    for (float x : opt->SlotValues(s)) {
      EXPECT_EQ(x, (names[s] == "sum" ? initial : 0.0f)) << names[s];
    }
  }
}

TEST(OptimizerTest, SlotNamesAndInitialValues) {
  OptimizerConfig c = OptimizerConfig::Sgd(0.1);
  ExpectSlots(c, {}, 0);
  c.momentum = 0.9;
  ExpectSlots(c, {"momentum_buffer"}, 0);
  c.nesterov = true;
  ExpectSlots(c, {"momentum_buffer"}, 0);
  for (OptimizerConfig a : {OptimizerConfig::Adam(), OptimizerConfig::AdamW()}) {
    ExpectSlots(a, {"exp_avg", "exp_avg_sq"}, 0);
    a.amsgrad = true;
    ExpectSlots(a, {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"}, 0);
  }
  c = OptimizerConfig::Adagrad();
  ExpectSlots(c, {"sum"}, 0);
  c.initial_accumulator_value = 0.25;
  ExpectSlots(c, {"sum"}, 0.25f);
  c.initial_accumulator_value = 0.1;  // Rounded to fp32, as torch.full_like does.
  ExpectSlots(c, {"sum"}, 0.1f);
  ExpectSlots(OptimizerConfig::Lion(), {"exp_avg"}, 0);
}

TEST(OptimizerTest, EmptyOptimizer) {
  std::unique_ptr<Optimizer> opt = MustCreate(OptimizerConfig::Adam(), 0);
  ASSERT_NE(opt, nullptr);
  EXPECT_EQ(opt->state_bytes(), 0u);
  opt->Update(1, nullptr, nullptr, 0, 0);
}

void ExpectInvalid(const OptimizerConfig& c) {
  absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(c, 10);
  EXPECT_EQ(opt.status().code(), absl::StatusCode::kInvalidArgument) << c.DebugString();
}

TEST(OptimizerTest, CreateRejectsInvalidConfigs) {
  ExpectInvalid(OptimizerConfig::Sgd(-0.1));
  ExpectInvalid(OptimizerConfig::Adam(-1e-3));
  ExpectInvalid(OptimizerConfig::Adagrad(-1e-2));
  ExpectInvalid(OptimizerConfig::Sgd(std::nan("")));
  OptimizerConfig c = OptimizerConfig::Sgd(0.1);
  c.nesterov = true;  // Without momentum.
  ExpectInvalid(c);
  c.momentum = 0.9;
  c.dampening = 0.1;  // Nesterov with dampening.
  ExpectInvalid(c);
  c = OptimizerConfig::Sgd(0.1);
  c.momentum = -0.5;
  ExpectInvalid(c);
  c = OptimizerConfig::Sgd(0.1);
  c.weight_decay = -1e-4;
  ExpectInvalid(c);
  for (OptimizerConfig a : {OptimizerConfig::Adam(), OptimizerConfig::AdamW()}) {
    OptimizerConfig b = a;
    b.beta1 = 1.0;
    ExpectInvalid(b);
    b = a;
    b.beta2 = 1.5;
    ExpectInvalid(b);
    b = a;
    b.beta1 = -0.1;
    ExpectInvalid(b);
    b = a;
    b.eps = -1e-8;
    ExpectInvalid(b);
  }
  c = OptimizerConfig::Adagrad();
  c.lr_decay = -1;
  ExpectInvalid(c);
  c = OptimizerConfig::Adagrad();
  c.initial_accumulator_value = -0.1;
  ExpectInvalid(c);

  // And the valid neighbours pass.
  c = OptimizerConfig::Sgd(0.1);
  c.momentum = 0.9;
  c.nesterov = true;
  EXPECT_TRUE(Optimizer::Create(c, 10).ok());
  OptimizerConfig a = OptimizerConfig::Adam();
  a.beta1 = 0.0;
  a.beta2 = 0.999999;
  EXPECT_TRUE(Optimizer::Create(a, 10).ok());
}

// PyTorch's step counter is a float32 that stops at 2^24; so does ours.
TEST(OptimizerTest, StepCountSaturatesLikePyTorchFloat32Step) {
  OptimizerConfig c = OptimizerConfig::Adagrad(0.1);
  c.lr_decay = 1e-3;
  auto one_step = [&](int64_t step) {
    std::unique_ptr<Optimizer> opt = MustCreate(c, 4);
    std::vector<float> p = {0, 0, 0, 0};
    const std::vector<float> g = {0.5f, -0.25f, 2, -3};
    if (opt != nullptr) opt->Update(step, p.data(), g.data(), 0, 4);
    return p;
  };
  const int64_t limit = int64_t{1} << 24;
  EXPECT_EQ(one_step(limit), one_step(limit + 1001));
  EXPECT_NE(one_step(limit), one_step(limit - 1000));
}

// torch.maximum propagates NaN into max_exp_avg_sq.
TEST(OptimizerTest, AmsgradMaxPropagatesNan) {
  OptimizerConfig c = OptimizerConfig::Adam();
  c.amsgrad = true;
  std::unique_ptr<Optimizer> opt = MustCreate(c, 3);
  ASSERT_NE(opt, nullptr);
  std::vector<float> p = {1, 1, 1};
  std::vector<float> g = {1, std::nanf(""), 1};
  opt->Update(1, p.data(), g.data(), 0, 3);
  g = {1, 1, 1};
  opt->Update(2, p.data(), g.data(), 0, 3);
  EXPECT_FALSE(std::isnan(opt->SlotValues(2)[0]));
  EXPECT_TRUE(std::isnan(opt->SlotValues(2)[1]));
  EXPECT_TRUE(std::isnan(p[1]));
  EXPECT_FALSE(std::isnan(p[2]));
}

}  // namespace
}  // namespace shardopt
