// Synchronous data-parallel training across real processes on loopback:
// S shard servers x T trainer processes, every optimizer, compared with a
// single-process run of the same optimizer on the same reduced gradients.
// The per-element arithmetic is the same whatever S is, so the match must be
// bit-identical.
#include <signal.h>

#include <algorithm>
#include <cstring>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/gpu_required.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr int kSteps = 25;
constexpr uint64_t kSeed = 42;
// (lamb, adafactor and muon on the whole_tensors partition: see
// SyntheticModelSpec.)
const std::vector<std::string> kOptimizers = {"sgd",     "sgd_momentum", "sgd_nesterov",  "adam",
                                              "adam_l2", "adamw",        "adamw_amsgrad", "adagrad",
                                              "lion",    "lamb",         "adafactor",     "muon"};

// Trains every optimizer on S servers started with `server_flags` and T
// trainer processes, and checks each trainer's final parameters against the
// single-process CPU reference, bit for bit.
void RunAndCompare(uint32_t shards, uint32_t trainers, const std::vector<std::string>& server_flags,
                   const std::vector<std::string>& optimizers = kOptimizers,
                   DType push_dtype = DType::kFloat32, DType pull_dtype = DType::kFloat32) {
  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers =
      StartCluster(shards, server_flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string out_root = MakeTempDir("e2e");

  std::vector<std::unique_ptr<ChildProcess>> trainer_procs;
  for (uint32_t r = 0; r < trainers; ++r) {
    const std::string out_dir = absl::StrCat(out_root, "/rank", r);
    ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_dir).c_str()), 0);
    absl::StatusOr<std::unique_ptr<ChildProcess>> proc = ChildProcess::Start(
        Runfile("tests/test_trainer"),
        {"--servers=" + absl::StrJoin(Addresses(*servers), ","), absl::StrCat("--rank=", r),
         absl::StrCat("--num_trainers=", trainers), "--models=" + absl::StrJoin(optimizers, ","),
         absl::StrCat("--push_dtype=", DTypeName(push_dtype)),
         absl::StrCat("--pull_dtype=", DTypeName(pull_dtype)), absl::StrCat("--steps=", kSteps),
         absl::StrCat("--seed=", kSeed), "--out_dir=" + out_dir});
    ASSERT_TRUE(proc.ok()) << proc.status();
    trainer_procs.push_back(std::move(*proc));
  }
  for (auto& proc : trainer_procs) {
    std::optional<int> rc = proc->Wait(absl::Seconds(240));
    ASSERT_TRUE(rc.has_value()) << "trainer did not finish";
    ASSERT_EQ(*rc, 0) << "trainer failed";
  }

  for (const std::string& name : optimizers) {
    const ModelSpec spec = SyntheticModelSpec(name, OptimizerByName(name).value(), trainers);
    const ModelLayout layout =
        ModelLayout::Create(spec.tensors, spec.alignment, shards, spec.partition).value();
    const std::vector<float> masters =
        ReferenceRun(spec, layout, kSteps, kSeed, {push_dtype, pull_dtype, {}});
    // What a trainer holds after its last pull.
    std::vector<float> expected = masters;
    RoundTo(pull_dtype, absl::MakeSpan(expected));
    const std::vector<float> initial = SyntheticInitialParams(layout, kSeed);
    ASSERT_NE(std::memcmp(expected.data(), initial.data(), expected.size() * sizeof(float)), 0)
        << name << ": the reference did not move";
    for (uint32_t r = 0; r < trainers; ++r) {
      // Trainers and shards on one host: the payloads went through shared
      // memory (tests/shared_memory_test.cc compares it with gRPC).
      absl::StatusOr<std::vector<float>> transfers =
          ReadFloats(absl::StrCat(out_root, "/rank", r, "/", name, ".shm_transfers"));
      ASSERT_TRUE(transfers.ok()) << transfers.status();
      EXPECT_GE((*transfers)[0], 2.0f * kSteps * shards) << name << " rank " << r;
      // What the trainer pulled, and the servers' fp32 masters.
      const std::pair<std::string, const std::vector<float>*> outputs[] = {
          {".bin", &expected}, {".master.bin", &masters}};
      for (const auto& [suffix, want] : outputs) {
        absl::StatusOr<std::vector<float>> got =
            ReadFloats(absl::StrCat(out_root, "/rank", r, "/", name, suffix));
        ASSERT_TRUE(got.ok()) << got.status();
        ASSERT_EQ(got->size(), want->size()) << name;
        size_t mismatches = 0;
        for (const TensorPlacement& t : layout.tensors()) {
          for (uint64_t i = 0; i < t.size; ++i) {
            const float a = (*got)[t.offset + i], b = (*want)[t.offset + i];
            if (std::memcmp(&a, &b, sizeof(float)) != 0 && mismatches++ < 5) {
              ADD_FAILURE() << name << suffix << " rank " << r << " " << t.spec.name << "[" << i
                            << "]: " << a << " != " << b;
            }
          }
        }
        EXPECT_EQ(mismatches, 0u) << name << suffix << " rank " << r;
      }
    }
  }
}

// LAMB on the flat partition: its tensors straddle the 3 shards, so each
// step gathers every tensor's norms from all of them (decisions in two
// halves), with and without clipping; 2 trainers end on the bits of the
// single-process reference, which updates every tensor whole.
void RunLambFlat(const std::vector<std::string>& server_flags) {
  constexpr uint32_t kShards = 3, kTrainers = 2;
  for (const double max_grad_norm : {0.0, 0.01}) {
    SCOPED_TRACE(max_grad_norm);
    ModelSpec spec = SyntheticModelSpec("lamb", OptimizerByName("lamb").value(), kTrainers);
    spec.partition = Partition::kFlat;
    spec.max_grad_norm = max_grad_norm;
    const ModelLayout layout =
        ModelLayout::Create(spec.tensors, spec.alignment, kShards, spec.partition).value();
    bool straddles = false;
    for (uint32_t s = 0; s < kShards; ++s) {
      for (const TensorPiece& piece : layout.PiecesIn(layout.ShardRange(s))) {
        straddles = straddles || piece.size != layout.tensors()[piece.tensor_index].size;
      }
    }
    ASSERT_TRUE(straddles);
    if (max_grad_norm > 0) {
      // The clip binds: without it the reference ends elsewhere.
      ModelSpec unclipped = spec;
      unclipped.max_grad_norm = 0;
      ASSERT_NE(ReferenceRun(spec, layout, kSteps, kJobSeed, {}),
                ReferenceRun(unclipped, layout, kSteps, kJobSeed, {}));
    }
    auto servers = StartCluster(kShards, server_flags);
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::string out_root = MakeTempDir("lamb_flat");
    RunTrainers(Addresses(*servers), kTrainers, "lamb", kSteps, out_root,
                {"--partition=flat", absl::StrCat("--max_grad_norm=", max_grad_norm)});
    ExpectMatchesReference(spec, kShards, kSteps, out_root);
  }
}

TEST(EndToEndLambFlatTest, NormsGatheredOverShardsGiveTheWholeTensorBits) {
  RunLambFlat({"--device=cpu"});
}

class EndToEndTest : public ::testing::TestWithParam<std::tuple<uint32_t, uint32_t>> {};

TEST_P(EndToEndTest, MatchesSingleProcessRunBitForBit) {
  const auto [shards, trainers] = GetParam();
  RunAndCompare(shards, trainers, {"--device=cpu"});
}

// 16-bit wire types: the trainers hold the parameters as the wire rounds
// them and push rounded gradients, while the shards keep fp32 master weights.
// The reference applies the same roundings, so the match is still exact; the
// trainers' pulled buffers are the masters rounded to the pull type.
TEST(EndToEndMixedPrecisionTest, SixteenBitWireMatchesTheRoundedReference) {
  const std::vector<std::string> optimizers = {"adamw", "sgd_momentum"};
  RunAndCompare(2, 2, {"--device=cpu"}, optimizers, DType::kBFloat16, DType::kBFloat16);
  RunAndCompare(3, 2, {"--device=cpu"}, optimizers, DType::kFloat16, DType::kFloat32);
  RunAndCompare(1, 1, {"--device=cpu"}, optimizers, DType::kFloat32, DType::kFloat16);
}

// Clipping and loss scaling across shards: rank 0's gradient overflows (on
// the last shard only) at two steps; every shard must skip exactly those,
// and the rest must match a reference that clips the same global norm.
TEST(EndToEndGradientControlTest, SkipsAndClipsAlikeOnEveryShard) {
  const std::vector<int64_t> planted = {3, 6};  // +inf, then NaN.
  for (uint32_t shards : {1u, 3u}) {
    for (uint32_t trainers : {1u, 2u}) {
      absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers =
          StartCluster(shards, {"--device=cpu"});
      ASSERT_TRUE(servers.ok()) << servers.status();
      const std::string out_root = MakeTempDir("control");
      std::vector<std::unique_ptr<ChildProcess>> procs;
      for (uint32_t r = 0; r < trainers; ++r) {
        const std::string out_dir = absl::StrCat(out_root, "/rank", r);
        ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_dir).c_str()), 0);
        auto proc = ChildProcess::Start(
            Runfile("tests/test_trainer"),
            {"--servers=" + absl::StrJoin(Addresses(*servers), ","), absl::StrCat("--rank=", r),
             absl::StrCat("--num_trainers=", trainers), "--models=adamw,sgd_momentum",
             absl::StrCat("--steps=", kSteps), absl::StrCat("--seed=", kSeed),
             "--max_grad_norm=1.5", "--loss_scaling", "--initial_loss_scale=1024",
             "--plant_inf_steps=3,6", "--out_dir=" + out_dir});
        ASSERT_TRUE(proc.ok());
        procs.push_back(std::move(*proc));
      }
      for (auto& proc : procs) {
        std::optional<int> rc = proc->Wait(absl::Seconds(240));
        ASSERT_TRUE(rc.has_value());
        ASSERT_EQ(*rc, 0) << "trainer failed (S=" << shards << ", T=" << trainers << ")";
      }
      for (const std::string name : {"adamw", "sgd_momentum"}) {
        ModelSpec spec = SyntheticModelSpec(name, OptimizerByName(name).value(), trainers);
        spec.max_grad_norm = 1.5;
        spec.loss_scaling = true;
        spec.loss_scaler.initial_scale = 1024;
        const ModelLayout layout =
            ModelLayout::Create(spec.tensors, spec.alignment, shards, spec.partition).value();
        ReferenceOptions reference;
        reference.plant_inf_steps = {planted.begin(), planted.end()};
        reference.plant_inf_element = layout.tensors().back().offset;
        std::vector<int64_t> skipped;
        reference.skipped_steps = &skipped;
        const std::vector<float> expected = ReferenceRun(spec, layout, kSteps, kSeed, reference);
        EXPECT_EQ(skipped, planted);
        for (uint32_t r = 0; r < trainers; ++r) {
          absl::StatusOr<std::vector<float>> got =
              ReadFloats(absl::StrCat(out_root, "/rank", r, "/", name, ".bin"));
          ASSERT_TRUE(got.ok()) << got.status();
          ASSERT_EQ(got->size(), expected.size());
          EXPECT_EQ(std::memcmp(got->data(), expected.data(), expected.size() * sizeof(float)), 0)
              << name << " S=" << shards << " T=" << trainers << " rank " << r;
        }
        // Every shard skipped the same steps and counted the same updates.
        for (const auto& server : *servers) {
          v1::InspectResponse info;
          ASSERT_TRUE(RawInspect(*NewStub(server->address()), name, &info).ok());
          EXPECT_EQ(info.skipped_steps(), 2) << name;
          EXPECT_EQ(info.optimizer_steps(), kSteps - 2) << name;
          EXPECT_EQ(info.last_decided_step(), kSteps);
          EXPECT_LT(info.last_decision().clip_coef(), 1.0) << "the norm was clipped";
        }
      }
    }
  }
}

// The same multi-trainer runs with the model state on GPU 0: the fused CUDA
// kernels must reproduce the CPU run exactly. Skips where shardopt_server
// cannot use a GPU (it refuses --device=cuda:0 at start).
// Skips (or fails, where a GPU is required) the calling test unless
// shardopt_server starts with --device=cuda:0; the caller returns when
// IsSkipped().
void SkipUnlessServersHaveAGpu() {
  if (std::optional<int> rc = ServerExitsAtStart({"--device=cuda:0"})) {
    SHARDOPT_GPU_UNAVAILABLE("no usable GPU: shardopt_server --device=cuda:0 exited with "
                             << *rc << " (see its message above)");
  }
}

TEST(EndToEndGpuTest, CudaShardsMatchTheCpuRunBitForBit) {
  SkipUnlessServersHaveAGpu();
  if (IsSkipped() || HasFatalFailure()) return;
  // (Muon's products on the GPU are cuBLAS's, equal to the CPU's within
  // rounding, not bit for bit: //server/cuda:gpu_backend_test compares
  // them. LAMB's and Adafactor's GPU passes are bit-identical to the CPU's
  // and stay in.)
  std::vector<std::string> fused = kOptimizers;
  for (const char* cpu_only : {"muon"}) {
    fused.erase(std::remove(fused.begin(), fused.end(), cpu_only), fused.end());
  }
  for (uint32_t shards : {1u, 2u}) RunAndCompare(shards, 2, {"--device=cuda:0"}, fused);
}

// LAMB's two-half decisions with the shards' state on GPU 0: the trust
// partials measured there must be the CPU's bits.
TEST(EndToEndGpuTest, LambFlatOnCudaShardsGivesTheWholeTensorBits) {
  SkipUnlessServersHaveAGpu();
  if (IsSkipped() || HasFatalFailure()) return;
  RunLambFlat({"--device=cuda:0"});
}

INSTANTIATE_TEST_SUITE_P(ShardsByTrainers, EndToEndTest,
                         ::testing::Combine(::testing::Values(1u, 2u, 3u),
                                            ::testing::Values(1u, 2u)),
                         [](const auto& info) {
                           return absl::StrCat("S", std::get<0>(info.param), "_T",
                                               std::get<1>(info.param));
                         });

// Each half of gradient control alone, on 2 shards x 2 trainers: clipping
// without loss scaling (every step decided, none skipped), and loss scaling
// without clipping whose scale grows every 3 clean steps and backs off at the
// planted overflows (the shards' scaler replica refuses any push whose scale
// is not the one the trainers' scalers must hold).
TEST(EndToEndGradientControlTest, ClippingOnlyAndScalingOnly) {
  constexpr uint32_t kShards = 2, kTrainers = 2;
  struct Case {
    const char* label;
    double max_grad_norm;
    bool loss_scaling;
    std::vector<int64_t> planted;
  };
  for (const Case& c :
       {Case{"clipping only", 0.8, false, {}}, Case{"scaling only", 0, true, {5, 6, 14}}}) {
    SCOPED_TRACE(c.label);
    auto servers = StartCluster(kShards, {"--device=cpu"});
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::string out_root = MakeTempDir("control_parts");
    std::vector<std::unique_ptr<ChildProcess>> procs;
    for (uint32_t r = 0; r < kTrainers; ++r) {
      const std::string out_dir = absl::StrCat(out_root, "/rank", r);
      ASSERT_EQ(system(absl::StrCat("mkdir -p ", out_dir).c_str()), 0);
      std::vector<std::string> args = {"--servers=" + absl::StrJoin(Addresses(*servers), ","),
                                       absl::StrCat("--rank=", r),
                                       absl::StrCat("--num_trainers=", kTrainers),
                                       "--models=adam",
                                       absl::StrCat("--steps=", kSteps),
                                       absl::StrCat("--seed=", kSeed),
                                       absl::StrCat("--max_grad_norm=", c.max_grad_norm),
                                       "--out_dir=" + out_dir};
      if (c.loss_scaling) {
        args.insert(args.end(),
                    {"--loss_scaling", "--initial_loss_scale=256", "--loss_scale_growth_interval=3",
                     "--plant_inf_steps=" + absl::StrJoin(c.planted, ",")});
      }
      auto proc = ChildProcess::Start(Runfile("tests/test_trainer"), args);
      ASSERT_TRUE(proc.ok());
      procs.push_back(std::move(*proc));
    }
    for (auto& proc : procs) {
      std::optional<int> rc = proc->Wait(absl::Seconds(240));
      ASSERT_TRUE(rc.has_value());
      ASSERT_EQ(*rc, 0) << "trainer failed";
    }
    ModelSpec spec = SyntheticModelSpec("adam", OptimizerByName("adam").value(), kTrainers);
    spec.max_grad_norm = c.max_grad_norm;
    spec.loss_scaling = c.loss_scaling;
    spec.loss_scaler.initial_scale = 256;
    spec.loss_scaler.growth_interval = 3;
    const ModelLayout layout =
        ModelLayout::Create(spec.tensors, spec.alignment, kShards, spec.partition).value();
    ReferenceOptions reference;
    reference.plant_inf_steps = {c.planted.begin(), c.planted.end()};
    reference.plant_inf_element = layout.tensors().back().offset;
    std::vector<int64_t> skipped;
    reference.skipped_steps = &skipped;
    const std::vector<float> expected = ReferenceRun(spec, layout, kSteps, kSeed, reference);
    EXPECT_EQ(skipped, c.planted);
    for (uint32_t r = 0; r < kTrainers; ++r) {
      absl::StatusOr<std::vector<float>> got =
          ReadFloats(absl::StrCat(out_root, "/rank", r, "/adam.bin"));
      ASSERT_TRUE(got.ok()) << got.status();
      EXPECT_EQ(std::memcmp(got->data(), expected.data(), expected.size() * sizeof(float)), 0)
          << "rank " << r;
    }
    v1::InspectResponse info;
    ASSERT_TRUE(RawInspect(*NewStub((*servers)[0]->address()), "adam", &info).ok());
    EXPECT_EQ(info.skipped_steps(), static_cast<int64_t>(c.planted.size()));
    if (c.loss_scaling) {
      // 256, grown at 3 clean steps in a row, backed off after hysteresis:
      // the last decided step ran at the scale the trainers' scalers held.
      EXPECT_GT(info.last_loss_scale(), 256.0);
    } else {
      EXPECT_LT(info.last_decision().clip_coef(), 1.0);  // 0.8 clips these gradients.
      EXPECT_EQ(info.last_loss_scale(), 1.0);
    }
  }
}

}  // namespace
}  // namespace shardopt::testing
