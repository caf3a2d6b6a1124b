// Checks the hand-written backward pass of mlp_loss.cc against central
// finite differences (in double, where they are accurate to ~1e-9), the fp32
// path the trainer runs against the double one, and that the data-parallel
// split (ShareOf + the servers' mean over trainers) reproduces the
// full-batch gradient.
#include <cmath>
#include <vector>

#include "client/gradient_accumulator.h"
#include "common/layout.h"
#include "gtest/gtest.h"
#include "tools/train/batches.h"
#include "tools/train/mlp.h"
#include "tools/train/mlp_init.h"
#include "tools/train/mlp_loss.h"
#include "tools/train/random.h"
#include "tools/train/spirals.h"
#include "tools/train/tensor_views.h"

namespace shardopt::train {
namespace {

// A tiny model and dataset, laid out across 2 shards with padding, so the
// views must honour real offsets rather than a packed buffer.
struct Fixture {
  MlpConfig config;
  Dataset data;
  ModelLayout layout;
  std::vector<float> params;  // Flat, in `layout`.
};

Fixture MakeFixture(Activation activation) {
  SpiralsOptions spirals;
  spirals.num_classes = 3;
  spirals.points_per_class = 6;
  spirals.noise_features = 1;
  Dataset data = MakeSpirals(spirals, /*seed=*/7).value();
  MlpConfig config;
  config.input_dim = data.num_features;
  config.hidden = {5, 4};
  config.num_classes = data.num_classes;
  config.activation = activation;
  ModelLayout layout = ModelLayout::Create(MlpTensorSpecs(config), 16, 2).value();
  std::vector<float> params(layout.total_elements(), 0.0f);
  MlpTensors<float> tensors =
      BindMlp(config, TensorViews<float>::Create(layout, absl::MakeSpan(params)).value()).value();
  InitMlp(config, tensors, /*seed=*/3);
  // InitMlp zeroes the biases; non-zero ones exercise their gradient paths.
  SplitMix64 rng(11);
  for (int l = 0; l < config.num_layers(); ++l) {
    for (int j = 0; j < config.fan_out(l); ++j) {
      tensors.bias[l][j] = static_cast<float>(rng.Uniform(-0.3, 0.3));
    }
  }
  return Fixture{config, std::move(data), std::move(layout), std::move(params)};
}

std::vector<int> AllIndices(const Dataset& data) {
  std::vector<int> all(data.size());
  for (int i = 0; i < data.size(); ++i) all[i] = i;
  return all;
}

template <typename T>
double Loss(const Fixture& f, const std::vector<T>& params, absl::Span<const int> indices,
            std::vector<T>* grads) {
  const MlpTensors<const T> p =
      BindMlp(f.config, TensorViews<const T>::Create(f.layout, absl::MakeConstSpan(params)).value())
          .value();
  if (grads == nullptr) return MlpLossAndGradient<T>(f.config, p, f.data, indices, nullptr);
  const MlpTensors<T> g =
      BindMlp(f.config, TensorViews<T>::Create(f.layout, absl::MakeSpan(*grads)).value()).value();
  return MlpLossAndGradient<T>(f.config, p, f.data, indices, &g);
}

class MlpGradientTest : public ::testing::TestWithParam<Activation> {};

TEST_P(MlpGradientTest, BackwardMatchesFiniteDifferencesInDouble) {
  const Fixture f = MakeFixture(GetParam());
  const std::vector<int> all = AllIndices(f.data);
  std::vector<double> params(f.params.begin(), f.params.end());
  std::vector<double> grads(params.size(), 0.0);
  const double loss = Loss<double>(f, params, all, &grads);
  EXPECT_GT(loss, 0.5);  // Untrained: far from zero, so the gradient is not tiny.

  constexpr double kH = 1e-6;
  int checked = 0;
  for (const TensorPlacement& t : f.layout.tensors()) {
    for (uint64_t i = t.offset; i < t.offset + t.size; ++i) {
      const double saved = params[i];
      params[i] = saved + kH;
      const double up = Loss<double>(f, params, all, nullptr);
      params[i] = saved - kH;
      const double down = Loss<double>(f, params, all, nullptr);
      params[i] = saved;
      const double numeric = (up - down) / (2 * kH);
      EXPECT_NEAR(grads[i], numeric, 1e-7 + 1e-6 * std::abs(numeric))
          << t.spec.name << "[" << i - t.offset << "]";
      ++checked;
    }
  }
  EXPECT_EQ(checked, f.layout.used_elements());
}

TEST_P(MlpGradientTest, Fp32MatchesDouble) {
  const Fixture f = MakeFixture(GetParam());
  const std::vector<int> all = AllIndices(f.data);
  std::vector<double> params64(f.params.begin(), f.params.end());
  std::vector<double> grads64(params64.size(), 0.0);
  std::vector<float> grads32(f.params.size(), 0.0f);
  const double loss64 = Loss<double>(f, params64, all, &grads64);
  const double loss32 = Loss<float>(f, f.params, all, &grads32);
  EXPECT_NEAR(loss32, loss64, 1e-6 * loss64);
  for (size_t i = 0; i < grads32.size(); ++i) {
    EXPECT_NEAR(grads32[i], grads64[i], 1e-6 + 1e-4 * std::abs(grads64[i])) << "element " << i;
  }
}

TEST_P(MlpGradientTest, GradientsOverwriteAndLeavePaddingAlone) {
  const Fixture f = MakeFixture(GetParam());
  const std::vector<int> all = AllIndices(f.data);
  std::vector<float> once(f.params.size(), 0.0f);
  Loss<float>(f, f.params, all, &once);
  std::vector<float> twice(f.params.size(), 0.0f);
  Loss<float>(f, f.params, all, &twice);
  Loss<float>(f, f.params, all, &twice);
  EXPECT_EQ(once, twice);
  // The servers expect zero gradients in the padding.
  std::vector<bool> used(once.size(), false);
  for (const TensorPlacement& t : f.layout.tensors()) {
    for (uint64_t i = t.offset; i < t.offset + t.size; ++i) used[i] = true;
  }
  for (size_t i = 0; i < once.size(); ++i) {
    if (!used[i]) {
      EXPECT_EQ(once[i], 0.0f) << "padding element " << i;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Activations, MlpGradientTest,
                         ::testing::Values(Activation::kRelu, Activation::kTanh),
                         [](const ::testing::TestParamInfo<Activation>& info) {
                           return info.param == Activation::kRelu ? "Relu" : "Tanh";
                         });

// What the job computes: each trainer's mean-loss gradient over its share,
// then the servers' mean over trainers (sum in rank order, then / T).
TEST(DataParallelTest, MeanOfShareGradientsIsFullBatchGradient) {
  const Fixture f = MakeFixture(Activation::kRelu);
  BatchSchedule schedule = BatchSchedule::Create(f.data.size(), 12, /*seed=*/5).value();
  for (int64_t step : {1, 2, 7}) {
    const std::vector<int> batch = schedule.GlobalBatch(step);
    std::vector<float> full(f.params.size(), 0.0f);
    Loss<float>(f, f.params, batch, &full);
    for (uint32_t trainers : {2u, 3u, 4u}) {
      std::vector<float> reduced(f.params.size(), 0.0f);
      for (uint32_t rank = 0; rank < trainers; ++rank) {
        std::vector<float> share(f.params.size(), 0.0f);
        Loss<float>(f, f.params, ShareOf(batch, rank, trainers), &share);
        for (size_t i = 0; i < share.size(); ++i) reduced[i] += share[i];
      }
      for (size_t i = 0; i < reduced.size(); ++i) {
        reduced[i] /= static_cast<float>(trainers);
        EXPECT_NEAR(reduced[i], full[i], 1e-6f + 1e-5f * std::abs(full[i]))
            << "step " << step << ", " << trainers << " trainers, element " << i;
      }
    }
  }
}

// Gradient accumulation as the trainer does it: micro-batches of unequal
// sizes, each a mean-loss gradient weighted by its size, give the gradient
// of the whole share.
TEST(DataParallelTest, AccumulatedMicroBatchesGiveTheShareGradient) {
  const Fixture f = MakeFixture(Activation::kTanh);
  BatchSchedule schedule = BatchSchedule::Create(f.data.size(), 11, /*seed=*/3).value();
  const std::vector<int> batch = schedule.GlobalBatch(2);
  std::vector<float> full(f.params.size(), 0.0f);
  Loss<float>(f, f.params, batch, &full);
  for (int micro_batches : {2, 3, 4}) {
    GradientAccumulator accumulator(f.params.size());
    for (int m = 0; m < micro_batches; ++m) {
      const size_t begin = batch.size() * m / micro_batches;
      const size_t end = batch.size() * (m + 1) / micro_batches;
      std::vector<float> micro(f.params.size(), 0.0f);
      Loss<float>(f, f.params, absl::MakeConstSpan(batch).subspan(begin, end - begin), &micro);
      ASSERT_TRUE(accumulator.Add(micro, end - begin).ok());
    }
    std::vector<float> accumulated(f.params.size());
    ASSERT_TRUE(accumulator.Mean(absl::MakeSpan(accumulated)).ok());
    for (size_t i = 0; i < full.size(); ++i) {
      EXPECT_NEAR(accumulated[i], full[i], 1e-6f + 1e-5f * std::abs(full[i]))
          << micro_batches << " micro-batches, element " << i;
    }
  }
}

TEST(BatchScheduleTest, EpochsArePermutationsAndSharesPartitionTheBatch) {
  constexpr int kSize = 40, kBatch = 8;
  BatchSchedule a = BatchSchedule::Create(kSize, kBatch, 9).value();
  BatchSchedule b = BatchSchedule::Create(kSize, kBatch, 9).value();
  std::vector<int> seen(kSize, 0);
  for (int64_t step = 1; step <= kSize / kBatch; ++step) {
    const std::vector<int> batch = a.GlobalBatch(step);
    for (int i : batch) ++seen[i];
    std::vector<int> rebuilt;
    for (uint32_t rank = 0; rank < 4; ++rank) {
      absl::Span<const int> share = ShareOf(batch, rank, 4);
      EXPECT_EQ(share.size(), kBatch / 4);
      rebuilt.insert(rebuilt.end(), share.begin(), share.end());
    }
    EXPECT_EQ(rebuilt, batch);
  }
  EXPECT_EQ(seen, std::vector<int>(kSize, 1));  // One epoch: each example once.
  // Order of calls does not matter (trainers may query any step).
  EXPECT_EQ(a.GlobalBatch(3), b.GlobalBatch(3));
  EXPECT_EQ(a.GlobalBatch(1), b.GlobalBatch(1));
  EXPECT_NE(a.GlobalBatch(1), a.GlobalBatch(1 + kSize / kBatch));  // A new epoch reshuffles.
  EXPECT_FALSE(BatchSchedule::Create(kSize, kSize + 1, 9).ok());
}

TEST(TensorViewsTest, FollowsTheLayoutAndRejectsMismatches) {
  const ModelLayout layout =
      ModelLayout::Create({{"a", {3}, DType::kFloat32}, {"b", {2, 2}, DType::kFloat32}}, 16, 2)
          .value();
  std::vector<float> flat(layout.total_elements(), 0.0f);
  TensorViews<float> views = TensorViews<float>::Create(layout, absl::MakeSpan(flat)).value();
  absl::Span<float> b = views.Get("b").value();
  EXPECT_EQ(b.data(), flat.data() + layout.tensors()[1].offset);
  EXPECT_EQ(b.size(), 4u);
  EXPECT_EQ(views.Get("nope").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(views.Get("b", 5).status().code(), absl::StatusCode::kInvalidArgument);
  std::vector<float> small(layout.total_elements() - 1);
  EXPECT_FALSE(TensorViews<float>::Create(layout, absl::MakeSpan(small)).ok());
}

TEST(SpiralsTest, SameSeedSameData) {
  const Dataset a = MakeSpirals(SpiralsOptions{}, 1).value();
  const Dataset b = MakeSpirals(SpiralsOptions{}, 1).value();
  const Dataset c = MakeSpirals(SpiralsOptions{}, 2).value();
  EXPECT_EQ(a.features, b.features);
  EXPECT_EQ(a.labels, b.labels);
  EXPECT_NE(a.features, c.features);
  EXPECT_EQ(a.features.size(), static_cast<size_t>(a.size()) * a.num_features);
}

}  // namespace
}  // namespace shardopt::train
