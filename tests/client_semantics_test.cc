// The trainer library against real shard processes, on the paths where the
// cluster-wide guarantees live: a repeated push (lost reply), a NaN anywhere,
// a trainer that fell behind, shards that disagree, equal configs spelled
// differently, and a server that answers a large push early.
#include <grpcpp/grpcpp.h>
#include <signal.h>

#include <cmath>
#include <cstring>
#include <iostream>
#include <limits>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "client/trainer_client.h"
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

class ClientSemanticsTest : public TwoShardClusterTest {};

TEST_F(ClientSemanticsTest, RepeatedPushIsCountedAsDuplicateAndTheStepStillCompletes) {
  const ModelSpec spec = SyntheticModelSpec("dup", OptimizerConfig::Adam(0.01), 2);
  auto rank0 = Connect(0), rank1 = Connect(1);
  std::vector<float> params = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 5);
  ASSERT_TRUE(rank0->Register(spec, params).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  std::vector<float> grad(params.size()), params1 = params;
  SyntheticGradient(rank0->layout(), params, 0, 1, 5, absl::MakeSpan(grad));

  absl::StatusOr<StepResult> first = rank0->Push(1, grad);
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_EQ(first->duplicate_pushes, 0);
  EXPECT_FALSE(first->applied_here);
  // The reply was "lost": the trainer pushes again. Nothing is added twice.
  absl::StatusOr<StepResult> again = rank0->Push(1, grad);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->duplicate_pushes, 2);

  std::vector<float> grad1(params.size());
  SyntheticGradient(rank1->layout(), params1, 1, 1, 5, absl::MakeSpan(grad1));
  absl::StatusOr<StepResult> last = rank1->Step(1, grad1, absl::MakeSpan(params1));
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->applied_here);
  EXPECT_EQ(last->version, 1);
  // Pushing an applied step again: acknowledged, still nothing added.
  absl::StatusOr<StepResult> late = rank0->Push(1, grad);
  ASSERT_TRUE(late.ok());
  EXPECT_EQ(late->duplicate_pushes, 2);
  ASSERT_EQ(*rank0->Pull(1, absl::MakeSpan(params)), 1);
  EXPECT_EQ(std::memcmp(params.data(), params1.data(), params.size() * sizeof(float)), 0);

  // Exactly the single-process result of one step on the mean gradient.
  const std::vector<float> expected = ReferenceRun(spec, rank0->layout(), 1, 5);
  EXPECT_EQ(std::memcmp(params.data(), expected.data(), params.size() * sizeof(float)), 0);
}

// With gradient control (clipping here) Push() then Pull() is Step(): the
// pull takes the step's decision. Both trainers with Push + Pull (each
// waited for a decision that no call sent, until its retry budget ran out),
// then one with Push + Pull and the other with Step: the same bits as two
// Steps.
TEST_F(ClientSemanticsTest, PushThenPullTakesTheDecisionAsStepDoes) {
  ModelSpec spec = SyntheticModelSpec("push_pull_clip", OptimizerConfig::Adam(0.01), 2);
  spec.max_grad_norm = 0.01;  // (The synthetic gradients' norm is far above.)
  auto rank0 = Connect(0), rank1 = Connect(1);
  const std::vector<float> initial = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 5);
  std::vector<float> params0 = initial, params1 = initial;
  ASSERT_TRUE(rank0->Register(spec, params0).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> grad0(initial.size()), grad1(initial.size());
    SyntheticGradient(rank0->layout(), params0, 0, step, 5, absl::MakeSpan(grad0));
    SyntheticGradient(rank1->layout(), params1, 1, step, 5, absl::MakeSpan(grad1));
    std::thread other([&] {
      if (step == 1) {  // Push + Pull on both trainers.
        ASSERT_TRUE(rank1->Push(step, grad1).ok());
        const absl::StatusOr<int64_t> r = rank1->Pull(step, absl::MakeSpan(params1));
        EXPECT_TRUE(r.ok()) << r.status();
      } else {  // Step on this one.
        const absl::StatusOr<StepResult> r = rank1->Step(step, grad1, absl::MakeSpan(params1));
        EXPECT_TRUE(r.ok()) << r.status();
        if (r.ok()) EXPECT_LT(r->clip_coef, 1.0) << "not clipped";
      }
    });
    ASSERT_TRUE(rank0->Push(step, grad0).ok());
    const absl::StatusOr<int64_t> pulled = rank0->Pull(step, absl::MakeSpan(params0));
    other.join();
    ASSERT_TRUE(pulled.ok()) << pulled.status();
    EXPECT_EQ(*pulled, step);
    EXPECT_EQ(params0, params1) << "step " << step;
  }
  // The same job with two Steps, on another model of the same servers.
  spec.model_id = "step_step_clip";
  auto again0 = Connect(0), again1 = Connect(1);
  std::vector<float> steps0 = initial, steps1 = initial;
  ASSERT_TRUE(again0->Register(spec, steps0).ok());
  ASSERT_TRUE(again1->Attach(spec).ok());
  for (int64_t step = 1; step <= 2; ++step) {
    std::vector<float> grad0(initial.size()), grad1(initial.size());
    SyntheticGradient(again0->layout(), steps0, 0, step, 5, absl::MakeSpan(grad0));
    SyntheticGradient(again1->layout(), steps1, 1, step, 5, absl::MakeSpan(grad1));
    std::thread other([&] { EXPECT_TRUE(again1->Step(step, grad1, absl::MakeSpan(steps1)).ok()); });
    ASSERT_TRUE(again0->Step(step, grad0, absl::MakeSpan(steps0)).ok());
    other.join();
  }
  EXPECT_EQ(params0, steps0);
}

TEST_F(ClientSemanticsTest, NonFiniteGradientAnywhereReachesNoShard) {
  const ModelSpec spec = SyntheticModelSpec("nan", OptimizerConfig::Sgd(0.1), 1);
  auto client = Connect(0);
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 1);
  ASSERT_TRUE(client->Register(spec, params).ok());
  const ModelLayout& layout = client->layout();
  // Put the NaN in the LAST shard's range: the first shard must not get the step.
  const TensorPlacement& last = layout.tensors()[layout.tensors().size() - 2];
  ASSERT_GE(last.offset, layout.ShardRange(1).begin);
  std::vector<float> grad = ConstantGradient(layout, 0.25f);
  grad[last.offset + 1] = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<StepResult> r = client->Step(1, grad, absl::MakeSpan(params));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find(absl::StrCat("tensor '", last.spec.name, "'[1]")),
            std::string::npos)
      << r.status();
  for (const auto& server : servers_) {
    const v1::InspectResponse info = InspectOf(server->address(), "nan");
    EXPECT_EQ(info.version(), 0);
    EXPECT_EQ(info.trainers_pushed_size(), 0);
    EXPECT_EQ(info.bytes().gradient_bytes_received(), 0u);
  }
  // The step can be retried with a clean gradient.
  grad[last.offset + 1] = 0.0f;
  r = client->Step(1, grad, absl::MakeSpan(params));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 1);
}

TEST_F(ClientSemanticsTest, Float16OverflowIsRefusedBeforeAnyShardSeesIt) {
  const ModelSpec spec = SyntheticModelSpec("fp16", OptimizerConfig::Sgd(0.1), 1);
  TrainerClientOptions options;
  options.push_dtype = DType::kFloat16;
  auto client = TrainerClient::Connect(Addresses(servers_), options).value();
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 1);
  ASSERT_TRUE(client->Register(spec, params).ok());
  std::vector<float> grad = ConstantGradient(client->layout(), 0.25f);
  grad[3] = 1e5f;  // Finite in fp32, inf in fp16.
  absl::StatusOr<StepResult> r = client->Step(1, grad, absl::MakeSpan(params));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("overflows float16"), std::string::npos) << r.status();
  for (const auto& server : servers_) {
    EXPECT_EQ(InspectOf(server->address(), "fp16").bytes().gradient_bytes_received(), 0u);
  }
  // A NaN of the fp32 gradient is named as such, not as an overflow.
  grad[3] = std::numeric_limits<float>::quiet_NaN();
  r = client->Step(1, grad, absl::MakeSpan(params));
  ASSERT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
  EXPECT_NE(r.status().message().find("is nan; nothing was pushed"), std::string::npos)
      << r.status();
  EXPECT_EQ(r.status().message().find("overflows"), std::string::npos) << r.status();
  grad[3] = 1e4f;
  r = client->Step(1, grad, absl::MakeSpan(params));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->bytes_pushed, params.size() * 2);  // Half the fp32 payload.
  EXPECT_FLOAT_EQ(r->lr, 0.1);                    // The step's learning rate.
}

TEST_F(ClientSemanticsTest, TrainerThatFellBehindIsToldSo) {
  const ModelSpec spec = SyntheticModelSpec("behind", OptimizerConfig::Sgd(0.1), 1);
  auto client = Connect(0);
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 1);
  ASSERT_TRUE(client->Register(spec, params).ok());
  std::vector<float> grad = ConstantGradient(client->layout(), 0.5f);
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(client->Step(step, grad, absl::MakeSpan(params)).ok());
  }
  // A restarted trainer that believes it is at step 2.
  auto restarted = Connect(0);
  ASSERT_TRUE(restarted->Register(spec, params).ok());
  EXPECT_EQ(restarted->registered_version(), 3);
  absl::StatusOr<StepResult> r = restarted->Step(2, grad, absl::MakeSpan(params));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_NE(r.status().message().find("behind"), std::string::npos) << r.status();
  // Nothing was applied by it.
  EXPECT_EQ(InspectOf(servers_[0]->address(), "behind").version(), 3);
}

TEST_F(ClientSemanticsTest, RegisterRefusesShardsAtDifferentVersions) {
  const ModelSpec spec = SyntheticModelSpec("split", OptimizerConfig::Sgd(0.1), 1);
  auto client = Connect(0);
  const ModelLayout layout = client->LayoutFor(spec).value();
  std::vector<float> params = SyntheticInitialParams(layout, 1);
  // Only shard 0 holds the model and has trained it one step (as if shard 1
  // had been restarted empty): set that up with raw calls to shard 0.
  auto stub = NewStub(servers_[0]->address());
  v1::ModelConfig config;
  config.set_model_id("split");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(spec.optimizer);
  config.set_num_trainers(1);
  config.set_shard_count(2);
  ASSERT_TRUE(
      RawRegister(*stub, config, 0, false, {{0, FloatBytes(params.data(), layout.ShardSize(0))}})
          .ok());
  v1::PushHeader header;
  header.set_model_id("split");
  header.set_step(1);
  header.set_num_elements(layout.ShardSize(0));
  std::vector<float> grad(layout.ShardSize(0), 1.0f);
  v1::PushGradientsResponse response;
  ASSERT_TRUE(RawPush(*stub, &header, {{0, FloatBytes(grad.data(), grad.size())}}, &response).ok());
  ASSERT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  absl::Status s = client->Register(spec, params);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("shard 0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("at version 1"), std::string::npos) << s;
  EXPECT_NE(s.message().find("at version 0 (just created)"), std::string::npos) << s;
}

TEST_F(ClientSemanticsTest, SameModelSpelledDifferentlyAttaches) {
  // alignment 0 means the default (64): a raw registration with 64 and a
  // client attaching with 0 describe the same model.
  ModelSpec spec = SyntheticModelSpec("canon", OptimizerConfig::AdamW(), 2);
  spec.alignment = 64;
  auto rank0 = Connect(0);
  std::vector<float> params = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 1);
  ASSERT_TRUE(rank0->Register(spec, params).ok());
  spec.alignment = 0;
  auto rank1 = Connect(1);
  EXPECT_TRUE(rank1->Attach(spec).ok());
}

TEST_F(ClientSemanticsTest, LargePushAnsweredEarlyReturnsAndReleasesTheBuffer) {
  // 16M elements (64 MiB): the server answers ALREADY_APPLIED after the
  // header, while the client still has most of the payload queued.
  ModelSpec spec;
  spec.model_id = "large";
  spec.tensors = {{"w", {int64_t{1} << 24}}};
  spec.optimizer = OptimizerConfig::Sgd(0.0);
  auto client = Connect(0);
  std::vector<float> params(client->LayoutFor(spec).value().total_elements(), 0.0f);
  ASSERT_TRUE(client->Register(spec, params).ok());
  auto grad = std::make_unique<std::vector<float>>(ConstantGradient(client->layout(), 1.0f));
  ASSERT_TRUE(client->Step(1, *grad, absl::MakeSpan(params)).ok());
  for (int repeat = 0; repeat < 3; ++repeat) {
    absl::StatusOr<StepResult> r = client->Push(1, *grad);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->duplicate_pushes, 2);
  }
  grad.reset();  // Freed right after Push returned: gRPC must not touch it any more.
  std::vector<float> grad2(params.size(), 2.0f);
  absl::StatusOr<StepResult> r = client->Step(2, grad2, absl::MakeSpan(params));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->version, 2);
}

// A trainer that waits on a missing one hears what it waits for while it
// waits (every wait_report_interval) and, when its budget runs out, the
// error names the trainer and the last step it pushed.
TEST_F(ClientSemanticsTest, AWaitThatRunsOutNamesTheMissingTrainerAndItsLastStep) {
  const ModelSpec spec = SyntheticModelSpec("waits", OptimizerConfig::Sgd(0.1), 2);
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(30);
  options.retry_budget = absl::Seconds(2);
  options.wait_report_interval = absl::Milliseconds(300);
  std::vector<std::string> reports;
  absl::Mutex mu;
  options.on_wait = [&](const std::string& report) {
    absl::MutexLock lock(&mu);
    reports.push_back(report);
  };
  auto rank0 = TrainerClient::Connect(Addresses(servers_), options).value();
  auto rank1 = Connect(1);
  std::vector<float> params = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 2);
  ASSERT_TRUE(rank0->Register(spec, params).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  std::vector<float> grad = ConstantGradient(rank0->layout(), 0.25f), params1 = params;
  // Step 1 together; then rank 1 stops pushing.
  std::thread other([&] { EXPECT_TRUE(rank1->Step(1, grad, absl::MakeSpan(params1)).ok()); });
  ASSERT_TRUE(rank0->Step(1, grad, absl::MakeSpan(params)).ok());
  other.join();
  const absl::Time start = absl::Now();
  absl::StatusOr<StepResult> stuck = rank0->Step(2, grad, absl::MakeSpan(params));
  const absl::Duration waited = absl::Now() - start;
  std::cout << "after " << waited << ": " << stuck.status() << std::endl;
  EXPECT_EQ(stuck.status().code(), absl::StatusCode::kDeadlineExceeded) << stuck.status();
  EXPECT_TRUE(absl::StrContains(stuck.status().message(),
                                "waiting for trainer 1 (last pushed step 1) to push step 2"))
      << stuck.status();
  EXPECT_TRUE(absl::StrContains(stuck.status().message(), "shard 0 is at version 1") ||
              absl::StrContains(stuck.status().message(), "shard 1 is at version 1"))
      << stuck.status();
  // The budget, plus at most one report interval: no long silence.
  EXPECT_LT(waited, absl::Seconds(5));
  absl::MutexLock lock(&mu);
  ASSERT_GE(reports.size(), 3u);
  EXPECT_TRUE(absl::StrContains(reports[0], "PullParameters version >= 2")) << reports[0];
  EXPECT_TRUE(absl::StrContains(reports[0], "waiting for trainer 1 (last pushed step 1)"))
      << reports[0];
  // The shards saw each trainer's pushes.
  const v1::InspectResponse info = InspectOf(servers_[0]->address(), "waits");
  ASSERT_EQ(info.trainers_size(), 2);
  EXPECT_EQ(info.trainers(0).last_pushed_step(), 2);
  EXPECT_EQ(info.trainers(1).last_pushed_step(), 1);
  EXPECT_GE(info.trainers(1).seconds_since_last_push(), absl::ToDoubleSeconds(waited) - 0.5);
  EXPECT_EQ(info.newest_committed_checkpoint(), -1);  // No periodic checkpoints here.
}

// A shard that freezes (SIGSTOP: no crash, no closed connection) while a
// trainer waits on it is noticed through keepalive within seconds, and the
// call fails naming the shard instead of sitting out its 30 s deadline.
TEST_F(ClientSemanticsTest, AFrozenShardIsNoticedWithinSeconds) {
  const ModelSpec spec = SyntheticModelSpec("frozen", OptimizerConfig::Sgd(0.1), 2);
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(30);
  options.retry_budget = absl::Seconds(2);
  auto rank0 = TrainerClient::Connect(Addresses(servers_), options).value();
  std::vector<float> params = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 4);
  ASSERT_TRUE(rank0->Register(spec, params).ok());
  std::vector<float> grad = ConstantGradient(rank0->layout(), 0.5f);
  ASSERT_TRUE(rank0->Push(1, grad).ok());  // Rank 1 never pushes: pulls wait.
  servers_[1]->process().Signal(SIGSTOP);
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> pulled = rank0->Pull(1, absl::MakeSpan(params));
  const absl::Duration took = absl::Now() - start;
  servers_[1]->process().Signal(SIGCONT);
  std::cout << "after " << took << ": " << pulled.status() << std::endl;
  EXPECT_FALSE(pulled.ok());
  // Whichever shard gives up first says why: the frozen one unreachable, or
  // the other one still waiting for trainer 1.
  EXPECT_TRUE(absl::StrContains(pulled.status().message(), "shard 1 (") ||
              absl::StrContains(pulled.status().message(),
                                "waiting for trainer 1 (last pushed step 0) to push step 1"))
      << pulled.status();
  // Keepalive (3 s + 3 s) and the 2 s budget, far below the 30 s deadline;
  // the frozen shard's attempt failed (keepalive closed its connection).
  EXPECT_LT(took, absl::Seconds(15));
  EXPECT_GT(rank0->failed_attempts(1), 0);
}

// An attach whose model differs from the registered one is refused, naming
// each field that differs and both values.
TEST_F(ClientSemanticsTest, ADifferentConfigIsRefusedNamingTheFieldsThatDiffer) {
  const ModelSpec spec = SyntheticModelSpec("differs", OptimizerConfig::AdamW(0.001), 2);
  auto rank0 = Connect(0);
  std::vector<float> params = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 2);
  ASSERT_TRUE(rank0->Register(spec, params).ok());
  ModelSpec other = spec;
  other.num_trainers = 3;
  other.optimizer.lr = 0.002;
  const absl::Status s = Connect(2)->Attach(other);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), "num_trainers: registered 2, this trainer 3")) << s;
  EXPECT_TRUE(
      absl::StrContains(s.message(), "optimizer.adamw.lr: registered 0.001, this trainer 0.002"))
      << s;
}

// A shard that accepts registration but fails every pull for good.
class BrokenPullShard final : public v1::ShardService::Service {
 public:
  explicit BrokenPullShard(FlatRange range) : range_(range) {}
  grpc::Status RegisterModel(grpc::ServerContext*,
                             grpc::ServerReader<v1::RegisterModelRequest>* reader,
                             v1::RegisterModelResponse* response) override {
    v1::RegisterModelRequest request;
    while (reader->Read(&request)) {
      // A new model belongs to the registering run, as on a real shard.
      if (request.has_header()) response->set_run_id(request.header().run_id());
    }
    response->set_created(true);
    response->mutable_range()->set_begin(range_.begin);
    response->mutable_range()->set_end(range_.end);
    return grpc::Status::OK;
  }
  grpc::Status PullParameters(grpc::ServerContext*, const v1::PullParametersRequest*,
                              grpc::ServerWriter<v1::PullParametersResponse>*) override {
    return grpc::Status(grpc::NOT_FOUND, "model lost");
  }

 private:
  FlatRange range_;
};

TEST(ClientCancellationTest, APermanentFailureOnOneShardCancelsTheOthers) {
  auto real = ServerProcess::Start(1, 2);
  ASSERT_TRUE(real.ok()) << real.status();
  const ModelSpec spec = SyntheticModelSpec("lost", OptimizerConfig::Sgd(0.1), 2);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 2).value();
  BrokenPullShard broken(layout.ShardRange(0));
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(&broken);
  std::unique_ptr<grpc::Server> fake = builder.BuildAndStart();
  ASSERT_GT(port, 0);

  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(20);
  auto client =
      TrainerClient::Connect({absl::StrCat("127.0.0.1:", port), (*real)->address()}, options)
          .value();
  std::vector<float> params = SyntheticInitialParams(layout, 1);
  ASSERT_TRUE(client->Register(spec, params).ok());
  // Shard 1 would block for version 1 (rank 1 never pushes) until the 20 s
  // deadline; shard 0's NOT_FOUND must end the whole pull at once.
  const absl::Time start = absl::Now();
  absl::StatusOr<int64_t> pulled = client->Pull(1, absl::MakeSpan(params));
  EXPECT_EQ(pulled.status().code(), absl::StatusCode::kNotFound) << pulled.status();
  EXPECT_NE(pulled.status().message().find("shard 0"), std::string::npos) << pulled.status();
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  fake->Shutdown();
}

// Step(k) called again after its decision moved the loss scaler (the pull
// of the first call failed, or a caller repeats it): the push goes with the
// scale it was made with, so that its history stays the push the shards
// hold, and a shard that comes back from an older checkpoint takes the
// replay (its replica of the scaler checks the scale) instead of refusing
// it for good.
TEST(ClientSemanticsRetryTest, AStepRepeatedAfterItsDecisionKeepsItsLossScale) {
  const std::string checkpoints = MakeTempDir("scale_retry");
  const std::vector<std::string> flags = CrashRecoveryFlags(checkpoints, 2);
  auto server = ServerProcess::Start(0, 1, flags);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  ModelSpec spec;
  spec.model_id = "scale";
  spec.tensors = {TensorSpec{"w", {1024}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Sgd(0.5);
  spec.loss_scaling = true;
  spec.loss_scaler.initial_scale = 1024;
  spec.loss_scaler.hysteresis = 1;  // The first overflow backs off.
  TrainerClientOptions options;
  options.replay_steps = 8;
  options.retry_budget = absl::Seconds(20);
  auto client = TrainerClient::Connect({address}, options).value();
  std::vector<float> params(1024, 0.25f);
  ASSERT_TRUE(client->Register(spec, params).ok());
  const std::vector<float> grad(1024, 0.125f * 1024);  // (Scaled by 1024.)
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(client->Step(step, grad, absl::MakeSpan(params)).ok());
  }
  for (int i = 0; i < 500 && InspectOf(address, "scale").newest_committed_checkpoint() < 2; ++i) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(InspectOf(address, "scale").newest_committed_checkpoint(), 2);
  std::vector<float> overflow = grad;
  overflow[7] = std::numeric_limits<float>::infinity();
  absl::StatusOr<StepResult> first = client->Step(3, overflow, absl::MakeSpan(params));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_TRUE(first->skipped);
  EXPECT_EQ(client->loss_scale(), 512);
  absl::StatusOr<StepResult> again = client->Step(3, overflow, absl::MakeSpan(params));
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->loss_scale, 1024) << "the repeat went with the next step's scale";
  EXPECT_EQ(client->loss_scale(), 512);

  // The shard comes back from step 2: step 4 replays step 3 from the
  // history first, with its scale.
  (*server)->process().Signal(SIGKILL);
  ASSERT_TRUE((*server)->process().Wait(absl::Seconds(10)).has_value());
  auto restarted = StartServerAt(address, 0, 1, flags);
  ASSERT_TRUE(restarted.ok()) << restarted.status();
  ASSERT_EQ(InspectOf(address, "scale").version(), 2);
  const std::vector<float> half(1024, 0.125f * 512);
  absl::StatusOr<StepResult> fourth = client->Step(4, half, absl::MakeSpan(params));
  ASSERT_TRUE(fourth.ok()) << fourth.status();
  EXPECT_EQ(fourth->version, 4);
  // 1/4 - 3 steps of 1/2 * 1/8 (step 3 skipped): exactly 1/16.
  EXPECT_EQ(params, std::vector<float>(1024, 0.0625f));
}

// A push of a step the journal no longer holds (dropped below the recovery
// floor) is sent as one never journaled: acknowledged, and no crash.
TEST(ClientSemanticsRetryTest, APushOfAStepTheJournalDroppedIsSentAsNew) {
  const std::string ckpt = MakeTempDir("dropped_journal_ckpt");
  auto server = ServerProcess::Start(0, 1, CrashRecoveryFlags(ckpt, 1));
  ASSERT_TRUE(server.ok()) << server.status();
  TrainerClientOptions journaled;
  journaled.journal_path = MakeTempDir("dropped_journal");
  auto client = TrainerClient::Connect({(*server)->address()}, journaled).value();
  const ModelSpec spec = SyntheticModelSpec("dropped", OptimizerConfig::Sgd(0.5), 1);
  std::vector<float> params = SyntheticInitialParams(client->LayoutFor(spec).value(), 8);
  ASSERT_TRUE(client->Register(spec, params).ok());
  const std::vector<float> grad(params.size(), 0.0f);
  for (int64_t step = 1; step <= 6; ++step) {
    ASSERT_TRUE(client->Step(step, grad, absl::MakeSpan(params)).ok());
    // (The pushes carry the recovery floor: the second-newest commit.)
    for (int i = 0; i < 500 && InspectOf((*server)->address(), "dropped")
                                       .newest_committed_checkpoint() < step;
         ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
  }
  const auto [rc, files] = RunShell("ls " + journaled.journal_path);
  ASSERT_EQ(rc, 0);
  ASSERT_FALSE(absl::StrContains(files, "push-000000000001")) << "not dropped: " << files;
  const absl::StatusOr<StepResult> again = client->Push(1, grad);
  EXPECT_TRUE(again.ok()) << again.status();
}

// A checkpoint of a step the shards cannot reach yet (a trainer has not
// pushed it) fails after the retry budget with the shard's report of what
// it waits for, not a bare deadline.
TEST_F(ClientSemanticsTest, ACheckpointThatCannotHappenSaysWhatItWaitsFor) {
  const ModelSpec spec = SyntheticModelSpec("ckwait", OptimizerConfig::Sgd(0.1), 2);
  TrainerClientOptions options;
  options.rpc_timeout = absl::Seconds(3);
  options.retry_budget = absl::Seconds(1);
  options.wait_report_interval = absl::Milliseconds(300);
  auto rank0 = TrainerClient::Connect(Addresses(servers_), options).value();
  std::vector<float> params = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 2);
  ASSERT_TRUE(rank0->Register(spec, params).ok());
  ASSERT_TRUE(rank0->Push(1, std::vector<float>(params.size(), 0.0f)).ok());
  const absl::StatusOr<std::string> saved =
      rank0->Checkpoint(MakeTempDir("ckwait"), /*step=*/1);
  ASSERT_FALSE(saved.ok());
  EXPECT_TRUE(absl::IsDeadlineExceeded(saved.status())) << saved.status();
  EXPECT_TRUE(absl::StrContains(saved.status().message(), "trainer 1")) << saved.status();
}

// A trainer that died after pushing step 3 comes back (attached at version
// 2) after the other trainer completed step 3 with its decision: its loss
// scaler takes that step's update from the shards, so that its step 4
// carries the scale the shards expect (it lagged one update behind, and
// with growth every step its push of step 4 was refused).
TEST_F(ClientSemanticsTest, ATrainerBackAfterItsStepWasDecidedKeepsTheLossScale) {
  ModelSpec spec = SyntheticModelSpec("scaled_resume", OptimizerConfig::Adam(0.01), 2);
  spec.loss_scaling = true;
  spec.loss_scaler.initial_scale = 1024;
  spec.loss_scaler.growth_interval = 1;
  auto rank0 = Connect(0), rank1 = Connect(1);
  const ModelLayout layout = rank0->LayoutFor(spec).value();
  std::vector<float> params0 = SyntheticInitialParams(layout, 6);
  ASSERT_TRUE(rank0->Register(spec, params0).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  std::vector<float> params1 = params0, grad0(params0.size()), grad1(params0.size());
  for (int64_t k = 1; k <= 2; ++k) {
    SyntheticGradient(layout, params0, 0, k, 6, absl::MakeSpan(grad0));
    SyntheticGradient(layout, params1, 1, k, 6, absl::MakeSpan(grad1));
    ASSERT_TRUE(rank0->Push(k, grad0).ok());
    ASSERT_TRUE(rank1->Push(k, grad1).ok());
    ASSERT_EQ(*rank0->Pull(k, absl::MakeSpan(params0)), k);
    ASSERT_EQ(*rank1->Pull(k, absl::MakeSpan(params1)), k);
  }
  SyntheticGradient(layout, params1, 1, 3, 6, absl::MakeSpan(grad1));
  ASSERT_TRUE(rank1->Push(3, grad1).ok());
  rank1.reset();  // Dead after its push of step 3.

  auto restarted = Connect(1);
  ASSERT_TRUE(restarted->Attach(spec).ok());
  ASSERT_EQ(restarted->registered_version(), 2);
  SyntheticGradient(layout, params0, 0, 3, 6, absl::MakeSpan(grad0));
  ASSERT_TRUE(rank0->Push(3, grad0).ok());
  ASSERT_EQ(*rank0->Pull(3, absl::MakeSpan(params0)), 3);
  absl::StatusOr<int64_t> resumed = restarted->PullToResume(absl::MakeSpan(params1));
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  ASSERT_EQ(*resumed, 3);
  EXPECT_EQ(restarted->loss_scale(), rank0->loss_scale());
  for (int64_t k = 4; k <= 5; ++k) {
    SyntheticGradient(layout, params0, 0, k, 6, absl::MakeSpan(grad0));
    SyntheticGradient(layout, params1, 1, k, 6, absl::MakeSpan(grad1));
    ASSERT_TRUE(rank0->Push(k, grad0).ok());
    const absl::StatusOr<StepResult> pushed = restarted->Push(k, grad1);
    ASSERT_TRUE(pushed.ok()) << "step " << k << ": " << pushed.status();
    ASSERT_EQ(*rank0->Pull(k, absl::MakeSpan(params0)), k);
    ASSERT_EQ(*restarted->Pull(k, absl::MakeSpan(params1)), k);
  }
  EXPECT_EQ(restarted->loss_scale(), rank0->loss_scale());
  EXPECT_EQ(std::memcmp(params0.data(), params1.data(), params0.size() * sizeof(float)), 0);
}

}  // namespace
}  // namespace shardopt::testing
