// The fused CUDA optimizer steps against server/optim's CPU Optimizer.
//
// Expectation: BIT-IDENTICAL parameters, state and bf16 copies after every
// checked step (see fused_optimizers.h for why that is possible: the same
// fp32 operations in the same order, each rounded once, the same host-side
// scalars). Only NaN payloads may differ (none occur with these data).
//
// This file: argument validation and access planning, the bf16 conversion
// (host and device) and the fused steps' parity with the CPU. Device
// selection and buffers: device_test.cc, in the same test binary.
//
// Runs without a GPU: argument validation and access planning (no CUDA call
// happens before those fail or decide) and the host bf16 conversion.
// Everything else skips, saying why, when SelectDevice("auto") finds no
// usable GPU (and fails instead under SHARDOPT_REQUIRE_GPU=1:
// tests/support/gpu_required.h).
//
// SHARDOPT_GPU_TEST_SMALL=1 leaves out the 1M-element cases (for
// compute-sanitizer, which is slow).
#include "server/cuda/fused_optimizers.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/cuda/device.h"
#include "server/cuda/fused_test_util.h"
#include "server/cuda/gpu_test_util.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace gpu {
namespace {

using ::shardopt::gpu::testing::Bf16Matches;
using ::shardopt::gpu::testing::Bits;
using ::shardopt::gpu::testing::CountBf16Mismatches;
using ::shardopt::gpu::testing::FillRandom;
using ::shardopt::gpu::testing::FromBits;
using ::shardopt::gpu::testing::GpuTest;
using ::shardopt::gpu::testing::NamedConfig;
using ::shardopt::gpu::testing::ParityConfigs;
using ::shardopt::gpu::testing::RandomBits;
using ::shardopt::gpu::testing::SameFloats;
using ::shardopt::gpu::testing::SpecialBits;
using ::shardopt::gpu::testing::ValueOrDie;

constexpr int64_t kSteps = 100;
constexpr size_t kGuard = 16;  // Sentinel elements around every device sub-buffer.
constexpr uint32_t kSentinelBits = 0x7fa5a5a5u;  // A NaN no kernel produces.

bool SmallOnly() {
  const char* v = std::getenv("SHARDOPT_GPU_TEST_SMALL");
  return v != nullptr && v[0] != '\0' && v[0] != '0';
}

// A device allocation of n elements of T plus guards, with the data starting
// `offset` elements after the first guard (so its address modulo 16 bytes is
// offset * sizeof(T)); the guards hold a sentinel.
template <typename T>
class GuardedBuffer {
 public:
  GuardedBuffer(size_t n, size_t offset) : n_(n), offset_(offset) {
    buf_ = ValueOrDie(DeviceBuffer::Allocate((n + 2 * kGuard) * sizeof(T)));
    std::vector<T> init(n + 2 * kGuard);
    SetSentinel(init);
    EXPECT_TRUE(buf_.Upload(init.data(), init.size() * sizeof(T)).ok());
  }
  T* data() const { return buf_.as<T>() + kGuard + offset_; }
  size_t n() const { return n_; }

  absl::Status Upload(const std::vector<T>& v) {
    return buf_.Upload(v.data(), n_ * sizeof(T), (kGuard + offset_) * sizeof(T));
  }
  absl::Status Poison() {  // Every byte 0xff: NaN for float, 0xffff for bf16.
    return buf_.Fill(0xff, n_ * sizeof(T), (kGuard + offset_) * sizeof(T));
  }
  // The data, and whether the guards still hold the sentinel.
  ::testing::AssertionResult Download(std::vector<T>* out) const {
    std::vector<T> all(n_ + 2 * kGuard);
    const absl::Status s = buf_.Download(all.data(), all.size() * sizeof(T));
    if (!s.ok()) return ::testing::AssertionFailure() << s;
    std::vector<T> sentinel(all.size());
    SetSentinel(sentinel);
    for (size_t i = 0; i < all.size(); ++i) {
      if (i >= kGuard + offset_ && i < kGuard + offset_ + n_) continue;
      if (std::memcmp(&all[i], &sentinel[i], sizeof(T)) != 0) {
        return ::testing::AssertionFailure()
               << "write outside the buffer: guard element " << i << " of " << all.size()
               << " (data at " << kGuard + offset_ << ".." << kGuard + offset_ + n_ << ")";
      }
    }
    out->assign(all.begin() + kGuard + offset_, all.begin() + kGuard + offset_ + n_);
    return ::testing::AssertionSuccess();
  }

 private:
  static void SetSentinel(std::vector<T>& v) {
    for (T& x : v) {
      if constexpr (sizeof(T) == 4) {
        std::memcpy(&x, &kSentinelBits, 4);
      } else {
        const uint16_t s = 0x7fa5;
        std::memcpy(&x, &s, 2);
      }
    }
  }

  DeviceBuffer buf_;
  size_t n_;
  size_t offset_;
};

// ---------------------------------------------------------------------------
// Argument validation and planning: no GPU needed (no CUDA call is made).

float* FakeDevicePointer(uintptr_t address) { return reinterpret_cast<float*>(address); }

struct FakeBuffers {
  std::vector<const float*> grads;
  FusedStepBuffers b;
  explicit FakeBuffers(int trainers, uintptr_t byte_offset = 0) {
    for (int t = 0; t < trainers; ++t)
      grads.push_back(FakeDevicePointer(0x100000 * (t + 1) + byte_offset));
    b.gradients = grads.data();
    b.num_gradients = trainers;
    b.params = FakeDevicePointer(0x10000000 + byte_offset);
    b.slots = {FakeDevicePointer(0x20000000 + byte_offset),
               FakeDevicePointer(0x30000000 + byte_offset),
               FakeDevicePointer(0x40000000 + byte_offset)};
  }
};

TEST(FusedStepPlanTest, AlignedBuffersTakeTheVectorPath) {
  FakeBuffers f(3);
  const FusedStepPlan plan = ValueOrDie(PlanFusedStep(OptimizerConfig::AdamW(), 1, 1000003, f.b));
  EXPECT_TRUE(plan.vectorized) << plan.DebugString();
  EXPECT_EQ(plan.head, 0u);
  EXPECT_EQ(plan.vector_groups, 250000u);
  EXPECT_EQ(plan.tail, 3u);
  EXPECT_EQ(plan.state_slots, 2);
}

TEST(FusedStepPlanTest, SameMisalignmentPeelsAHead) {
  for (uintptr_t off : {4u, 8u, 12u}) {
    FakeBuffers f(2, off);
    uint16_t* bf16 = reinterpret_cast<uint16_t*>(0x50000000 + off / 2);
    f.b.params_bf16 = bf16;
    const FusedStepPlan plan = ValueOrDie(PlanFusedStep(OptimizerConfig::Adam(), 7, 101, f.b));
    const size_t head = (16 - off) / 4;
    EXPECT_TRUE(plan.vectorized) << off << ": " << plan.DebugString();
    EXPECT_EQ(plan.head, head);
    EXPECT_EQ(plan.vector_groups, (101 - head) / 4);
    EXPECT_EQ(plan.head + 4 * plan.vector_groups + plan.tail, 101u);
  }
}

TEST(FusedStepPlanTest, DifferentMisalignmentsFallBackToScalar) {
  FakeBuffers f(3);
  f.b.slots[1] = FakeDevicePointer(0x30000004);
  FusedStepPlan plan = ValueOrDie(PlanFusedStep(OptimizerConfig::AdamW(), 1, 4099, f.b));
  EXPECT_FALSE(plan.vectorized);
  EXPECT_EQ(plan.tail, 4099u);

  // An unused slot does not matter (AdamW without amsgrad uses 2).
  FakeBuffers g(1);
  g.b.slots[2] = FakeDevicePointer(0x40000004);
  EXPECT_TRUE(ValueOrDie(PlanFusedStep(OptimizerConfig::AdamW(), 1, 4099, g.b)).vectorized);

  // A gradient at another offset.
  FakeBuffers h(3);
  h.grads[2] = FakeDevicePointer(0x300008);
  EXPECT_FALSE(ValueOrDie(PlanFusedStep(OptimizerConfig::Sgd(0.1), 1, 4099, h.b)).vectorized);

  // bf16 not 8-byte aligned where the floats are 16-byte aligned.
  FakeBuffers k(1);
  k.b.params_bf16 = reinterpret_cast<uint16_t*>(0x50000002);
  EXPECT_FALSE(ValueOrDie(PlanFusedStep(OptimizerConfig::Sgd(0.1), 1, 4099, k.b)).vectorized);

  // Too short for one float4 group.
  FakeBuffers s(1);
  EXPECT_FALSE(ValueOrDie(PlanFusedStep(OptimizerConfig::Sgd(0.1), 1, 3, s.b)).vectorized);
}

TEST(FusedStepValidationTest, RejectsBadArgumentsBeforeTouchingTheDevice) {
  const OptimizerConfig adam = OptimizerConfig::Adam();
  auto expect_invalid = [&](const OptimizerConfig& c, int64_t step, size_t n,
                            const FusedStepBuffers& b, const std::string& why) {
    const absl::Status plan = PlanFusedStep(c, step, n, b).status();
    EXPECT_EQ(plan.code(), absl::StatusCode::kInvalidArgument) << why << ": " << plan;
    const absl::Status run = FusedOptimizerStep(c, step, n, b);
    EXPECT_EQ(run.code(), absl::StatusCode::kInvalidArgument) << why << ": " << run;
  };
  {
    FakeBuffers f(1);
    expect_invalid(adam, 0, 10, f.b, "step 0");
  }
  {
    FakeBuffers f(1);
    f.b.num_gradients = 0;
    expect_invalid(adam, 1, 10, f.b, "no gradients");
  }
  {
    std::vector<const float*> many(kMaxGradientBuffers + 1, FakeDevicePointer(0x1000));
    FakeBuffers f(1);
    f.b.gradients = many.data();
    f.b.num_gradients = kMaxGradientBuffers + 1;
    expect_invalid(adam, 1, 10, f.b, "too many gradients");
  }
  {
    FakeBuffers f(1);
    f.b.gradients = nullptr;
    expect_invalid(adam, 1, 10, f.b, "null gradient array");
  }
  {
    FakeBuffers f(3);
    f.grads[1] = nullptr;
    expect_invalid(adam, 1, 10, f.b, "null gradient");
  }
  {
    FakeBuffers f(1);
    f.b.params = nullptr;
    expect_invalid(adam, 1, 10, f.b, "null params");
  }
  {
    FakeBuffers f(1);
    f.b.slots[1] = nullptr;
    expect_invalid(adam, 1, 10, f.b, "missing exp_avg_sq");
  }
  {
    OptimizerConfig amsgrad = adam;
    amsgrad.amsgrad = true;
    FakeBuffers f(1);
    f.b.slots[2] = nullptr;
    expect_invalid(amsgrad, 1, 10, f.b, "missing max_exp_avg_sq");
  }
  {
    OptimizerConfig momentum = OptimizerConfig::Sgd(0.1);
    momentum.momentum = 0.9;
    FakeBuffers f(1);
    f.b.slots[0] = nullptr;
    expect_invalid(momentum, 1, 10, f.b, "missing momentum_buffer");
  }
  {
    FakeBuffers f(1);
    f.b.params = FakeDevicePointer(0x10000002);
    expect_invalid(adam, 1, 10, f.b, "misaligned params");
  }
  {
    FakeBuffers f(1);
    f.b.params_bf16 = reinterpret_cast<uint16_t*>(0x50000001);
    expect_invalid(adam, 1, 10, f.b, "misaligned bf16");
  }
  {
    OptimizerConfig bad = adam;
    bad.lr = -1.0;
    FakeBuffers f(1);
    expect_invalid(bad, 1, 10, f.b, "negative lr");
  }
  {
    OptimizerConfig bad = OptimizerConfig::Sgd(0.1);
    bad.nesterov = true;  // needs momentum > 0 and dampening 0
    FakeBuffers f(1);
    expect_invalid(bad, 1, 10, f.b, "nesterov without momentum");
  }
}

TEST(FusedStepValidationTest, SgdWithoutMomentumNeedsNoSlotsAndEmptyRangesLaunchNothing) {
  FakeBuffers f(2);
  f.b.slots = {nullptr, nullptr, nullptr};
  EXPECT_EQ(ValueOrDie(PlanFusedStep(OptimizerConfig::Sgd(0.1), 1, 10, f.b)).state_slots, 0);
  // n == 0: nothing is touched, so null buffers are fine and no GPU is needed.
  FusedStepBuffers empty;
  const float* none[1] = {nullptr};
  empty.gradients = none;
  empty.num_gradients = 1;
  EXPECT_TRUE(FusedOptimizerStep(OptimizerConfig::AdamW(), 1, 0, empty).ok());
}

// ---------------------------------------------------------------------------
// bf16 conversion on the host (no GPU needed).

TEST(Bf16Test, HostConversionRoundsToNearestEvenAndKeepsNaN) {
  std::vector<uint32_t> all = SpecialBits();
  const std::vector<uint32_t> random = RandomBits(1 << 20, 17);
  all.insert(all.end(), random.begin(), random.end());
  size_t failures = 0;
  for (uint32_t u : all) {
    const float x = FromBits(u);
    const ::testing::AssertionResult r = Bf16Matches(x, Fp32ToBf16Bits(x));
    if (!r && failures++ < 10) ADD_FAILURE() << r.message();
  }
  EXPECT_EQ(failures, 0u);
  EXPECT_EQ(Fp32ToBf16Bits(FromBits(0x7f7fffffu)), 0x7f80u);  // FLT_MAX rounds to inf
  EXPECT_EQ(Fp32ToBf16Bits(FromBits(0x7f800001u)), 0x7fc0u);  // signalling NaN stays NaN
  EXPECT_EQ(Fp32ToBf16Bits(1.0f + 1.0f / 256), 0x3f80u);      // tie, even below
  EXPECT_EQ(Fp32ToBf16Bits(1.0f + 3.0f / 256), 0x3f82u);      // tie, even above
}

TEST_F(GpuTest, DeviceBf16ConversionMatchesTheReference) {
  std::vector<uint32_t> bits = SpecialBits();
  const std::vector<uint32_t> random = RandomBits(1000003 - bits.size(), 99);
  bits.insert(bits.end(), random.begin(), random.end());
  std::vector<float> src(bits.size());
  std::memcpy(src.data(), bits.data(), bits.size() * sizeof(float));
  // (src offset, dst offset): vector path with and without a head; scalar.
  for (auto [so, dof] : {std::pair<size_t, size_t>{0, 0}, {1, 1}, {3, 3}, {0, 1}, {2, 3}}) {
    SCOPED_TRACE(absl::StrCat("src offset ", so, ", dst offset ", dof));
    for (size_t n : {size_t{1}, size_t{3}, size_t{37}, src.size()}) {
      std::vector<float> part(src.begin(), src.begin() + n);
      GuardedBuffer<float> d_src(n, so);
      GuardedBuffer<uint16_t> d_dst(n, dof);
      ASSERT_OK(d_src.Upload(part));
      ASSERT_OK(d_dst.Poison());
      ASSERT_OK(ConvertToBf16(d_src.data(), d_dst.data(), n));
      ASSERT_OK(SynchronizeStream());
      std::vector<uint16_t> got;
      ASSERT_TRUE(d_dst.Download(&got));
      size_t failures = 0;
      for (size_t i = 0; i < n; ++i) {
        const ::testing::AssertionResult r = Bf16Matches(part[i], got[i]);
        if (!r && failures++ < 5) ADD_FAILURE() << "element " << i << ": " << r.message();
      }
      EXPECT_EQ(failures, 0u) << "n = " << n;
    }
  }
}

// ---------------------------------------------------------------------------
// Fused steps vs the CPU Optimizer.

enum class Placement { kAligned, kSameOffset, kMixedOffsets };

struct ParityCase {
  size_t n;
  int trainers;
  Placement placement;
  size_t offset;  // kSameOffset: elements past 16-byte alignment
  bool bf16;
  GradientReduction reduction;
  bool own_stream;
};

std::vector<ParityCase> ParityCases() {
  using P = Placement;
  const GradientReduction kMean = GradientReduction::kMean;
  std::vector<ParityCase> cases = {
      {1, 1, P::kAligned, 0, true, kMean, false},                         // scalar (too short)
      {3, 3, P::kSameOffset, 1, true, kMean, true},                       // scalar (too short)
      {7, 2, P::kSameOffset, 2, true, kMean, false},                      // head 2, 1 group, tail 1
      {4101, 3, P::kSameOffset, 1, true, GradientReduction::kSum, true},  // head 3, tail 2
      {4099, 3, P::kMixedOffsets, 0, true, kMean, false},                 // scalar: offsets differ
      {1000003, 1, P::kAligned, 0, false, kMean, false},                  // the common case, tail 3
      {1000003, 3, P::kSameOffset, 3, true, kMean, true},                 // head 1, tail 2
  };
  if (SmallOnly()) {
    cases.erase(std::remove_if(cases.begin(), cases.end(),
                               [](const ParityCase& c) { return c.n > 100000; }),
                cases.end());
  }
  return cases;
}

// Element offsets for buffer k (0..T-1 gradients, then params, slots, bf16).
size_t OffsetFor(const ParityCase& c, size_t k) {
  switch (c.placement) {
    case Placement::kAligned:
      return 0;
    case Placement::kSameOffset:
      return c.offset;  // bf16 too: then bf16 + head elements is 8-byte aligned
    case Placement::kMixedOffsets:
      return (k * 3 + 1) % 4;
  }
  return 0;
}

// One case: kSteps steps on the CPU and the GPU from the same start with the
// same gradients, compared bit for bit after steps 1, 2, 3, kSteps / 2 and
// kSteps. `first_step` > 1 starts the step count there (the 2^24 cap test).
void RunParity(const NamedConfig& nc, const ParityCase& c, uint64_t seed, int64_t first_step = 1,
               int64_t steps = kSteps) {
  const OptimizerConfig& config = nc.config;
  const size_t n = c.n;
  const int T = c.trainers;
  std::unique_ptr<Optimizer> cpu = ValueOrDie(Optimizer::Create(config, n));
  const int slots = config.StateSlotsPerElement();
  ASSERT_EQ(static_cast<size_t>(slots), cpu->slot_names().size());

  std::vector<float> params(n);
  FillRandom(params, seed, /*gradient=*/false);

  // Device buffers.
  std::vector<std::unique_ptr<GuardedBuffer<float>>> d_grads;
  for (int t = 0; t < T; ++t) {
    d_grads.push_back(std::make_unique<GuardedBuffer<float>>(n, OffsetFor(c, t)));
  }
  GuardedBuffer<float> d_params(n, OffsetFor(c, T));
  std::vector<std::unique_ptr<GuardedBuffer<float>>> d_slots;
  for (int k = 0; k < slots; ++k) {
    d_slots.push_back(std::make_unique<GuardedBuffer<float>>(n, OffsetFor(c, T + 1 + k)));
  }
  std::unique_ptr<GuardedBuffer<uint16_t>> d_bf16;
  if (c.bf16) d_bf16 = std::make_unique<GuardedBuffer<uint16_t>>(n, OffsetFor(c, T + 4));
  ASSERT_OK(d_params.Upload(params));

  std::vector<const float*> grad_ptrs;
  for (auto& g : d_grads) grad_ptrs.push_back(g->data());
  FusedStepBuffers b;
  b.gradients = grad_ptrs.data();
  b.num_gradients = T;
  b.reduction = c.reduction;
  b.params = d_params.data();
  for (int k = 0; k < slots; ++k) b.slots[k] = d_slots[k]->data();
  b.params_bf16 = c.bf16 ? d_bf16->data() : nullptr;

  // The plan must be the one the case is meant to exercise.
  const FusedStepPlan plan = ValueOrDie(PlanFusedStep(config, first_step, n, b));
  {
    bool want_vec = false;
    size_t want_head = 0;
    if (c.placement != Placement::kMixedOffsets) {
      want_head = std::min(n, (4 - c.offset % 4) % 4);
      want_vec = (n - want_head) / 4 > 0;
    }
    EXPECT_EQ(plan.vectorized, want_vec) << plan.DebugString();
    if (want_vec) {
      EXPECT_EQ(plan.head, want_head) << plan.DebugString();
    }
  }

  std::unique_ptr<Stream> stream;
  if (c.own_stream) stream = std::make_unique<Stream>(ValueOrDie(Stream::Create()));
  void* s = stream ? stream->get() : nullptr;

  ASSERT_OK(InitializeOptimizerState(config, n, b.slots, s));
  // SGD's first step must not read the momentum buffer (PyTorch clones g).
  if (config.kind == OptimizerKind::kSgd && slots == 1 && first_step == 1) {
    ASSERT_OK(SynchronizeStream(s));
    ASSERT_OK(d_slots[0]->Poison());
  }

  std::vector<std::vector<float>> grads(T, std::vector<float>(n));
  std::vector<float> sum(n);
  for (int64_t step = first_step; step < first_step + steps; ++step) {
    for (int t = 0; t < T; ++t) {
      FillRandom(grads[t], seed * 1000003 + static_cast<uint64_t>(step) * 131 + t, true);
      ASSERT_OK(d_grads[t]->Upload(grads[t]));
    }
    // CPU: ModelShard::ApplyStep's reduction, then Optimizer::Update.
    sum = grads[0];
    for (int t = 1; t < T; ++t) {
      const float* other = grads[t].data();
      for (size_t i = 0; i < n; ++i) sum[i] += other[i];
    }
    if (c.reduction == GradientReduction::kMean && T > 1) {
      const float divisor = static_cast<float>(T);
      for (size_t i = 0; i < n; ++i) sum[i] /= divisor;
    }
    cpu->Update(step, params.data(), sum.data(), 0, n);

    // GPU.
    if (c.bf16) {
      ASSERT_OK(SynchronizeStream(s));
      ASSERT_OK(d_bf16->Poison());
    }
    ASSERT_OK(FusedOptimizerStep(config, step, n, b, s));
    ASSERT_OK(SynchronizeStream(s));

    const int64_t k = step - first_step + 1;
    if (!(k <= 3 || k == steps / 2 || k == steps)) continue;
    SCOPED_TRACE(absl::StrCat("step ", step));
    std::vector<float> got;
    ASSERT_TRUE(d_params.Download(&got));
    ASSERT_TRUE(SameFloats("params", params.data(), got.data(), n));
    for (int j = 0; j < slots; ++j) {
      ASSERT_TRUE(d_slots[j]->Download(&got));
      ASSERT_TRUE(SameFloats(cpu->slot_names()[j], cpu->SlotValues(j).data(), got.data(), n));
    }
    for (auto& g : d_grads) {
      std::vector<float> unchanged;
      ASSERT_TRUE(g->Download(&unchanged));  // guards only: gradients are inputs
    }
    if (c.bf16) {
      std::vector<uint16_t> got16;
      ASSERT_TRUE(d_bf16->Download(&got16));
      ASSERT_EQ(CountBf16Mismatches(params.data(), got16.data(), n), 0u);
    }
  }
}

class FusedParityTest : public GpuTest, public ::testing::WithParamInterface<NamedConfig> {};

TEST_P(FusedParityTest, BitIdenticalToCpuOptimizer) {
  const std::vector<ParityCase> cases = ParityCases();
  for (size_t i = 0; i < cases.size(); ++i) {
    const ParityCase& c = cases[i];
    SCOPED_TRACE(absl::StrFormat("%s n=%d T=%d placement=%d offset=%d bf16=%d %s", GetParam().name,
                                 c.n, c.trainers, static_cast<int>(c.placement), c.offset, c.bf16,
                                 c.reduction == GradientReduction::kMean ? "mean" : "sum"));
    RunParity(GetParam(), c, 1 + 7919 * i + std::hash<std::string>()(GetParam().name) % 100000);
    if (HasFatalFailure() || HasFailure()) return;
  }
}

INSTANTIATE_TEST_SUITE_P(AllFamilies, FusedParityTest, ::testing::ValuesIn(ParityConfigs()),
                         [](const ::testing::TestParamInfo<NamedConfig>& info) {
                           return info.param.name;
                         });

TEST_F(GpuTest, StepCountCapsAt2To24LikeTheCpu) {
  for (const NamedConfig& nc : ParityConfigs()) {
    if (nc.config.kind == OptimizerKind::kSgd) continue;  // no step-dependent scalars
    SCOPED_TRACE(nc.name);
    const ParityCase c{1027, 2, Placement::kAligned, 0, true, GradientReduction::kMean, false};
    RunParity(nc, c, 4242, (int64_t{1} << 24) - 3, 7);
    if (HasFailure()) return;
  }
}

TEST_F(GpuTest, MaximumTrainerCount) {
  const NamedConfig nc{"adamw", OptimizerConfig::AdamW(1e-3)};
  const ParityCase c{
      37, kMaxGradientBuffers, Placement::kSameOffset, 2, true, GradientReduction::kMean, false};
  RunParity(nc, c, 777, 1, 5);
}

}  // namespace
}  // namespace gpu
}  // namespace shardopt
