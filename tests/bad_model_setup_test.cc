// Bad model set-up calls against a real shard-server process: registrations
// (idempotent for the same model, refused for a different or invalid one),
// hyperparameter changes, Inspect's report and its bad slices, and the state
// budget (--max_state_mib). Each refusal gets its documented gRPC status and
// leaves the shard's state as it was. Pushes and pulls: bad_input_test.cc.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/bad_input_fixture.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

TEST_F(BadInputTest, RegistrationIsIdempotentAndRefusesADifferentModel) {
  const State before = Capture();
  v1::RegisterModelResponse response;
  // Same config: attaches, initial values ignored.
  std::vector<float> other(range_.size(), 7.0f);
  ZeroPadding(&other);
  ASSERT_TRUE(Register(config_, false, {{0, Bytes(other, 0, other.size())}}, &response).ok());
  EXPECT_FALSE(response.created());
  EXPECT_EQ(response.range().begin(), range_.begin);
  ASSERT_TRUE(Register(config_, true, {}, &response).ok());
  EXPECT_FALSE(response.created());
  EXPECT_TRUE(Capture() == before);

  v1::ModelConfig different = config_;
  different.mutable_optimizer()->mutable_adam()->set_lr(0.5);
  ExpectRejected(Register(different, false, {{0, Bytes(other, 0, other.size())}}),
                 grpc::FAILED_PRECONDITION, "with a different config", before);
  different = config_;
  different.mutable_layout()->mutable_tensors(0)->set_shape(0, 11);
  ExpectRejected(Register(different, true, {}), grpc::FAILED_PRECONDITION,
                 "with a different config", before);

  v1::ModelConfig fresh = config_;
  fresh.set_model_id("fresh");
  ExpectRejected(Register(fresh, true, {}), grpc::NOT_FOUND, "not registered on shard 1 yet",
                 before);
  ExpectRejected(Register(fresh, false, {{0, Bytes(other, 0, 10)}}), grpc::INVALID_ARGUMENT,
                 "initial values of the range", before);
  ExpectRejected(Register(fresh, false, {{0, ""}, {0, Bytes(other, 0, other.size())}}),
                 grpc::INVALID_ARGUMENT, "empty chunk at element 0", before);
  std::vector<float> nan_values = other;
  nan_values[5] = std::nan("");
  ExpectRejected(Register(fresh, false, {{0, Bytes(nan_values, 0, nan_values.size())}}),
                 grpc::INVALID_ARGUMENT, "initial value 5", before);
  ExpectRejected(Register(fresh, false, {{0, Bytes(other, 0, other.size())}}, nullptr, 0),
                 grpc::FAILED_PRECONDITION, "meant for shard 0", before);
  // Names a checkpoint root's listing would take for a checkpoint's own.
  for (const char* id : {"step-00000004", "shard-a", "manifest.json"}) {
    v1::ModelConfig entry = fresh;
    entry.set_model_id(id);
    ExpectRejected(Register(entry, false, {{0, Bytes(other, 0, other.size())}}),
                   grpc::INVALID_ARGUMENT, "would read as a checkpoint's own entry", before);
  }
  v1::ModelConfig bad = fresh;
  bad.set_shard_count(3);
  ExpectRejected(Register(bad, false, {}), grpc::FAILED_PRECONDITION, "split into 3 shards",
                 before);
  bad = fresh;
  bad.set_num_trainers(0);
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "num_trainers 0", before);
  bad = fresh;
  bad.mutable_optimizer()->mutable_adam()->set_beta2(1.5);
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "beta2", before);
  bad = fresh;
  bad.mutable_optimizer()->Clear();
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "no optimizer", before);
  bad = fresh;
  bad.mutable_layout()->mutable_tensors(1)->set_name("w");
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "appears twice", before);
  bad = fresh;
  bad.set_model_id("");
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "model_id is empty", before);
  // The whole-tensor optimizers: Adafactor on the flat partition, LAMB on
  // it off the 64-element grid or asynchronous, Muon on a vector ('b'), bad
  // Adafactor and Muon settings, an unknown partition.
  bad = fresh;
  *bad.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Adafactor());
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT,
                 "needs the partition whole_tensors", before);
  *bad.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Lamb());
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT,
                 "needs an alignment that is a multiple of 64", before);
  bad.mutable_layout()->set_alignment(64);
  bad.set_consistency(v1::CONSISTENCY_ASYNC);
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "it needs consistency sync",
                 before);
  bad = fresh;
  bad.mutable_layout()->set_partition(v1::PARTITION_WHOLE_TENSORS);
  *bad.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Muon());
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "tensor 'b' has 1 dimensions",
                 before);
  bad.mutable_optimizer()->mutable_muon()->set_ns_steps(0);
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "ns_steps 0", before);
  *bad.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Adafactor());
  bad.mutable_optimizer()->mutable_adafactor()->set_clip_threshold(0.5);
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "clipping threshold d", before);
  bad.mutable_layout()->set_partition(static_cast<v1::Partition>(7));
  ExpectRejected(Register(bad, false, {}), grpc::INVALID_ARGUMENT, "unknown partition 7", before);

  // None of the refused registrations created the model.
  std::vector<float> values;
  int64_t version;
  EXPECT_EQ(Pull(0, &values, &version, absl::Seconds(5), "fresh").error_code(), grpc::NOT_FOUND);
}

TEST_F(BadInputTest, BadHyperparameterChangesAreRefused) {
  const State before = Capture();
  auto set = [&](const v1::SetHyperparametersRequest& request) {
    grpc::ClientContext context;
    v1::SetHyperparametersResponse response;
    return stub_->SetHyperparameters(&context, request, &response);
  };
  v1::SetHyperparametersRequest request;
  request.set_model_id("nope");
  request.set_effective_step(3);
  *request.mutable_optimizer() = config_.optimizer();
  ExpectRejected(set(request), grpc::NOT_FOUND, "not registered", before);
  request.set_model_id(kModel);
  request.mutable_optimizer()->mutable_adam()->set_beta1(2.0);
  ExpectRejected(set(request), grpc::INVALID_ARGUMENT, "beta1", before);
  *request.mutable_optimizer() = config_.optimizer();
  request.mutable_lr_schedule()->set_kind(v1::LrSchedule::LR_SCHEDULE_WARMUP_COSINE);
  request.mutable_lr_schedule()->set_total_steps(0);
  ExpectRejected(set(request), grpc::INVALID_ARGUMENT, "total_steps", before);
  request.clear_lr_schedule();
  request.mutable_optimizer()->mutable_adam()->set_amsgrad(true);
  ExpectRejected(set(request), grpc::FAILED_PRECONDITION, "amsgrad", before);
  request.mutable_optimizer()->mutable_adam()->set_amsgrad(false);
  request.set_effective_step(0);
  ExpectRejected(set(request), grpc::FAILED_PRECONDITION, "already applied", before);
  // Registration with a bad schedule is refused too.
  v1::ModelConfig bad = config_;
  bad.set_model_id("sched");
  bad.mutable_lr_schedule()->set_kind(static_cast<v1::LrSchedule::Kind>(42));
  ExpectRejected(Register(bad, false, {{0, Bytes(initial_, 0, initial_.size())}}),
                 grpc::INVALID_ARGUMENT, "unknown lr schedule kind", before);
}

// One tensor larger than all others together on whole tensors: allowed, and
// Inspect says which and how uneven the shards are.
TEST_F(BadInputTest, InspectReportsATensorThatOutweighsTheRest) {
  const ModelLayout layout = ModelLayout::Create({{"small", {10}}, {"huge", {1000}}}, 16,
                                                 kShardCount, Partition::kWholeTensors)
                                 .value();
  v1::ModelConfig config = config_;
  config.set_model_id("lopsided");
  *config.mutable_layout() = LayoutToProto(layout);
  const std::vector<float> values(layout.ShardSize(kShardIndex), 0.0f);
  ASSERT_TRUE(Register(config, false, {{0, Bytes(values, 0, values.size())}}).ok());
  grpc::ClientContext context;
  v1::InspectRequest request;
  request.set_model_id("lopsided");
  v1::InspectResponse info;
  ASSERT_TRUE(stub_->Inspect(&context, request, &info).ok());
  EXPECT_EQ(info.partition(), v1::PARTITION_WHOLE_TENSORS);
  EXPECT_NEAR(info.imbalance(), layout.Imbalance(), 1e-12);
  EXPECT_GT(info.imbalance(), 1.9);
  EXPECT_NE(info.imbalance_note().find("tensor 'huge' (1000 elements) outweighs"),
            std::string::npos)
      << info.imbalance_note();
  // The fixture's balanced model has no note.
  EXPECT_TRUE(Inspect().imbalance_note().empty());
}

TEST_F(BadInputTest, InspectReportsTheShardAndRejectsBadSlices) {
  v1::InspectResponse info = Inspect();
  EXPECT_EQ(info.shard_index(), kShardIndex);
  EXPECT_EQ(info.shard_count(), kShardCount);
  EXPECT_EQ(info.range().begin(), range_.begin);
  EXPECT_EQ(info.range().end(), range_.end);
  EXPECT_EQ(info.next_step(), 1);
  EXPECT_TRUE(info.optimizer().has_adam());
  ASSERT_EQ(info.values_size(), 8);
  EXPECT_FLOAT_EQ(info.values(3), initial_[3]);
  EXPECT_EQ(info.bytes().parameter_bytes(), range_.size() * 4);
  EXPECT_EQ(info.bytes().staging_bytes(), kTrainers * range_.size() * 4);
  EXPECT_EQ(info.bytes().optimizer_state_bytes(), 2 * range_.size() * 4);
  double elements = 0;
  for (const v1::TensorStats& t : info.tensors()) {
    elements += t.num_elements();
    EXPECT_LE(t.min(), t.mean());
    EXPECT_LE(t.mean(), t.max());
    EXPECT_GE(t.l2_norm(), 0);
  }
  EXPECT_GT(elements, 0);

  grpc::ClientContext c1;
  v1::InspectRequest request;
  request.set_model_id(kModel);
  request.set_slice_offset(range_.size());
  EXPECT_EQ(stub_->Inspect(&c1, request, &info).error_code(), grpc::OUT_OF_RANGE);
  grpc::ClientContext c2;
  request.set_slice_offset(0);
  request.set_tensor_name("missing");
  EXPECT_EQ(stub_->Inspect(&c2, request, &info).error_code(), grpc::NOT_FOUND);
  grpc::ClientContext c3;
  request.set_model_id("nope");
  request.set_tensor_name("");
  EXPECT_EQ(stub_->Inspect(&c3, request, &info).error_code(), grpc::NOT_FOUND);
}

// What a hostile client sent a live server (the probe of issue 12), each
// answered with a clear status, a bounded message, and nothing changed.
TEST_F(BadInputTest, HostileRequestsGetClearBoundedStatusesAndChangeNothing) {
  const State before = Capture();
  // Ids: a 1 MiB model id is refused, and not echoed back whole (it would
  // not fit the reply's metadata).
  v1::ModelConfig huge = config_;
  huge.set_model_id(std::string(1 << 20, 'm'));
  grpc::Status s = Register(huge, false, {});
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 300u);
  EXPECT_NE(s.error_message().find("(1048576 bytes)"), std::string::npos);
  // A long tensor name with an unknown dtype (the dtype is looked at first).
  v1::ModelConfig long_name = config_;
  long_name.set_model_id("long_name");
  long_name.mutable_layout()->mutable_tensors(0)->set_name(std::string(1 << 20, 't'));
  long_name.mutable_layout()->mutable_tensors(0)->set_dtype(static_cast<v1::DType>(99));
  s = Register(long_name, false, {});
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message().substr(0, 200);
  EXPECT_LT(s.error_message().size(), 300u);
  {
    grpc::ClientContext context;
    v1::InspectRequest request;
    request.set_model_id(std::string(1 << 20, 'm'));
    v1::InspectResponse response;
    s = stub_->Inspect(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_LT(s.error_message().size(), 300u);
  }
  // Inspect's documented most is 4096 values.
  {
    grpc::ClientContext context;
    v1::InspectRequest request;
    request.set_model_id(kModel);
    request.set_slice_length(4097);
    v1::InspectResponse response;
    s = stub_->Inspect(&context, request, &response);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
    EXPECT_NE(s.error_message().find("4096"), std::string::npos) << s.error_message();
  }
  // Checkpoint directories: a NUL byte (the system would cut the name
  // there), an overlong name, a path through a file.
  const std::string root = MakeTempDir("hostile");
  struct BadDirectory {
    std::string directory;
    grpc::StatusCode code;
    std::string message_part;
  };
  for (const BadDirectory& bad : std::vector<BadDirectory>{
           {root + std::string("/ck_b\0evil", 10), grpc::INVALID_ARGUMENT, "NUL"},
           {root + "/" + std::string(5000, 'n'), grpc::INVALID_ARGUMENT, "longer than"},
           {root + "/" + std::string(300, 'n') + "/x", grpc::INVALID_ARGUMENT, "component"},
           {"/dev/null/x", grpc::FAILED_PRECONDITION, "not a directory"}}) {
    grpc::ClientContext context;
    v1::CheckpointRequest request;
    request.set_model_id(kModel);
    request.set_shard_index(kShardIndex);
    request.set_directory(bad.directory);
    v1::CheckpointResponse response;
    ExpectRejected(stub_->Checkpoint(&context, request, &response), bad.code, bad.message_part,
                   before);
  }
  auto [rc, listing] = RunShell("ls -A " + root);
  EXPECT_EQ(listing, "") << "something was created: " << listing;

  // Bytes that are no message of the request's type, on every unary method:
  // INVALID_ARGUMENT saying so (gRPC alone answers INTERNAL, no message).
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  for (const std::string method : {"Inspect", "SetHyperparameters", "Checkpoint", "GetServerInfo",
                                   "GetStepStats", "RollBack"}) {
    const std::string garbage = "\xff\xff\xff\xff\x0f";  // A truncated varint tag.
    const grpc::Status status =
        RawUnaryCall(channel.get(), "/shardopt.v1.ShardService/" + method, garbage, 10000);
    EXPECT_EQ(status.error_code(), grpc::INVALID_ARGUMENT)
        << method << ": " << status.error_message();
    EXPECT_NE(status.error_message().find("does not parse"), std::string::npos) << method;
  }
  EXPECT_TRUE(Capture() == before);
}

// Padding holds zeros and gets zero gradients: initial values or a push
// that put anything else there are refused, naming the element.
TEST_F(BadInputTest, NonZeroPaddingIsRefused) {
  const State before = Capture();
  const std::vector<FlatRange> padding = layout_->PaddingIn(range_);
  ASSERT_FALSE(padding.empty());
  const size_t pad = padding.front().begin - range_.begin;
  std::vector<float> g = Gradient(0.5f);
  g[pad] = 0.5f;  // As a grpcurl push of 0.5 on every element would.
  const v1::PushHeader header = Header(0, 1);
  ExpectRejected(Push(&header, GoodChunks(g)), grpc::INVALID_ARGUMENT, "padding element", before);
  v1::ModelConfig fresh = config_;
  fresh.set_model_id("fresh");
  std::vector<float> values(range_.size(), 0.0f);
  values[pad] = 1.0f;
  ExpectRejected(Register(fresh, false, {{0, Bytes(values, 0, values.size())}}),
                 grpc::INVALID_ARGUMENT, "padding must hold zeros", before);
  // The clean push of the same step is taken.
  g[pad] = 0.0f;
  EXPECT_TRUE(Push(&header, GoodChunks(g)).ok());
}

// The state budget (--max_state_mib) refuses models that do not fit, before
// allocating, and a refused or broken registration gives its bytes back.
TEST(StateBudgetTest, OversizedModelsAreRefusedAndReservationsReleased) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--max_state_mib=4"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  // 2^20 elements with SGD (no slots) and 1 trainer: 4 MiB params + 4 MiB staging.
  auto register_model = [&](const std::string& id, int64_t elements, uint64_t values_to_send) {
    v1::ModelConfig config;
    config.set_model_id(id);
    v1::TensorSpec* t = config.mutable_layout()->add_tensors();
    t->set_name("w");
    t->add_shape(elements);
    config.mutable_optimizer()->mutable_sgd()->set_lr(0.1);
    config.set_num_trainers(1);
    config.set_shard_count(1);
    std::vector<float> zeros(values_to_send, 0.0f);
    std::vector<RawChunk> chunks;
    if (values_to_send > 0) chunks.push_back({0, FloatBytes(zeros.data(), zeros.size())});
    return RawRegister(*stub, config, 0, false, chunks);
  };
  grpc::Status s = register_model("huge", int64_t{1} << 40, 0);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  EXPECT_NE(s.error_message().find("--max_state_mib"), std::string::npos) << s.error_message();
  s = register_model("big", int64_t{1} << 20, 0);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  // 2^18 elements need 2 MiB (params + staging). Broken attempts must not keep
  // their reservation: after three of them, 2 MiB still fit, then 2 MiB + 8 KiB do not.
  for (int attempt = 0; attempt < 3; ++attempt) {
    s = register_model("ok", int64_t{1} << 18, 100);  // Too few values.
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message();
  }
  s = register_model("ok", int64_t{1} << 18, uint64_t{1} << 18);
  EXPECT_TRUE(s.ok()) << s.error_message();
  s = register_model("ok2", (int64_t{1} << 18) + 1024, 0);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
}

// Adafactor's state is its factors: the budget reserves those, not two
// slots of the whole range, and Inspect reports what is held.
TEST(StateBudgetTest, AdafactorIsBudgetedByItsFactors) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--max_state_mib=4"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  // 512 x 512 with 1 trainer: 1 MiB params + 1 MiB staging + 4 KiB of
  // factors (two full slots would be 2 MiB more, the whole budget).
  v1::ModelConfig adafactor;
  adafactor.set_model_id("factored");
  v1::TensorSpec* t = adafactor.mutable_layout()->add_tensors();
  t->set_name("w");
  t->add_shape(512);
  t->add_shape(512);
  adafactor.mutable_layout()->set_partition(v1::PARTITION_WHOLE_TENSORS);
  *adafactor.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Adafactor());
  adafactor.set_num_trainers(1);
  adafactor.set_shard_count(1);
  const std::vector<float> zeros(512 * 512, 0.0f);
  grpc::Status s =
      RawRegister(*stub, adafactor, 0, false, {{0, FloatBytes(zeros.data(), zeros.size())}});
  ASSERT_TRUE(s.ok()) << s.error_message();
  grpc::ClientContext context;
  v1::InspectRequest request;
  request.set_model_id("factored");
  v1::InspectResponse info;
  ASSERT_TRUE(stub->Inspect(&context, request, &info).ok());
  EXPECT_EQ(info.bytes().optimizer_state_bytes(), (512 + 512) * 4);
  EXPECT_EQ(info.bytes().parameter_bytes(), 512 * 512 * 4);
  // An SGD model of 2 MiB - 16 KiB fits beside it; one of 2 MiB does not
  // (the factors are counted).
  auto register_sgd = [&](const std::string& id, int64_t elements) {
    v1::ModelConfig config;
    config.set_model_id(id);
    v1::TensorSpec* v = config.mutable_layout()->add_tensors();
    v->set_name("v");
    v->add_shape(elements);
    config.mutable_optimizer()->mutable_sgd()->set_lr(0.1);
    config.set_num_trainers(1);
    config.set_shard_count(1);
    const std::vector<float> values(elements, 0.0f);
    return RawRegister(*stub, config, 0, false, {{0, FloatBytes(values.data(), values.size())}});
  };
  s = register_sgd("too_big", int64_t{1} << 18);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  s = register_sgd("fits", (int64_t{1} << 18) - 2048);
  EXPECT_TRUE(s.ok()) << s.error_message();
}

// Muon's step needs Newton-Schulz buffers besides its state (two of the
// largest matrix, two of its Gram matrix: server/optim/muon_workspace.h),
// which the GPU backend holds for the model's life: the budget counts them.
TEST(StateBudgetTest, MuonIsBudgetedWithItsWorkspace) {
  // 512 x 512 with 1 trainer: 1 MiB each of params, staging and momentum,
  // and 4 MiB of workspace: 7 MiB.
  auto muon_model = [](const std::string& id) {
    v1::ModelConfig muon;
    muon.set_model_id(id);
    v1::TensorSpec* t = muon.mutable_layout()->add_tensors();
    t->set_name("w");
    t->add_shape(512);
    t->add_shape(512);
    muon.mutable_layout()->set_partition(v1::PARTITION_WHOLE_TENSORS);
    *muon.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Muon());
    muon.set_num_trainers(1);
    muon.set_shard_count(1);
    return muon;
  };
  const std::vector<float> zeros(512 * 512, 0.0f);
  {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(0, 1, {"--max_state_mib=6"});
    ASSERT_TRUE(server.ok()) << server.status();
    auto stub = NewStub((*server)->address());
    grpc::Status s = RawRegister(*stub, muon_model("orthogonal"), 0, false,
                                 {{0, FloatBytes(zeros.data(), zeros.size())}});
    EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
    EXPECT_NE(s.error_message().find("needs 7340032 bytes"), std::string::npos)
        << s.error_message();
  }
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--max_state_mib=7"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  grpc::Status s = RawRegister(*stub, muon_model("orthogonal"), 0, false,
                               {{0, FloatBytes(zeros.data(), zeros.size())}});
  ASSERT_TRUE(s.ok()) << s.error_message();
  // The budget is full: one more small model does not fit.
  v1::ModelConfig sgd;
  sgd.set_model_id("small");
  v1::TensorSpec* v = sgd.mutable_layout()->add_tensors();
  v->set_name("v");
  v->add_shape(16);
  sgd.mutable_optimizer()->mutable_sgd()->set_lr(0.1);
  sgd.set_num_trainers(1);
  sgd.set_shard_count(1);
  s = RawRegister(*stub, sgd, 0, false, {{0, FloatBytes(zeros.data(), 16)}});
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
}

}  // namespace
}  // namespace shardopt::testing
