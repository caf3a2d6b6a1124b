// CpuBackend's parts of a decided step: the reduction over trainers, the
// sum of squares in fixed 64K-element blocks (the same double whatever the
// thread count, and equal to summing the blocks in order by hand), and the
// update with a multiplier.
#include "server/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "gtest/gtest.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

// Several norm blocks and a partial last one.
constexpr size_t kSize = 3 * UpdateBackend::kNormBlockElements + 12345;

std::vector<float> Values(uint32_t seed) {
  std::vector<float> v(kSize);
  for (size_t i = 0; i < kSize; ++i) {
    v[i] = static_cast<float>(std::sin(0.001 * i + seed)) * (1.0f + 0.25f * seed);
  }
  return v;
}

double SumOfSquaresWith(int threads, float scale) {
  ThreadPool pool(threads);
  auto backend =
      CpuBackend::Create(OptimizerConfig::Sgd(0.1), 2, std::vector<float>(kSize), &pool).value();
  for (uint32_t rank = 0; rank < 2; ++rank) {
    const std::vector<float> g = Values(rank + 1);
    EXPECT_EQ(backend->Stage(rank, 0, g.data(), DType::kFloat32, kSize).value(), kSize);
    EXPECT_TRUE(backend->FinishStaging(rank).ok());
  }
  EXPECT_TRUE(backend->Reduce(/*mean=*/true).ok());
  return backend->SumOfSquares(scale).value();
}

TEST(CpuBackendTest, SumOfSquaresIsFixedBlocksInOrder) {
  const float scale = 0.25f;  // Unscaling by a power of two is exact.
  const std::vector<float> a = Values(1), b = Values(2);
  double expected = 0;
  for (size_t block = 0; block < kSize; block += UpdateBackend::kNormBlockElements) {
    double s = 0;
    for (size_t i = block; i < std::min(kSize, block + UpdateBackend::kNormBlockElements); ++i) {
      const float g = (a[i] + b[i]) / 2.0f;
      const double x = static_cast<double>(g * scale);
      s += x * x;
    }
    expected += s;
  }
  for (int threads : {1, 2, 5}) {
    const double got = SumOfSquaresWith(threads, scale);
    EXPECT_EQ(std::memcmp(&got, &expected, sizeof(double)), 0)
        << threads << " threads: " << got << " vs " << expected;
  }
}

TEST(CpuBackendTest, UpdateAppliesTheMultiplierToTheReducedGradient) {
  ThreadPool pool(2);
  std::vector<float> init(kSize, 1.0f);
  auto backend = CpuBackend::Create(OptimizerConfig::Sgd(0.5), 1, init, &pool).value();
  const std::vector<float> g = Values(3);
  ASSERT_EQ(backend->Stage(0, 0, g.data(), DType::kFloat32, kSize).value(), kSize);
  ASSERT_TRUE(backend->Reduce(true).ok());
  const float multiplier = 0.375f;
  ASSERT_TRUE(backend->Update(1, OptimizerConfig::Sgd(0.5), multiplier).ok());
  std::vector<float> got(kSize);
  ASSERT_TRUE(backend->Read(0, kSize, got.data()).ok());
  for (size_t i = 0; i < kSize; i += 997) {
    // torch: p.add_(g, alpha=-lr) with g already multiplied.
    const float want = 1.0f + (g[i] * multiplier) * -0.5f;
    ASSERT_EQ(got[i], want) << i;
  }
}

// Asynchronous application: each trainer's staged gradient is a step of its
// own (no sum, no mean), in the order the shard applies them, and range by
// range gives the bits of the whole range: a sequential optimizer fed the
// same gradients in the same order is matched exactly.
TEST(CpuBackendTest, ApplyOneRangeIsASequentialStepPerPush) {
  ThreadPool pool(2);
  const std::vector<float> init = Values(7);
  const OptimizerConfig adamw = OptimizerConfig::AdamW(0.01);
  auto backend = CpuBackend::Create(adamw, 2, init, &pool).value();
  auto reference = Optimizer::Create(adamw, kSize).value();
  std::vector<float> expected = init;
  // The shard's order: trainer 1's push, then trainer 0's, then 1's again.
  const std::pair<uint32_t, uint32_t> order[] = {{1, 11}, {0, 12}, {1, 13}};
  int64_t step = 0;
  for (const auto& [rank, seed] : order) {
    const std::vector<float> g = Values(seed);
    ASSERT_EQ(backend->Stage(rank, 0, g.data(), DType::kFloat32, kSize).value(), kSize);
    ASSERT_TRUE(backend->FinishStaging(rank).ok());
    ++step;
    // In two ranges, the second first: each element sees the same update.
    const uint64_t cut = UpdateBackend::kNormBlockElements + 5;
    ASSERT_TRUE(backend->ApplyOneRange(rank, step, adamw, cut, kSize).ok());
    ASSERT_TRUE(backend->ApplyOneRange(rank, step, adamw, 0, cut).ok());
    std::vector<float> g_copy = g;
    reference->Update(step, expected.data(), g_copy.data(), 0, kSize);
  }
  std::vector<float> got(kSize);
  ASSERT_TRUE(backend->Read(0, kSize, got.data()).ok());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), kSize * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(got.data(), init.data(), kSize * sizeof(float)), 0);
  EXPECT_EQ(backend->ApplyOneRange(2, 4, adamw, 0, kSize).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->ApplyOneRange(0, 4, adamw, 0, kSize + 1).code(),
            absl::StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace shardopt
