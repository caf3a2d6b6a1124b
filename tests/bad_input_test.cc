// Every bad input and every duplicate against a real shard-server process:
// each gets its documented gRPC status, and the shard's state (version,
// ranks pushed, parameter bytes) is the same afterwards.
#include <grpcpp/grpcpp.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "server/optim/optimizer.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

namespace shardopt::testing {
namespace {

constexpr uint32_t kShardCount = 2;
constexpr uint32_t kShardIndex = 1;  // Not 0, so a defaulted shard_index is wrong.
constexpr uint32_t kTrainers = 2;
const char kModel[] = "model";

using Chunk = RawChunk;

std::string Bytes(const std::vector<float>& v, size_t begin, size_t end) {
  return FloatBytes(v.data() + begin, end - begin);
}

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    absl::StatusOr<std::unique_ptr<ServerProcess>> server =
        ServerProcess::Start(kShardIndex, kShardCount);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = std::move(*server);
    stub_ = NewStub(server_->address());

    layout_ = std::make_unique<ModelLayout>(
        ModelLayout::Create({{"w", {10, 13}, DType::kFloat32}, {"b", {13}, DType::kFloat32}}, 16,
                            kShardCount)
            .value());
    range_ = layout_->ShardRange(kShardIndex);
    config_.set_model_id(kModel);
    *config_.mutable_layout() = LayoutToProto(*layout_);
    OptimizerConfig adam = OptimizerConfig::Adam(0.01);
    *config_.mutable_optimizer() = OptimizerConfigToProto(adam);
    config_.set_num_trainers(kTrainers);
    config_.set_shard_count(kShardCount);
    initial_.resize(range_.size());
    for (size_t i = 0; i < initial_.size(); ++i) initial_[i] = 0.01f * static_cast<float>(i);
    grpc::Status s = Register(config_, false, {{0, Bytes(initial_, 0, initial_.size())}});
    ASSERT_TRUE(s.ok()) << s.error_message();
  }

  grpc::Status Register(const v1::ModelConfig& config, bool attach_only,
                        const std::vector<Chunk>& chunks,
                        v1::RegisterModelResponse* response_out = nullptr,
                        uint32_t shard_index = kShardIndex) {
    return RawRegister(*stub_, config, shard_index, attach_only, chunks, response_out);
  }

  v1::PushHeader Header(uint32_t rank, int64_t step) const {
    v1::PushHeader h;
    h.set_model_id(kModel);
    h.set_trainer_rank(rank);
    h.set_step(step);
    h.set_shard_index(kShardIndex);
    h.set_num_elements(range_.size());
    h.set_dtype(v1::DTYPE_FLOAT32);
    return h;
  }

  // Sends a header (unless null) then chunks; `cancel_after` >= 0 cancels
  // the call after that many chunks instead of finishing the stream.
  grpc::Status Push(const v1::PushHeader* header, const std::vector<Chunk>& chunks,
                    v1::PushGradientsResponse* response_out = nullptr, int cancel_after = -1) {
    if (cancel_after < 0) return RawPush(*stub_, header, chunks, response_out);
    grpc::ClientContext context;
    v1::PushGradientsResponse response;
    auto writer = stub_->PushGradients(&context, &response);
    v1::PushGradientsRequest request;
    *request.mutable_header() = *header;
    bool open = writer->Write(request);
    for (int sent = 0; open && sent < cancel_after && sent < static_cast<int>(chunks.size());
         ++sent) {
      request.mutable_chunk()->set_offset(chunks[sent].offset);
      request.mutable_chunk()->set_data(chunks[sent].data);
      open = writer->Write(request);
    }
    context.TryCancel();
    writer->Finish();
    return grpc::Status(grpc::CANCELLED, "cancelled by test");
  }

  std::vector<Chunk> GoodChunks(const std::vector<float>& grad, size_t chunk = 16) const {
    std::vector<Chunk> chunks;
    for (size_t off = 0; off < grad.size(); off += chunk) {
      chunks.push_back({off, Bytes(grad, off, std::min(grad.size(), off + chunk))});
    }
    return chunks;
  }

  std::vector<float> Gradient(float scale) const {
    std::vector<float> g(range_.size());
    for (size_t i = 0; i < g.size(); ++i) g[i] = scale * std::sin(static_cast<float>(i));
    return g;
  }

  // Pulls the raw payload bytes of `dtype` elements.
  grpc::Status PullBytes(int64_t min_version, v1::DType dtype, std::string* bytes, int64_t* version,
                         absl::Duration timeout = absl::Seconds(10),
                         const std::string& model = kModel, uint32_t shard_index = kShardIndex) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    v1::PullParametersRequest request;
    request.set_model_id(model);
    request.set_min_version(min_version);
    request.set_shard_index(shard_index);
    request.set_dtype(dtype);
    auto reader = stub_->PullParameters(&context, request);
    v1::PullParametersResponse response;
    const size_t element = dtype == v1::DTYPE_FLOAT32 ? 4 : 2;
    bytes->clear();
    while (reader->Read(&response)) {
      *version = response.version();
      EXPECT_EQ(response.chunk().offset(), bytes->size() / element);
      *bytes += response.chunk().data();
    }
    return reader->Finish();
  }

  grpc::Status Pull(int64_t min_version, std::vector<float>* values, int64_t* version,
                    absl::Duration timeout = absl::Seconds(10), const std::string& model = kModel,
                    uint32_t shard_index = kShardIndex) {
    std::string bytes;
    grpc::Status status =
        PullBytes(min_version, v1::DTYPE_FLOAT32, &bytes, version, timeout, model, shard_index);
    values->resize(bytes.size() / 4);
    std::memcpy(values->data(), bytes.data(), values->size() * 4);
    return status;
  }

  v1::InspectResponse Inspect() {
    grpc::ClientContext context;
    v1::InspectRequest request;
    request.set_model_id(kModel);
    v1::InspectResponse response;
    grpc::Status s = stub_->Inspect(&context, request, &response);
    EXPECT_TRUE(s.ok()) << s.error_message();
    return response;
  }

  // The observable state: version, ranks pushed for the next step, values.
  struct State {
    int64_t version;
    std::vector<uint32_t> pushed;
    std::vector<float> values;
    bool operator==(const State& o) const {
      return version == o.version && pushed == o.pushed && values.size() == o.values.size() &&
             std::memcmp(values.data(), o.values.data(), values.size() * 4) == 0;
    }
  };
  State Capture() {
    v1::InspectResponse info = Inspect();
    State state{info.version(), {info.trainers_pushed().begin(), info.trainers_pushed().end()}, {}};
    int64_t version = -1;
    grpc::Status s = Pull(0, &state.values, &version);
    EXPECT_TRUE(s.ok()) << s.error_message();
    EXPECT_EQ(version, state.version);
    return state;
  }

  void ExpectRejected(const grpc::Status& status, grpc::StatusCode code,
                      const std::string& message_part, const State& before) {
    EXPECT_EQ(status.error_code(), code) << status.error_message();
    EXPECT_NE(status.error_message().find(message_part), std::string::npos)
        << "message: " << status.error_message();
    EXPECT_TRUE(Capture() == before) << "state changed after: " << status.error_message();
  }

  std::unique_ptr<ServerProcess> server_;
  std::unique_ptr<v1::ShardService::Stub> stub_;
  std::unique_ptr<ModelLayout> layout_;
  FlatRange range_;
  v1::ModelConfig config_;
  std::vector<float> initial_;
};

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

TEST_F(BadInputTest, RegistrationIsIdempotentAndRefusesADifferentModel) {
  const State before = Capture();
  v1::RegisterModelResponse response;
  // Same config: attaches, initial values ignored.
  std::vector<float> other(range_.size(), 7.0f);
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
  std::vector<float> nan_values = other;
  nan_values[5] = std::nan("");
  ExpectRejected(Register(fresh, false, {{0, Bytes(nan_values, 0, nan_values.size())}}),
                 grpc::INVALID_ARGUMENT, "initial value 5", before);
  ExpectRejected(Register(fresh, false, {{0, Bytes(other, 0, other.size())}}, nullptr, 0),
                 grpc::FAILED_PRECONDITION, "meant for shard 0", before);
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
  const ModelLayout layout = ModelLayout::Create({{"w", {40}, DType::kFloat32}}, 16, 1).value();
  std::vector<float> values(layout.shard_size(), 1.0f);
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

// A push stream that stalls (client alive, sending nothing) is cancelled by
// the server after --stream_idle_timeout_s, freeing the trainer's slot.
TEST(StreamWatchdogTest, StalledPushIsCancelledAndTheSlotFreed) {
  absl::StatusOr<std::unique_ptr<ServerProcess>> server =
      ServerProcess::Start(0, 1, {"--stream_idle_timeout_s=1"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = NewStub((*server)->address());
  const ModelLayout layout = ModelLayout::Create({{"w", {100}, DType::kFloat32}}, 16, 1).value();
  std::vector<float> values(layout.shard_size(), 0.5f);
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
  // The stalled stream: header and one chunk, then nothing, without a deadline.
  grpc::ClientContext stalled_context;
  v1::PushGradientsResponse stalled_response;
  auto stalled = push(&stalled_context, &stalled_response, /*finish=*/false);

  // Probes send only a header: ABORTED while the stalled push holds the
  // slot, INVALID_ARGUMENT (no data) once it is free. The first probes wait
  // for the stalled stream to reach the server (it may trail on a loaded
  // machine), so that no probe takes the slot first.
  auto probe = [&]() {
    grpc::ClientContext context;
    v1::PushGradientsResponse r;
    auto writer = stub->PushGradients(&context, &r);
    writer->Write(header());
    writer->WritesDone();
    return writer->Finish().error_code();
  };
  const absl::Time registered_by = absl::Now() + absl::Seconds(10);
  while (absl::Now() < registered_by && probe() != grpc::ABORTED) {
    absl::SleepFor(absl::Milliseconds(5));
  }
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

}  // namespace
}  // namespace shardopt::testing
