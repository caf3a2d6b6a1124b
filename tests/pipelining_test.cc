// Pipelined steps seen from outside, through real shard processes with
// --step_timeline: with overlap_pull the trainer's pull reads the first
// ranges of a step before its last range has even arrived (push, update and
// pull overlap); without it, every range is pulled after every range
// arrived. The parameters are the same bits either way, and the same as a
// cluster that runs whole steps (--pipeline_range_elements=0). Ordering of
// recorded events only, no timing thresholds.
#include <algorithm>
#include <limits>
#include <thread>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

constexpr int64_t kElements = 3 << 20;  // 12 MiB: 24 ranges of 64Ki on each of 2 shards.
constexpr int kSteps = 6;

struct TrainingRun {
  std::vector<float> params;
  std::vector<v1::StepTimeline> timelines;  // Per step and shard.
};

TrainingRun Train(bool overlap_pull, const std::vector<std::string>& flags) {
  TrainingRun run;
  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers = StartCluster(2, flags);
  EXPECT_TRUE(servers.ok()) << servers.status();
  if (!servers.ok()) return run;
  TrainerClientOptions options;
  options.overlap_pull = overlap_pull;
  options.chunk_bytes = 1 << 20;
  std::unique_ptr<TrainerClient> client =
      TrainerClient::Connect(Addresses(*servers), options).value();
  ModelSpec spec;
  spec.model_id = "pipe";
  spec.tensors = {TensorSpec{"w", {kElements}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Adam(0.01);
  spec.num_trainers = 1;
  run.params.assign(kElements, 0.5f);
  EXPECT_TRUE(client->Register(spec, run.params).ok());
  std::vector<float> grad(kElements);
  for (int64_t step = 1; step <= kSteps; ++step) {
    for (int64_t i = 0; i < kElements; ++i) {
      grad[i] = static_cast<float>((i * 7 + step * 13) % 101 - 50) / 64.0f;
    }
    absl::StatusOr<StepResult> r = client->Step(step, grad, absl::MakeSpan(run.params));
    EXPECT_TRUE(r.ok()) << r.status();
    // Each step's timeline: whether the overlap shows depends on how the
    // two CPUs were shared in that step, so every step is looked at.
    for (const auto& server : *servers) {
      v1::InspectResponse inspect;
      EXPECT_TRUE(RawInspect(*NewStub(server->address()), "pipe", &inspect).ok());
      run.timelines.push_back(inspect.step_timeline());
    }
  }
  return run;
}

TEST(PipeliningTest, PullsOverlapThePushOnlyWithOverlapPullAndTheBitsDoNotChange) {
  const std::vector<std::string> flags = {"--step_timeline", "--pipeline_range_elements=65536"};
  const TrainingRun overlapped = Train(true, flags);
  const TrainingRun sequential = Train(false, flags);
  const TrainingRun whole = Train(true, {"--pipeline_range_elements=0"});
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(overlapped.params, whole.params);
  EXPECT_EQ(sequential.params, whole.params);

  bool overlap_seen = false;
  for (size_t i = 0; i < 2 * kSteps; ++i) {
    const int64_t step = static_cast<int64_t>(i / 2) + 1;
    const size_t shard = i % 2;
    for (const TrainingRun* run : {&overlapped, &sequential}) {
      ASSERT_EQ(run->timelines.size(), 2u * kSteps);
      const v1::StepTimeline& t = run->timelines[i];
      EXPECT_EQ(t.step(), step) << "shard " << shard;
      ASSERT_EQ(t.ranges_size(), 24) << "shard " << shard << ", step " << step;
      double last_arrival = -1;
      for (const v1::RangeTimeline& r : t.ranges()) {
        // Each range: arrived, then updated, then pulled.
        EXPECT_GE(r.arrived_ms(), 0);
        EXPECT_GE(r.updated_ms(), r.arrived_ms());
        EXPECT_GE(r.pulled_ms(), r.updated_ms());
        last_arrival = std::max(last_arrival, r.arrived_ms());
      }
      EXPECT_GE(t.last_push_committed_ms(), last_arrival);
      const double first_pull = t.ranges(0).pulled_ms();
      if (run == &sequential) {
        // The pull opens once the push returned: after every arrival.
        EXPECT_GT(first_pull, last_arrival) << "shard " << shard << ", step " << step;
      } else if (first_pull < last_arrival) {
        overlap_seen = true;
      }
    }
  }
  // (On each of 2 shards the first of 24 ranges is updated while 23 still
  // stream in; the trainer's open pull reads it at once, unless the CPUs
  // were busy elsewhere for the whole push: in one step of six at least.)
  EXPECT_TRUE(overlap_seen);
}

// Steps 1..`to` with both trainers, `lr_change_at` switching Adam's lr
// to 0.005 (both send it); for the bits of a job that took every step once.
std::vector<float> CleanRun(const ModelSpec& spec, int64_t to, int64_t lr_change_at,
                            const std::vector<float>& grad) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> clean = ServerProcess::Start(0, 1, {});
  EXPECT_TRUE(clean.ok()) << clean.status();
  if (!clean.ok()) return {};
  TrainerClientOptions options;
  std::vector<std::unique_ptr<TrainerClient>> fresh;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    options.trainer_rank = rank;
    fresh.push_back(TrainerClient::Connect({(*clean)->address()}, options).value());
  }
  std::vector<float> params(4096, 0.25f), other(4096);
  EXPECT_TRUE(fresh[0]->Register(spec, params).ok());
  EXPECT_TRUE(fresh[1]->Attach(spec).ok());
  for (int64_t step = 1; step <= to; ++step) {
    if (step == lr_change_at) {
      for (auto& t : fresh)
        EXPECT_TRUE(t->SetHyperparameters(step, OptimizerConfig::Adam(0.005), LrSchedule{}).ok());
    }
    std::thread t([&] { EXPECT_TRUE(fresh[1]->Step(step, grad, absl::MakeSpan(other)).ok()); });
    EXPECT_TRUE(fresh[0]->Step(step, grad, absl::MakeSpan(params)).ok());
    t.join();
  }
  return params;
}

// A job of 2 trainers (no journals) on one shard with a checkpoint every
// `checkpoint_every` steps (0: no checkpoints), `steps` steps taken whole,
// the newest checkpoint `checkpoint` committed; then step steps + 1 partly
// run: trainer 1's push whole, trainer 0's broken off after 1024 elements
// (16 ranges ran).
struct PartlyRunJob {
  std::unique_ptr<ServerProcess> server;
  std::unique_ptr<v1::ShardService::Stub> stub;
  ModelSpec spec;
  TrainerClientOptions options;
  std::vector<std::unique_ptr<TrainerClient>> trainers;
  std::vector<float> grad = std::vector<float>(4096, 0.125f);

  // Trainer `rank` restarted without a journal: a new client, attached.
  std::unique_ptr<TrainerClient> Restarted(uint32_t rank) {
    TrainerClientOptions restarted = options;
    restarted.trainer_rank = rank;
    std::unique_ptr<TrainerClient> client =
        TrainerClient::Connect({server->address()}, restarted).value();
    const absl::Status attached = client->Attach(spec);
    EXPECT_TRUE(attached.ok()) << attached;
    return client;
  }
};

void StartPartlyRunJob(const std::string& model_id, int checkpoint_every, int64_t steps,
                       int64_t checkpoint, PartlyRunJob* job) {
  std::vector<std::string> flags = {"--pipeline_range_elements=64"};
  if (checkpoint_every > 0) {
    flags.push_back("--checkpoint_dir=" + MakeTempDir(model_id));
    flags.push_back(absl::StrCat("--checkpoint_every=", checkpoint_every));
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(0, 1, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  job->server = std::move(*server);
  job->stub = NewStub(job->server->address());
  job->options.retry_budget = absl::Seconds(10);
  for (uint32_t rank = 0; rank < 2; ++rank) {
    job->options.trainer_rank = rank;
    job->trainers.push_back(TrainerClient::Connect({job->server->address()}, job->options).value());
  }
  job->spec.model_id = model_id;
  job->spec.tensors = {TensorSpec{"w", {4096}, DType::kFloat32}};
  job->spec.optimizer = OptimizerConfig::Adam(0.01);
  job->spec.num_trainers = 2;
  std::vector<float> params(4096, 0.25f), other(4096);
  ASSERT_TRUE(job->trainers[0]->Register(job->spec, params).ok());
  ASSERT_TRUE(job->trainers[1]->Attach(job->spec).ok());
  for (int64_t step = 1; step <= steps; ++step) {
    std::thread t(
        [&] { EXPECT_TRUE(job->trainers[1]->Step(step, job->grad, absl::MakeSpan(other)).ok()); });
    ASSERT_TRUE(job->trainers[0]->Step(step, job->grad, absl::MakeSpan(params)).ok());
    t.join();
  }
  if (checkpoint_every > 0) {
    v1::InspectResponse inspect;
    // (A checkpoint being written would hold the ranges back.)
    for (int i = 0; i < 500 && inspect.newest_committed_checkpoint() < checkpoint; ++i) {
      ASSERT_TRUE(RawInspect(*job->stub, model_id, &inspect).ok());
      absl::SleepFor(absl::Milliseconds(10));
    }
    ASSERT_EQ(inspect.newest_committed_checkpoint(), checkpoint);
  }
  ASSERT_TRUE(job->trainers[1]->Push(steps + 1, job->grad).ok());
  v1::PushHeader header;
  header.set_model_id(model_id);
  header.set_trainer_rank(0);
  header.set_step(steps + 1);
  header.set_num_elements(4096);
  const grpc::Status broken =
      RawPush(*job->stub, &header, {{0, FloatBytes(job->grad.data(), 1024)}});
  EXPECT_EQ(broken.error_code(), grpc::INVALID_ARGUMENT) << broken.error_message();
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(job->stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  ASSERT_TRUE(info.models(0).partly_run()) << info.DebugString();
}

// Both trainers `from` to `to` (steps), from `params` / `other`.
void BothStep(TrainerClient& a, TrainerClient& b, int64_t from, int64_t to,
              const std::vector<float>& grad, std::vector<float>* params,
              std::vector<float>* other) {
  for (int64_t step = from; step <= to; ++step) {
    std::thread t([&] { EXPECT_TRUE(b.Step(step, grad, absl::MakeSpan(*other)).ok()); });
    EXPECT_TRUE(a.Step(step, grad, absl::MakeSpan(*params)).ok());
    t.join();
  }
}

// A trainer dies in the middle of a pipelined step after some ranges ran
// with its gradient, and has no journal: restarted, it cannot get the
// version it would resume from (its ranges moved on), so PullToResume rolls
// the job back to the checkpoint of the step before by itself and resumes
// there at once (instead of waiting for its own push); the surviving
// trainer's step re-sends its push, and both go on to the bits of a job
// that took the step once.
TEST(PipeliningTest, ATrainerLostMidStepRollsTheJobBackOverThePartlyRunStepByItself) {
  PartlyRunJob job;
  ASSERT_NO_FATAL_FAILURE(StartPartlyRunJob("lost", 1, 1, 1, &job));
  // Trainer 1 is in its Step(2) meanwhile (the push acknowledged as a
  // duplicate, the pull waiting); after the rollback its shard has lost the
  // push, which the step sends again (its gradient was of version 1, which
  // the job is back at).
  std::vector<float> survivor_params(4096);
  absl::StatusOr<StepResult> survivor;
  std::thread survivor_step(
      [&] { survivor = job.trainers[1]->Step(2, job.grad, absl::MakeSpan(survivor_params)); });

  // Restarted without a journal, trainer 0 attaches and asks where to resume.
  std::unique_ptr<TrainerClient> restarted = job.Restarted(0);
  const absl::Time asked = absl::Now();
  std::vector<float> resumed(4096);
  absl::StatusOr<int64_t> resumed_at = restarted->PullToResume(absl::MakeSpan(resumed));
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5));  // At once, not after the retry budget.
  ASSERT_TRUE(resumed_at.ok()) << resumed_at.status();
  EXPECT_EQ(*resumed_at, 1);
  EXPECT_EQ(resumed, CleanRun(job.spec, 1, 0, job.grad));
  v1::InspectResponse inspect;
  ASSERT_TRUE(RawInspect(*job.stub, "lost", &inspect).ok());
  EXPECT_EQ(inspect.version(), 1);

  // Both go on: step 2 applied once, from version 1's values.
  const absl::StatusOr<StepResult> restarted_step =
      restarted->Step(2, job.grad, absl::MakeSpan(resumed));
  survivor_step.join();
  ASSERT_TRUE(restarted_step.ok()) << restarted_step.status();
  ASSERT_TRUE(survivor.ok()) << survivor.status();
  EXPECT_EQ(survivor->version, 2);
  EXPECT_EQ(survivor_params, resumed);
  EXPECT_EQ(resumed, CleanRun(job.spec, 2, 0, job.grad));
}

// The same with the newest checkpoint two steps back: the restarted trainer
// resumes there (its registration follows: it can schedule a change for the
// next step), the survivor's step ends with the rollback (its push of the
// step in between is gone), and both take the two steps again.
TEST(PipeliningTest, ALostPushRollsBackPastAnOlderCheckpointAndBothTrainersRedoTheSteps) {
  PartlyRunJob job;
  ASSERT_NO_FATAL_FAILURE(StartPartlyRunJob("lost_old", 2, 3, 2, &job));
  std::vector<float> params(4096), other(4096);
  absl::StatusOr<StepResult> survivor;
  std::thread survivor_step(
      [&] { survivor = job.trainers[1]->Step(4, job.grad, absl::MakeSpan(other)); });
  std::unique_ptr<TrainerClient> restarted = job.Restarted(0);
  absl::StatusOr<int64_t> resumed_at = restarted->PullToResume(absl::MakeSpan(params));
  ASSERT_TRUE(resumed_at.ok()) << resumed_at.status();
  EXPECT_EQ(*resumed_at, 2);
  EXPECT_EQ(restarted->registered_version(), 2);
  survivor_step.join();
  ASSERT_FALSE(survivor.ok());
  ASSERT_EQ(job.trainers[1]->rolled_back_to(), std::optional<int64_t>(2)) << survivor.status();
  ASSERT_EQ(job.trainers[1]->PullToResume(absl::MakeSpan(other)).value(), 2);
  for (TrainerClient* t : {restarted.get(), job.trainers[1].get()}) {
    const absl::Status changed =
        t->SetHyperparameters(3, OptimizerConfig::Adam(0.005), LrSchedule{});
    ASSERT_TRUE(changed.ok()) << changed;
  }
  BothStep(*restarted, *job.trainers[1], 3, 4, job.grad, &params, &other);
  EXPECT_EQ(params, other);
  EXPECT_EQ(params, CleanRun(job.spec, 4, 3, job.grad));
}

// Both trainers restart without journals. The one whose push was whole
// comes first: it cannot know whether the other still holds its push, so it
// rolls the job back; the other, attached before that rollback, follows it.
TEST(PipeliningTest, BothTrainersRestartWithoutJournalsTheFirstRollsBackTheSecondFollows) {
  PartlyRunJob job;
  ASSERT_NO_FATAL_FAILURE(StartPartlyRunJob("both_restart", 2, 3, 2, &job));
  job.trainers.clear();
  std::vector<std::unique_ptr<TrainerClient>> restarted;
  for (uint32_t rank = 0; rank < 2; ++rank) {
    restarted.push_back(job.Restarted(rank));
    EXPECT_EQ(restarted.back()->registered_version(), 3);
  }
  std::vector<float> params(4096), other(4096);
  absl::StatusOr<int64_t> first = restarted[1]->PullToResume(absl::MakeSpan(other));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(*first, 2);
  absl::StatusOr<int64_t> second = restarted[0]->PullToResume(absl::MakeSpan(params));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(*second, 2);
  EXPECT_EQ(restarted[0]->registered_version(), 2);
  BothStep(*restarted[0], *restarted[1], 3, 4, job.grad, &params, &other);
  EXPECT_EQ(params, other);
  EXPECT_EQ(params, CleanRun(job.spec, 4, 0, job.grad));
}

// A trainer with a journal in the same place sends its push again instead:
// no rollback, and the step ends once the other trainer's push is whole.
TEST(PipeliningTest, AJournaledTrainerResumesOverAPartlyRunStepWithoutARollBack) {
  const std::string checkpoints = MakeTempDir("pipeline_journal_ckpt");
  const std::string journal = MakeTempDir("pipeline_journal");
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(
      0, 1,
      {"--pipeline_range_elements=64", "--checkpoint_dir=" + checkpoints, "--checkpoint_every=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  TrainerClientOptions options;
  options.retry_budget = absl::Seconds(10);
  TrainerClientOptions journaled = options;
  journaled.journal_path = journal;
  journaled.trainer_rank = 1;
  std::unique_ptr<TrainerClient> other_trainer =
      TrainerClient::Connect({(*server)->address()}, options).value();
  std::unique_ptr<TrainerClient> first =
      TrainerClient::Connect({(*server)->address()}, journaled).value();
  ModelSpec spec;
  spec.model_id = "journaled";
  spec.tensors = {TensorSpec{"w", {4096}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Adam(0.01);
  spec.num_trainers = 2;
  std::vector<float> params(4096, 0.25f), grad(4096, 0.125f), other(4096);
  ASSERT_TRUE(other_trainer->Register(spec, params).ok());
  ASSERT_TRUE(first->Attach(spec).ok());
  std::thread t([&] { EXPECT_TRUE(other_trainer->Step(1, grad, absl::MakeSpan(other)).ok()); });
  ASSERT_TRUE(first->Step(1, grad, absl::MakeSpan(params)).ok());
  t.join();
  // Step 2: trainer 1 (journaled) pushes all of it, trainer 0's push breaks
  // off after 1024 elements: the first 16 ranges run.
  std::unique_ptr<v1::ShardService::Stub> stub = NewStub((*server)->address());
  v1::InspectResponse saved;
  for (int i = 0; i < 500 && saved.newest_committed_checkpoint() < 1; ++i) {
    ASSERT_TRUE(RawInspect(*stub, "journaled", &saved).ok());
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_TRUE(first->Push(2, grad).ok());
  v1::PushHeader header;
  header.set_model_id("journaled");
  header.set_trainer_rank(0);
  header.set_step(2);
  header.set_num_elements(4096);
  RawPush(*stub, &header, {{0, FloatBytes(grad.data(), 1024)}});
  v1::InspectResponse before;
  ASSERT_TRUE(RawInspect(*stub, "journaled", &before).ok());
  {
    grpc::ClientContext context;
    v1::ServerInfo info;
    ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    ASSERT_EQ(info.models_size(), 1);
    ASSERT_TRUE(info.models(0).partly_run()) << info.DebugString();
  }
  first.reset();  // Trainer 1 "dies" and restarts on its journal.
  std::unique_ptr<TrainerClient> restarted =
      TrainerClient::Connect({(*server)->address()}, journaled).value();
  ASSERT_TRUE(restarted->Attach(spec).ok());
  absl::StatusOr<int64_t> resumed_at;
  std::thread resume([&] { resumed_at = restarted->PullToResume(absl::MakeSpan(params)); });
  // Once the restarted trainer has sent its journaled push again (it found
  // the step partly run), trainer 0 (alive) sends its step 2 again, whole.
  for (int i = 0; i < 1000 && restarted->replayed_pushes() == 0; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(restarted->replayed_pushes(), 1);
  ASSERT_TRUE(other_trainer->Step(2, grad, absl::MakeSpan(other)).ok());
  resume.join();
  ASSERT_TRUE(resumed_at.ok()) << resumed_at.status();
  EXPECT_EQ(*resumed_at, 2);
  EXPECT_EQ(params, other);
  v1::InspectResponse after;
  ASSERT_TRUE(RawInspect(*stub, "journaled", &after).ok());
  EXPECT_EQ(after.incarnation(), before.incarnation());  // Never rolled back.
  EXPECT_EQ(params, CleanRun(spec, 2, 0, grad));
}

// Without a checkpoint to go back to, the restarted trainer of the same
// situation is told at once what is missing.
TEST(PipeliningTest, ATrainerLostMidStepWithoutACheckpointIsToldWhatIsMissing) {
  PartlyRunJob job;
  ASSERT_NO_FATAL_FAILURE(StartPartlyRunJob("lost_nockpt", 0, 0, -1, &job));
  std::unique_ptr<TrainerClient> restarted = job.Restarted(0);
  const absl::Time asked = absl::Now();
  std::vector<float> resumed(4096);
  const absl::Status told = restarted->PullToResume(absl::MakeSpan(resumed)).status();
  EXPECT_LT(absl::Now() - asked, absl::Seconds(5));
  EXPECT_EQ(told.code(), absl::StatusCode::kFailedPrecondition) << told;
  EXPECT_TRUE(absl::StrContains(told.message(), "ran part of step 1")) << told;
  EXPECT_TRUE(absl::StrContains(told.message(), "no committed checkpoint")) << told;
}

// Gradient of `step` for `rank`: exactly representable, different per rank.
void FillGradient(int64_t step, uint32_t rank, std::vector<float>* grad) {
  for (size_t i = 0; i < grad->size(); ++i) {
    (*grad)[i] = static_cast<float>((i * 7 + step * 13 + rank * 5) % 101 - 50) / 64.0f;
  }
}

// Streamed pushes (the gradient sent bucket by bucket while it is computed,
// as shardopt.torch's backward hooks do): the data reaches the shards before
// the step is finished, the bits equal Step's, a NaN in the last bucket
// leaves every shard as it was, and the step can be retried.
TEST(PipeliningTest, StreamedPushesArriveBeforeTheStepEndsAndGiveStepsBits) {
  constexpr int64_t kSize = 1 << 18;
  const auto train = [&](bool streamed, std::vector<float>* after4) {
    std::vector<float> own;
    std::vector<float>* params = &own;
    absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers = StartCluster(2);
    ASSERT_TRUE(servers.ok()) << servers.status();
    std::vector<std::unique_ptr<TrainerClient>> trainers;
    for (uint32_t rank = 0; rank < 2; ++rank) {
      TrainerClientOptions options;
      options.trainer_rank = rank;
      options.chunk_bytes = 64 << 10;
      trainers.push_back(TrainerClient::Connect(Addresses(*servers), options).value());
    }
    ModelSpec spec;
    spec.model_id = "streamed";
    spec.tensors = {TensorSpec{"a", {kSize / 2}, DType::kFloat32},
                    TensorSpec{"b", {kSize / 2}, DType::kFloat32}};
    spec.optimizer = OptimizerConfig::AdamW(0.01);
    spec.num_trainers = 2;
    params->assign(kSize, 0.5f);
    std::vector<float> params1 = *params;
    ASSERT_TRUE(trainers[0]->Register(spec, *params).ok());
    ASSERT_TRUE(trainers[1]->Attach(spec).ok());
    std::unique_ptr<v1::ShardService::Stub> stub = NewStub((*servers)[1]->address());
    std::vector<float> grad0(kSize), grad1(kSize);
    for (int64_t step = 1; step <= 4; ++step) {
      FillGradient(step, 0, &grad0);
      FillGradient(step, 1, &grad1);
      // Trainer 1's push first, whole: what shard 1 holds before trainer 0
      // starts is then known.
      ASSERT_TRUE(trainers[1]->Push(step, grad1).ok());
      std::thread other([&] {
        EXPECT_EQ(trainers[1]->Pull(step, absl::MakeSpan(params1)).value_or(-1), step);
      });
      if (!streamed) {
        EXPECT_TRUE(trainers[0]->Step(step, grad0, absl::MakeSpan(*params)).ok());
      } else {
        v1::InspectResponse before;
        ASSERT_TRUE(RawInspect(*stub, "streamed", &before).ok());
        ASSERT_TRUE(trainers[0]->BeginStreamedPush(step, grad0).ok());
        // Buckets in backward order: the last tensor's gradient first.
        for (int64_t end = kSize; end > 0; end -= kSize / 8) {
          trainers[0]->MarkGradientReady(end - kSize / 8, end);
        }
        // Before the step is finished, shard 1 (the second half) has this
        // trainer's whole gradient of it.
        const uint64_t expected =
            before.bytes().gradient_bytes_received() + (kSize / 2) * sizeof(float);
        v1::InspectResponse now;
        for (int i = 0; i < 1000; ++i) {
          ASSERT_TRUE(RawInspect(*stub, "streamed", &now).ok());
          if (now.bytes().gradient_bytes_received() >= expected) break;
          absl::SleepFor(absl::Milliseconds(5));
        }
        EXPECT_GE(now.bytes().gradient_bytes_received(), expected) << "step " << step;
        absl::StatusOr<StepResult> r =
            trainers[0]->FinishStreamedStep(step, grad0, absl::MakeSpan(*params));
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) {
          EXPECT_EQ(r->version, step);
          // Shard 1's part at least went out before the step was finished.
          EXPECT_GE(r->bytes_pushed_early, (kSize / 2) * sizeof(float));
          EXPECT_LE(r->bytes_pushed_early, r->bytes_pushed);
        }
      }
      other.join();
      EXPECT_EQ(*params, params1) << "step " << step;
    }
    *after4 = *params;
    if (!streamed) return;
    EXPECT_EQ(trainers[0]->streamed_pushes(), 4);

    // A NaN in the last bucket: refused before any stream ends, nothing used.
    FillGradient(5, 0, &grad0);
    grad0[3] = std::numeric_limits<float>::quiet_NaN();
    ASSERT_TRUE(trainers[0]->BeginStreamedPush(5, grad0).ok());
    trainers[0]->MarkGradientReady(kSize / 2, kSize);
    const absl::Status refused =
        trainers[0]->FinishStreamedStep(5, grad0, absl::MakeSpan(*params)).status();
    EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
    for (const auto& server : *servers) {
      v1::InspectResponse inspect;
      ASSERT_TRUE(RawInspect(*NewStub(server->address()), "streamed", &inspect).ok());
      EXPECT_EQ(inspect.version(), 4);
      EXPECT_EQ(inspect.trainers_pushed_size(), 0);  // Neither shard holds the push.
    }
    // The step again, clean: it completes as usual.
    grad0[3] = 0;
    FillGradient(5, 1, &grad1);
    std::thread other([&] { EXPECT_TRUE(trainers[1]->Step(5, grad1, absl::MakeSpan(params1)).ok()); });
    ASSERT_TRUE(trainers[0]->BeginStreamedPush(5, grad0).ok());
    EXPECT_TRUE(trainers[0]->FinishStreamedStep(5, grad0, absl::MakeSpan(*params)).ok());
    other.join();
    EXPECT_EQ(*params, params1);
  };
  std::vector<float> stepped, streamed;
  train(false, &stepped);
  train(true, &streamed);
  ASSERT_FALSE(HasFailure());
  EXPECT_EQ(streamed, stepped);  // After step 4, taken in each run.
}

// A streamed push stays open while backward runs: a backward pass longer
// than rpc_timeout (here 3 s against 1 s, which would end the attempt and
// send everything again) completes in its one attempt (streamed_push_timeout:
// the shard receives the gradient exactly once), with Step's bits.
TEST(PipeliningTest, AStreamedPushOutlastsTheRpcTimeoutWhileTheGradientIsComputed) {
  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(1);
  options.chunk_bytes = 8 << 10;  // 4 chunks: the first two go before the wait.
  std::unique_ptr<TrainerClient> trainer =
      TrainerClient::Connect(Addresses(*servers), options).value();
  ModelSpec spec;
  spec.model_id = "slow_backward";
  spec.tensors = {TensorSpec{"w", {8192}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Adam(0.01);
  spec.num_trainers = 1;
  std::vector<float> params(8192, 0.5f), grad(8192);
  FillGradient(1, 0, &grad);
  ASSERT_TRUE(trainer->Register(spec, params).ok());
  ASSERT_TRUE(trainer->BeginStreamedPush(1, grad).ok());
  trainer->MarkGradientReady(0, 4096);
  absl::SleepFor(absl::Seconds(3));  // The rest of backward.
  trainer->MarkGradientReady(4096, 8192);
  absl::StatusOr<StepResult> r = trainer->FinishStreamedStep(1, grad, absl::MakeSpan(params));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(trainer->streamed_pushes(), 1);  // Not pushed again whole.
  v1::InspectResponse inspect;
  ASSERT_TRUE(RawInspect(*NewStub((*servers)[0]->address()), "slow_backward", &inspect).ok());
  EXPECT_EQ(inspect.bytes().gradient_bytes_received(), 8192 * sizeof(float));
  EXPECT_GE(r->bytes_pushed_early, 4096 * sizeof(float));

  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> clean = StartCluster(1);
  ASSERT_TRUE(clean.ok()) << clean.status();
  std::unique_ptr<TrainerClient> reference =
      TrainerClient::Connect(Addresses(*clean), options).value();
  std::vector<float> expected(8192, 0.5f);
  ASSERT_TRUE(reference->Register(spec, expected).ok());
  ASSERT_TRUE(reference->Step(1, grad, absl::MakeSpan(expected)).ok());
  EXPECT_EQ(params, expected);
}

}  // namespace
}  // namespace shardopt::testing
