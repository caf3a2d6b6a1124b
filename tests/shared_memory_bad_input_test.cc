// Bad input through the shared-memory path (PushHeader.shared_memory,
// PullParametersRequest.shared_memory) against a real shard process: each is
// refused with a clear status and leaves the shard as it was; then a good
// push and pull through the same segment work. And a pull its trainer gave
// up on does not write over the retry that took its place.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "absl/time/clock.h"
#include "common/segment_fence.h"
#include "common/shared_memory.h"
#include "tests/bad_input_fixture.h"

namespace shardopt::testing {
namespace {

class SharedMemoryBadInputTest : public BadInputTest {
 protected:
  void SetUp() override {
    BadInputTest::SetUp();
    if (HasFatalFailure()) return;
    v1::ServerInfo info;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    ASSERT_FALSE(info.shared_memory_socket().empty());
    EXPECT_TRUE(info.shared_memory_fences());
    // Room for the range's gradient and, after it, its parameters, then a
    // fence word.
    absl::StatusOr<SharedSegment> segment = SharedSegment::Create(2 * range_.size() * 4 + 64);
    ASSERT_TRUE(segment.ok()) << segment.status();
    segment_ = *std::move(segment);
    shared_memory_socket_ = info.shared_memory_socket();
    ASSERT_NO_FATAL_FAILURE(Attach(&socket_, &attachment_));
  }
  void TearDown() override {
    if (socket_ >= 0) close(socket_);
  }

  // Attaches the segment over a new link (`*socket`, to close): one more
  // attachment of it, `*attachment`.
  void Attach(int* socket, std::string* attachment) {
    absl::StatusOr<int> connected = ConnectAbstract(shared_memory_socket_);
    ASSERT_TRUE(connected.ok()) << connected.status();
    *socket = *connected;
    ASSERT_TRUE(SendMessage(*socket, absl::StrCat("attach ", segment_.size()), segment_.fd()).ok());
    absl::StatusOr<std::string> answer = ReceiveMessage(*socket, absl::Seconds(10));
    ASSERT_TRUE(answer.ok()) << answer.status();
    ASSERT_TRUE(absl::StartsWith(*answer, "ok ")) << *answer;
    *attachment = std::string(absl::StripPrefix(*answer, "ok "));
  }

  void PutGradient(const std::vector<float>& grad) {
    std::memcpy(segment_.data(), grad.data(), grad.size() * sizeof(float));
  }
  v1::PushHeader SharedHeader(uint32_t rank, int64_t step, uint64_t byte_offset = 0,
                              const std::string& attachment = "") const {
    v1::PushHeader header = Header(rank, step);
    header.mutable_shared_memory()->set_attachment(attachment.empty() ? attachment_ : attachment);
    header.mutable_shared_memory()->set_byte_offset(byte_offset);
    return header;
  }
  // The fence word's place: after the parameters.
  uint64_t FenceOffset() const { return 2 * range_.size() * 4; }
  SegmentFence Fence() { return SegmentFence(segment_.data() + FenceOffset()); }
  static void SetFence(v1::SharedMemoryPayload* where, uint64_t offset, uint64_t ticket) {
    where->set_fence_offset(offset);
    where->set_fence_ticket(ticket);
  }
  // A pull through the segment: its one message's version. `fence`: its
  // fence word's offset and ticket, when it names one.
  grpc::Status SharedPull(int64_t min_version, uint64_t byte_offset, int64_t* version,
                          const std::string& attachment = "",
                          std::optional<std::pair<uint64_t, uint64_t>> fence = std::nullopt) {
    v1::PullParametersRequest request;
    request.set_model_id(kModel);
    request.set_shard_index(kShardIndex);
    request.set_min_version(min_version);
    request.mutable_shared_memory()->set_attachment(attachment.empty() ? attachment_ : attachment);
    request.mutable_shared_memory()->set_byte_offset(byte_offset);
    if (fence) SetFence(request.mutable_shared_memory(), fence->first, fence->second);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub_->PullParameters(&context, request);
    v1::PullParametersResponse response;
    int messages = 0;
    while (reader->Read(&response)) {
      ++messages;
      EXPECT_FALSE(response.has_chunk());
      *version = response.version();
    }
    grpc::Status status = reader->Finish();
    if (status.ok()) {
      EXPECT_EQ(messages, 1);
    }
    return status;
  }

  // A pull of `min_version` through the segment (its parameters' place)
  // answers `expected_version` and writes what a streamed pull gets.
  void ExpectSharedPullMatchesStream(int64_t min_version, int64_t expected_version) {
    const uint64_t bytes = range_.size() * 4;
    int64_t version = -1;
    ASSERT_TRUE(SharedPull(min_version, bytes, &version).ok());
    EXPECT_EQ(version, expected_version);
    std::vector<float> streamed;
    int64_t streamed_version = -1;
    ASSERT_TRUE(Pull(min_version, &streamed, &streamed_version).ok());
    ASSERT_EQ(streamed.size(), range_.size());
    EXPECT_EQ(std::memcmp(streamed.data(), segment_.data() + bytes, bytes), 0);
  }

  // Waits (bounded) until one pull through the segment waits on the shard.
  void AwaitOneWaitingPull() {
    const absl::Time give_up = absl::Now() + absl::Seconds(10);
    while (Info().shared_memory_pull_places() != 1 && absl::Now() < give_up) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(Info().shared_memory_pull_places(), 1u) << "the pull did not reach the shard";
  }
  // Both trainers push step 1 through the segment (it is applied) while the
  // pull on `abandoned` waits for it; that pull then ends ABORTED, saying
  // `why`.
  void ApplyStepOneAndExpectAborted(std::thread& abandoned, const grpc::Status& status,
                                    const std::string& why) {
    v1::PushHeader push0 = SharedHeader(0, 1);
    v1::PushHeader push1 = SharedHeader(1, 1);
    v1::PushGradientsResponse response;
    ASSERT_TRUE(Push(&push0, {}, &response).ok());
    ASSERT_TRUE(Push(&push1, {}, &response).ok());
    EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
    abandoned.join();
    EXPECT_EQ(status.error_code(), grpc::ABORTED) << status.error_message();
    EXPECT_TRUE(absl::StrContains(status.error_message(), why)) << status.error_message();
  }

  // A pull waiting for version 1 (its trainer gave up on it) is overtaken
  // by a retry of version 0 into the same place (after `before_retry`, when
  // given); then step 1 is applied. The place keeps the retry's version.
  void ExpectTheRetryKeepsItsPlace(const std::function<void()>& before_retry = nullptr);

  SharedSegment segment_;
  std::string shared_memory_socket_;
  int socket_ = -1;
  std::string attachment_;
};

TEST_F(SharedMemoryBadInputTest, RefusedPushesAndPullsLeaveTheShardAsItWas) {
  const State before = Capture();
  PutGradient(Gradient(1.0f));
  const uint64_t bytes = range_.size() * 4;

  v1::PushHeader unknown = SharedHeader(0, 1, 0, "00112233445566778899aabbccddeeff");
  ExpectRejected(Push(&unknown, {}), grpc::FAILED_PRECONDITION, "is not open on this shard",
                 before);
  v1::PushHeader overrun = SharedHeader(0, 1, segment_.size() - bytes + 4);
  ExpectRejected(Push(&overrun, {}), grpc::INVALID_ARGUMENT, "overrun", before);
  v1::PushHeader huge = SharedHeader(0, 1, ~uint64_t{0} - 2);
  ExpectRejected(Push(&huge, {}), grpc::INVALID_ARGUMENT, "overrun", before);
  v1::PushHeader with_chunk = SharedHeader(0, 1);
  ExpectRejected(Push(&with_chunk, GoodChunks(Gradient(1.0f))), grpc::INVALID_ARGUMENT,
                 "shared memory sent a chunk too", before);

  // A NaN in shared memory, as in a stream.
  std::vector<float> bad = Gradient(1.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  PutGradient(bad);
  v1::PushHeader nan = SharedHeader(0, 1);
  ExpectRejected(Push(&nan, {}), grpc::INVALID_ARGUMENT, "is nan", before);
  // Padding in shared memory, checked where the shard copied it.
  const std::vector<FlatRange> padding = layout_->PaddingIn(range_);
  ASSERT_FALSE(padding.empty());
  std::vector<float> padded = Gradient(1.0f);
  padded[padding.front().begin - range_.begin] = 0.75f;
  PutGradient(padded);
  v1::PushHeader on_padding = SharedHeader(0, 1);
  ExpectRejected(Push(&on_padding, {}), grpc::INVALID_ARGUMENT,
                 "is 0.75: padding gets zero gradients", before);

  int64_t version = -1;
  ExpectRejected(SharedPull(0, segment_.size() - 4, &version), grpc::INVALID_ARGUMENT, "overrun",
                 before);
  ExpectRejected(SharedPull(0, 0, &version, "0123"), grpc::FAILED_PRECONDITION,
                 "is not open on this shard", before);

  // The same segment, used right: both trainers push step 1 through it.
  PutGradient(Gradient(1.0f));
  v1::PushHeader good0 = SharedHeader(0, 1);
  v1::PushHeader good1 = SharedHeader(1, 1);
  v1::PushGradientsResponse response;
  ASSERT_TRUE(Push(&good0, {}, &response).ok());
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
  ASSERT_TRUE(Push(&good1, {}, &response).ok());
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  // Pulled through the segment: the same values as a streamed pull.
  ASSERT_NO_FATAL_FAILURE(ExpectSharedPullMatchesStream(1, 1));
  EXPECT_NE(std::memcmp(segment_.data() + bytes, initial_.data(), bytes), 0)
      << "the step was applied";

  // Detached (the socket closed): the attachment is refused from then on.
  close(socket_);
  socket_ = -1;
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  for (;;) {
    v1::ServerInfo info;
    grpc::ClientContext context;
    ASSERT_TRUE(stub_->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
    if (info.shared_memory_attachments() == 0) break;
    ASSERT_LT(absl::Now(), deadline) << "the shard kept the attachment of a closed socket";
    absl::SleepFor(absl::Milliseconds(10));
  }
  const State after = Capture();
  v1::PushHeader late = SharedHeader(0, 2);
  ExpectRejected(Push(&late, {}), grpc::FAILED_PRECONDITION, "is not open on this shard", after);
}

// The fence (SharedMemoryPayload.fence_ticket): a bad one is refused with
// the shard unchanged; a push or pull whose trainer closed it touches the
// segment no more, even when what it waited for comes right after (a
// trainer's Ctrl-C, then another trainer's push completing the step).
TEST_F(SharedMemoryBadInputTest, ACallTouchesNothingOnceItsTrainerClosedItsFence) {
  const State before = Capture();
  const uint64_t bytes = range_.size() * 4;
  PutGradient(Gradient(1.0f));
  ASSERT_TRUE(Fence().TryOpen(5));
  v1::PushHeader misaligned = SharedHeader(0, 1);
  SetFence(misaligned.mutable_shared_memory(), FenceOffset() + 4, 5);
  ExpectRejected(Push(&misaligned, {}), grpc::INVALID_ARGUMENT, "not 8-byte aligned", before);
  v1::PushHeader in_payload = SharedHeader(0, 1);
  SetFence(in_payload.mutable_shared_memory(), 8, 5);
  ExpectRejected(Push(&in_payload, {}), grpc::INVALID_ARGUMENT, "lies in the payload", before);
  v1::PushHeader outside = SharedHeader(0, 1);
  SetFence(outside.mutable_shared_memory(), segment_.size(), 5);
  ExpectRejected(Push(&outside, {}), grpc::INVALID_ARGUMENT, "overruns", before);
  v1::PushHeader busy_ticket = SharedHeader(0, 1);
  SetFence(busy_ticket.mutable_shared_memory(), FenceOffset(), SegmentFence::kBusy | 5);
  ExpectRejected(Push(&busy_ticket, {}), grpc::INVALID_ARGUMENT, "is not in [1, 2^62)", before);
  int64_t version = -1;
  ExpectRejected(SharedPull(0, bytes, &version, "", std::make_pair(bytes + 8, 5)),
                 grpc::INVALID_ARGUMENT, "lies in the payload", before);

  // Closed (or moved on to another attempt): the push reads nothing.
  ASSERT_TRUE(Fence().Revoke(5, absl::Seconds(10)).ok());
  v1::PushHeader closed = SharedHeader(0, 1);
  SetFence(closed.mutable_shared_memory(), FenceOffset(), 5);
  ExpectRejected(Push(&closed, {}), grpc::ABORTED, "gave up on this call", before);

  // A pull waiting for step 1 with its fence open; its trainer closes it,
  // then step 1 is applied at once.
  const std::string sentinel(bytes, '\x5a');
  std::memcpy(segment_.data() + bytes, sentinel.data(), bytes);
  ASSERT_TRUE(Fence().TryOpen(6));
  grpc::Status abandoned_status;
  std::thread abandoned([&, attachment = attachment_] {
    int64_t abandoned_version = -1;
    abandoned_status = SharedPull(1, bytes, &abandoned_version, attachment,
                                  std::make_pair(FenceOffset(), uint64_t{6}));
  });
  const absl::Cleanup join = [&abandoned] {
    if (abandoned.joinable()) abandoned.join();
  };
  ASSERT_NO_FATAL_FAILURE(AwaitOneWaitingPull());
  ASSERT_TRUE(Fence().Revoke(6, absl::Seconds(10)).ok());
  ASSERT_NO_FATAL_FAILURE(
      ApplyStepOneAndExpectAborted(abandoned, abandoned_status, "gave up on this"));
  EXPECT_EQ(std::string(segment_.data() + bytes, bytes), sentinel)
      << "the pull wrote into the trainer's memory after its fence closed";

  // With the fence open (a new attempt's ticket), push and pull work, and
  // leave the word as they found it.
  ASSERT_TRUE(Fence().TryOpen(7));
  ASSERT_TRUE(
      SharedPull(1, bytes, &version, "", std::make_pair(FenceOffset(), uint64_t{7})).ok());
  EXPECT_EQ(version, 1);
  std::vector<float> streamed;
  ASSERT_TRUE(Pull(1, &streamed, &version).ok());
  EXPECT_EQ(std::memcmp(streamed.data(), segment_.data() + bytes, bytes), 0);
  EXPECT_TRUE(Fence().Open(7));
  ASSERT_TRUE(Fence().Revoke(7, absl::ZeroDuration()).ok());
  ASSERT_TRUE(Fence().TryOpen(8));
  v1::PushHeader fenced = SharedHeader(0, 2);
  SetFence(fenced.mutable_shared_memory(), FenceOffset(), 8);
  v1::PushGradientsResponse response;
  ASSERT_TRUE(Push(&fenced, {}, &response).ok());
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
  EXPECT_TRUE(Fence().Revoke(8, absl::ZeroDuration()).ok());
}

// A pull its trainer gave up on, still waiting on the shard when the
// trainer's retry pulls into the same place, writes nothing there once the
// retry has claimed it (server/pull_place_claims.h): the place keeps the
// retry's version, not the abandoned pull's newer one over it.
void SharedMemoryBadInputTest::ExpectTheRetryKeepsItsPlace(
    const std::function<void()>& before_retry) {
  const uint64_t bytes = range_.size() * 4;
  const auto pull_places = [&] { return Info().shared_memory_pull_places(); };
  // Version 1 does not exist yet: this pull waits on the shard, its place
  // claimed.
  grpc::Status abandoned_status;
  int64_t abandoned_version = -1;
  std::thread abandoned([&, attachment = attachment_] {
    abandoned_status = SharedPull(1, bytes, &abandoned_version, attachment);
  });
  const absl::Cleanup join = [&abandoned] {
    if (abandoned.joinable()) abandoned.join();
  };
  ASSERT_NO_FATAL_FAILURE(AwaitOneWaitingPull());
  if (before_retry) {
    ASSERT_NO_FATAL_FAILURE(before_retry());
  }
  // The retry takes the place.
  int64_t version = -1;
  ASSERT_TRUE(SharedPull(0, bytes, &version).ok());
  EXPECT_EQ(version, 0);
  EXPECT_EQ(std::memcmp(segment_.data() + bytes, initial_.data(), bytes), 0);

  // Step 1, which the first pull waited for, is applied while it may still
  // wait: it writes nothing of it into the place.
  PutGradient(Gradient(1.0f));
  ASSERT_NO_FATAL_FAILURE(ApplyStepOneAndExpectAborted(abandoned, abandoned_status, "newer pull"));
  EXPECT_EQ(std::memcmp(segment_.data() + bytes, initial_.data(), bytes), 0)
      << "the abandoned pull wrote version 1 over its retry's version 0";
  EXPECT_EQ(pull_places(), 0u);

  // The place serves the next pull as before.
  ASSERT_NO_FATAL_FAILURE(ExpectSharedPullMatchesStream(1, 1));
}

TEST_F(SharedMemoryBadInputTest, AnAbandonedPullDoesNotWriteOverItsRetry) {
  ASSERT_NO_FATAL_FAILURE(ExpectTheRetryKeepsItsPlace());
}

// The same when the trainer's link broke and it attached the segment again
// for the retry: the abandoned pull still holds its mapping through the
// dropped attachment, the retry comes through a mapping of its own.
TEST_F(SharedMemoryBadInputTest, AnAbandonedPullDoesNotWriteOverARetryThroughANewAttachment) {
  int second_socket = -1;
  std::string second;
  ASSERT_NO_FATAL_FAILURE(Attach(&second_socket, &second));
  ASSERT_NE(second, attachment_);
  ASSERT_NO_FATAL_FAILURE(ExpectTheRetryKeepsItsPlace([&] {
    close(socket_);  // The first link breaks: its attachment is dropped.
    socket_ = second_socket;
    attachment_ = second;
    const absl::Time deadline = absl::Now() + absl::Seconds(10);
    while (Info().shared_memory_attachments() != 1 && absl::Now() < deadline) {
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_EQ(Info().shared_memory_attachments(), 1u) << "the broken link's attachment stayed";
  }));
}

}  // namespace
}  // namespace shardopt::testing
