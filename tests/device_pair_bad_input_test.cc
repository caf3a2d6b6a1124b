// Bad input through the device-pair path (PushHeader.device_pair,
// PullParametersRequest.device_pair, OpenDevicePair) against a real shard
// process with loopback pairs: each is refused with a clear status and
// leaves the shard as it was; a push refused for what its bytes hold is
// still drained, so the pair carries the next transfer; then a good push
// and pull over the pair match the stream's bits.
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/device_pair.h"
#include "common/loopback_pair.h"
#include "tests/bad_input_fixture.h"

namespace shardopt::testing {
namespace {

class DevicePairBadInputTest : public BadInputTest {
 protected:
  std::vector<std::string> ServerFlags() const override {
    return {"--device=cpu", "--device_pairs=loopback"};
  }

  struct Pair {
    std::string name;
    std::unique_ptr<DevicePair> pair;
  };
  Pair Open() {
    v1::OpenDevicePairRequest request;
    request.set_kind("loopback");
    request.set_peer("bad input test");
    v1::OpenDevicePairResponse response;
    grpc::ClientContext context;
    EXPECT_TRUE(stub_->OpenDevicePair(&context, request, &response).ok());
    absl::StatusOr<std::unique_ptr<DevicePair>> pair = LoopbackPairKind().Connect(
        response.id(), 1, 0, absl::Now() + absl::Seconds(10), "the shard");
    EXPECT_TRUE(pair.ok()) << pair.status();
    return {response.pair(), pair.ok() ? *std::move(pair) : nullptr};
  }
  v1::PushHeader PairHeader(uint32_t rank, int64_t step, const Pair& pair,
                            uint64_t transfer) const {
    v1::PushHeader header = Header(rank, step);
    header.mutable_device_pair()->set_pair(pair.name);
    header.mutable_device_pair()->set_transfer(transfer);
    return header;
  }
  // A push over `pair`: the header, then (once the shard says it is ready)
  // `values` over the pair. `sent` says whether the bytes went.
  grpc::Status PairPush(const v1::PushHeader& header, const Pair& pair,
                        const std::vector<float>& values, bool* sent = nullptr,
                        v1::PushGradientsResponse* response = nullptr) {
    v1::PushGradientsResponse unused;
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto writer = stub_->PushGradients(&context, response ? response : &unused);
    v1::PushGradientsRequest request;
    *request.mutable_header() = header;
    writer->Write(request);
    writer->WritesDone();
    writer->WaitForInitialMetadata();
    const auto& metadata = context.GetServerInitialMetadata();
    const bool ready = metadata.find(kDevicePairReadyKey) != metadata.end();
    if (sent) *sent = ready;
    if (ready) {
      EXPECT_TRUE(pair.pair
                      ->Send(values.data(), values.size() * sizeof(float),
                             absl::Now() + absl::Seconds(10), "test push")
                      .ok());
    }
    return writer->Finish();
  }
  // A push of trainer 0's step 1 over `pair` (the call's deadline `timeout`
  // away) that the shard has taken, with half of its bytes sent.
  void StartHalfPush(const Pair& pair, absl::Duration timeout, grpc::ClientContext* context,
                     v1::PushGradientsResponse* response,
                     std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>>* writer) {
    context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    *writer = stub_->PushGradients(context, response);
    v1::PushGradientsRequest request;
    *request.mutable_header() = PairHeader(0, 1, pair, 1);
    (*writer)->Write(request);
    (*writer)->WritesDone();
    (*writer)->WaitForInitialMetadata();
    ASSERT_NE(context->GetServerInitialMetadata().find(kDevicePairReadyKey),
              context->GetServerInitialMetadata().end());
    const std::vector<float> half(range_.size() / 2, 0.25f);
    ASSERT_TRUE(
        pair.pair
            ->Send(half.data(), half.size() * sizeof(float), absl::Now() + absl::Seconds(5), "half")
            .ok());
  }
  grpc::Status PairPull(int64_t min_version, const Pair& pair, std::vector<float>* values,
                        int64_t* version, v1::DType dtype = v1::DTYPE_FLOAT32,
                        std::optional<uint64_t> expected = std::nullopt, int64_t max_wait_ms = 0) {
    v1::PullParametersRequest request;
    request.set_model_id(kModel);
    request.set_shard_index(kShardIndex);
    request.set_min_version(min_version);
    request.set_max_wait_ms(max_wait_ms);
    request.set_dtype(dtype);
    request.mutable_device_pair()->set_pair(pair.name);
    request.mutable_device_pair()->set_transfer(1);
    request.mutable_device_pair()->set_num_elements(expected.value_or(range_.size()));
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub_->PullParameters(&context, request);
    v1::PullParametersResponse response;
    if (!reader->Read(&response)) return reader->Finish();
    EXPECT_FALSE(response.has_chunk());
    values->assign(range_.size(), 0.0f);
    EXPECT_TRUE(pair.pair
                    ->Recv(values->data(), values->size() * sizeof(float),
                           absl::Now() + absl::Seconds(10), "test pull")
                    .ok());
    int messages = 0;
    while (reader->Read(&response)) {
      ++messages;
      *version = response.version();
    }
    grpc::Status status = reader->Finish();
    if (status.ok()) {
      EXPECT_EQ(messages, 1);
    }
    return status;
  }
};

TEST_F(DevicePairBadInputTest, RefusedPushesAndPullsLeaveTheShardAsItWas) {
  const State before = Capture();
  const std::vector<float> good = Gradient(1.0f);
  Pair pair = Open();
  ASSERT_NE(pair.pair, nullptr);

  Pair unknown{std::string(32, 'c'), nullptr};
  bool sent = true;
  ExpectRejected(PairPush(PairHeader(0, 1, unknown, 1), unknown, good, &sent),
                 grpc::FAILED_PRECONDITION, kDevicePairNotOpen, before);
  EXPECT_FALSE(sent) << "nothing goes over a pair the shard refused";

  // 16-bit payloads do not travel over pairs.
  v1::PushHeader bf16 = PairHeader(0, 1, pair, 1);
  bf16.set_dtype(v1::DTYPE_BFLOAT16);
  ExpectRejected(PairPush(bf16, pair, good, &sent), grpc::INVALID_ARGUMENT, "carries fp32", before);
  EXPECT_FALSE(sent);

  // A pair and another place for the payload at once.
  v1::PushHeader both = PairHeader(0, 1, pair, 1);
  both.mutable_socket_payload()->set_link("x");
  ExpectRejected(PairPush(both, pair, good, &sent), grpc::INVALID_ARGUMENT,
                 "names a device pair and another place", before);

  // A NaN over the pair: refused as in a stream; its bytes are drained.
  std::vector<float> nan = good;
  nan[3] = std::numeric_limits<float>::quiet_NaN();
  ExpectRejected(PairPush(PairHeader(0, 1, pair, 2), pair, nan, &sent), grpc::INVALID_ARGUMENT,
                 "is nan", before);
  EXPECT_TRUE(sent);

  // Something on a padding element.
  std::vector<float> padded = good;
  std::optional<uint64_t> padding;
  for (const FlatRange& gap : layout_->PaddingIn(range_)) {
    if (gap.end > gap.begin) padding = gap.begin - range_.begin;
  }
  ASSERT_TRUE(padding.has_value()) << "the fixture's layout has padding in this shard";
  padded[*padding] = 0.5f;
  ExpectRejected(PairPush(PairHeader(0, 1, pair, 3), pair, padded, &sent), grpc::INVALID_ARGUMENT,
                 "padding gets zero gradients", before);

  // Pulls: a pair that is not open, a 16-bit pull over a pair.
  std::vector<float> values;
  int64_t version = -1;
  ExpectRejected(PairPull(0, unknown, &values, &version), grpc::FAILED_PRECONDITION,
                 kDevicePairNotOpen, before);
  ExpectRejected(PairPull(0, pair, &values, &version, v1::DTYPE_BFLOAT16), grpc::INVALID_ARGUMENT,
                 "carries fp32", before);
  // A trainer expecting another count than the shard's range: refused before
  // a byte moves (the pair stays in step).
  ExpectRejected(PairPull(0, pair, &values, &version, v1::DTYPE_FLOAT32, range_.size() + 1),
                 grpc::INVALID_ARGUMENT, "expects", before);

  // A pull whose wait for the version runs out (max_wait_ms: the trainer's
  // "still waiting" report) sent nothing over the pair: the pair stays.
  ExpectRejected(PairPull(1, pair, &values, &version, v1::DTYPE_FLOAT32, std::nullopt, 200),
                 grpc::DEADLINE_EXCEEDED, "", before);

  // Opening a pair of a kind the shard does not open.
  v1::OpenDevicePairRequest request;
  request.set_kind("nccl");
  v1::OpenDevicePairResponse response;
  grpc::ClientContext context;
  const grpc::Status wrong_kind = stub_->OpenDevicePair(&context, request, &response);
  EXPECT_EQ(wrong_kind.error_code(), grpc::FAILED_PRECONDITION) << wrong_kind.error_message();
  // Long strings are refused or quoted in part, never echoed whole (they
  // would not fit the reply's metadata).
  {
    v1::OpenDevicePairRequest long_kind;
    long_kind.set_kind(std::string(1 << 20, 'k'));
    grpc::ClientContext c;
    const grpc::Status s = stub_->OpenDevicePair(&c, long_kind, &response);
    EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message().substr(0, 200);
    EXPECT_LT(s.error_message().size(), 300u);
  }
  {
    v1::OpenDevicePairRequest long_peer;
    long_peer.set_kind("loopback");
    long_peer.set_peer(std::string(1 << 20, 'p'));
    grpc::ClientContext c;
    const grpc::Status s = stub_->OpenDevicePair(&c, long_peer, &response);
    EXPECT_EQ(s.error_code(), grpc::INVALID_ARGUMENT) << s.error_message().substr(0, 200);
    EXPECT_LT(s.error_message().size(), 300u);
  }
  {
    Pair unopened{std::string(1 << 20, 'n'), nullptr};
    const grpc::Status s = PairPush(PairHeader(0, 1, unopened, 99), pair, good);
    EXPECT_EQ(s.error_code(), grpc::FAILED_PRECONDITION) << s.error_message().substr(0, 200);
    EXPECT_LT(s.error_message().size(), 300u);
  }

  // The same pair still carries good transfers, with the stream's bits.
  for (uint32_t rank = 0; rank < kTrainers; ++rank) {
    ASSERT_TRUE(PairPush(PairHeader(rank, 1, pair, 10 + rank), pair, good, &sent).ok());
    EXPECT_TRUE(sent);
  }
  ASSERT_TRUE(PairPull(1, pair, &values, &version).ok());
  EXPECT_EQ(version, 1);
  std::vector<float> streamed;
  int64_t streamed_version = -1;
  ASSERT_TRUE(Pull(1, &streamed, &streamed_version).ok());
  EXPECT_EQ(streamed_version, 1);
  ASSERT_EQ(values.size(), streamed.size());
  EXPECT_EQ(std::memcmp(values.data(), streamed.data(), values.size() * sizeof(float)), 0);
  EXPECT_NE(std::memcmp(values.data(), before.values.data(), values.size() * sizeof(float)), 0)
      << "the step was applied";

  // A push repeated after it was applied is acknowledged without its bytes.
  v1::PushGradientsResponse repeated;
  ASSERT_TRUE(PairPush(PairHeader(0, 1, pair, 20), pair, good, &sent, &repeated).ok());
  EXPECT_FALSE(sent);
  EXPECT_EQ(repeated.outcome(), v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED);
}

// A trainer whose pair breaks half way through a push (its end closes): the
// push fails UNAVAILABLE, nothing of it is applied, the pair is dropped.
TEST_F(DevicePairBadInputTest, APairBrokenHalfWayDropsThePushAndThePair) {
  const State before = Capture();
  Pair pair = Open();
  ASSERT_NE(pair.pair, nullptr);
  grpc::ClientContext context;
  v1::PushGradientsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> writer;
  ASSERT_NO_FATAL_FAILURE(StartHalfPush(pair, absl::Seconds(10), &context, &response, &writer));
  pair.pair.reset();  // (Closes the trainer's end.)
  ExpectRejected(writer->Finish(), grpc::UNAVAILABLE, "the push's payload", before);
  ExpectRejected(PairPush(PairHeader(0, 1, pair, 2), pair, Gradient(1.0f)),
                 grpc::FAILED_PRECONDITION, kDevicePairNotOpen, before);
}

// A trainer that cancels its push half way, its pair still open: the shard
// stops waiting for the bytes at once (not at the call's deadline), drops
// the pair and keeps nothing of the push.
TEST_F(DevicePairBadInputTest, APushCancelledHalfWayEndsAtOnce) {
  const State before = Capture();
  Pair pair = Open();
  ASSERT_NE(pair.pair, nullptr);
  grpc::ClientContext context;
  v1::PushGradientsResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> writer;
  ASSERT_NO_FATAL_FAILURE(StartHalfPush(pair, absl::Seconds(60), &context, &response, &writer));
  const absl::Time cancelled = absl::Now();
  context.TryCancel();
  EXPECT_EQ(writer->Finish().error_code(), grpc::CANCELLED);
  // The shard hangs up its end: the trainer's next wait on the pair ends.
  float value;
  const absl::Status hung_up =
      pair.pair->Recv(&value, sizeof(value), absl::Now() + absl::Seconds(20), "the shard's end");
  EXPECT_FALSE(hung_up.ok());
  EXPECT_LT(absl::Now() - cancelled, absl::Seconds(10)) << hung_up;
  EXPECT_TRUE(Capture() == before);
  ExpectRejected(PairPush(PairHeader(0, 1, pair, 2), pair, Gradient(1.0f)),
                 grpc::FAILED_PRECONDITION, kDevicePairNotOpen, before);
}

// A pull that waits on the shard for its version holds its pair; its
// "still waiting" report keeps the pair, but a pull its trainer cancels
// drops it on the shard too (the trainer drops its end then: it cannot
// tell what moved), instead of leaving a pair nobody names again.
TEST_F(DevicePairBadInputTest, APairWhosePullWasCancelledIsDropped) {
  const State before = Capture();
  Pair pair = Open();
  ASSERT_NE(pair.pair, nullptr);
  const auto wait_for = [&](const std::function<bool(const v1::ServerInfo&)>& holds) {
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (!holds(Info()) && absl::Now() < deadline) absl::SleepFor(absl::Milliseconds(5));
    return holds(Info());
  };
  ASSERT_TRUE(wait_for([](const v1::ServerInfo& i) { return i.device_pairs() == 1; }));
  std::vector<float> values;
  int64_t version = -1;
  ExpectRejected(PairPull(1, pair, &values, &version, v1::DTYPE_FLOAT32, std::nullopt,
                          /*max_wait_ms=*/100),
                 grpc::DEADLINE_EXCEEDED, "", before);
  EXPECT_EQ(Info().device_pairs(), 1u) << "a wait report dropped the pair";

  v1::PullParametersRequest request;
  request.set_model_id(kModel);
  request.set_shard_index(kShardIndex);
  request.set_min_version(1);
  request.mutable_device_pair()->set_pair(pair.name);
  request.mutable_device_pair()->set_transfer(2);
  request.mutable_device_pair()->set_num_elements(range_.size());
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  grpc::Status pulled;
  std::thread puller([&] {
    auto reader = stub_->PullParameters(&context, request);
    v1::PullParametersResponse response;
    while (reader->Read(&response)) {
    }
    pulled = reader->Finish();
  });
  const bool held = wait_for([](const v1::ServerInfo& i) { return i.device_pairs_busy() == 1; });
  context.TryCancel();
  puller.join();
  ASSERT_TRUE(held) << "the waiting pull did not take its pair";
  EXPECT_EQ(pulled.error_code(), grpc::CANCELLED) << pulled.error_message();
  EXPECT_TRUE(wait_for([](const v1::ServerInfo& i) { return i.device_pairs() == 0; }))
      << "the shard kept the pair of a cancelled pull";
  ExpectRejected(PairPush(PairHeader(0, 1, pair, 3), pair, Gradient(1.0f)),
                 grpc::FAILED_PRECONDITION, kDevicePairNotOpen, before);
}

}  // namespace
}  // namespace shardopt::testing
