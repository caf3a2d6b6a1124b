// LAMB's GPU path on the host: LambPlan plus the kernels' per-thread code
// (lamb_kernels_emulated.cc) driven as GpuBackend drives them, against
// CpuBackend, bit for bit: parameters, both moments, and the trust partials
// of pieces of tensors. Odd sizes (not multiples of 8 or 64), pieces whole
// and not, maximize, gradient multipliers, the trust ratio's clamps and a
// zero norm.
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/cpu_backend.h"
#include "server/cuda/cpu_step_testing.h"
#include "server/cuda/lamb_kernels.h"
#include "server/cuda/lamb_plan.h"
#include "server/parallel_for.h"

namespace shardopt {
namespace {

using testing::ExpectSameBits;

using gpu::LambPiece;
using gpu::LambPlan;

// GpuBackend's state and its LAMB passes, on host memory.
struct EmulatedLamb {
  EmulatedLamb(std::vector<LambPiece> pieces, std::vector<float> initial)
      : plan(std::move(pieces)),
        params(std::move(initial)),
        exp_avg(params.size(), 0.0f),
        exp_avg_sq(params.size(), 0.0f),
        weight_squares(plan.blocks().size()),
        update_squares(plan.blocks().size()) {}

  std::vector<TrustPartial> Measure(const OptimizerConfig& c, int64_t step, float multiplier,
                                    const std::vector<float>& grad) {
    gpu::LambMeasureArgs a{plan.blocks().data(),
                           plan.blocks().size(),
                           params.data(),
                           grad.data(),
                           exp_avg.data(),
                           exp_avg_sq.data(),
                           LambPlan::Scalars(c, step, multiplier),
                           weight_squares.data(),
                           update_squares.data()};
    EXPECT_TRUE(gpu::LambMeasure(a, nullptr).ok());
    return plan.Partials(weight_squares.data(), update_squares.data());
  }

  void Apply(const OptimizerConfig& c, int64_t step, float multiplier,
             const std::vector<float>& grad, absl::Span<const TensorNorms> norms) {
    absl::StatusOr<std::vector<float>> sizes = plan.StepSizes(c, norms);
    ASSERT_TRUE(sizes.ok()) << sizes.status();
    gpu::LambApplyArgs a{plan.blocks().data(),
                         plan.blocks().size(),
                         params.data(),
                         grad.data(),
                         exp_avg.data(),
                         exp_avg_sq.data(),
                         LambPlan::Scalars(c, step, multiplier),
                         sizes->data()};
    ASSERT_TRUE(gpu::LambApply(a, nullptr).ok());
  }

  // GpuBackend::Apply / Update on tensors held whole.
  void Step(const OptimizerConfig& c, int64_t step, float multiplier,
            const std::vector<float>& grad) {
    const std::vector<TensorNorms> norms = LambPlan::OwnNorms(Measure(c, step, multiplier, grad));
    Apply(c, step, multiplier, grad, norms);
  }

  LambPlan plan;
  std::vector<float> params, exp_avg, exp_avg_sq;
  std::vector<double> weight_squares, update_squares;
};

std::vector<RangeTensor> RangeTensorsOf(const std::vector<LambPiece>& pieces) {
  std::vector<RangeTensor> tensors;
  for (const LambPiece& p : pieces) {
    RangeTensor t;
    t.offset = p.offset;
    t.size = p.size;
    t.shape = {static_cast<int64_t>(p.size)};
    t.index = p.tensor_index;
    t.whole = p.whole;
    tensors.push_back(t);
  }
  return tensors;
}

std::vector<float> Random(std::mt19937& rng, size_t n, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void ExpectSameState(CpuBackend& cpu, const EmulatedLamb& gpu, int64_t step) {
  const size_t n = gpu.params.size();
  std::vector<float> params(n), m(n), v(n);
  ASSERT_TRUE(cpu.Read(0, n, params.data()).ok());
  ASSERT_TRUE(cpu.ReadSlot(0, 0, n, m.data()).ok());
  ASSERT_TRUE(cpu.ReadSlot(1, 0, n, v.data()).ok());
  ExpectSameBits(params, gpu.params, "params", step);
  ExpectSameBits(m, gpu.exp_avg, "exp_avg", step);
  ExpectSameBits(v, gpu.exp_avg_sq, "exp_avg_sq", step);
}

// Whole tensors of sizes around the lanes and blocks: 1, 7, 8, 63, 64, 65,
// 200 and 1037 elements, back to back.
std::vector<LambPiece> WholePieces() {
  std::vector<LambPiece> pieces;
  uint64_t offset = 0;
  uint32_t index = 0;
  for (uint64_t size : {1, 7, 8, 63, 64, 65, 200, 1037}) {
    pieces.push_back(LambPiece{offset, size, index++, true});
    offset += size;
  }
  return pieces;
}

uint64_t TotalSize(const std::vector<LambPiece>& pieces) {
  return pieces.back().offset + pieces.back().size;
}

void RunWholeTensorSteps(const OptimizerConfig& config, float multiplier) {
  const std::vector<LambPiece> pieces = WholePieces();
  const uint64_t n = TotalSize(pieces);
  std::mt19937 rng(7);
  std::vector<float> initial = Random(rng, n, 1.0f);
  initial[0] = 0.0f;  // A zero tensor: ||p|| = 0, ratio 1.
  ThreadPool pool(2);
  absl::StatusOr<std::unique_ptr<CpuBackend>> cpu =
      CpuBackend::Create(config, 1, initial, &pool, RangeTensorsOf(pieces));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EmulatedLamb gpu(pieces, initial);
  for (int64_t step = 1; step <= 12; ++step) {
    const std::vector<float> grad = Random(rng, n, step % 3 == 0 ? 1e-3f : 0.5f);
    ASSERT_TRUE(testing::CpuStep(**cpu, config, step, multiplier, grad).ok());
    gpu.Step(config, step, multiplier, grad);
    ExpectSameState(**cpu, gpu, step);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(LambKernelsEmulationTest, WholeTensorsMatchTheCpuBackend) {
  OptimizerConfig c = OptimizerConfig::Lamb(1e-2);
  c.weight_decay = 0.01;
  RunWholeTensorSteps(c, 1.0f);
}

TEST(LambKernelsEmulationTest, MaximizeClampsAndMultiplierMatchTheCpuBackend) {
  OptimizerConfig c = OptimizerConfig::Lamb(3e-3);
  c.maximize = true;
  c.weight_decay = 0.1;
  c.min_trust_ratio = 0.5;
  c.max_trust_ratio = 2.0;
  c.beta1 = 0.8;
  c.beta2 = 0.95;
  c.eps = 1e-4;
  RunWholeTensorSteps(c, 0.25f);
}

TEST(LambKernelsEmulationTest, WithoutBiasCorrectionMatchesTheCpuBackend) {
  OptimizerConfig c = OptimizerConfig::Lamb(1e-2);
  c.bias_correction = false;
  c.max_trust_ratio = 0;  // No upper clamp.
  RunWholeTensorSteps(c, 1.0f);
}

// Pieces of tensors (a flat partition): the partials the shard sends and the
// update with norms from every shard (here made up, one of them zero).
TEST(LambKernelsEmulationTest, PiecesMeasureAndUpdateWithGivenNormsLikeTheCpuBackend) {
  const std::vector<LambPiece> pieces = {
      {0, 130, 3, false}, {130, 64, 4, true}, {194, 1001, 5, false}, {1195, 5, 6, false}};
  const uint64_t n = TotalSize(pieces);
  OptimizerConfig c = OptimizerConfig::Lamb(1e-2);
  c.weight_decay = 0.02;
  std::mt19937 rng(11);
  const std::vector<float> initial = Random(rng, n, 0.3f);
  ThreadPool pool(2);
  absl::StatusOr<std::unique_ptr<CpuBackend>> cpu =
      CpuBackend::Create(c, 1, initial, &pool, RangeTensorsOf(pieces));
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EmulatedLamb gpu(pieces, initial);
  EXPECT_TRUE(gpu.plan.needs_every_shards_norms());
  for (int64_t step = 1; step <= 6; ++step) {
    const float multiplier = step % 2 == 0 ? 0.5f : 1.0f;
    const std::vector<float> grad = Random(rng, n, 0.1f);
    ASSERT_TRUE((*cpu)->Stage(0, 0, grad.data(), DType::kFloat32, n).ok());
    ASSERT_TRUE((*cpu)->FinishStaging(0).ok());
    ASSERT_TRUE((*cpu)->Reduce(/*mean=*/false).ok());
    absl::StatusOr<std::vector<TrustPartial>> expected = (*cpu)->MeasureTrust(step, c, multiplier);
    ASSERT_TRUE(expected.ok()) << expected.status();
    const std::vector<TrustPartial> actual = gpu.Measure(c, step, multiplier, grad);
    ASSERT_EQ(expected->size(), actual.size());
    for (size_t p = 0; p < actual.size(); ++p) {
      EXPECT_EQ((*expected)[p].tensor_index, actual[p].tensor_index);
      EXPECT_EQ((*expected)[p].whole_tensor, actual[p].whole_tensor);
      EXPECT_TRUE((*expected)[p].weight_squares == actual[p].weight_squares) << "piece " << p;
      EXPECT_TRUE((*expected)[p].update_squares == actual[p].update_squares) << "piece " << p;
    }
    // Every shard's norms: this shard's, grown as other shards' would, and
    // tensor 5's update norm zero (ratio 1).
    std::vector<TensorNorms> norms = LambPlan::OwnNorms(actual);
    for (TensorNorms& t : norms) {
      t.weight_squares *= 1.5;
      t.update_squares *= 3.0;
    }
    norms[5].update_squares = 0;
    ASSERT_TRUE((*cpu)->UpdateWithTrust(step, c, multiplier, norms).ok());
    gpu.Apply(c, step, multiplier, grad, norms);
    ExpectSameState(**cpu, gpu, step);
    if (HasFatalFailure()) return;
  }
}

TEST(LambPlanTest, BlocksCountFromEachPieceAndRefuseMissingNorms) {
  const LambPlan plan({{0, 65, 0, true}, {65, 3, 2, true}});
  ASSERT_EQ(plan.blocks().size(), 3u);
  EXPECT_EQ(plan.blocks()[0].begin, 0u);
  EXPECT_EQ(plan.blocks()[0].count, 64u);
  EXPECT_EQ(plan.blocks()[1].begin, 64u);
  EXPECT_EQ(plan.blocks()[1].count, 1u);
  EXPECT_EQ(plan.blocks()[2].begin, 65u);
  EXPECT_EQ(plan.blocks()[2].count, 3u);
  EXPECT_EQ(plan.blocks()[2].piece, 1u);
  EXPECT_FALSE(plan.needs_every_shards_norms());
  const std::vector<TensorNorms> two(2);
  absl::StatusOr<std::vector<float>> sizes = plan.StepSizes(OptimizerConfig::Lamb(), two);
  EXPECT_EQ(sizes.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(sizes.status().message().find("no norms for tensor 2"), std::string::npos)
      << sizes.status();
}

// Enough blocks for several threads, pieces crossing the threads' shares:
// the partials are each piece's exact sum, as one Add after another gives.
TEST(LambPlanTest, PartialsOverThreadsAreTheOneThreadSums) {
  const uint64_t big = LambPlan::kBlocksPerPartialThread * 64 * 3 + 1000;
  const LambPlan plan({{0, 70, 0, true}, {70, big, 1, true}, {70 + big, 3000, 2, true}});
  const size_t blocks = plan.blocks().size();
  std::mt19937_64 rng(9);
  std::uniform_real_distribution<double> value(0.0, 100.0);
  std::vector<double> weight(blocks), update(blocks);
  for (size_t b = 0; b < blocks; ++b) {
    weight[b] = value(rng);
    update[b] = value(rng) * 1e-6;
  }
  update[blocks / 2] = std::numeric_limits<double>::infinity();  // Piece 1 becomes inf.
  const std::vector<TrustPartial> partials = plan.Partials(weight.data(), update.data());
  ASSERT_EQ(partials.size(), 3u);
  std::vector<ExactSum> want_weight(3), want_update(3);
  for (size_t b = 0; b < blocks; ++b) {
    want_weight[plan.blocks()[b].piece].Add(weight[b]);
    want_update[plan.blocks()[b].piece].Add(update[b]);
  }
  for (size_t p = 0; p < 3; ++p) {
    EXPECT_EQ(partials[p].tensor_index, p);
    EXPECT_TRUE(partials[p].weight_squares == want_weight[p]) << "piece " << p;
    EXPECT_TRUE(partials[p].update_squares == want_update[p]) << "piece " << p;
  }
  EXPECT_EQ(partials[1].update_squares.Rounded(), std::numeric_limits<double>::infinity());
}

}  // namespace
}  // namespace shardopt
