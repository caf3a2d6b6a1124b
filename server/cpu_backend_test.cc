// CpuBackend's parts of a decided step: the reduction over trainers, the
// sum of squares in fixed 64K-element blocks (the same double whatever the
// thread count, and equal to summing the blocks in order by hand), and the
// update with a multiplier; LAMB's parts and trust norms.
#include "server/cpu_backend.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
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

// LAMB on big tensors cut into thread-sized parts: the backend's whole-step
// update (its own norms) and the two-call step (MeasureTrust, then
// UpdateWithTrust with those norms) give the bits of the optimizer updating
// each tensor alone, whatever the thread count; a shard holding only a piece
// of a tensor refuses the whole-step calls (its norms are other shards' too).
TEST(CpuBackendTest, LambPartsGiveTheBitsOfWholeTensors) {
  const std::vector<RangeTensor> tensors = {
      {0, 200000, {200000}, 0, 0, true},
      {200000, kSize - 200000, {static_cast<int64_t>(kSize - 200000)}, 1, 0, true}};
  const OptimizerConfig lamb = OptimizerConfig::Lamb(1e-2);
  const std::vector<float> init = Values(4), g = Values(5);
  std::vector<float> want = init;
  {
    std::unique_ptr<Optimizer> opt = Optimizer::Create(lamb, kSize, tensors).value();
    std::vector<float> scaled = g;
    for (float& x : scaled) x *= 0.5f;
    for (size_t t = 0; t < tensors.size(); ++t) opt->UpdateTensor(1, want.data(), scaled.data(), t);
  }
  for (int threads : {1, 3}) {
    ThreadPool pool(threads);
    for (bool two_calls : {false, true}) {
      auto backend = CpuBackend::Create(lamb, 1, init, &pool, tensors).value();
      EXPECT_TRUE(backend->measures_trust());
      ASSERT_EQ(backend->Stage(0, 0, g.data(), DType::kFloat32, kSize).value(), kSize);
      ASSERT_TRUE(backend->Reduce(true).ok());
      if (two_calls) {
        absl::StatusOr<std::vector<TrustPartial>> partials = backend->MeasureTrust(1, lamb, 0.5f);
        ASSERT_TRUE(partials.ok()) << partials.status();
        ASSERT_EQ(partials->size(), 2u);
        std::vector<TensorNorms> norms;
        for (const TrustPartial& p : *partials) {
          EXPECT_TRUE(p.whole_tensor);
          norms.push_back({p.weight_squares.Rounded(), p.update_squares.Rounded()});
        }
        EXPECT_EQ(backend->UpdateWithTrust(1, lamb, 0.5f, {norms[0]}).code(),
                  absl::StatusCode::kInvalidArgument);  // (Too few norms: nothing changes.)
        ASSERT_TRUE(backend->UpdateWithTrust(1, lamb, 0.5f, norms).ok());
      } else {
        ASSERT_TRUE(backend->Update(1, lamb, 0.5f).ok());
      }
      std::vector<float> got(kSize);
      ASSERT_TRUE(backend->Read(0, kSize, got.data()).ok());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), kSize * sizeof(float)), 0)
          << threads << " threads, two calls " << two_calls;
    }
  }
  // Pieces that do not name their layout tensors (norms are looked up by them).
  {
    ThreadPool pool(1);
    const std::vector<RangeTensor> unnamed = {{0, 200000, {200000}}, {200000, kSize - 200000, {1}}};
    EXPECT_EQ(CpuBackend::Create(lamb, 1, init, &pool, unnamed).status().code(),
              absl::StatusCode::kInvalidArgument);
  }
  // Only a piece of tensor 0: the whole-step calls are refused.
  std::vector<RangeTensor> piece = {{0, 1024, {4096}, 0, 2048, false}};
  ThreadPool pool(1);
  auto backend = CpuBackend::Create(lamb, 1, std::vector<float>(1024, 1.0f), &pool, piece).value();
  ASSERT_EQ(backend->Stage(0, 0, g.data(), DType::kFloat32, 1024).value(), 1024u);
  EXPECT_EQ(backend->Apply(1, true, lamb).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(backend->Reduce(true).ok());
  EXPECT_EQ(backend->Update(1, lamb, 1.0f).code(), absl::StatusCode::kFailedPrecondition);
  std::vector<float> got(1024);
  ASSERT_TRUE(backend->Read(0, 1024, got.data()).ok());
  EXPECT_EQ(got, std::vector<float>(1024, 1.0f));
  EXPECT_FALSE(backend->MeasureTrust(1, lamb, 1.0f).value()[0].whole_tensor);
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
    ASSERT_TRUE(backend->ApplyOneRange(rank, step, adamw, 1.0f, cut, kSize).ok());
    ASSERT_TRUE(backend->ApplyOneRange(rank, step, adamw, 1.0f, 0, cut).ok());
    std::vector<float> g_copy = g;
    reference->Update(step, expected.data(), g_copy.data(), 0, kSize);
  }
  std::vector<float> got(kSize);
  ASSERT_TRUE(backend->Read(0, kSize, got.data()).ok());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), kSize * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(got.data(), init.data(), kSize * sizeof(float)), 0);
  EXPECT_EQ(backend->ApplyOneRange(2, 4, adamw, 1.0f, 0, kSize).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend->ApplyOneRange(0, 4, adamw, 1.0f, 0, kSize + 1).code(),
            absl::StatusCode::kOutOfRange);
}

// The refusals of elements outside the range, in the words every backend
// uses (update_backend.h), and nothing changed by them.
TEST(CpuBackendTest, RefusesElementsOutsideItsRangeSayingWhich) {
  ThreadPool pool(2);
  const std::vector<float> init = Values(9);
  const OptimizerConfig adamw = OptimizerConfig::AdamW(0.01);
  auto backend = CpuBackend::Create(adamw, 1, init, &pool).value();
  const auto message_of = [](const absl::Status& s) {
    EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
    return std::string(s.message());
  };
  std::vector<float> out(kSize + 1);
  EXPECT_EQ(
      message_of(backend->Read(kSize - 1, 2, out.data())),
      absl::StrCat("elements [", kSize - 1, ", ", kSize + 1, ") are outside the range of ", kSize));
  EXPECT_EQ(message_of(backend->ReadSlot(0, 0, kSize + 1, out.data())),
            absl::StrCat("slot elements [0, ", kSize + 1, ") are outside the range of ", kSize));
  EXPECT_EQ(message_of(backend->UpdateRange(1, adamw, 1.0, 5, 3)), "elements [5, 3) are no range");
  // An offset so large that offset + count wraps is refused too.
  EXPECT_EQ(backend->Read(~uint64_t{0}, 2, out.data()).code(), absl::StatusCode::kOutOfRange);
  std::vector<float> got(kSize);
  ASSERT_TRUE(backend->Read(0, kSize, got.data()).ok());
  EXPECT_EQ(std::memcmp(got.data(), init.data(), kSize * sizeof(float)), 0);
}

}  // namespace
}  // namespace shardopt
