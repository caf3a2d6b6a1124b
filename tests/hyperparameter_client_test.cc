// Hyperparameter changes through the trainer library against real shard
// processes: a schedule and a live change agree on every shard, a restarted
// trainer may repeat its change, a cancel of a pushed step is refused, a
// change that reached only some shards reaches the others, and a trainer
// keeps its pending changes within what a shard takes.
#include <signal.h>

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/shard_queries.h"
#include "tests/support/synthetic.h"
#include "tests/support/two_shard_cluster.h"

namespace shardopt::testing {
namespace {

class HyperparameterClientTest : public TwoShardClusterTest {};

TEST_F(HyperparameterClientTest, ScheduleAndLiveHyperparameterChangeAgreeOnEveryShard) {
  ModelSpec spec = SyntheticModelSpec("live", OptimizerConfig::AdamW(0.02), 2);
  spec.lr_schedule.kind = LrSchedule::Kind::kWarmupLinearDecay;
  spec.lr_schedule.warmup_steps = 3;
  spec.lr_schedule.total_steps = 20;
  auto rank0 = Connect(0), rank1 = Connect(1);
  const ModelLayout layout = rank0->LayoutFor(spec).value();
  std::vector<float> params0 = SyntheticInitialParams(layout, 9);
  ASSERT_TRUE(rank0->Register(spec, params0).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  std::vector<float> params1 = params0, grad0(params0.size()), grad1(params0.size());
  auto step = [&](int64_t k) {
    SyntheticGradient(layout, params0, 0, k, 9, absl::MakeSpan(grad0));
    SyntheticGradient(layout, params1, 1, k, 9, absl::MakeSpan(grad1));
    ASSERT_TRUE(rank0->Push(k, grad0).ok());
    ASSERT_TRUE(rank1->Push(k, grad1).ok());
    ASSERT_EQ(*rank0->Pull(k, absl::MakeSpan(params0)), k);
    ASSERT_EQ(*rank1->Pull(k, absl::MakeSpan(params1)), k);
  };
  for (int64_t k = 1; k <= 4; ++k) step(k);

  // From step 7: another lr and weight decay, and a cosine schedule.
  OptimizerConfig changed = OptimizerConfig::AdamW(0.005);
  changed.weight_decay = 0.1;
  LrSchedule cosine;
  cosine.kind = LrSchedule::Kind::kWarmupCosine;
  cosine.warmup_steps = 0;
  cosine.total_steps = 12;
  cosine.min_lr = 1e-4;
  ASSERT_TRUE(rank0->SetHyperparameters(7, changed, cosine).ok());
  ASSERT_TRUE(rank1->SetHyperparameters(7, changed, cosine).ok());  // Repeat: harmless.
  for (const auto& server : servers_) {
    const v1::InspectResponse info = InspectOf(server->address(), "live");
    ASSERT_EQ(info.scheduled_changes_size(), 1);
    EXPECT_EQ(info.scheduled_changes(0), 7);
    EXPECT_DOUBLE_EQ(info.last_lr(), spec.lr_schedule.LearningRate(0.02, 4));
  }
  // Refused: a step already applied, another change for step 7, a new kind.
  EXPECT_EQ(rank0->SetHyperparameters(4, changed, cosine).code(),
            absl::StatusCode::kFailedPrecondition);
  OptimizerConfig other = changed;
  other.lr = 0.5;
  EXPECT_EQ(rank0->SetHyperparameters(7, other, cosine).code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(rank0->SetHyperparameters(9, OptimizerConfig::Adam(0.1), cosine).code(),
            absl::StatusCode::kFailedPrecondition);

  for (int64_t k = 5; k <= 10; ++k) step(k);
  ReferenceOptions reference;
  reference.changes[7] = {changed, cosine};
  const std::vector<float> expected = ReferenceRun(spec, layout, 10, 9, reference);
  EXPECT_EQ(std::memcmp(params0.data(), expected.data(), expected.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(params1.data(), expected.data(), expected.size() * sizeof(float)), 0);
  for (const auto& server : servers_) {
    const v1::InspectResponse info = InspectOf(server->address(), "live");
    EXPECT_EQ(info.scheduled_changes_size(), 0);
    EXPECT_DOUBLE_EQ(info.last_lr(), cosine.LearningRate(0.005, 10));
    EXPECT_DOUBLE_EQ(info.current_optimizer().adamw().weight_decay(), 0.1);
    EXPECT_EQ(info.lr_schedule().kind(), v1::LrSchedule::LR_SCHEDULE_WARMUP_COSINE);
  }
  // Without the change the run would differ: the test can tell.
  const std::vector<float> unchanged = ReferenceRun(spec, layout, 10, 9);
  EXPECT_NE(std::memcmp(params0.data(), unchanged.data(), unchanged.size() * sizeof(float)), 0);
}

// A trainer that dies after pushing a step the job has not finished (the
// other trainer has not pushed it yet) comes back on its journal and, as
// its program does, asks for that step's change again: an identical repeat
// goes through, another change for that step is still refused.
TEST_F(HyperparameterClientTest, ARestartedTrainerMayRepeatItsChangeForAStepItPushed) {
  const ModelSpec spec = SyntheticModelSpec("repeat", OptimizerConfig::AdamW(0.02), 2);
  TrainerClientOptions journaled;
  journaled.trainer_rank = 1;
  journaled.rpc_timeout = absl::Seconds(10);
  journaled.retry_budget = absl::Seconds(5);
  journaled.journal_path = MakeTempDir("repeat_journal");
  auto rank0 = Connect(0);
  auto rank1 = TrainerClient::Connect(Addresses(servers_), journaled).value();
  const ModelLayout layout = rank0->LayoutFor(spec).value();
  std::vector<float> params0 = SyntheticInitialParams(layout, 4);
  ASSERT_TRUE(rank0->Register(spec, params0).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  std::vector<float> params1 = params0, grad0(params0.size()), grad1(params0.size());
  for (int64_t k = 1; k <= 2; ++k) {
    SyntheticGradient(layout, params0, 0, k, 4, absl::MakeSpan(grad0));
    SyntheticGradient(layout, params1, 1, k, 4, absl::MakeSpan(grad1));
    ASSERT_TRUE(rank0->Push(k, grad0).ok());
    ASSERT_TRUE(rank1->Push(k, grad1).ok());
    ASSERT_EQ(*rank0->Pull(k, absl::MakeSpan(params0)), k);
    ASSERT_EQ(*rank1->Pull(k, absl::MakeSpan(params1)), k);
  }
  const OptimizerConfig changed = OptimizerConfig::AdamW(0.005);
  ASSERT_TRUE(rank1->SetHyperparameters(3, changed, LrSchedule()).ok());
  SyntheticGradient(layout, params1, 1, 3, 4, absl::MakeSpan(grad1));
  ASSERT_TRUE(rank1->Push(3, grad1).ok());
  rank1.reset();  // Dead after its push of step 3.

  auto restarted = TrainerClient::Connect(Addresses(servers_), journaled).value();
  ASSERT_TRUE(restarted->Attach(spec).ok());
  EXPECT_EQ(restarted->registered_version(), 2);
  // Its step 3 is not applied yet (rank 0 has not pushed it): it goes on from 2.
  EXPECT_EQ(restarted->PullToResume(absl::MakeSpan(params1)).value(), 2);
  EXPECT_TRUE(restarted->SetHyperparameters(3, changed, LrSchedule()).ok());
  OptimizerConfig other = changed;
  other.lr = 0.5;
  const absl::Status refused = restarted->SetHyperparameters(3, other, LrSchedule());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(absl::StrContains(refused.message(), "this trainer pushed step 3")) << refused;
  ASSERT_TRUE(rank0->SetHyperparameters(3, changed, LrSchedule()).ok());
  SyntheticGradient(layout, params0, 0, 3, 4, absl::MakeSpan(grad0));
  ASSERT_TRUE(rank0->Push(3, grad0).ok());
  ASSERT_TRUE(restarted->Push(3, grad1).ok());
  ASSERT_EQ(*rank0->Pull(3, absl::MakeSpan(params0)), 3);
  ASSERT_EQ(*restarted->Pull(3, absl::MakeSpan(params1)), 3);
  ReferenceOptions reference;
  reference.changes[3] = {changed, LrSchedule()};
  const std::vector<float> expected = ReferenceRun(spec, layout, 3, 4, reference);
  EXPECT_EQ(std::memcmp(params0.data(), expected.data(), expected.size() * sizeof(float)), 0);
  EXPECT_EQ(std::memcmp(params1.data(), expected.data(), expected.size() * sizeof(float)), 0);
}

// A cancel, like a change, is refused for a step this trainer pushed: the
// step may have started on some shards (every trainer's push in there),
// which would keep the change while the others dropped it.
TEST(HyperparameterOwnClusterTest, ACancelOfAStepThisTrainerPushedIsRefused) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  ModelSpec spec = SyntheticModelSpec("cancel", OptimizerConfig::Sgd(0.5), 1);
  auto client = TrainerClient::Connect({(*server)->address()}, TrainerClientOptions()).value();
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 5);
  ASSERT_TRUE(client->Register(spec, params).ok());
  ASSERT_TRUE(client->SetHyperparameters(2, OptimizerConfig::Sgd(0.25), LrSchedule{}).ok());
  ASSERT_TRUE(client->SetHyperparameters(3, OptimizerConfig::Sgd(0.125), LrSchedule{}).ok());
  std::vector<float> grad(params.size(), 0.0f);
  ASSERT_TRUE(client->Push(1, grad).ok());
  ASSERT_TRUE(client->Pull(1, absl::MakeSpan(params)).ok());
  ASSERT_TRUE(client->Push(2, grad).ok());
  const absl::Status refused = client->CancelHyperparameters(2);
  EXPECT_TRUE(absl::IsFailedPrecondition(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "this trainer pushed step 2")) << refused;
  EXPECT_TRUE(client->CancelHyperparameters(3).ok());
}

// A change that reached only some shards (another was down) fails, naming
// the shards that took it, and is recorded all the same: the restarted
// shard gets it (recovery, and the next push carries it), so the shards do
// not go on with different hyperparameters when the caller does not repeat
// the call.
TEST(HyperparameterOwnClusterTest, AChangeThatReachedSomeShardsReachesTheOthers) {
  const std::string ckpt = MakeTempDir("partial_change_ckpt");
  // Only the registration's checkpoint: the restarted shard is at step 0.
  const std::vector<std::string> flags = CrashRecoveryFlags(ckpt, 1000);
  auto servers = StartCluster(2, flags);
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::vector<std::string> addresses = Addresses(*servers);
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(2);
  options.retry_budget = absl::Seconds(2);
  options.replay_steps = 8;
  auto client = TrainerClient::Connect(addresses, options).value();
  const ModelSpec spec = SyntheticModelSpec("partial", OptimizerConfig::AdamW(0.02), 1);
  const ModelLayout layout = client->LayoutFor(spec).value();
  std::vector<float> params = SyntheticInitialParams(layout, 6), grad(params.size());
  ASSERT_TRUE(client->Register(spec, params).ok());
  auto step = [&](int64_t k) {
    SyntheticGradient(layout, params, 0, k, 6, absl::MakeSpan(grad));
    absl::StatusOr<StepResult> r = client->Step(k, grad, absl::MakeSpan(params));
    ASSERT_TRUE(r.ok()) << "step " << k << ": " << r.status();
  };
  for (int64_t k = 1; k <= 2; ++k) step(k);

  (*servers)[1]->process().Signal(SIGKILL);
  ASSERT_TRUE((*servers)[1]->process().Wait(absl::Seconds(10)).has_value());
  const OptimizerConfig changed = OptimizerConfig::AdamW(0.004);
  const absl::Status partial = client->SetHyperparameters(4, changed, LrSchedule());
  ASSERT_FALSE(partial.ok());
  EXPECT_TRUE(absl::StrContains(partial.message(), "shard 1")) << partial;
  EXPECT_TRUE(absl::StrContains(partial.message(), "shard 0 took it")) << partial;
  EXPECT_EQ(InspectOf(addresses[0], "partial").scheduled_changes_size(), 1);

  auto restarted = StartServerAt(addresses[1], 1, 2, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_EQ(InspectOf(addresses[1], "partial").version(), 0);
  for (int64_t k = 3; k <= 6; ++k) step(k);
  EXPECT_EQ(client->replayed_pushes(), 2);

  ReferenceOptions reference;
  reference.changes[4] = {changed, LrSchedule()};
  const std::vector<float> expected = ReferenceRun(spec, layout, 6, 6, reference);
  EXPECT_EQ(std::memcmp(params.data(), expected.data(), expected.size() * sizeof(float)), 0);
  for (const std::string& address : addresses) {
    EXPECT_DOUBLE_EQ(InspectOf(address, "partial").last_lr(), 0.004) << address;
  }
}

// Every push carries its trainer's pending changes, and a shard takes at
// most kMaxPendingHyperparameterChanges: the trainer refuses one more itself.
TEST(HyperparameterOwnClusterTest, ATrainerKeepsItsPendingChangesWithinWhatAShardTakes) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  ModelSpec spec = SyntheticModelSpec("many", OptimizerConfig::Sgd(0.5), 1);
  auto client = TrainerClient::Connect({(*server)->address()}, TrainerClientOptions()).value();
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 5);
  ASSERT_TRUE(client->Register(spec, params).ok());
  for (size_t i = 0; i < kMaxPendingHyperparameterChanges; ++i) {
    const absl::Status s =
        client->SetHyperparameters(2 + i, OptimizerConfig::Sgd(0.25), LrSchedule{});
    ASSERT_TRUE(s.ok()) << i << ": " << s;
  }
  const absl::Status refused =
      client->SetHyperparameters(5000, OptimizerConfig::Sgd(0.25), LrSchedule{});
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  EXPECT_TRUE(absl::StrContains(refused.message(), "this trainer has 1024")) << refused;
  // A repeat is no new one; the pushes (carrying all of them) go through.
  EXPECT_TRUE(client->SetHyperparameters(2, OptimizerConfig::Sgd(0.25), LrSchedule{}).ok());
  std::vector<float> grad(params.size(), 0.0f);
  absl::StatusOr<StepResult> first = client->Step(1, grad, absl::MakeSpan(params));
  ASSERT_TRUE(first.ok()) << first.status();
  absl::StatusOr<StepResult> second = client->Step(2, grad, absl::MakeSpan(params));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_DOUBLE_EQ(second->lr, 0.25);
  // Step 2's change took effect: there is room for one more.
  EXPECT_TRUE(client->SetHyperparameters(5000, OptimizerConfig::Sgd(0.25), LrSchedule{}).ok());
}

// Before Register or Attach there is no model to change: said, not a crash
// (a change used to read the push history, which only a model has).
TEST_F(HyperparameterClientTest, AChangeBeforeRegisteringIsRefused) {
  auto rank0 = Connect(0);
  for (const absl::Status& s :
       {rank0->SetHyperparameters(5, OptimizerConfig::AdamW(0.01), LrSchedule()),
        rank0->CancelHyperparameters(5)}) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("call Register or Attach first"), std::string::npos) << s;
  }
}

// A change one shard refused (its schedule is full) while another took it is
// not recorded: every later push would carry it to the shard that refuses
// it, and that shard would refuse the pushes too. (Whether the other shard's
// answer comes before the refusal cancels it is a race: the rule itself is
// //client:partial_change_test's.)
TEST_F(HyperparameterClientTest, AChangeAShardRefusedIsNotCarried) {
  const ModelSpec spec = SyntheticModelSpec("full", OptimizerConfig::Sgd(0.5), 1);
  auto client = Connect(0);
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 3);
  ASSERT_TRUE(client->Register(spec, params).ok());
  auto shard1 = NewStub(servers_[1]->address());
  for (size_t i = 0; i < kMaxPendingHyperparameterChanges; ++i) {
    v1::SetHyperparametersRequest request;
    request.set_model_id("full");
    request.set_effective_step(100 + i);
    *request.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Sgd(0.25));
    grpc::ClientContext context;
    v1::SetHyperparametersResponse response;
    ASSERT_TRUE(shard1->SetHyperparameters(&context, request, &response).ok()) << i;
  }
  const absl::Status refused =
      client->SetHyperparameters(5, OptimizerConfig::Sgd(0.125), LrSchedule{});
  EXPECT_TRUE(absl::IsResourceExhausted(refused)) << refused;
  std::vector<float> grad(params.size(), 0.0f);
  const absl::StatusOr<StepResult> step = client->Step(1, grad, absl::MakeSpan(params));
  EXPECT_TRUE(step.ok()) << "the refused change went with the push: " << step.status();
}

}  // namespace
}  // namespace shardopt::testing
