// ModelShard with trust norms (LAMB on the flat partition), three shards
// driven by hand as trainers drive them: push, statistics, the clip half
// (each shard measures its trust partials), the norms combined and sent.
// The shards end on the bits of one optimizer updating whole tensors; a
// decision without norms, with norms a shard's own part contradicts, or
// sent to a model that gathers none is refused and changes nothing.
#include <cmath>
#include <memory>
#include <vector>

#include "absl/strings/match.h"
#include "common/layout.h"
#include "common/step_protocol.h"
#include "gtest/gtest.h"
#include "server/model_shard.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

constexpr uint32_t kShards = 3;
constexpr double kMaxGradNorm = 2.0;

ModelLayout Layout() {
  // (With a tensor of no elements, which lies on no shard.)
  return ModelLayout::Create({{"w", {37, 19}}, {"v", {300}}, {"e", {0, 4}}, {"b", {5}}, {"s", {}}},
                             64, kShards)
      .value();
}

// Keyed by tensor element; zero in padding.
std::vector<float> Values(const ModelLayout& layout, int64_t step) {
  std::vector<float> x(layout.total_elements(), 0.0f);
  for (size_t ti = 0; ti < layout.tensors().size(); ++ti) {
    const TensorPlacement& t = layout.tensors()[ti];
    for (uint64_t k = 0; k < t.size; ++k) {
      x[t.offset + k] = step == 0 ? 0.02f * ((k * 7 + ti) % 23) - 0.2f
                                  : static_cast<float>(std::sin(0.3 * step + 0.07 * k + ti));
    }
  }
  return x;
}

std::vector<float> RangeOf(const ModelLayout& layout, uint32_t shard, const std::vector<float>& x) {
  const FlatRange r = layout.ShardRange(shard);
  return std::vector<float>(x.begin() + r.begin, x.begin() + r.end);
}

std::unique_ptr<ModelShard> MakeShard(ThreadPool* pool, uint32_t shard, OptimizerConfig optimizer,
                                      double max_grad_norm) {
  ModelShardOptions options{"m", Layout(), shard, optimizer, 1, true};
  options.max_grad_norm = max_grad_norm;
  return ModelShard::Create(std::move(options), RangeOf(Layout(), shard, Values(Layout(), 0)), pool)
      .value();
}

absl::Status Push(ModelShard& shard, int64_t step, const std::vector<float>& grad) {
  absl::StatusOr<ModelShard::PushStart> start = shard.BeginPush(0, step, grad.size());
  if (!start.ok()) return start.status();
  if (start->immediate) return absl::OkStatus();
  if (absl::Status s = start->writer->Write(0, grad.data(), grad.size() * sizeof(float)); !s.ok()) {
    return s;
  }
  return start->writer->Commit().status();
}

std::vector<float> Read(ModelShard& shard, int64_t version) {
  std::vector<float> out(shard.size());
  EXPECT_TRUE(shard.ReadParameters(version, 0, out.size(), out.data()).ok());
  return out;
}

const absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

TEST(ModelShardTrustTest, ShardsGatherNormsAndEndOnTheWholeTensorBits) {
  ThreadPool pool(2);
  const ModelLayout layout = Layout();
  ASSERT_TRUE(StepsNeedTrustNorms(OptimizerKind::kLamb, layout));
  OptimizerConfig lamb = OptimizerConfig::Lamb(1e-2);
  lamb.weight_decay = 0.01;
  std::vector<std::unique_ptr<ModelShard>> shards;
  for (uint32_t s = 0; s < kShards; ++s) shards.push_back(MakeShard(&pool, s, lamb, kMaxGradNorm));
  EXPECT_TRUE(shards[0]->options().needs_decision());

  // The reference: every tensor whole in one range, the gradient multiplied
  // as the shards multiply it.
  std::vector<RangeTensor> whole;
  for (const TensorPlacement& t : layout.tensors()) {
    whole.push_back(RangeTensor{t.offset, t.size, t.spec.shape});
  }
  std::unique_ptr<Optimizer> reference =
      Optimizer::Create(lamb, layout.total_elements(), whole).value();
  std::vector<float> expected = Values(layout, 0);

  bool clipped = false;
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<float> grad = Values(layout, step);
    std::vector<StepStats> stats;
    for (uint32_t s = 0; s < kShards; ++s) {
      ASSERT_TRUE(Push(*shards[s], step, RangeOf(layout, s, grad)).ok());
      absl::StatusOr<StepStats> got = shards[s]->WaitForStepStats(step, Soon(), nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_TRUE(got->trust_partials.empty());
      stats.push_back(*got);
    }
    StepDecision decision = DecideStep(stats, kMaxGradNorm);
    clipped = clipped || decision.clip_coef < 1;
    ASSERT_FALSE(decision.skip);
    if (step == 1) {
      // A decision that applies the step without norms: refused, nothing moves.
      const absl::Status refused = shards[0]->Decide(step, decision, true, Soon());
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_EQ(shards[0]->version(), 0);
      // Norms of too few tensors, under another clip: refused before that
      // clip is taken (the one below, asked for the partials, still is).
      StepDecision short_norms = decision;
      short_norms.grad_norm = decision.grad_norm * 2;
      short_norms.clip_coef = ClipCoefficient(kMaxGradNorm, short_norms.grad_norm);
      short_norms.tensor_norms.resize(1);
      const absl::Status counted = shards[0]->Decide(step, short_norms, true, Soon());
      EXPECT_EQ(counted.code(), absl::StatusCode::kInvalidArgument) << counted;
      EXPECT_TRUE(absl::StrContains(counted.message(), "tensor norms for 1 tensors")) << counted;
    }
    std::vector<StepStats> partials;
    for (uint32_t s = 0; s < kShards; ++s) {
      absl::StatusOr<StepStats> got =
          shards[s]->WaitForStepStats(step, Soon(), nullptr, std::nullopt, &decision);
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_FALSE(got->trust_partials.empty());
      // A second ask (another trainer) gets the same partials.
      absl::StatusOr<StepStats> again =
          shards[s]->WaitForStepStats(step, Soon(), nullptr, std::nullopt, &decision);
      ASSERT_TRUE(again.ok());
      ASSERT_EQ(again->trust_partials.size(), got->trust_partials.size());
      for (size_t i = 0; i < got->trust_partials.size(); ++i) {
        EXPECT_EQ(again->trust_partials[i].update_squares, got->trust_partials[i].update_squares);
      }
      partials.push_back(*got);
    }
    absl::StatusOr<std::vector<TensorNorms>> norms = CombineTrustPartials(partials, layout);
    ASSERT_TRUE(norms.ok()) << norms.status();
    decision.tensor_norms = *norms;
    if (step == 2) {
      // Norms below what shard 1 measured of tensor 'w': refused, untouched.
      StepDecision low = decision;
      low.tensor_norms[0].update_squares = 0;
      const absl::Status refused = shards[1]->Decide(step, low, true, Soon());
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_EQ(shards[1]->version(), 1);
      EXPECT_EQ(Read(*shards[1], 1), RangeOf(layout, 1, expected));
    }
    for (uint32_t s = 0; s < kShards; ++s) {
      ASSERT_TRUE(shards[s]->Decide(step, decision, true, Soon()).ok());
      EXPECT_EQ(shards[s]->version(), step);
      EXPECT_TRUE(shards[s]->Decide(step, decision, true, Soon()).ok());  // A repeat.
      // A late trainer's first half: the statistics, not the partials.
      absl::StatusOr<StepStats> late = shards[s]->WaitForStepStats(step, Soon(), nullptr);
      ASSERT_TRUE(late.ok()) << late.status();
      EXPECT_TRUE(late->trust_partials.empty());
    }
    const float multiplier = GradientMultiplier(decision, 1.0);
    for (float& g : grad) g *= multiplier;
    reference->Update(step, expected.data(), grad.data(), 0, expected.size());
    for (uint32_t s = 0; s < kShards; ++s) {
      EXPECT_EQ(Read(*shards[s], step), RangeOf(layout, s, expected)) << "shard " << s;
    }
  }
  EXPECT_TRUE(clipped);
}

TEST(ModelShardTrustTest, ModelsWithoutTrustNormsRefuseThem) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> adamw = MakeShard(&pool, 0, OptimizerConfig::AdamW(1e-2), 1.0);
  EXPECT_FALSE(adamw->options().needs_trust_norms());
  const std::vector<float> grad = RangeOf(Layout(), 0, Values(Layout(), 1));
  ASSERT_TRUE(Push(*adamw, 1, grad).ok());
  absl::StatusOr<StepStats> stats = adamw->WaitForStepStats(1, Soon(), nullptr);
  ASSERT_TRUE(stats.ok()) << stats.status();
  StepDecision clip = DecideStep({*stats}, 1.0);
  EXPECT_EQ(adamw->WaitForStepStats(1, Soon(), nullptr, std::nullopt, &clip).status().code(),
            absl::StatusCode::kInvalidArgument);
  StepDecision with_norms = clip;
  with_norms.tensor_norms.resize(Layout().tensors().size());
  EXPECT_EQ(adamw->Decide(1, with_norms, true, Soon()).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(adamw->version(), 0);
  const absl::Status decided = adamw->Decide(1, clip, true, Soon());
  ASSERT_TRUE(decided.ok()) << decided;
  EXPECT_EQ(adamw->version(), 1);

  // LAMB without clipping still decides its steps (for the norms); a skip
  // asks for no partials.
  std::unique_ptr<ModelShard> lamb = MakeShard(&pool, 0, OptimizerConfig::Lamb(1e-2), 0);
  EXPECT_TRUE(lamb->options().needs_decision());
  ASSERT_TRUE(Push(*lamb, 1, grad).ok());
  StepDecision skip{true, 1.0, 0, {}};
  EXPECT_EQ(lamb->WaitForStepStats(1, Soon(), nullptr, std::nullopt, &skip).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(lamb->version(), 0);
}

}  // namespace
}  // namespace shardopt
