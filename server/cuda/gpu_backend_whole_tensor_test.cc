// LAMB and Adafactor on the GPU backend against the CPU backend through
// ModelShard, bit for bit. LAMB: tensors whole on one shard (with clipping, the Update path, and
// without; maximize, no bias correction, a binding lower clamp and a tensor
// of zeros; bf16 pulls from step 2 on, whose copy each LAMB step must
// refresh), and the flat partition over three shards, where each shard's
// trust partials must be the CPU's exactly and the norms gathered from all
// of them update every piece. Adafactor: matrices, a batch of them, a
// vector and a scalar, with and without clipping, maximize and weight
// decay, bf16 pulls; its packed factors read as a checkpoint reads them and
// a write of a value where they store nothing refused in the CPU's words.
// Parameters and both slots compared. Skips, with the reason, where no
// usable GPU exists.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <vector>

#include "common/layout.h"
#include "common/step_protocol.h"
#include "gtest/gtest.h"
#include "server/cpu_backend.h"
#include "server/cuda/gpu_backend.h"
#include "server/cuda/gpu_backend_test_fixture.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

using testing::PushInChunks;
using testing::RandomGradient;
using testing::ZeroPadding;

absl::Time Soon() { return absl::Now() + absl::Seconds(30); }

// One job per (optimizer, max_grad_norm) on a whole-tensor layout of one
// shard and 2 trainers, 6 steps on both backends: the same fp32 parameters
// every step, the same bf16 pulls from step 2 on (the first makes the bf16
// copy, each later step must refresh it), the same two slots at the end.
struct WholeTensorJob {
  OptimizerConfig optimizer;
  double max_grad_norm;
};

class GpuWholeTensorTest : public GpuBackendTest {
 protected:
  void RunJobs(const ModelLayout& layout, const std::vector<float>& init,
               const std::vector<WholeTensorJob>& jobs, size_t chunk) {
    for (const WholeTensorJob& job : jobs) {
      SCOPED_TRACE(job.optimizer.DebugString() + (job.max_grad_norm > 0 ? " clipped" : ""));
      ModelShardOptions options{"m", layout, 0, job.optimizer, 2, true};
      options.max_grad_norm = job.max_grad_norm;
      std::unique_ptr<ModelShard> cpu = MakeShard(options, init, false);
      std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
      ASSERT_EQ(gpu->device(), "cuda:" + std::to_string(gpu_index_));
      for (int64_t step = 1; step <= 6; ++step) {
        for (ModelShard* shard : {cpu.get(), gpu.get()}) {
          for (uint32_t rank = 0; rank < 2; ++rank) {
            std::vector<float> g = RandomGradient(rank, step, shard->size());
            ZeroPadding(layout, 0, &g);
            ASSERT_TRUE(PushInChunks(*shard, rank, step, g, chunk).ok());
          }
          if (shard->options().needs_decision()) {
            absl::StatusOr<StepStats> stats = shard->WaitForStepStats(step, Soon(), nullptr);
            ASSERT_TRUE(stats.ok()) << stats.status();
            ASSERT_TRUE(shard->Decide(step, DecideStep({*stats}, job.max_grad_norm)).ok());
          }
        }
        ExpectSameParameters(*cpu, *gpu, step);
        if (step >= 2) ExpectSameParameters(*cpu, *gpu, step, DType::kBFloat16);
      }
      ExpectSameSlots(*cpu, *gpu, 6, {0, 1});
    }
  }
};

TEST_F(GpuWholeTensorTest, LambOnWholeTensorsMatchesTheCpuBitForBit) {
  // Sizes not multiples of 8 or 64; one tensor larger than a pinned buffer.
  const ModelLayout layout =
      ModelLayout::Create({{"a", {37, 11}}, {"b", {(1 << 20) + 77}}, {"c", {63}}, {"d", {1}}}, 16,
                          1, Partition::kWholeTensors)
          .value();
  OptimizerConfig decayed = OptimizerConfig::Lamb(1e-2);
  decayed.weight_decay = 0.01;
  decayed.max_trust_ratio = 2.0;
  OptimizerConfig unusual = OptimizerConfig::Lamb(3e-3);
  unusual.maximize = true;
  unusual.bias_correction = false;
  unusual.min_trust_ratio = 0.5;
  unusual.beta1 = 0.8;
  unusual.eps = 1e-4;
  std::vector<float> init(layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * std::sin(0.37f * i);
  // Tensor 'c' all zeros: ||p|| = 0, trust ratio 1.
  const TensorPlacement& zeros = layout.tensors()[2];
  std::fill(init.begin() + zeros.offset, init.begin() + zeros.offset + zeros.size, 0.0f);
  ZeroPadding(layout, 0, &init);
  RunJobs(layout, init, {{decayed, 0.0}, {decayed, 5.0}, {unusual, 0.0}}, 300001);
}

TEST_F(GpuBackendTest, LambOnTheFlatPartitionGathersTheCpusPartials) {
  constexpr uint32_t kShards = 3;
  // Tensors straddle the shards' ranges.
  const ModelLayout layout =
      ModelLayout::Create({{"w", {37, 19}}, {"v", {300}}, {"b", {5}}}, 64, kShards).value();
  ASSERT_TRUE(StepsNeedTrustNorms(OptimizerKind::kLamb, layout));
  OptimizerConfig lamb = OptimizerConfig::Lamb(1e-2);
  lamb.weight_decay = 0.01;
  constexpr uint32_t kTrainers = 2;
  std::vector<std::unique_ptr<ModelShard>> cpu, gpu;
  for (uint32_t s = 0; s < kShards; ++s) {
    ModelShardOptions options{"m", layout, s, lamb, kTrainers, true};
    options.max_grad_norm = 1.0;
    std::vector<float> init(layout.ShardSize(s));
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.05f * std::cos(0.11f * i + s);
    ZeroPadding(layout, s, &init);
    cpu.push_back(MakeShard(options, init, false));
    gpu.push_back(MakeShard(options, init, true));
    ASSERT_EQ(gpu.back()->device(), "cuda:" + std::to_string(gpu_index_));
  }
  for (int64_t step = 1; step <= 4; ++step) {
    std::vector<StepStats> stats;
    for (uint32_t s = 0; s < kShards; ++s) {
      for (uint32_t rank = 0; rank < kTrainers; ++rank) {
        std::vector<float> g = RandomGradient(rank, step, layout.ShardSize(s));
        ZeroPadding(layout, s, &g);
        for (ModelShard* shard : {cpu[s].get(), gpu[s].get()}) {
          ASSERT_TRUE(PushInChunks(*shard, rank, step, g, 97).ok());
        }
      }
      absl::StatusOr<StepStats> got = cpu[s]->WaitForStepStats(step, Soon(), nullptr);
      ASSERT_TRUE(got.ok()) << got.status();
      stats.push_back(*got);
    }
    StepDecision decision = DecideStep(stats, 1.0);
    std::vector<StepStats> partials;
    for (uint32_t s = 0; s < kShards; ++s) {
      absl::StatusOr<StepStats> want =
          cpu[s]->WaitForStepStats(step, Soon(), nullptr, std::nullopt, &decision);
      absl::StatusOr<StepStats> got =
          gpu[s]->WaitForStepStats(step, Soon(), nullptr, std::nullopt, &decision);
      ASSERT_TRUE(want.ok() && got.ok()) << want.status() << " / " << got.status();
      ASSERT_EQ(want->trust_partials.size(), got->trust_partials.size()) << "shard " << s;
      for (size_t i = 0; i < got->trust_partials.size(); ++i) {
        EXPECT_EQ(want->trust_partials[i].tensor_index, got->trust_partials[i].tensor_index);
        EXPECT_EQ(want->trust_partials[i].whole_tensor, got->trust_partials[i].whole_tensor);
        EXPECT_TRUE(want->trust_partials[i].weight_squares == got->trust_partials[i].weight_squares)
            << "shard " << s << " piece " << i << " at step " << step;
        EXPECT_TRUE(want->trust_partials[i].update_squares == got->trust_partials[i].update_squares)
            << "shard " << s << " piece " << i << " at step " << step;
      }
      partials.push_back(*got);
    }
    absl::StatusOr<std::vector<TensorNorms>> norms = CombineTrustPartials(partials, layout);
    ASSERT_TRUE(norms.ok()) << norms.status();
    decision.tensor_norms = *norms;
    for (uint32_t s = 0; s < kShards; ++s) {
      ASSERT_TRUE(cpu[s]->Decide(step, decision, true, Soon()).ok());
      ASSERT_TRUE(gpu[s]->Decide(step, decision, true, Soon()).ok());
      ExpectSameParameters(*cpu[s], *gpu[s], step);
    }
  }
  for (uint32_t s = 0; s < kShards; ++s) ExpectSameSlots(*cpu[s], *gpu[s], 4, {0, 1});
}

TEST_F(GpuWholeTensorTest, AdafactorMatchesTheCpuBitForBit) {
  const ModelLayout layout = ModelLayout::Create({{"w", {37, 11}},
                                                  {"wide", {3, 2500}},
                                                  {"batch", {2, 3, 7}},
                                                  {"batch_wide", {2, 5, 300}},
                                                  {"v", {1000}},
                                                  {"s", {}},
                                                  {"none", {3, 0}},
                                                  {"rows", {300, 2100}},
                                                  {"long", {70001}}},
                                                 16, 1, Partition::kWholeTensors)
                                 .value();
  OptimizerConfig unusual = OptimizerConfig::Adafactor(5e-2);
  unusual.weight_decay = 0.1;
  unusual.maximize = true;
  unusual.eps1 = 1e-20;
  std::vector<float> init(layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.1f * std::cos(0.29f * i);
  ZeroPadding(layout, 0, &init);
  RunJobs(layout, init,
          {{OptimizerConfig::Adafactor(1e-2), 0.0},
           {OptimizerConfig::Adafactor(1e-2), 5.0},
           {unusual, 0.0}},
          4099);
}

TEST_F(GpuBackendTest, AdafactorRefusesStateWhereItStoresNothingAsTheCpuDoes) {
  const ModelLayout layout =
      ModelLayout::Create({{"w", {8, 4}}}, 16, 1, Partition::kWholeTensors).value();
  const std::vector<RangeTensor> tensors = WholeTensorsOfShard(layout, 0).value();
  const OptimizerConfig config = OptimizerConfig::Adafactor();
  const std::vector<float> init(layout.ShardSize(0), 0.5f);
  ThreadPool pool(1);
  std::unique_ptr<CpuBackend> cpu = CpuBackend::Create(config, 1, init, &pool, tensors).value();
  std::unique_ptr<GpuBackend> gpu =
      GpuBackend::Create(gpu_index_, config, 1, init, tensors).value();
  // row_var stores 8 factors at the start of the tensor: element 8 is not one.
  std::vector<float> state(init.size(), 0.0f);
  for (int i = 0; i < 8; ++i) state[i] = 0.25f * (i + 1);
  state[8] = 1.0f;
  const absl::Status want = cpu->WriteSlot(0, 0, state.size(), state.data());
  const absl::Status got = gpu->WriteSlot(0, 0, state.size(), state.data());
  EXPECT_EQ(want.code(), absl::StatusCode::kInvalidArgument) << want;
  EXPECT_EQ(got, want);
  // The same bytes of state as the CPU's (only the factors), and no ranges.
  EXPECT_EQ(gpu->optimizer_state_bytes(), cpu->optimizer_state_bytes());
  EXPECT_EQ(gpu->ApplyRange(1, true, config, 0, 8).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu->UpdateRange(1, config, 1.0f, 0, 8).code(), absl::StatusCode::kFailedPrecondition);
  // Without it the write lands and reads back, zeros around the factors.
  state[8] = 0.0f;
  ASSERT_TRUE(gpu->WriteSlot(0, 0, state.size(), state.data()).ok());
  std::vector<float> back(state.size(), -1.0f);
  ASSERT_TRUE(gpu->ReadSlot(0, 0, back.size(), back.data()).ok());
  EXPECT_EQ(back, state);
  // A window in the middle of the factors.
  std::vector<float> window(5, -1.0f);
  ASSERT_TRUE(gpu->ReadSlot(0, 5, window.size(), window.data()).ok());
  EXPECT_EQ(window, std::vector<float>(state.begin() + 5, state.begin() + 10));
}

// A CPU state restored into the GPU backend (every slot written whole, as
// a restore writes it, padding included) continues with the CPU's bits.
TEST_F(GpuBackendTest, AdafactorContinuesFromARestoredCpuState) {
  const ModelLayout layout = ModelLayout::Create({{"w", {37, 11}}, {"v", {100}}, {"b", {2, 3, 5}}},
                                                 16, 1, Partition::kWholeTensors)
                                 .value();
  const std::vector<RangeTensor> tensors = WholeTensorsOfShard(layout, 0).value();
  const OptimizerConfig config = OptimizerConfig::Adafactor();
  const size_t n = layout.ShardSize(0);
  std::vector<float> init(n);
  for (size_t i = 0; i < n; ++i) init[i] = 0.1f * std::sin(0.5f * i);
  ZeroPadding(layout, 0, &init);
  ThreadPool pool(1);
  std::unique_ptr<CpuBackend> cpu = CpuBackend::Create(config, 1, init, &pool, tensors).value();
  auto step_on = [&](UpdateBackend& backend, int64_t step) {
    std::vector<float> g = RandomGradient(0, step, n);
    ZeroPadding(layout, 0, &g);
    ASSERT_TRUE(backend.Stage(0, 0, g.data(), DType::kFloat32, n).ok());
    ASSERT_TRUE(backend.FinishStaging(0).ok());
    ASSERT_TRUE(backend.Apply(step, true, config).ok());
  };
  for (int64_t step = 1; step <= 2; ++step) step_on(*cpu, step);
  std::vector<float> params(n);
  ASSERT_TRUE(cpu->Read(0, n, params.data()).ok());
  std::unique_ptr<GpuBackend> gpu =
      GpuBackend::Create(gpu_index_, config, 1, params, tensors).value();
  for (int slot : {0, 1}) {
    std::vector<float> state(n);
    ASSERT_TRUE(cpu->ReadSlot(slot, 0, n, state.data()).ok());
    ASSERT_TRUE(gpu->WriteSlot(slot, 0, n, state.data()).ok()) << "slot " << slot;
  }
  for (int64_t step = 3; step <= 5; ++step) {
    step_on(*cpu, step);
    step_on(*gpu, step);
    std::vector<float> want(n), got(n);
    ASSERT_TRUE(cpu->Read(0, n, want.data()).ok());
    ASSERT_TRUE(gpu->Read(0, n, got.data()).ok());
    EXPECT_EQ(std::memcmp(want.data(), got.data(), n * sizeof(float)), 0) << "step " << step;
    for (int slot : {0, 1}) {
      ASSERT_TRUE(cpu->ReadSlot(slot, 0, n, want.data()).ok());
      ASSERT_TRUE(gpu->ReadSlot(slot, 0, n, got.data()).ok());
      EXPECT_EQ(std::memcmp(want.data(), got.data(), n * sizeof(float)), 0)
          << "slot " << slot << " at step " << step;
    }
  }
}

}  // namespace
}  // namespace shardopt
