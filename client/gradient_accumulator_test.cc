#include "client/gradient_accumulator.h"

#include <vector>

#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(GradientAccumulatorTest, WeightedMeanEqualsTheFullBatchGradient) {
  // Per-sample gradients of a loss that is a mean over samples: the step's
  // gradient is the mean over all samples, whatever the micro-batching.
  const std::vector<std::vector<float>> per_sample = {
      {1.0f, -2.0f}, {3.0f, 0.5f}, {-1.0f, 4.0f}, {0.25f, 1.0f}, {2.0f, 2.0f}};
  std::vector<float> full(2, 0.0f);
  for (const auto& g : per_sample) {
    for (int j = 0; j < 2; ++j) full[j] += g[j] / 5.0f;
  }
  GradientAccumulator acc(2);
  // Micro-batches of 2 and 3 samples, each pushing its own mean gradient.
  std::vector<float> a = {(1.0f + 3.0f) / 2, (-2.0f + 0.5f) / 2};
  std::vector<float> b = {(-1.0f + 0.25f + 2.0f) / 3, (4.0f + 1.0f + 2.0f) / 3};
  ASSERT_TRUE(acc.Add(a, 2).ok());
  ASSERT_TRUE(acc.Add(b, 3).ok());
  EXPECT_EQ(acc.samples(), 5u);
  EXPECT_EQ(acc.micro_batches(), 2);
  std::vector<float> mean(2);
  ASSERT_TRUE(acc.Mean(absl::MakeSpan(mean)).ok());
  EXPECT_NEAR(mean[0], full[0], 1e-6f);
  EXPECT_NEAR(mean[1], full[1], 1e-6f);
  // It starts over.
  EXPECT_EQ(acc.micro_batches(), 0);
  EXPECT_EQ(acc.Mean(absl::MakeSpan(mean)).code(), absl::StatusCode::kFailedPrecondition);
}

TEST(GradientAccumulatorTest, EqualMicroBatchesGiveThePlainMeanExactly) {
  // Values whose weighted sums would round differently: (3a + 3b) / 6 is
  // not always (a + b) / 2 in fp32.
  std::vector<float> a(1000), b(1000);
  for (int i = 0; i < 1000; ++i) {
    a[i] = 0.1f * static_cast<float>(i) + 0.013f;
    b[i] = -0.07f * static_cast<float>(i) + 0.5f;
  }
  GradientAccumulator acc(1000);
  ASSERT_TRUE(acc.Add(a, 3).ok());
  ASSERT_TRUE(acc.Add(b, 3).ok());
  std::vector<float> mean(1000);
  ASSERT_TRUE(acc.Mean(absl::MakeSpan(mean)).ok());
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(mean[i], (a[i] + b[i]) / 2.0f) << i;
}

TEST(GradientAccumulatorTest, BadInput) {
  GradientAccumulator acc(2);
  EXPECT_EQ(acc.Add(std::vector<float>{1.0f}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(acc.Add(std::vector<float>{1.0f, 2.0f}, 0).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(acc.Add(std::vector<float>{1.0f, 2.0f}).ok());
  std::vector<float> wrong(3);
  EXPECT_EQ(acc.Mean(absl::MakeSpan(wrong)).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace shardopt
