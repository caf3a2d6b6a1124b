// The whole-tensor optimizers (LAMB, Adafactor, Muon) against an independent
// float64 implementation of their published formulas, on odd shapes
// (matrices taller and wider than square, a 3-D tensor, a vector, a
// scalar) over 1,000 steps of random gradients; the whole-tensor partition
// gives the same bits for every shard count; a flat partition is refused
// (but for LAMB: lamb_flat_test).
//
// Bound: max |p32 - p64| / max(|p64|, 1) after kSteps steps. The reference
// rounds to fp32 exactly the scalars the fp32 code takes as fp32
// hyperparameters (F below), nothing else; the rest of the difference is
// the fp32 rounding of each step's arithmetic, random-walking over the
// steps (the test prints each case's figure).
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "common/layout.h"
#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

constexpr int kSteps = 1000;
// Measured 1.5e-6 .. 3.4e-6 (the test prints each case).
constexpr double kTrajectoryBound = 1e-5;

double F(double scalar) { return static_cast<float>(scalar); }

const std::vector<std::vector<int64_t>>& OddShapes() {
  static const auto* shapes = new std::vector<std::vector<int64_t>>{
      {37, 11}, {5, 53}, {3, 4, 7}, {131}, {}, {1, 9}, {9, 1}};
  return *shapes;
}

// Muon takes matrices only.
const std::vector<std::vector<int64_t>>& MatrixShapes() {
  static const auto* shapes =
      new std::vector<std::vector<int64_t>>{{37, 11}, {5, 53}, {16, 16}, {1, 9}, {9, 1}};
  return *shapes;
}

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Float64 state of one tensor.
struct RefTensor {
  std::vector<int64_t> shape;
  std::vector<double> p, m, v;     // LAMB: m, v; Adafactor: v = variance (vectors)
  std::vector<double> rows, cols;  // Adafactor, 2+ dimensions.
};

double Norm(const std::vector<double>& x) {
  double s = 0;
  for (double e : x) s += e * e;
  return std::sqrt(s);
}

void RefLamb(const OptimizerConfig& c, int64_t t, const std::vector<double>& grad, RefTensor& x) {
  const size_t n = x.p.size();
  const double c1 = c.bias_correction ? F(1 - std::pow(c.beta1, t)) : 1.0;
  const double c2 = c.bias_correction ? F(1 - std::pow(c.beta2, t)) : 1.0;
  std::vector<double> u(n);
  for (size_t i = 0; i < n; ++i) {
    const double g = c.maximize ? -grad[i] : grad[i];
    x.m[i] = F(c.beta1) * x.m[i] + F(1 - c.beta1) * g;
    x.v[i] = F(c.beta2) * x.v[i] + F(1 - c.beta2) * g * g;
    u[i] = (x.m[i] / c1) / (std::sqrt(x.v[i] / c2) + F(c.eps)) + F(c.weight_decay) * x.p[i];
  }
  const double pn = Norm(x.p), un = Norm(u);
  double r = 1;
  if (pn > 0 && un > 0) {
    r = std::max(pn / un, c.min_trust_ratio);
    if (c.max_trust_ratio > 0) r = std::min(r, c.max_trust_ratio);
  }
  for (size_t i = 0; i < n; ++i) x.p[i] -= c.lr * r * u[i];
}

double Lerp(double self, double end, double w) { return self + w * (end - self); }

// torch.lerp's two formulas (Muon's weights are 0.05 and 0.95).
double TorchLerp(double self, double end, double w) {
  return std::fabs(w) < 0.5 ? self + w * (end - self) : end - (end - self) * (1 - w);
}

// C = A B for row-major A (m x k) and B (k x n).
std::vector<double> MatMul(const std::vector<double>& a, const std::vector<double>& b, size_t m,
                           size_t k, size_t n) {
  std::vector<double> c(m * n, 0.0);
  for (size_t i = 0; i < m; ++i) {
    for (size_t l = 0; l < k; ++l) {
      for (size_t j = 0; j < n; ++j) c[i * n + j] += a[i * k + l] * b[l * n + j];
    }
  }
  return c;
}

void RefMuon(const OptimizerConfig& c, const std::vector<double>& grad, RefTensor& x) {
  const size_t rows = x.shape[0], cols = x.shape[1];
  const bool transpose = rows > cols;
  const size_t m = transpose ? cols : rows, n = transpose ? rows : cols;
  std::vector<double> u(rows * cols);
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      const size_t e = i * cols + j;
      x.m[e] = TorchLerp(x.m[e], grad[e], F(1 - c.momentum));
      u[transpose ? j * rows + i : e] =
          c.nesterov ? TorchLerp(grad[e], x.m[e], F(c.momentum)) : x.m[e];
    }
  }
  const double norm = std::max(Norm(u), F(c.eps));
  for (double& v : u) v /= norm;
  for (int k = 0; k < c.ns_steps; ++k) {
    std::vector<double> ut(n * m);
    for (size_t i = 0; i < m; ++i) {
      for (size_t j = 0; j < n; ++j) ut[j * m + i] = u[i * n + j];
    }
    const std::vector<double> gram = MatMul(u, ut, m, n, m);
    const std::vector<double> gram2 = MatMul(gram, gram, m, m, m);
    std::vector<double> poly(m * m);
    for (size_t i = 0; i < m * m; ++i) poly[i] = F(c.ns_b) * gram[i] + F(c.ns_c) * gram2[i];
    const std::vector<double> px = MatMul(poly, u, m, m, n);
    for (size_t i = 0; i < m * n; ++i) u[i] = F(c.ns_a) * u[i] + px[i];
  }
  const double ratio = c.adjust_lr == MuonAdjustLr::kOriginal
                           ? std::sqrt(std::max(1.0, static_cast<double>(rows) / cols))
                           : 0.2 * std::sqrt(static_cast<double>(std::max(rows, cols)));
  for (size_t i = 0; i < rows; ++i) {
    for (size_t j = 0; j < cols; ++j) {
      const size_t e = i * cols + j;
      x.p[e] =
          x.p[e] * F(1 - c.lr * c.weight_decay) - F(c.lr * ratio) * u[transpose ? j * rows + i : e];
    }
  }
}

void RefAdafactor(const OptimizerConfig& c, int64_t t, const std::vector<double>& grad,
                  RefTensor& x) {
  const size_t n = x.p.size();
  if (n == 0) return;
  const double w = F(std::pow(static_cast<double>(t), c.beta2_decay));
  const double rho = std::min(c.lr, 1 / std::sqrt(static_cast<double>(t)));
  const double alpha = std::max(c.eps2, Norm(x.p) / std::sqrt(static_cast<double>(n))) * rho;
  if (c.weight_decay != 0) {
    for (double& p : x.p) p *= F(1 - c.lr * c.weight_decay);
  }
  const double eps1 = c.eps1 < 0 ? FLT_EPSILON : c.eps1;
  std::vector<double> g(n), variance(n);
  for (size_t i = 0; i < n; ++i) g[i] = c.maximize ? -grad[i] : grad[i];
  if (x.shape.size() >= 2) {
    const size_t cols = x.shape.back(), rows = x.shape[x.shape.size() - 2];
    const size_t batches = n / (rows * cols);
    for (size_t b = 0; b < batches; ++b) {
      for (size_t r = 0; r < rows; ++r) {
        double s = 0;
        for (size_t k = 0; k < cols; ++k)
          s += g[(b * rows + r) * cols + k] * g[(b * rows + r) * cols + k];
        x.rows[b * rows + r] = Lerp(x.rows[b * rows + r], s / cols, w);
      }
      for (size_t k = 0; k < cols; ++k) {
        double s = 0;
        for (size_t r = 0; r < rows; ++r)
          s += g[(b * rows + r) * cols + k] * g[(b * rows + r) * cols + k];
        x.cols[b * cols + k] = Lerp(x.cols[b * cols + k], s / rows, w);
      }
      double mean = 0;
      for (size_t r = 0; r < rows; ++r) mean += x.rows[b * rows + r];
      mean = std::max(mean / rows, F(eps1));
      for (size_t r = 0; r < rows; ++r) {
        for (size_t k = 0; k < cols; ++k) {
          variance[(b * rows + r) * cols + k] = x.rows[b * rows + r] * x.cols[b * cols + k] / mean;
        }
      }
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      x.v[i] = Lerp(x.v[i], g[i] * g[i], w);
      variance[i] = x.v[i];
    }
  }
  std::vector<double> u(n);
  for (size_t i = 0; i < n; ++i) u[i] = g[i] / std::sqrt(std::max(variance[i], F(eps1 * eps1)));
  const double denom =
      std::max(1.0, Norm(u) / (std::sqrt(static_cast<double>(n)) * c.clip_threshold));
  for (size_t i = 0; i < n; ++i) x.p[i] -= alpha / denom * u[i];
}

struct Case {
  std::string name;
  OptimizerConfig config;
  double bound = kTrajectoryBound;
};

std::vector<Case> Cases() {
  std::vector<Case> cases;
  cases.push_back({"lamb", OptimizerConfig::Lamb(1e-3)});
  OptimizerConfig lamb = OptimizerConfig::Lamb(2e-3);
  lamb.bias_correction = false;
  lamb.max_trust_ratio = 0;  // apex: no clamp
  lamb.min_trust_ratio = 0;
  lamb.maximize = true;
  lamb.weight_decay = 0.1;
  cases.push_back({"lamb_apex_maximize", lamb});
  OptimizerConfig tight = OptimizerConfig::Lamb(1e-3);
  tight.min_trust_ratio = 0.5;
  tight.max_trust_ratio = 0.8;  // The clamp binds.
  cases.push_back({"lamb_clamped", tight});
  cases.push_back({"adafactor", OptimizerConfig::Adafactor()});
  OptimizerConfig af = OptimizerConfig::Adafactor(0.05);
  af.weight_decay = 0.02;
  af.eps1 = 1e-5;
  af.eps2 = 1e-2;
  af.clip_threshold = 1.5;
  af.beta2_decay = -0.5;
  af.maximize = true;
  cases.push_back({"adafactor_decay_eps_maximize", af});
  cases.push_back({"muon", OptimizerConfig::Muon(2e-3)});
  OptimizerConfig muon = OptimizerConfig::Muon(1e-3);
  muon.nesterov = false;
  muon.momentum = 0.9;
  muon.ns_steps = 3;
  muon.weight_decay = 0.01;
  muon.adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
  // Muon's Newton-Schulz polynomial has slope 3.4 at zero: fp32 rounding in
  // the small singular values is amplified, and this case's steps are 1.5x
  // lr (match_rms_adamw on 53 columns); measured 1.2e-5.
  cases.push_back({"muon_plain_match_rms", muon, 5e-5});
  return cases;
}

// Initial parameters and the gradients of every step, shared by all runs.
std::vector<double> RandomValues(std::mt19937_64& rng, size_t n, double scale) {
  std::normal_distribution<double> d(0.0, scale);
  std::vector<double> x(n);
  for (double& e : x) e = static_cast<float>(d(rng));
  return x;
}

TEST(WholeTensorReferenceTest, TrajectoriesMatchFloat64OnOddShapes) {
  for (const Case& test : Cases()) {
    SCOPED_TRACE(test.name);
    std::mt19937_64 rng(2024);
    std::vector<RangeTensor> tensors;
    std::vector<RefTensor> ref;
    uint64_t n = 0;
    const bool muon = test.config.kind == OptimizerKind::kMuon;
    for (const std::vector<int64_t>& shape : muon ? MatrixShapes() : OddShapes()) {
      const uint64_t size = Numel(shape);
      tensors.push_back(RangeTensor{n, size, shape});
      RefTensor r;
      r.shape = shape;
      r.p = RandomValues(rng, size, 0.5);
      r.m.assign(size, 0);
      r.v.assign(size, 0);
      r.rows.assign(size, 0);
      r.cols.assign(size, 0);
      ref.push_back(std::move(r));
      n += size;
    }
    absl::StatusOr<std::unique_ptr<Optimizer>> opt = Optimizer::Create(test.config, n, tensors);
    ASSERT_TRUE(opt.ok()) << opt.status();
    ASSERT_TRUE((*opt)->needs_whole_tensors());
    std::vector<float> p32(n);
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (uint64_t k = 0; k < tensors[t].size; ++k) {
        p32[tensors[t].offset + k] = static_cast<float>(ref[t].p[k]);
      }
    }
    const std::vector<float> initial = p32;
    std::vector<float> g32(n);
    for (int64_t step = 1; step <= kSteps; ++step) {
      for (size_t t = 0; t < tensors.size(); ++t) {
        // Gradients shrink and grow over the run, so both the early (bias
        // correction, rho = lr) and the late regime are exercised.
        const double scale = 0.1 * (1 + std::sin(step * 0.01)) + 1e-3;
        const std::vector<double> g = RandomValues(rng, tensors[t].size, scale);
        for (uint64_t k = 0; k < tensors[t].size; ++k) g32[tensors[t].offset + k] = g[k];
        if (test.config.kind == OptimizerKind::kLamb) {
          RefLamb(test.config, step, g, ref[t]);
        } else if (muon) {
          RefMuon(test.config, g, ref[t]);
        } else {
          RefAdafactor(test.config, step, g, ref[t]);
        }
      }
      (*opt)->Update(step, p32.data(), g32.data(), 0, n);
    }
    double worst = 0;
    for (size_t t = 0; t < tensors.size(); ++t) {
      for (uint64_t k = 0; k < tensors[t].size; ++k) {
        const double want = ref[t].p[k];
        const double got = p32[tensors[t].offset + k];
        ASSERT_TRUE(std::isfinite(got)) << "tensor " << t << "[" << k << "]";
        worst = std::max(worst, std::fabs(got - want) / std::max(std::fabs(want), 1.0));
      }
      // The parameters moved: the comparison is not of two untouched copies.
      double moved = 0;
      for (uint64_t k = 0; k < tensors[t].size; ++k) {
        moved = std::max<double>(
            moved, std::fabs(p32[tensors[t].offset + k] - initial[tensors[t].offset + k]));
      }
      EXPECT_GT(moved, 1e-3) << "tensor " << t;
    }
    std::printf("%-30s max relative trajectory error %.3g after %d steps\n", test.name.c_str(),
                worst, kSteps);
    EXPECT_LE(worst, test.bound);
  }
}

// One step from a known state: the state slots hold what the formulas say
// (Adafactor's factored row and column state at the documented places).
TEST(WholeTensorReferenceTest, AdafactorStateLayout) {
  const OptimizerConfig c = OptimizerConfig::Adafactor();
  // A (2, 3) matrix and a vector of 4.
  std::vector<RangeTensor> tensors = {{0, 6, {2, 3}}, {6, 4, {4}}};
  std::unique_ptr<Optimizer> opt = Optimizer::Create(c, 10, tensors).value();
  std::vector<float> p(10, 1.0f);
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 1, -2, 3, -4};
  opt->Update(1, p.data(), g.data(), 0, 10);
  // Step 1: weight 1, so the factors are the first means themselves.
  const std::vector<float> rows = opt->SlotValues(0);
  const std::vector<float> cols = opt->SlotValues(1);
  EXPECT_FLOAT_EQ(rows[0], (1 + 4 + 9) / 3.0f);
  EXPECT_FLOAT_EQ(rows[1], (16 + 25 + 36) / 3.0f);
  EXPECT_FLOAT_EQ(cols[0], (1 + 16) / 2.0f);
  EXPECT_FLOAT_EQ(cols[1], (4 + 25) / 2.0f);
  EXPECT_FLOAT_EQ(cols[2], (9 + 36) / 2.0f);
  for (int i = 2; i < 6; ++i) EXPECT_EQ(rows[i], 0.0f);
  for (int i = 3; i < 6; ++i) EXPECT_EQ(cols[i], 0.0f);
  // The vector keeps torch's "variance" in row_var.
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(rows[6 + i], g[6 + i] * g[6 + i]);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(cols[6 + i], 0.0f);
  // rho = min(0.01, 1) and RMS(p) = 1: alpha 0.01; the vector's update is
  // g / |g| = sign(g), RMS 1, so each element moves by exactly -0.01 sign(g).
  EXPECT_FLOAT_EQ(p[6], 1.0f - 0.01f);
  EXPECT_FLOAT_EQ(p[7], 1.0f + 0.01f);
}

// Adafactor's slots are packed: only the factors are stored (state_bytes
// counts them, and PlannedStateBytes foresees it), windows of a slot read
// the factors where they belong and zeros elsewhere, and writing the slots
// (a checkpoint restore) into a fresh optimizer continues bit for bit. A
// value where a packed slot stores nothing is refused, changing nothing.
TEST(WholeTensorReferenceTest, AdafactorStoresOnlyItsFactors) {
  const OptimizerConfig c = OptimizerConfig::Adafactor();
  // (2, 3) at 0, (4) at 6, padding, (3, 5, 7) at 12, a (0, 4) at 117, a
  // scalar at 117, (11, 1) at 120.
  const std::vector<RangeTensor> tensors = {{0, 6, {2, 3}},   {6, 4, {4}},  {12, 105, {3, 5, 7}},
                                            {117, 0, {0, 4}}, {117, 1, {}}, {120, 11, {11, 1}}};
  constexpr size_t kRange = 133;
  // row_var: 2 + 4 + 15 + 0 + 1 + 11; col_var: 3 + 0 + 21 + 0 + 0 + 1.
  constexpr size_t kStored = 33 + 25;
  std::unique_ptr<Optimizer> a = Optimizer::Create(c, kRange, tensors).value();
  EXPECT_EQ(a->state_bytes(), kStored * sizeof(float));
  EXPECT_EQ(Optimizer::PlannedStateBytes(c, kRange, tensors), kStored * sizeof(float));
  // The dense optimizers hold every element of every slot.
  EXPECT_EQ(Optimizer::PlannedStateBytes(OptimizerConfig::Lamb(), kRange, tensors),
            2 * kRange * sizeof(float));

  std::mt19937_64 rng(7);
  std::normal_distribution<float> normal;
  std::vector<float> p(kRange, 0.0f), g(kRange, 0.0f);
  for (const RangeTensor& t : tensors) {
    for (uint64_t k = 0; k < t.size; ++k) p[t.offset + k] = normal(rng);
  }
  auto gradient = [&] {
    for (const RangeTensor& t : tensors) {
      for (uint64_t k = 0; k < t.size; ++k) g[t.offset + k] = normal(rng);
    }
  };
  // The same tensors listed in another order store the same state.
  std::vector<RangeTensor> shuffled = tensors;
  std::reverse(shuffled.begin(), shuffled.end());
  std::swap(shuffled[1], shuffled[3]);
  std::unique_ptr<Optimizer> reordered = Optimizer::Create(c, kRange, shuffled).value();
  std::vector<float> p_reordered = p;
  for (int64_t step = 1; step <= 5; ++step) {
    gradient();
    a->Update(step, p.data(), g.data(), 0, kRange);
    reordered->Update(step, p_reordered.data(), g.data(), 0, kRange);
  }
  EXPECT_EQ(p_reordered, p);
  EXPECT_EQ(reordered->SlotValues(0), a->SlotValues(0));
  EXPECT_EQ(reordered->SlotValues(1), a->SlotValues(1));
  const std::vector<float> rows = a->SlotValues(0);
  const std::vector<float> cols = a->SlotValues(1);
  auto stored = [&](int slot, size_t i) {
    for (const RangeTensor& t : tensors) {
      if (i >= t.offset && i < t.offset + c.StoredSlotElements(slot, t.shape, t.size)) return true;
    }
    return false;
  };
  for (size_t i = 0; i < kRange; ++i) {
    EXPECT_EQ(rows[i] != 0.0f, stored(0, i)) << "row_var " << i;
    EXPECT_EQ(cols[i] != 0.0f, stored(1, i)) << "col_var " << i;
  }
  // Any window reads what the whole slot says.
  for (int slot = 0; slot < 2; ++slot) {
    const std::vector<float>& whole = slot == 0 ? rows : cols;
    for (uint64_t offset : {0, 1, 5, 6, 11, 20, 116, 117, 118, 130}) {
      for (uint64_t count : {0, 1, 3, 13}) {
        if (offset + count > kRange) continue;
        std::vector<float> window(count, -1.0f);
        a->ReadSlot(slot, offset, count, window.data());
        EXPECT_TRUE(std::equal(window.begin(), window.end(), whole.begin() + offset))
            << "slot " << slot << ": " << offset << " + " << count;
      }
    }
  }

  // Restore into a fresh optimizer in blocks of 7, then both go on.
  std::unique_ptr<Optimizer> b = Optimizer::Create(c, kRange, tensors).value();
  for (int slot = 0; slot < 2; ++slot) {
    const std::vector<float>& values = slot == 0 ? rows : cols;
    for (uint64_t at = 0; at < kRange; at += 7) {
      const uint64_t n = std::min<uint64_t>(7, kRange - at);
      ASSERT_TRUE(b->WriteSlot(slot, at, n, values.data() + at).ok());
    }
  }
  EXPECT_EQ(b->SlotValues(0), rows);
  EXPECT_EQ(b->SlotValues(1), cols);
  std::vector<float> q = p;
  for (int64_t step = 6; step <= 10; ++step) {
    gradient();
    a->Update(step, p.data(), g.data(), 0, kRange);
    b->Update(step, q.data(), g.data(), 0, kRange);
  }
  EXPECT_EQ(p, q);
  EXPECT_EQ(a->SlotValues(0), b->SlotValues(0));
  EXPECT_EQ(a->SlotValues(1), b->SlotValues(1));

  // A nonzero where col_var stores nothing (element 3: the (2, 3) matrix
  // keeps 3 column factors at 0..2), in the middle of a good block.
  const std::vector<float> before_rows = b->SlotValues(0), before_cols = b->SlotValues(1);
  std::vector<float> block(cols.begin(), cols.begin() + 8);
  block[0] = 42.0f;  // Stored: this alone would be taken.
  block[3] = 1.0f;
  const absl::Status refused = b->WriteSlot(1, 0, block.size(), block.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
  EXPECT_NE(refused.message().find("col_var"), std::string::npos) << refused;
  EXPECT_NE(refused.message().find("element 3"), std::string::npos) << refused;
  EXPECT_EQ(b->SlotValues(1), before_cols);
  // Past the last stored element of the range too.
  std::vector<float> tail(3, 0.0f);
  tail[2] = -1e-30f;
  EXPECT_EQ(b->WriteSlot(0, 130, 3, tail.data()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b->SlotValues(0), before_rows);
}

// Trains `layout`'s tensors for `steps` steps with one optimizer per shard
// range (whole-tensor optimizers get the shard's tensors), from values and
// gradients that depend on the tensor element only; returns each tensor's
// final values, so that any two layouts of the same tensors compare.
std::vector<std::vector<float>> TrainByShard(const OptimizerConfig& config,
                                             const ModelLayout& layout, int steps) {
  std::vector<float> params(layout.total_elements(), 0.0f), grad(layout.total_elements());
  for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
    const TensorPlacement& t = layout.tensors()[ti];
    for (uint64_t k = 0; k < t.size; ++k)
      params[t.offset + k] = 0.01f * (ti + 1) * (k % 17) - 0.05f;
  }
  std::vector<std::unique_ptr<Optimizer>> opts;
  for (uint32_t s = 0; s < layout.shard_count(); ++s) {
    std::vector<RangeTensor> tensors;
    if (NeedsWholeTensors(config.kind)) tensors = WholeTensorsOfShard(layout, s).value();
    opts.push_back(Optimizer::Create(config, layout.ShardSize(s), tensors).value());
  }
  for (int64_t step = 1; step <= steps; ++step) {
    for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
      const TensorPlacement& t = layout.tensors()[ti];
      for (uint64_t k = 0; k < t.size; ++k) {
        grad[t.offset + k] = std::sin(0.37 * step + 0.11 * k + ti);
      }
    }
    for (uint32_t s = 0; s < layout.shard_count(); ++s) {
      const FlatRange range = layout.ShardRange(s);
      opts[s]->Update(step, params.data() + range.begin, grad.data() + range.begin, 0,
                      range.size());
    }
  }
  std::vector<std::vector<float>> by_tensor;
  for (const TensorPlacement& t : layout.tensors()) {
    by_tensor.emplace_back(params.begin() + t.offset, params.begin() + t.offset + t.size);
  }
  return by_tensor;
}

std::vector<TensorSpec> SpecsOf(const std::vector<std::vector<int64_t>>& shapes) {
  std::vector<TensorSpec> specs;
  for (size_t i = 0; i < shapes.size(); ++i) {
    specs.push_back(TensorSpec{"t" + std::to_string(i), shapes[i], DType::kFloat32});
  }
  return specs;
}

// The whole-tensor partition: each shard updates its own tensors; the
// result, gathered by tensor, is bit-identical for S in {1, 2, 3, 5} (every
// tensor is computed whole by one shard in the same order).
TEST(WholeTensorReferenceTest, EveryShardCountGivesTheSameBits) {
  for (const Case& test : Cases()) {
    SCOPED_TRACE(test.name);
    const std::vector<TensorSpec> specs =
        SpecsOf(test.config.kind == OptimizerKind::kMuon ? MatrixShapes() : OddShapes());
    const auto reference = TrainByShard(
        test.config, ModelLayout::Create(specs, 16, 1, Partition::kWholeTensors).value(), 50);
    for (uint32_t shards : {2u, 3u, 5u}) {
      EXPECT_EQ(TrainByShard(
                    test.config,
                    ModelLayout::Create(specs, 16, shards, Partition::kWholeTensors).value(), 50),
                reference)
          << shards << " shards";
    }
  }
}

// The elementwise optimizers on either partition: each shard updates its own
// range (tensors cut anywhere with flat, whole with whole_tensors); gathered
// by tensor, every layout gives the bits of one range over everything.
TEST(WholeTensorReferenceTest, ElementwiseOptimizersGiveTheSameBitsOnEitherPartition) {
  const std::vector<TensorSpec> specs = SpecsOf(OddShapes());
  OptimizerConfig sgd = OptimizerConfig::Sgd(0.05);
  sgd.momentum = 0.9;
  sgd.nesterov = true;
  OptimizerConfig adamw = OptimizerConfig::AdamW(1e-2);
  adamw.amsgrad = true;
  const OptimizerConfig configs[] = {sgd, adamw, OptimizerConfig::Adagrad(0.1),
                                     OptimizerConfig::Lion(3e-3)};
  for (const OptimizerConfig& config : configs) {
    SCOPED_TRACE(config.DebugString());
    const auto reference = TrainByShard(config, ModelLayout::Create(specs, 16, 1).value(), 40);
    for (const Partition partition : {Partition::kFlat, Partition::kWholeTensors}) {
      for (uint32_t shards : {1u, 2u, 3u, 5u}) {
        EXPECT_EQ(
            TrainByShard(config, ModelLayout::Create(specs, 16, shards, partition).value(), 40),
            reference)
            << PartitionName(partition) << " x" << shards;
      }
    }
  }
}

TEST(WholeTensorReferenceTest, FlatPartitionIsRefusedNamingTheTensor) {
  const ModelLayout flat = ModelLayout::Create({{"w", {37, 11}}, {"b", {11}}}, 16, 2).value();
  absl::StatusOr<std::vector<RangeTensor>> tensors = WholeTensorsOfShard(flat, 0);
  EXPECT_EQ(tensors.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(tensors.status().message().find("'w'"), std::string::npos) << tensors.status();
  // (LAMB runs on the flat partition with norms from every shard: lamb_flat_test.)
  for (OptimizerKind kind : {OptimizerKind::kAdafactor, OptimizerKind::kMuon}) {
    EXPECT_EQ(CheckOptimizerFitsPartition(kind, false).code(), absl::StatusCode::kInvalidArgument);
    EXPECT_TRUE(CheckOptimizerFitsPartition(kind, true).ok());
  }
  EXPECT_TRUE(CheckOptimizerFitsPartition(OptimizerKind::kAdamW, false).ok());
  // Tensors outside the range are refused; Muon refuses anything but a matrix.
  EXPECT_EQ(Optimizer::Create(OptimizerConfig::Lamb(), 10, {{4, 7, {7}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(Optimizer::Create(OptimizerConfig::Muon(), 10, {{0, 10, {10}}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CheckOptimizerFitsTensor(OptimizerKind::kMuon, "bias", {3}).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CheckOptimizerFitsTensor(OptimizerKind::kMuon, "w", {3, 4}).ok());
}

}  // namespace
}  // namespace shardopt
