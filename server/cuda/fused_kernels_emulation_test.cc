// The fused kernels' code, run on the host over a simulated grid
// (fused_kernels_emulated.h), against server/optim's CPU Optimizer: bit for
// bit, over every configuration, odd sizes, 1..256 trainers, aligned, equally
// misaligned (float4 path with a head and a tail) and differently misaligned
// (scalar path) buffers, and grids smaller than the range (grid-stride
// loops). Needs no GPU: it checks FusedOptimizerStep's host side (argument
// checks, the float4 plan, the step-dependent scalars) and the kernels'
// indexing and operation order. What only a GPU can check (its arithmetic
// is IEEE too, nvcc's code generation, memory) is fused_optimizers_test.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_format.h"
#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/cuda/fused_kernels_emulated.h"
#include "server/cuda/fused_optimizers.h"
#include "server/cuda/fused_test_util.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace gpu {
namespace {

using ::shardopt::gpu::internal::SetEmulatedGridThreads;
using ::shardopt::gpu::testing::Bf16Matches;
using ::shardopt::gpu::testing::CountBf16Mismatches;
using ::shardopt::gpu::testing::FillRandom;
using ::shardopt::gpu::testing::FromBits;
using ::shardopt::gpu::testing::NamedConfig;
using ::shardopt::gpu::testing::ParityConfigs;
using ::shardopt::gpu::testing::RandomBits;
using ::shardopt::gpu::testing::SameFloats;
using ::shardopt::gpu::testing::SpecialBits;

constexpr size_t kGuard = 16;

// n elements of T at `offset` elements past a 64-byte boundary, between
// guards of a sentinel byte pattern.
template <typename T>
class HostBuffer {
 public:
  HostBuffer(size_t n, size_t offset)
      : n_(n), offset_(offset), storage_((n + 2 * kGuard) * sizeof(T) + 64, 0xa5) {
    uintptr_t base = reinterpret_cast<uintptr_t>(storage_.data());
    base = (base + 63) / 64 * 64;
    data_ = reinterpret_cast<T*>(base) + kGuard + offset;
  }
  T* data() const { return data_; }
  std::vector<T> Get() const { return std::vector<T>(data_, data_ + n_); }
  void Set(const std::vector<T>& v) { std::memcpy(data_, v.data(), n_ * sizeof(T)); }
  void Poison() { std::memset(data_, 0xff, n_ * sizeof(T)); }
  ::testing::AssertionResult GuardsIntact() const {
    const uint8_t* first = reinterpret_cast<const uint8_t*>(data_ - kGuard - offset_);
    const uint8_t* begin = reinterpret_cast<const uint8_t*>(data_);
    const uint8_t* end = reinterpret_cast<const uint8_t*>(data_ + n_);
    const uint8_t* last = end + (kGuard - offset_) * sizeof(T);
    for (const uint8_t* p = first; p < last; ++p) {
      if (p >= begin && p < end) continue;
      if (*p != 0xa5) {
        return ::testing::AssertionFailure() << "write outside the buffer at byte " << (p - begin);
      }
    }
    return ::testing::AssertionSuccess();
  }

 private:
  size_t n_;
  size_t offset_;
  std::vector<uint8_t> storage_;
  T* data_;
};

enum class Placement { kAligned, kSameOffset, kMixedOffsets };

struct Case {
  size_t n;
  int trainers;
  Placement placement;
  size_t offset;
  bool bf16;
  GradientReduction reduction;
  size_t grid_threads;  // 0: as on an H200
};

size_t OffsetFor(const Case& c, size_t k) {
  switch (c.placement) {
    case Placement::kAligned:
      return 0;
    case Placement::kSameOffset:
      return c.offset;
    case Placement::kMixedOffsets:
      return (k * 3 + 1) % 4;
  }
  return 0;
}

void RunCase(const NamedConfig& nc, const Case& c, uint64_t seed, int64_t first_step,
             int64_t steps) {
  const OptimizerConfig& config = nc.config;
  const size_t n = c.n;
  const int T = c.trainers;
  SetEmulatedGridThreads(c.grid_threads);
  std::unique_ptr<Optimizer> cpu = *Optimizer::Create(config, n);
  const int slots = config.StateSlotsPerElement();

  std::vector<float> params(n);
  FillRandom(params, seed, false);
  std::vector<std::unique_ptr<HostBuffer<float>>> grads;
  for (int t = 0; t < T; ++t)
    grads.push_back(std::make_unique<HostBuffer<float>>(n, OffsetFor(c, t)));
  HostBuffer<float> p(n, OffsetFor(c, T));
  p.Set(params);
  std::vector<std::unique_ptr<HostBuffer<float>>> state;
  for (int k = 0; k < slots; ++k) {
    state.push_back(std::make_unique<HostBuffer<float>>(n, OffsetFor(c, T + 1 + k)));
  }
  HostBuffer<uint16_t> bf16(n, OffsetFor(c, T + 4));

  std::vector<const float*> grad_ptrs;
  for (auto& g : grads) grad_ptrs.push_back(g->data());
  FusedStepBuffers b;
  b.gradients = grad_ptrs.data();
  b.num_gradients = T;
  b.reduction = c.reduction;
  b.params = p.data();
  for (int k = 0; k < slots; ++k) b.slots[k] = state[k]->data();
  b.params_bf16 = c.bf16 ? bf16.data() : nullptr;

  const FusedStepPlan plan = *PlanFusedStep(config, first_step, n, b);
  if (c.placement != Placement::kMixedOffsets) {
    const size_t head = std::min(n, (4 - c.offset % 4) % 4);
    ASSERT_EQ(plan.vectorized, (n - head) / 4 > 0) << plan.DebugString();
    if (plan.vectorized) {
      ASSERT_EQ(plan.head, head);
    }
  } else {
    ASSERT_FALSE(plan.vectorized) << plan.DebugString();
  }

  ASSERT_TRUE(InitializeOptimizerState(config, n, b.slots).ok());
  for (int k = 0; k < slots; ++k) {
    ASSERT_TRUE(SameFloats("initial " + cpu->slot_names()[k], cpu->SlotValues(k).data(),
                           state[k]->data(), n));
  }
  if (config.kind == OptimizerKind::kSgd && slots == 1 && first_step == 1) {
    state[0]->Poison();  // step 1 must not read the momentum buffer
  }

  std::vector<std::vector<float>> g(T, std::vector<float>(n));
  std::vector<float> sum;
  for (int64_t step = first_step; step < first_step + steps; ++step) {
    for (int t = 0; t < T; ++t) {
      FillRandom(g[t], seed * 1000003 + static_cast<uint64_t>(step) * 131 + t, true);
      grads[t]->Set(g[t]);
    }
    sum = g[0];
    for (int t = 1; t < T; ++t) {
      for (size_t i = 0; i < n; ++i) sum[i] += g[t][i];
    }
    if (c.reduction == GradientReduction::kMean && T > 1) {
      const float divisor = static_cast<float>(T);
      for (size_t i = 0; i < n; ++i) sum[i] /= divisor;
    }
    cpu->Update(step, params.data(), sum.data(), 0, n);

    if (c.bf16) bf16.Poison();
    const absl::Status s = FusedOptimizerStep(config, step, n, b);
    ASSERT_TRUE(s.ok()) << s;

    SCOPED_TRACE(absl::StrFormat("step %d", step));
    ASSERT_TRUE(SameFloats("params", params.data(), p.data(), n));
    for (int k = 0; k < slots; ++k) {
      ASSERT_TRUE(SameFloats(cpu->slot_names()[k], cpu->SlotValues(k).data(), state[k]->data(), n));
    }
    if (c.bf16) {
      ASSERT_EQ(CountBf16Mismatches(params.data(), bf16.data(), n), 0u);
    }
    ASSERT_TRUE(p.GuardsIntact());
    for (auto& st : state) ASSERT_TRUE(st->GuardsIntact());
    ASSERT_TRUE(bf16.GuardsIntact());
    for (int t = 0; t < T; ++t) {
      ASSERT_TRUE(grads[t]->GuardsIntact());
      ASSERT_TRUE(SameFloats("gradient (input)", g[t].data(), grads[t]->data(), n));
    }
  }
}

class EmulatedParityTest : public ::testing::TestWithParam<NamedConfig> {
 protected:
  void TearDown() override { SetEmulatedGridThreads(0); }
};

TEST_P(EmulatedParityTest, BitIdenticalToCpuOptimizer) {
  using P = Placement;
  const GradientReduction kMean = GradientReduction::kMean;
  const std::vector<Case> cases = {
      {1, 1, P::kAligned, 0, true, kMean, 0},
      {3, 3, P::kSameOffset, 1, true, kMean, 0},
      {7, 2, P::kSameOffset, 2, true, kMean, 0},
      {4101, 3, P::kSameOffset, 1, true, GradientReduction::kSum, 256},  // one block
      {4099, 3, P::kMixedOffsets, 0, true, kMean, 768},
      {100003, 1, P::kAligned, 0, false, kMean, 0},
      {100003, 3, P::kSameOffset, 3, true, kMean, 1000},
      {65, 5, P::kSameOffset, 1, true, kMean, 256},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const Case& c = cases[i];
    SCOPED_TRACE(absl::StrFormat("n=%d T=%d placement=%d offset=%d bf16=%d grid=%d", c.n,
                                 c.trainers, static_cast<int>(c.placement), c.offset, c.bf16,
                                 c.grid_threads));
    RunCase(GetParam(), c, 11 + 7919 * i, 1, c.n > 10000 ? 12 : 40);
    if (HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, EmulatedParityTest, ::testing::ValuesIn(ParityConfigs()),
                         [](const ::testing::TestParamInfo<NamedConfig>& info) {
                           return info.param.name;
                         });

TEST(EmulatedTest, StepCountCapsAt2To24LikeTheCpu) {
  for (const NamedConfig& nc : ParityConfigs()) {
    if (nc.config.kind == OptimizerKind::kSgd) continue;
    SCOPED_TRACE(nc.name);
    RunCase(nc, {1027, 2, Placement::kAligned, 0, true, GradientReduction::kMean, 0}, 4242,
            (int64_t{1} << 24) - 3, 7);
    if (HasFailure()) return;
  }
}

TEST(EmulatedTest, MaximumTrainerCount) {
  RunCase({"adamw", OptimizerConfig::AdamW(1e-3)},
          {37, kMaxGradientBuffers, Placement::kSameOffset, 2, true, GradientReduction::kMean, 0},
          777, 1, 5);
  RunCase({"sgd", OptimizerConfig::Sgd(0.1)},
          {37, kMaxGradientBuffers, Placement::kMixedOffsets, 0, false, GradientReduction::kSum, 0},
          778, 1, 3);
}

TEST(EmulatedTest, Bf16ConversionMatchesTheReference) {
  std::vector<uint32_t> bits = SpecialBits();
  const std::vector<uint32_t> random = RandomBits(100003 - bits.size(), 99);
  bits.insert(bits.end(), random.begin(), random.end());
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * sizeof(float));
  for (auto [so, dof] : {std::pair<size_t, size_t>{0, 0}, {1, 1}, {3, 3}, {0, 1}, {2, 3}}) {
    for (size_t n : {size_t{1}, size_t{3}, size_t{37}, src.size()}) {
      SCOPED_TRACE(absl::StrFormat("src offset %d, dst offset %d, n %d", so, dof, n));
      HostBuffer<float> s(n, so);
      HostBuffer<uint16_t> d(n, dof);
      s.Set(std::vector<float>(src.begin(), src.begin() + n));
      d.Poison();
      ASSERT_TRUE(ConvertToBf16(s.data(), d.data(), n).ok());
      EXPECT_EQ(CountBf16Mismatches(s.data(), d.data(), n), 0u);
      EXPECT_TRUE(d.GuardsIntact());
    }
  }
  // The host function agrees with the kernels.
  for (uint32_t u : bits) {
    EXPECT_TRUE(Bf16Matches(FromBits(u), Fp32ToBf16Bits(FromBits(u))));
  }
}

}  // namespace
}  // namespace gpu
}  // namespace shardopt
