// Bad and duplicate pushes and pulls against a real shard-server process:
// each gets its documented gRPC status, and the shard's state (version,
// ranks pushed, parameter bytes) is the same afterwards; duplicates are
// added once, 16-bit wire types convert exactly, and a stalled push stream
// is cancelled. Registration, hyperparameter changes, Inspect and the state
// budget: bad_model_setup_test.cc.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype_convert.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "server/optim/optimizer.h"
#include "tests/bad_input_fixture.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

TEST_F(BadInputTest, MalformedPushesAreRejectedAndChangeNothing) {
  const State before = Capture();
  ASSERT_EQ(before.version, 0);
  ASSERT_EQ(before.values.size(), range_.size());
  const std::vector<float> grad = Gradient(1.0f);
  const std::vector<Chunk> good = GoodChunks(grad);

  v1::PushHeader h = Header(0, 1);
  h.set_model_id("nope");
  ExpectRejected(Push(&h, good), grpc::NOT_FOUND, "model 'nope' is not registered", before);

  h = Header(0, 1);
  h.set_num_elements(range_.size() + 1);
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "elements; shard 1 owns", before);

  h = Header(kTrainers, 1);
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "trainer rank 2", before);

  h = Header(0, 0);
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "step 0 is not positive", before);

  h = Header(0, 2);
  ExpectRejected(Push(&h, good), grpc::OUT_OF_RANGE, "ahead of the shard", before);

  h = Header(0, 1);
  h.set_shard_index(0);
  ExpectRejected(Push(&h, good), grpc::FAILED_PRECONDITION, "meant for shard 0", before);

  h = Header(0, 1);
  h.set_dtype(static_cast<v1::DType>(99));
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "unknown dtype", before);

  h = Header(0, 1);
  h.set_dtype(v1::DTYPE_BFLOAT16);
  ExpectRejected(Push(&h, {{0, std::string(3, 'x')}}), grpc::INVALID_ARGUMENT,
                 "whole number of bfloat16 elements", before);

  ExpectRejected(Push(nullptr, good), grpc::INVALID_ARGUMENT, "must start with a header", before);

  h = Header(0, 1);
  ExpectRejected(Push(&h, {good.begin(), good.end() - 1}), grpc::INVALID_ARGUMENT,
                 "push ended after", before);

  std::vector<Chunk> gap = good;
  gap.erase(gap.begin() + 1);
  ExpectRejected(Push(&h, gap), grpc::INVALID_ARGUMENT, "without gaps or overlaps", before);

  std::vector<Chunk> overlap = good;
  overlap.insert(overlap.begin() + 1, good[0]);
  ExpectRejected(Push(&h, overlap), grpc::INVALID_ARGUMENT, "without gaps or overlaps", before);

  std::vector<Chunk> empty = good;
  empty.insert(empty.begin() + 1, Chunk{good[1].offset, ""});
  ExpectRejected(Push(&h, empty), grpc::INVALID_ARGUMENT, "empty chunk at element", before);

  std::vector<Chunk> ragged = good;
  ragged[0].data.pop_back();
  ExpectRejected(Push(&h, ragged), grpc::INVALID_ARGUMENT, "whole number of float32", before);

  std::vector<Chunk> overrun = good;
  overrun.push_back({range_.size(), Bytes(grad, 0, 4)});
  ExpectRejected(Push(&h, overrun), grpc::INVALID_ARGUMENT, "overruns the shard range", before);

  for (float bad : {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity()}) {
    std::vector<float> poisoned = grad;
    poisoned[range_.size() - 3] = bad;  // In the last chunk: earlier chunks were staged.
    ExpectRejected(Push(&h, GoodChunks(poisoned)), grpc::INVALID_ARGUMENT, "from trainer 0",
                   before);
  }

  // A second header in the middle of the stream.
  {
    grpc::ClientContext context;
    v1::PushGradientsResponse response;
    auto writer = stub_->PushGradients(&context, &response);
    v1::PushGradientsRequest request;
    *request.mutable_header() = Header(0, 1);
    writer->Write(request);
    writer->Write(request);
    writer->WritesDone();
    ExpectRejected(writer->Finish(), grpc::INVALID_ARGUMENT, "second header", before);
  }

  // A stream the client abandons half way leaves the slot free.
  Push(&h, good, nullptr, /*cancel_after=*/2);
  EXPECT_TRUE(Capture() == before);

  // After all that, a good push is accepted normally (no slot left busy).
  v1::PushGradientsResponse response;
  grpc::Status s = Push(&h, good, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
  EXPECT_EQ(response.trainers_pending(), 1u);
}

// A message of the push stream that does not parse (gRPC's reader reports
// it as the stream's end): the push is refused as incomplete and nothing
// of it is used, wherever it comes before the last chunk. (After the last
// one it cannot be told from the stream's end in gRPC's synchronous API:
// the push is whole and checked, and is applied as sent.)
TEST_F(BadInputTest, AnUnparsableMessageInAPushStreamChangesNothing) {
  const State before = Capture();
  const std::vector<float> grad = Gradient(1.0f);
  std::vector<std::string> good;
  v1::PushGradientsRequest request;
  *request.mutable_header() = Header(0, 1);
  good.push_back(request.SerializeAsString());
  for (const Chunk& c : GoodChunks(grad)) {
    request.mutable_chunk()->set_offset(c.offset);
    request.mutable_chunk()->set_data(c.data);
    good.push_back(request.SerializeAsString());
  }
  ASSERT_GT(good.size(), 3u);
  // Field 1 (the header), 127 bytes long, with 3 there.
  const std::string unparsable(
      "\x0a\x7f"
      "abc",
      5);
  auto channel = grpc::CreateChannel(server_->address(), grpc::InsecureChannelCredentials());
  const std::string method = "/shardopt.v1.ShardService/PushGradients";
  for (const size_t at : {size_t{1}, size_t{2}, good.size() - 1}) {
    std::vector<std::string> messages = good;
    messages.insert(messages.begin() + at, unparsable);
    const grpc::Status s = RawClientStream(channel.get(), method, messages, 10000);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << "at " << at << ": " << s.error_message();
    EXPECT_TRUE(absl::StrContains(s.error_message(), "push ended after"))
        << "at " << at << ": " << s.error_message();
    EXPECT_EQ(Capture(), before) << "the unparsable message at " << at;
  }
  std::vector<std::string> trailing = good;
  trailing.push_back(unparsable);
  EXPECT_TRUE(RawClientStream(channel.get(), method, trailing, 10000).ok());
  v1::PushGradientsResponse response;
  const v1::PushHeader header = Header(0, 1);
  const grpc::Status again = Push(&header, GoodChunks(grad), &response);
  ASSERT_TRUE(again.ok()) << again.error_message();
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_DUPLICATE)
      << "the push before the trailing message was not applied";
}

// The hyperparameter changes a push carries are checked with the rest of
// the push, and taken only with a push the shard admits and keeps: a
// refused push schedules nothing, also one refused for its payload after
// its admission.
TEST_F(BadInputTest, CarriedHyperparameterChangesComeOnlyWithAnAdmittedPush) {
  const State before = Capture();
  const std::vector<Chunk> good = GoodChunks(Gradient(1.0f));
  v1::SetHyperparametersRequest change;
  change.set_model_id(kModel);
  change.set_effective_step(5);
  *change.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Adam(0.0005));
  const auto scheduled = [&] { return Inspect().scheduled_changes_size(); };

  v1::PushHeader h = Header(0, 2);
  *h.add_hyperparameter_changes() = change;
  ExpectRejected(Push(&h, good), grpc::OUT_OF_RANGE, "ahead of the shard", before);
  EXPECT_EQ(scheduled(), 0) << "a refused push scheduled its change";

  h = Header(0, 1);
  *h.add_hyperparameter_changes() = change;
  h.mutable_hyperparameter_changes(0)->set_model_id("other");
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "names model 'other'", before);

  h = Header(0, 3);
  *h.add_hyperparameter_changes() = change;
  h.mutable_hyperparameter_changes(0)->set_effective_step(2);
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "change for step 2", before);

  // Admitted, then refused for its payload: a NaN, a stream that ends short.
  std::vector<float> nan = Gradient(1.0f);
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  h = Header(0, 1);
  *h.add_hyperparameter_changes() = change;
  ExpectRejected(Push(&h, GoodChunks(nan)), grpc::INVALID_ARGUMENT, "is nan", before);
  EXPECT_EQ(scheduled(), 0) << "a push refused for a NaN scheduled its change";
  std::vector<Chunk> short_stream = good;
  short_stream.pop_back();
  ExpectRejected(Push(&h, short_stream), grpc::INVALID_ARGUMENT, "push ended after", before);
  EXPECT_EQ(scheduled(), 0) << "a push that ended short scheduled its change";

  h = Header(0, 1);
  for (size_t i = 0; i <= kMaxPendingHyperparameterChanges; ++i) {
    *h.add_hyperparameter_changes() = change;
    h.mutable_hyperparameter_changes(i)->set_effective_step(10 + i);
  }
  ExpectRejected(Push(&h, good), grpc::INVALID_ARGUMENT, "at most 1024 pending", before);
  EXPECT_EQ(scheduled(), 0);

  // At most kMaxPendingHyperparameterChanges scheduled, by SetHyperparameters
  // or carried in.
  for (size_t i = 0; i < kMaxPendingHyperparameterChanges; ++i) {
    v1::SetHyperparametersRequest request = change;
    request.set_effective_step(100 + i);
    grpc::ClientContext context;
    v1::SetHyperparametersResponse response;
    const grpc::Status s = stub_->SetHyperparameters(&context, request, &response);
    ASSERT_TRUE(s.ok()) << i << ": " << s.error_message();
  }
  {
    grpc::ClientContext context;
    v1::SetHyperparametersResponse response;
    const grpc::Status s = stub_->SetHyperparameters(&context, change, &response);
    EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED) << s.error_message();
  }
  h = Header(0, 1);
  *h.add_hyperparameter_changes() = change;
  ExpectRejected(Push(&h, good), grpc::RESOURCE_EXHAUSTED, "does not hold", before);
  EXPECT_EQ(scheduled(), static_cast<int>(kMaxPendingHyperparameterChanges));

  // One already scheduled is no new entry: the push goes in.
  h = Header(0, 1);
  *h.add_hyperparameter_changes() = change;
  h.mutable_hyperparameter_changes(0)->set_effective_step(100);
  v1::PushGradientsResponse response;
  const grpc::Status s = Push(&h, good, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
}

TEST_F(BadInputTest, NonFiniteMessageNamesTheTensorElement) {
  std::vector<float> grad = Gradient(1.0f);
  grad[0] = std::numeric_limits<float>::quiet_NaN();
  const v1::PushHeader h = Header(1, 1);
  grpc::Status s = Push(&h, GoodChunks(grad));
  EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT);
  // Shard 1's range starts inside tensor "w".
  const std::vector<TensorPiece> pieces = layout_->PiecesIn(range_);
  ASSERT_FALSE(pieces.empty());
  const std::string expected =
      absl::StrCat("tensor '", layout_->tensors()[pieces[0].tensor_index].spec.name, "'[",
                   pieces[0].tensor_offset, "]");
  EXPECT_NE(s.error_message().find(expected), std::string::npos) << s.error_message();
}

TEST_F(BadInputTest, DuplicatePushesAreAcknowledgedAndAddedOnce) {
  const std::vector<float> g0 = Gradient(1.0f), g0_other = Gradient(5.0f), g1 = Gradient(-0.5f);
  const v1::PushHeader h0 = Header(0, 1), h1 = Header(1, 1);
  v1::PushGradientsResponse r;

  ASSERT_TRUE(Push(&h0, GoodChunks(g0), &r).ok());
  EXPECT_EQ(r.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
  const State staged = Capture();
  EXPECT_EQ(staged.pushed, std::vector<uint32_t>{0});

  // The same (trainer, step) again, even with other data: acknowledged, ignored.
  ASSERT_TRUE(Push(&h0, GoodChunks(g0_other), &r).ok());
  EXPECT_EQ(r.outcome(), v1::PushGradientsResponse::OUTCOME_DUPLICATE);
  EXPECT_TRUE(Capture() == staged);

  ASSERT_TRUE(Push(&h1, GoodChunks(g1), &r).ok());
  EXPECT_EQ(r.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  EXPECT_EQ(r.version(), 1);
  const State applied = Capture();
  EXPECT_EQ(applied.version, 1);
  EXPECT_TRUE(applied.pushed.empty());

  // The expected values: Adam step 1 on the mean of the FIRST pushes.
  std::vector<float> mean(range_.size());
  for (size_t i = 0; i < mean.size(); ++i) mean[i] = (g0[i] + g1[i]) / 2.0f;
  std::vector<float> expected = initial_;
  auto optimizer = Optimizer::Create(OptimizerConfig::Adam(0.01), expected.size()).value();
  optimizer->Update(1, expected.data(), mean.data(), 0, expected.size());
  ASSERT_EQ(applied.values.size(), expected.size());
  EXPECT_EQ(std::memcmp(applied.values.data(), expected.data(), expected.size() * 4), 0);

  // Re-pushing an applied step (a retry after a lost reply): acknowledged.
  for (const v1::PushHeader* h : {&h0, &h1}) {
    ASSERT_TRUE(Push(h, GoodChunks(g0_other), &r).ok());
    EXPECT_EQ(r.outcome(), v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED);
    EXPECT_EQ(r.version(), 1);
  }
  EXPECT_TRUE(Capture() == applied);
}

TEST_F(BadInputTest, PullErrors) {
  std::vector<float> values;
  int64_t version = -1;
  EXPECT_EQ(Pull(0, &values, &version, absl::Seconds(5), "nope").error_code(), grpc::NOT_FOUND);
  EXPECT_EQ(Pull(0, &values, &version, absl::Seconds(5), kModel, 0).error_code(),
            grpc::FAILED_PRECONDITION);
  std::string bytes;
  EXPECT_EQ(PullBytes(0, static_cast<v1::DType>(99), &bytes, &version).error_code(),
            grpc::INVALID_ARGUMENT);
  EXPECT_EQ(Pull(-1, &values, &version).error_code(), grpc::INVALID_ARGUMENT);
  // A version that does not come: the deadline ends the wait.
  const absl::Time start = absl::Now();
  EXPECT_EQ(Pull(1, &values, &version, absl::Milliseconds(300)).error_code(),
            grpc::DEADLINE_EXCEEDED);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // Version 0 is the registered values.
  ASSERT_TRUE(Pull(0, &values, &version).ok());
  EXPECT_EQ(version, 0);
  ASSERT_EQ(values.size(), initial_.size());
  EXPECT_EQ(std::memcmp(values.data(), initial_.data(), values.size() * 4), 0);
}

TEST_F(BadInputTest, SixteenBitPushesAndPulls) {
  const State before = Capture();
  // An fp16 gradient holding +inf (0x7c00) is refused like an fp32 inf.
  std::vector<uint16_t> half(range_.size());
  for (size_t i = 0; i < half.size(); ++i) half[i] = FloatToHalfBits(0.25f * (i % 7));
  shardopt::ZeroPadding(*layout_, range_, half.data());
  half[range_.size() / 2] = 0x7c00;
  v1::PushHeader h = Header(0, 1);
  h.set_dtype(v1::DTYPE_FLOAT16);
  const std::string poisoned(reinterpret_cast<const char*>(half.data()), half.size() * 2);
  ExpectRejected(Push(&h, {{0, poisoned}}), grpc::INVALID_ARGUMENT, "is inf", before);

  // Valid 16-bit pushes from both ranks, in two dtypes: step 1 applies the
  // mean of their exact fp32 values.
  half[range_.size() / 2] = FloatToHalfBits(-1.5f);
  std::vector<uint16_t> bf16(range_.size());
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = FloatToBFloat16Bits(0.1f * (i % 5) - 0.2f);
  shardopt::ZeroPadding(*layout_, range_, bf16.data());
  v1::PushGradientsResponse r;
  ASSERT_TRUE(Push(&h,
                   {{0, std::string(reinterpret_cast<const char*>(half.data()), 2 * 10)},
                    {10, std::string(reinterpret_cast<const char*>(half.data() + 10),
                                     2 * (half.size() - 10))}},
                   &r)
                  .ok());
  v1::PushHeader h1 = Header(1, 1);
  h1.set_dtype(v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(
      Push(&h1, {{0, std::string(reinterpret_cast<const char*>(bf16.data()), bf16.size() * 2)}}, &r)
          .ok());
  ASSERT_EQ(r.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  std::vector<float> mean(range_.size());
  for (size_t i = 0; i < mean.size(); ++i) {
    mean[i] = (HalfBitsToFloat(half[i]) + BFloat16BitsToFloat(bf16[i])) / 2.0f;
  }
  std::vector<float> expected = initial_;
  auto optimizer = Optimizer::Create(OptimizerConfig::Adam(0.01), expected.size()).value();
  optimizer->Update(1, expected.data(), mean.data(), 0, expected.size());
  const State applied = Capture();
  EXPECT_EQ(std::memcmp(applied.values.data(), expected.data(), expected.size() * 4), 0);

  // Pulls in each 16-bit type: the fp32 master values rounded to nearest even.
  for (v1::DType dtype : {v1::DTYPE_BFLOAT16, v1::DTYPE_FLOAT16}) {
    std::string bytes;
    int64_t version = -1;
    ASSERT_TRUE(PullBytes(1, dtype, &bytes, &version).ok());
    EXPECT_EQ(version, 1);
    ASSERT_EQ(bytes.size(), range_.size() * 2);
    for (size_t i = 0; i < range_.size(); ++i) {
      uint16_t got;
      std::memcpy(&got, bytes.data() + 2 * i, 2);
      const uint16_t want = dtype == v1::DTYPE_BFLOAT16 ? FloatToBFloat16Bits(expected[i])
                                                        : FloatToHalfBits(expected[i]);
      ASSERT_EQ(got, want) << i;
    }
  }
}

TEST(Float16PullTest, AParameterBeyondFloat16IsRefusedNotSentAsInf) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  // 48 elements: no padding.
  const ModelLayout layout = ModelLayout::Create({{"w", {48}, DType::kFloat32}}, 16, 1).value();
  std::vector<float> values(layout.ShardSize(0), 1.0f);
  values[7] = 70000.0f;  // Finite in fp32 and bf16, beyond fp16's 65504.
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Sgd(0.1));
  config.set_num_trainers(1);
  config.set_shard_count(1);
  ASSERT_TRUE(
      RawRegister(*stub, config, 0, false, {{0, FloatBytes(values.data(), values.size())}}).ok());
  for (v1::DType dtype : {v1::DTYPE_FLOAT16, v1::DTYPE_BFLOAT16}) {
    grpc::ClientContext context;
    v1::PullParametersRequest request;
    request.set_model_id("m");
    request.set_dtype(dtype);
    auto reader = stub->PullParameters(&context, request);
    v1::PullParametersResponse response;
    while (reader->Read(&response)) {
    }
    grpc::Status status = reader->Finish();
    if (dtype == v1::DTYPE_FLOAT16) {
      EXPECT_EQ(status.error_code(), grpc::FAILED_PRECONDITION) << status.error_message();
      EXPECT_NE(status.error_message().find("tensor 'w'[7] is 70000, which overflows float16"),
                std::string::npos)
          << status.error_message();
    } else {
      EXPECT_TRUE(status.ok()) << status.error_message();
    }
  }
}

// A push stream that stalls (client alive, sending nothing) is cancelled by
// the server after --stream_idle_timeout_s, freeing the trainer's slot.
TEST(StreamWatchdogTest, StalledPushIsCancelledAndTheSlotFreed) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--stream_idle_timeout_s=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  // 112 elements: no padding.
  const ModelLayout layout = ModelLayout::Create({{"w", {112}, DType::kFloat32}}, 16, 1).value();
  std::vector<float> values(layout.ShardSize(0), 0.5f);
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Sgd(0.1));
  config.set_num_trainers(2);
  config.set_shard_count(1);
  ASSERT_TRUE(
      RawRegister(*stub, config, 0, false, {{0, FloatBytes(values.data(), values.size())}}).ok());
  // The header of trainer 0's push of step 1.
  const auto header = [&] {
    v1::PushGradientsRequest request;
    v1::PushHeader* h = request.mutable_header();
    h->set_model_id("m");
    h->set_step(1);
    h->set_num_elements(values.size());
    return request;
  };
  auto push = [&](grpc::ClientContext* context, v1::PushGradientsResponse* response,
                  bool finish) -> std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> {
    auto writer = stub->PushGradients(context, response);
    v1::PushGradientsRequest request = header();
    writer->Write(request);
    request.mutable_chunk()->set_data(values.data(), 16 * 4);  // Part of the range.
    writer->Write(request);
    if (!finish) return writer;
    request.mutable_chunk()->set_offset(16);
    request.mutable_chunk()->set_data(values.data() + 16, (values.size() - 16) * 4);
    writer->Write(request);
    writer->WritesDone();
    return writer;
  };
  // Probes send only a header: ABORTED while the stalled push holds the
  // slot, INVALID_ARGUMENT (no data) once it is free.
  auto probe = [&]() {
    grpc::ClientContext context;
    v1::PushGradientsResponse r;
    auto writer = stub->PushGradients(&context, &r);
    writer->Write(header());
    writer->WritesDone();
    return writer->Finish().error_code();
  };
  // The stalled stream: header and one chunk, then nothing, without a
  // deadline. The first probes wait for it to reach the server (it may trail
  // on a loaded machine); one that held the slot at that very moment makes
  // the stalled push itself ABORTED, so a stream that never comes to hold
  // the slot is opened again (at most 3 times).
  std::unique_ptr<grpc::ClientContext> stalled_context;
  v1::PushGradientsResponse stalled_response;
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> stalled;
  bool holds_slot = false;
  for (int attempt = 0; attempt < 3 && !holds_slot; ++attempt) {
    if (stalled) stalled->Finish().IgnoreError();
    stalled_context = std::make_unique<grpc::ClientContext>();
    stalled = push(stalled_context.get(), &stalled_response, /*finish=*/false);
    const absl::Time registered_by = absl::Now() + absl::Seconds(3);
    while (absl::Now() < registered_by && !holds_slot) {
      holds_slot = probe() == grpc::ABORTED;
      if (!holds_slot) absl::SleepFor(absl::Milliseconds(5));
    }
  }
  ASSERT_TRUE(holds_slot) << "the stalled push never held the trainer's slot";
  const absl::Time start = absl::Now();
  int aborted = 0;
  while (absl::Now() - start < absl::Seconds(15) && probe() == grpc::ABORTED) {
    ++aborted;
    absl::SleepFor(absl::Milliseconds(100));
  }
  grpc::ClientContext context;
  v1::PushGradientsResponse response;
  const grpc::Status status = push(&context, &response, /*finish=*/true)->Finish();
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
  EXPECT_GT(aborted, 0);                             // The slot was busy at first...
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));  // ...and freed after ~1 s.
  EXPECT_EQ(stalled->Finish().error_code(), grpc::CANCELLED);
}

// The watchdog watches the client's sending only: a push whose stream has
// ended and which waits to be applied (here: bounded staleness, trainer 0's
// step 2 behind trainer 1's step 1) for longer than
// --stream_idle_timeout_s is applied and answered, not cancelled.
TEST(StreamWatchdogTest, APushWaitingToBeAppliedIsNotCancelled) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--stream_idle_timeout_s=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  const ModelLayout layout = ModelLayout::Create({{"w", {112}, DType::kFloat32}}, 16, 1).value();
  const std::vector<float> values(layout.ShardSize(0), 0.5f);
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Sgd(0.1));
  config.set_num_trainers(2);
  config.set_shard_count(1);
  config.set_consistency(v1::CONSISTENCY_BOUNDED);
  config.set_staleness(1);
  ASSERT_TRUE(
      RawRegister(*stub, config, 0, false, {{0, FloatBytes(values.data(), values.size())}}).ok());
  const std::vector<float> gradient(values.size(), 0.25f);
  const auto push = [&](uint32_t rank, int64_t step, v1::PushGradientsResponse* response) {
    v1::PushHeader header;
    header.set_model_id("m");
    header.set_trainer_rank(rank);
    header.set_step(step);
    header.set_num_elements(gradient.size());
    return RawPush(*stub, &header, {{0, FloatBytes(gradient.data(), gradient.size())}}, response);
  };
  v1::PushGradientsResponse first;
  ASSERT_TRUE(push(0, 1, &first).ok());
  // No deadline, no max_wait_ms: it waits as long as trainer 1 takes.
  grpc::Status waited;
  v1::PushGradientsResponse waited_response;
  absl::Time answered;
  std::thread waiting([&] {
    waited = push(0, 2, &waited_response);
    answered = absl::Now();
  });
  absl::SleepFor(absl::Milliseconds(2500));  // Twice the idle timeout, and its check period.
  const absl::Time released = absl::Now();
  v1::PushGradientsResponse second;
  const grpc::Status released_status = push(1, 1, &second);
  waiting.join();
  ASSERT_TRUE(released_status.ok()) << released_status.error_message();
  ASSERT_TRUE(waited.ok()) << waited.error_message() << " (" << waited.error_code() << ")";
  EXPECT_EQ(waited_response.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  EXPECT_GE(answered, released) << "trainer 0's step 2 was answered before trainer 1 pushed";
}

}  // namespace
}  // namespace shardopt::testing
