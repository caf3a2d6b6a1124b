// The asynchronous and bounded-staleness modes with real processes
// (shardopt_server, tests/test_trainer on 127.0.0.1): plain SGD with dyadic
// numbers ends exactly at p0 - lr * (sum of every push) whatever the
// interleaving, also through kill -9 of shards (restarted from periodic
// checkpoints, the trainers re-pushing what they lost) and of a trainer; the
// staleness bound holds on every push of a trainer that runs ahead of a slow
// one; a trainer that stops makes the others' error name it; an async
// checkpoint restores on other shard counts and continues exactly.
#include <signal.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/proto_convert.h"
#include "common/step_protocol.h"
#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr double kLr = 1.0 / 16;
const char kModel[] = "sgd";

std::vector<std::string> AsyncFlags(const std::string& consistency, int64_t staleness = 0) {
  std::vector<std::string> flags = {"--consistency=" + consistency, "--dyadic",
                                    absl::StrCat("--lr=", kLr)};
  if (staleness > 0) flags.push_back(absl::StrCat("--staleness=", staleness));
  return flags;
}

ModelLayout JobLayout(uint32_t shards, uint32_t trainers) {
  ModelSpec spec = SyntheticModelSpec(kModel, OptimizerByName(kModel).value(), trainers);
  return ModelLayout::Create(spec.tensors, spec.alignment, shards).value();
}

// Every rank's final parameters are exactly the dyadic sum.
void ExpectExactSgd(uint32_t shards, uint32_t trainers, int steps, const std::string& out_root) {
  const std::vector<float> want =
      DyadicSgdResult(JobLayout(shards, trainers), trainers, steps, kJobSeed, kLr);
  for (uint32_t r = 0; r < trainers; ++r) {
    absl::StatusOr<std::vector<float>> got =
        ReadFloats(absl::StrCat(out_root, "/rank", r, "/", kModel, ".bin"));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    size_t differ = 0, first = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      if (std::memcmp(&(*got)[i], &want[i], sizeof(float)) != 0 && differ++ == 0) first = i;
    }
    EXPECT_EQ(differ, 0u) << "rank " << r << ": " << differ << " elements differ, first " << first
                          << ": " << (*got)[first] << " vs " << want[first];
  }
}

v1::InspectResponse Inspect(const std::string& address) {
  auto stub = NewStub(address);
  v1::InspectResponse response;
  const grpc::Status s = RawInspect(*stub, kModel, &response, 10);
  EXPECT_TRUE(s.ok()) << address << ": " << s.error_message();
  return response;
}

// Each shard applied every push once: every trainer at `steps`, the version
// and the optimizer's step count their sum.
void ExpectEveryPushOnce(const std::vector<std::string>& addresses, uint32_t trainers, int steps) {
  for (const std::string& address : addresses) {
    const v1::InspectResponse r = Inspect(address);
    EXPECT_EQ(std::vector<int64_t>(r.trainer_steps().begin(), r.trainer_steps().end()),
              std::vector<int64_t>(trainers, steps))
        << address;
    EXPECT_EQ(r.version(), int64_t{trainers} * steps) << address;
    EXPECT_EQ(r.optimizer_steps(), int64_t{trainers} * steps) << address;
  }
}

TEST(AsyncTest, SgdIsExactWhateverTheInterleaving) {
  constexpr uint32_t kShards = 2, kTrainers = 3;
  constexpr int kSteps = 30;
  auto servers = StartCluster(kShards);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string out = MakeTempDir("async_exact");
  RunTrainers(Addresses(*servers), kTrainers, kModel, kSteps, out, AsyncFlags("async"));
  ExpectExactSgd(kShards, kTrainers, kSteps, out);
  ExpectEveryPushOnce(Addresses(*servers), kTrainers, kSteps);
  // The shards applied the pushes in orders of their own, each trainer's in
  // its step order.
  for (const std::string& address : Addresses(*servers)) {
    const v1::InspectResponse r = Inspect(address);
    ASSERT_EQ(r.applied_order_size(), kTrainers * kSteps);
    std::vector<int64_t> last(kTrainers, 0);
    for (const v1::AppliedPush& p : r.applied_order()) {
      ASSERT_EQ(p.step(), last[p.trainer_rank()] + 1) << address;
      last[p.trainer_rank()] = p.step();
    }
  }
}

// SIGKILL each shard in turn (and one trainer) while three trainers train
// asynchronously; shards come back from their periodic checkpoints (cuts),
// the trainers re-push what they lost, and the end is exact.
TEST(AsyncTest, KilledShardsAndTrainerLoseNothingAndApplyNothingTwice) {
  constexpr uint32_t kShards = 2, kTrainers = 3;
  constexpr int kSteps = 60, kKills = 4;
  const std::string root = MakeTempDir("async_faults");
  const std::string ckpt = root + "/ckpt";
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, 5);
  auto servers = StartCluster(kShards, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  std::vector<std::string> extra = AsyncFlags("async");
  extra.insert(extra.end(), {"--replay_steps=40", "--retry_budget=60s", "--chunk_bytes=256",
                             "--min_step_time=15ms"});
  std::vector<std::unique_ptr<ChildProcess>> trainers;
  ASSERT_NO_FATAL_FAILURE(
      StartTrainers(addresses, kTrainers, kModel, kSteps, root + "/out", extra, &trainers));
  std::mt19937 rng(14);
  for (int kill = 0; kill < kKills; ++kill) {
    const uint32_t victim = kill % kShards;
    // Spread over the run: versions count pushes (T per trainer step). Two
    // past a multiple of --checkpoint_every: a periodic checkpoint holds the
    // shard's pushes while it is written, so a kill at a multiple can find
    // the shard exactly at its checkpoint, losing nothing.
    AwaitVersion(addresses[victim], kModel, (kill + 1) * kTrainers * kSteps / (kKills + 2) + 2);
    absl::SleepFor(absl::Microseconds(std::uniform_int_distribution<int>(0, 5000)(rng)));
    (*servers)[victim]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[victim]->process().Wait(absl::Seconds(10)).has_value());
    auto restarted = StartServerAt(addresses[victim], victim, kShards, flags);
    ASSERT_TRUE(restarted.ok()) << restarted.status();
    (*servers)[victim] = std::move(*restarted);
    if (kill == 1) {
      // A trainer dies too and its new process goes on from where the shards
      // have it (its gradients do not depend on the parameters: the same).
      trainers[1]->Signal(SIGKILL);
      ASSERT_TRUE(trainers[1]->Wait(absl::Seconds(10)).has_value());
      ASSERT_NO_FATAL_FAILURE(StartTrainer(addresses, 1, kTrainers, kModel, kSteps, root + "/out",
                                           extra, &trainers[1]));
    }
  }
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  ExpectExactSgd(kShards, kTrainers, kSteps, root + "/out");
  ExpectEveryPushOnce(addresses, kTrainers, kSteps);
  int64_t replayed = 0;
  for (uint32_t r = 0; r < kTrainers; ++r) {
    replayed += TrainerCount(root + "/out", r, kModel, "replayed");
  }
  EXPECT_GT(replayed, 0) << "no shard lost a push: the kills tested nothing";
}

TEST(AsyncTest, BoundedStalenessHoldsEveryPushOfTheFastTrainer) {
  constexpr uint32_t kShards = 2, kTrainers = 2;
  constexpr int kSteps = 30;
  constexpr int64_t kStaleness = 2;
  auto servers = StartCluster(kShards);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string out = MakeTempDir("bounded");
  std::vector<std::unique_ptr<ChildProcess>> trainers(kTrainers);
  const std::vector<std::string> flags = AsyncFlags("bounded", kStaleness);
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(Addresses(*servers), 0, kTrainers, kModel, kSteps, out, flags, &trainers[0]));
  std::vector<std::string> slow = flags;
  slow.push_back("--min_step_time=40ms");  // Twice... many times slower on purpose.
  ASSERT_NO_FATAL_FAILURE(
      StartTrainer(Addresses(*servers), 1, kTrainers, kModel, kSteps, out, slow, &trainers[1]));
  ASSERT_NO_FATAL_FAILURE(AwaitTrainers(trainers));
  absl::StatusOr<std::vector<float>> staleness =
      ReadFloats(absl::StrCat(out, "/rank0/", kModel, ".staleness"));
  ASSERT_TRUE(staleness.ok()) << staleness.status();
  ASSERT_EQ(staleness->size(), kSteps + 1u);
  float worst = 0;
  for (int step = 1; step <= kSteps; ++step) {
    EXPECT_LE((*staleness)[step], kStaleness) << "step " << step;
    worst = std::max(worst, (*staleness)[step]);
  }
  EXPECT_EQ(worst, kStaleness) << "the fast trainer never ran ahead: the test tested nothing";
  for (const std::string& address : Addresses(*servers)) {
    EXPECT_LE(Inspect(address).max_staleness(), kStaleness) << address;
  }
  ExpectExactSgd(kShards, kTrainers, kSteps, out);
}

TEST(AsyncTest, ATrainerThatStopsIsNamedInTheOthersError) {
  auto servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string out = MakeTempDir("stopped");
  // Rank 0 of 2 alone: its step 2 waits for trainer 1's step 1, which never
  // comes.
  std::vector<std::string> args =
      TrainerArgs(Addresses(*servers), 0, 2, kModel, 5, out, AsyncFlags("bounded", 1));
  args.insert(args.end(), {"--retry_budget=3s", "--rpc_timeout=10s"});
  std::string command = Runfile("tests/test_trainer");
  for (const std::string& a : args) command += " '" + a + "'";
  const auto [code, output] = RunShell(command);
  EXPECT_NE(code, 0) << output;
  EXPECT_TRUE(absl::StrContains(output, "waits for trainer(s) 1 (applied step 0)")) << output;
  EXPECT_TRUE(absl::StrContains(output, "step 2")) << output;
  // Nothing of the refused push stayed: trainer 0 has its step 1 only.
  const v1::InspectResponse r = Inspect((*servers)[0]->address());
  EXPECT_EQ(std::vector<int64_t>(r.trainer_steps().begin(), r.trainer_steps().end()),
            (std::vector<int64_t>{1, 0}));
}

// Gradient control is the trainer's in the asynchronous modes: under loss
// scaling an overflowing step of one trainer is skipped by that trainer
// alone (nothing of it anywhere, the optimizer's step count included), and
// clipping scales each push by its own gradient's norm.
TEST(AsyncTest, TrainersSkipAndClipTheirOwnGradients) {
  constexpr uint32_t kShards = 2, kTrainers = 2;
  constexpr int kSteps = 20;
  {
    auto servers = StartCluster(kShards);
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::string out = MakeTempDir("async_skip");
    std::vector<std::string> flags = AsyncFlags("async");
    flags.insert(flags.end(), {"--loss_scaling", "--plant_inf_steps=5,9"});
    RunTrainers(Addresses(*servers), kTrainers, kModel, kSteps, out, flags);
    const std::vector<float> want = DyadicSgdResult(JobLayout(kShards, kTrainers), kTrainers,
                                                    kSteps, kJobSeed, kLr, {{0, 5}, {0, 9}});
    absl::StatusOr<std::vector<float>> got =
        ReadFloats(absl::StrCat(out, "/rank1/", kModel, ".bin"));
    ASSERT_TRUE(got.ok()) << got.status();
    ASSERT_EQ(got->size(), want.size());
    EXPECT_EQ(std::memcmp(got->data(), want.data(), want.size() * sizeof(float)), 0)
        << "the skipped steps left a trace, or a push is missing";
    for (const std::string& address : Addresses(*servers)) {
      const v1::InspectResponse r = Inspect(address);
      EXPECT_EQ(std::vector<int64_t>(r.trainer_steps().begin(), r.trainer_steps().end()),
                std::vector<int64_t>(kTrainers, kSteps))
          << address;
      EXPECT_EQ(r.skipped_steps(), 2) << address;
      EXPECT_EQ(r.optimizer_steps(), kTrainers * kSteps - 2) << address;
    }
  }
  {
    constexpr double kMaxNorm = 0.5;
    auto servers = StartCluster(kShards);
    ASSERT_TRUE(servers.ok()) << servers.status();
    const std::string out = MakeTempDir("async_clip");
    std::vector<std::string> flags = AsyncFlags("async");
    flags.push_back(absl::StrCat("--max_grad_norm=", kMaxNorm));
    RunTrainers(Addresses(*servers), kTrainers, kModel, kSteps, out, flags);
    // Each push times its own clip coefficient (at fp32, as the trainer
    // multiplies), summed in double; the shards' fp32 sums round a little.
    const ModelLayout layout = JobLayout(kShards, kTrainers);
    const std::vector<float> p0 = DyadicInitialParams(layout, kJobSeed);
    std::vector<double> want(p0.begin(), p0.end());
    std::vector<float> g(p0.size());
    double smallest_coef = 1;
    for (uint32_t r = 0; r < kTrainers; ++r) {
      for (int64_t k = 1; k <= kSteps; ++k) {
        DyadicGradient(layout, r, k, kJobSeed, absl::MakeSpan(g));
        double sum = 0;
        for (float x : g) sum += static_cast<double>(x) * x;
        StepDecision decision;
        decision.clip_coef = ClipCoefficient(kMaxNorm, std::sqrt(sum));
        smallest_coef = std::min(smallest_coef, decision.clip_coef);
        const float multiplier = GradientMultiplier(decision, 1.0);
        for (size_t i = 0; i < g.size(); ++i)
          want[i] -= kLr * static_cast<float>(g[i] * multiplier);
      }
    }
    ASSERT_LT(smallest_coef, 0.5) << "no push was clipped: the test tests nothing";
    absl::StatusOr<std::vector<float>> got =
        ReadFloats(absl::StrCat(out, "/rank0/", kModel, ".bin"));
    ASSERT_TRUE(got.ok()) << got.status();
    double worst = 0;
    for (size_t i = 0; i < want.size(); ++i) {
      worst = std::max(worst, std::abs((*got)[i] - want[i]));
    }
    EXPECT_LT(worst, 5e-5) << "clipped pushes differ from each trainer's own clipping";
  }
}

// Loss scaling with a 16-bit wire type in asynchronous mode: the trainer
// pushes its gradient still scaled and the shard unscales it, as in
// synchronous mode, so that a gradient below fp16's smallest value
// survives; a scaled gradient that overflows fp16 is the trainer's own
// overflow: the step is skipped and its scaler backs off.
TEST(AsyncTest, ALossScaledSixteenBitPushKeepsSmallGradients) {
  auto servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  TrainerClientOptions options;
  options.push_dtype = DType::kFloat16;
  auto client = TrainerClient::Connect(Addresses(*servers), options);
  ASSERT_TRUE(client.ok()) << client.status();
  ModelSpec spec;
  spec.model_id = "fp16_async";
  spec.tensors = {TensorSpec{"w", {64}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Sgd(1.0);
  spec.consistency = Consistency::kAsync;
  spec.loss_scaling = true;
  spec.loss_scaler.initial_scale = 65536.0;  // 2^16
  spec.loss_scaler.hysteresis = 1;
  std::vector<float> params(64, 0x1p-20f);
  ASSERT_TRUE((*client)->Register(spec, params).ok());
  // 2^-26 is below fp16's smallest subnormal (2^-24); scaled, 2^-10.
  const std::vector<float> tiny(64, 0x1p-26f * 65536.0f);
  absl::StatusOr<StepResult> first = (*client)->Step(1, tiny, absl::MakeSpan(params));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->skipped);
  EXPECT_EQ(params, std::vector<float>(64, 0x1p-20f - 0x1p-26f))
      << "the gradient was unscaled before the fp16 wire and lost";
  // 2^5 unscaled: finite in fp32 and fp16, but not once scaled by 2^16.
  const double scale = (*client)->loss_scale();
  const std::vector<float> large(64, static_cast<float>(0x1p5 * scale));
  absl::StatusOr<StepResult> second = (*client)->Step(2, large, absl::MakeSpan(params));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_TRUE(second->skipped);
  EXPECT_EQ((*client)->loss_scale(), scale / 2);
  EXPECT_EQ(params, std::vector<float>(64, 0x1p-20f - 0x1p-26f));
}

// A trainer that gives up 2 s into an outage (a shard killed under it).
TrainerClientOptions FailingSoon() {
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(2);
  options.retry_budget = absl::Seconds(2);
  return options;
}

// An asynchronous model of one 4096-element tensor with loss scaling from
// `initial_scale`.
ModelSpec LossScaledAsync(const std::string& model_id, const OptimizerConfig& optimizer,
                          double initial_scale) {
  ModelSpec spec;
  spec.model_id = model_id;
  spec.tensors = {TensorSpec{"w", {4096}, DType::kFloat32}};
  spec.optimizer = optimizer;
  spec.consistency = Consistency::kAsync;
  spec.loss_scaling = true;
  spec.loss_scaler.initial_scale = initial_scale;
  return spec;
}

// A trainer restarted on its journal re-sends the push a shard missed as it
// journaled it, with the scale it was made with, even though its scaler
// starts afresh (another scale) and its recomputed gradient differs: the
// shard that had it and the one that missed it end on the same step.
TEST(AsyncTest, ARestartedTrainerResendsItsJournaledLossScaledPush) {
  const std::string ckpt = MakeTempDir("async_journal_ckpt");
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, 2);
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  TrainerClientOptions options = FailingSoon();
  options.journal_path = MakeTempDir("async_journal");
  ModelSpec spec = LossScaledAsync("journaled", OptimizerConfig::Sgd(1.0), 65536.0);
  spec.loss_scaler.growth_interval = 1;  // Each step's scale doubles: 2^16, 2^17, 2^18.
  std::vector<float> params(4096, 0.5f);
  const auto scaled = [&](float g, double scale) {
    return std::vector<float>(4096, static_cast<float>(g * scale));
  };
  {
    auto trainer = TrainerClient::Connect(addresses, options).value();
    ASSERT_TRUE(trainer->Register(spec, params).ok());
    for (int64_t step = 1; step <= 2; ++step) {
      ASSERT_TRUE(trainer->Step(step, scaled(0.0625f, trainer->loss_scale()),
                                absl::MakeSpan(params))
                      .ok());
    }
    for (const std::string& address : addresses) {
      auto stub = NewStub(address);
      v1::InspectResponse inspect;
      for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < 2; ++i) {
        ASSERT_TRUE(RawInspect(*stub, "journaled", &inspect, 10).ok());
        absl::SleepFor(absl::Milliseconds(10));
      }
      ASSERT_EQ(inspect.newest_committed_checkpoint(), 2);
    }
    // Shard 1 dies; step 3 (scale 2^18) reaches shard 0 only, then the
    // trainer dies too.
    (*servers)[1]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
    EXPECT_EQ(trainer->loss_scale(), 262144.0);
    EXPECT_FALSE(
        trainer->Step(3, scaled(0.0625f, trainer->loss_scale()), absl::MakeSpan(params)).ok());
  }
  auto restarted = StartServerAt(addresses[1], 1, 2, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  auto again = TrainerClient::Connect(addresses, options).value();
  ASSERT_TRUE(again->Attach(spec).ok());
  EXPECT_EQ(again->PullToResume(absl::MakeSpan(params)).value(), 2);
  EXPECT_EQ(again->loss_scale(), 65536.0);
  // Its program computes step 3's gradient again, and it comes out other.
  absl::StatusOr<StepResult> third =
      again->Step(3, scaled(0.25f, again->loss_scale()), absl::MakeSpan(params));
  ASSERT_TRUE(third.ok()) << third.status();
  // SGD, lr 1: 1/2 - 3/16 on both shards' ranges.
  EXPECT_EQ(params, std::vector<float>(4096, 0.3125f))
      << "a shard took the recomputed gradient instead of the journaled push";
}

// Without a journal, the restarted trainer's recomputed step may overflow
// where the push a shard already applied did not: that shard keeps the
// step, the shard that missed it skips it, and their step counts differ for
// good. The job still checkpoints (each part keeps its shard's counts; it
// used to be refused at every later step), and a restart restores each
// shard's own counts.
TEST(AsyncTest, AStepOneShardAppliedAndAnotherSkippedStillCheckpoints) {
  const std::string ckpt = MakeTempDir("async_split_skip_ckpt");
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, 2);
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  const TrainerClientOptions options = FailingSoon();
  const ModelSpec spec = LossScaledAsync("split_skip", OptimizerConfig::Adam(0.125), 1024.0);
  std::vector<float> params(4096, 0.5f);
  const auto gradient = [](float g) { return std::vector<float>(4096, g); };
  const auto committed = [&](const std::string& address, int64_t step) {
    auto stub = NewStub(address);
    v1::InspectResponse inspect;
    for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < step; ++i) {
      if (!RawInspect(*stub, "split_skip", &inspect, 10).ok()) break;
      absl::SleepFor(absl::Milliseconds(10));
    }
    return inspect.newest_committed_checkpoint();
  };
  {
    auto trainer = TrainerClient::Connect(addresses, options).value();
    ASSERT_TRUE(trainer->Register(spec, params).ok());
    for (int64_t step = 1; step <= 2; ++step) {
      ASSERT_TRUE(trainer->Step(step, gradient(64.0f), absl::MakeSpan(params)).ok());
    }
    for (const std::string& address : addresses) ASSERT_EQ(committed(address, 2), 2);
    // Shard 1 dies; step 3 reaches shard 0 only, then the trainer dies too.
    (*servers)[1]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
    EXPECT_FALSE(trainer->Step(3, gradient(64.0f), absl::MakeSpan(params)).ok());
  }
  auto restarted = StartServerAt(addresses[1], 1, 2, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  (*servers)[1] = std::move(*restarted);
  {
    auto again = TrainerClient::Connect(addresses, options).value();
    ASSERT_TRUE(again->Attach(spec).ok());
    EXPECT_EQ(again->PullToResume(absl::MakeSpan(params)).value(), 2);
    // Recomputed, step 3 overflows: shard 1 skips it, shard 0 has it.
    const std::vector<float> overflowing(4096, std::numeric_limits<float>::infinity());
    absl::StatusOr<StepResult> third = again->Step(3, overflowing, absl::MakeSpan(params));
    ASSERT_TRUE(third.ok()) << third.status();
    for (int64_t step = 4; step <= 4; ++step) {
      ASSERT_TRUE(again->Step(step, gradient(64.0f), absl::MakeSpan(params)).ok());
    }
  }
  std::vector<v1::InspectResponse> before(2);
  for (size_t shard = 0; shard < 2; ++shard) {
    EXPECT_EQ(committed(addresses[shard], 4), 4) << "shard " << shard << ": step 4 not committed";
    auto stub = NewStub(addresses[shard]);
    ASSERT_TRUE(RawInspect(*stub, "split_skip", &before[shard], 10).ok());
  }
  ASSERT_EQ(before[0].skipped_steps(), 0);
  ASSERT_EQ(before[1].skipped_steps(), 1);
  // Both shards restart from step 4: each takes its own counts (Adam's bias
  // correction goes by them).
  for (size_t shard = 0; shard < 2; ++shard) {
    (*servers)[shard]->process().Signal(SIGKILL);
    ASSERT_TRUE((*servers)[shard]->process().Wait(absl::Seconds(10)).has_value());
    auto back = StartServerAt(addresses[shard], shard, 2, flags);
    ASSERT_TRUE(back.ok()) << back.status();
    (*servers)[shard] = std::move(*back);
    auto stub = NewStub(addresses[shard]);
    v1::InspectResponse after;
    ASSERT_TRUE(RawInspect(*stub, "split_skip", &after, 10).ok());
    EXPECT_EQ(after.version(), 4) << "shard " << shard;
    EXPECT_EQ(after.optimizer_steps(), before[shard].optimizer_steps()) << "shard " << shard;
    EXPECT_EQ(after.skipped_steps(), before[shard].skipped_steps()) << "shard " << shard;
  }
}

// Bad input to an asynchronous model over the wire: each gets its status and
// leaves the record as it was.
TEST(AsyncTest, BadCallsGetTheirStatusAndChangeNothing) {
  auto servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string address = (*servers)[0]->address();
  auto client = TrainerClient::Connect({address}, TrainerClientOptions());
  ASSERT_TRUE(client.ok());
  ModelSpec spec = SyntheticModelSpec(kModel, OptimizerConfig::Sgd(kLr), 2);
  spec.consistency = Consistency::kBounded;
  spec.staleness = 2;
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  ASSERT_TRUE((*client)->Register(spec, DyadicInitialParams(layout, kJobSeed)).ok());
  std::vector<float> grad(layout.total_elements());
  DyadicGradient(layout, 0, 1, kJobSeed, absl::MakeSpan(grad));
  ASSERT_TRUE((*client)->Push(1, grad).ok());
  auto stub = NewStub(address);
  v1::PushHeader header;
  header.set_model_id(kModel);
  header.set_trainer_rank(0);
  header.set_num_elements(layout.total_elements());
  const std::vector<RawChunk> whole = {{0, FloatBytes(grad.data(), grad.size())}};
  struct Case {
    const char* what;
    int64_t step;
    double loss_scale;
    bool skip;
    std::vector<RawChunk> chunks;
    grpc::StatusCode code;
    const char* says;
  };
  const std::vector<Case> cases = {
      {"a gap", 3, 1, false, whole, grpc::OUT_OF_RANGE, "push steps 2..2 first"},
      {"a scaled push", 2, 4, false, whole, grpc::INVALID_ARGUMENT, "loss scale 4"},
      // (Only a loss scaler's overflow skips a step; model_shard_async_test
      // has a skip with a gradient on a loss-scaled model.)
      {"a skip without loss scaling",
       2,
       1,
       true,
       {},
       grpc::INVALID_ARGUMENT,
       "registered without loss scaling"},
      {"a short push",
       2,
       1,
       false,
       {{0, FloatBytes(grad.data(), 10)}},
       grpc::INVALID_ARGUMENT,
       "push ended after 10"},
  };
  for (const Case& c : cases) {
    header.set_step(c.step);
    header.set_loss_scale(c.loss_scale);
    header.set_skip_step(c.skip);
    const grpc::Status s = RawPush(*stub, &header, c.chunks);
    EXPECT_EQ(s.error_code(), c.code) << c.what << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), c.says))
        << c.what << ": " << s.error_message();
  }
  // Calls of the synchronous protocol.
  auto channel = grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  const auto unary = [&](const std::string& method, const google::protobuf::Message& request) {
    std::string bytes;
    request.SerializeToString(&bytes);
    return RawUnaryCall(channel.get(), "/shardopt.v1.ShardService/" + method, bytes, 10000);
  };
  v1::CheckpointRequest checkpoint;
  checkpoint.set_model_id(kModel);
  checkpoint.set_directory(MakeTempDir("async_bad") + "/ckpt");
  checkpoint.set_step(-1);
  grpc::Status s = unary("Checkpoint", checkpoint);
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "name the step")) << s.error_message();
  v1::GetStepStatsRequest stats;
  stats.set_model_id(kModel);
  stats.set_step(1);
  s = unary("GetStepStats", stats);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message();
  v1::SetHyperparametersRequest change;
  change.set_model_id(kModel);
  change.set_effective_step(5);
  *change.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Sgd(0.5));
  s = unary("SetHyperparameters", change);
  EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message();
  EXPECT_TRUE(absl::StrContains(s.error_message(), "only in synchronous mode"))
      << s.error_message();
  // Nothing moved: trainer 0 at step 1, one update.
  const v1::InspectResponse r = Inspect(address);
  EXPECT_EQ(std::vector<int64_t>(r.trainer_steps().begin(), r.trainer_steps().end()),
            (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(r.optimizer_steps(), 1);
  EXPECT_EQ(r.consistency(), v1::CONSISTENCY_BOUNDED);
  EXPECT_EQ(r.staleness(), 2);

  // With clipping but no loss scaler a NaN is refused, naming the element,
  // not skipped (only a loss scaler skips), and nothing reaches the shard.
  ModelSpec clipped = SyntheticModelSpec("clipped", OptimizerConfig::Sgd(kLr), 2);
  clipped.consistency = Consistency::kAsync;
  clipped.max_grad_norm = 1.0;
  auto clip_client = TrainerClient::Connect({address}, TrainerClientOptions());
  ASSERT_TRUE(clip_client.ok());
  ASSERT_TRUE((*clip_client)->Register(clipped, DyadicInitialParams(layout, kJobSeed)).ok());
  std::vector<float> nan = grad;
  nan[layout.tensors()[1].offset] = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<StepResult> refused = (*clip_client)->Push(1, nan);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << refused.status();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "is nan")) << refused.status();
  auto inspect_stub = NewStub(address);
  v1::InspectResponse c;
  ASSERT_TRUE(RawInspect(*inspect_stub, "clipped", &c, 10).ok());
  EXPECT_EQ(std::vector<int64_t>(c.trainer_steps().begin(), c.trainer_steps().end()),
            (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(c.skipped_steps(), 0);
}

TEST(AsyncTest, AnAsyncCheckpointRestoresOnOtherShardCountsExactly) {
  constexpr uint32_t kTrainers = 2;
  constexpr int kFirst = 10, kTotal = 16;
  const std::string root = MakeTempDir("async_reshard");
  {
    auto servers = StartCluster(3);
    ASSERT_TRUE(servers.ok()) << servers.status();
    RunTrainers(Addresses(*servers), kTrainers, kModel, kFirst, root + "/first",
                AsyncFlags("async"));
    ASSERT_NO_FATAL_FAILURE(
        CheckpointEveryShard(Addresses(*servers), kModel, kFirst, root + "/ckpt/" + kModel));
  }
  for (uint32_t shards : {2u, 5u}) {
    SCOPED_TRACE(absl::StrCat(shards, " shards"));
    auto servers = StartCluster(shards, {"--restore_from=" + root + "/ckpt"});
    ASSERT_TRUE(servers.ok()) << servers.status();
    for (const std::string& address : Addresses(*servers)) {
      const v1::InspectResponse r = Inspect(address);
      EXPECT_EQ(std::vector<int64_t>(r.trainer_steps().begin(), r.trainer_steps().end()),
                std::vector<int64_t>(kTrainers, kFirst));
    }
    const std::string out = absl::StrCat(root, "/resumed", shards);
    RunTrainers(Addresses(*servers), kTrainers, kModel, kTotal, out, AsyncFlags("async"));
    ExpectExactSgd(shards, kTrainers, kTotal, out);
    ExpectEveryPushOnce(Addresses(*servers), kTrainers, kTotal);
  }
}

}  // namespace
}  // namespace shardopt::testing
