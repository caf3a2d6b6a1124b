// Bad input through the payload-socket path (PushHeader.socket_payload,
// PullParametersRequest.socket_payload) against a real shard process: each is
// refused with a clear status and leaves the shard as it was (a link whose
// transfer broke off is closed by the shard); then a good push and pull
// over a link work and match the stream's bits.
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/fork_private.h"
#include "common/payload_socket.h"
#include "common/shared_memory.h"
#include "tests/bad_input_fixture.h"

namespace shardopt::testing {
namespace {

SocketWait Soon() {
  SocketWait wait;
  wait.deadline = absl::Now() + absl::Seconds(10);
  return wait;
}

class PayloadSocketBadInputTest : public BadInputTest {
 protected:
  struct Link {
    int socket = -1;
    std::string token;
  };

  void SetUp() override {
    BadInputTest::SetUp();
    if (HasFatalFailure()) return;
    v1::ServerInfo info = Info();
    ASSERT_GT(info.payload_socket_port(), 0u);
    port_ = static_cast<uint16_t>(info.payload_socket_port());
  }
  void TearDown() override {
    for (int socket : opened_) CloseForkPrivate(socket);
  }

  Link Open() {
    Link link{-1, RandomHexToken(kLinkTokenChars / 2)};
    absl::StatusOr<int> socket = OpenLink("127.0.0.1", port_, link.token, absl::Seconds(10));
    EXPECT_TRUE(socket.ok()) << socket.status();
    if (!socket.ok()) return {};
    opened_.push_back(*socket);
    link.socket = *socket;
    return link;
  }
  // Sends a frame header announcing `announced` bytes of `transfer`, then
  // `data` (which may be shorter: a trainer breaking the rule).
  static void SendRawFrame(const Link& link, uint64_t transfer, const std::string& data,
                           uint64_t announced) {
    char head[kFrameHeaderBytes];
    EncodeFrameHeader(PayloadFrame{PayloadFrame::kData, transfer, 0, announced}, head);
    ASSERT_TRUE(SendAll(link.socket, head, sizeof(head), Soon()).ok());
    ASSERT_TRUE(SendAll(link.socket, data.data(), data.size(), Soon()).ok());
  }
  static std::string Raw(const std::vector<float>& v) {
    return std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float));
  }
  v1::PushHeader SocketHeader(uint32_t rank, int64_t step, const Link& link,
                              uint64_t transfer) const {
    v1::PushHeader header = Header(rank, step);
    header.mutable_socket_payload()->set_link(link.token);
    header.mutable_socket_payload()->set_transfer(transfer);
    return header;
  }
  // Whether the shard closed `link` (its end reads as closed).
  static bool Closed(const Link& link) {
    char byte;
    SocketWait wait;
    wait.deadline = absl::Now() + absl::Seconds(10);
    return absl::IsUnavailable(ReceiveAll(link.socket, &byte, 1, wait));
  }
  // What a pull over a link saw on it besides its data.
  struct PullFrames {
    int empty = 0;          // Frames without data (the shard waiting).
    bool ended = false;     // An end frame came.
    uint64_t ended_at = 0;  // At this byte.
  };
  // A pull over `link`: the frames' bytes into `bytes`.
  grpc::Status SocketPull(int64_t min_version, const Link& link, uint64_t transfer,
                          std::string* bytes, int64_t* version, PullFrames* frames = nullptr,
                          int64_t max_wait_ms = 0) {
    PullFrames unused;
    if (frames == nullptr) frames = &unused;
    v1::PullParametersRequest request;
    request.set_model_id(kModel);
    request.set_shard_index(kShardIndex);
    request.set_min_version(min_version);
    request.set_max_wait_ms(max_wait_ms);
    request.mutable_socket_payload()->set_link(link.token);
    request.mutable_socket_payload()->set_transfer(transfer);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto reader = stub_->PullParameters(&context, request);
    v1::PullParametersResponse response;
    if (!reader->Read(&response)) return reader->Finish();
    EXPECT_FALSE(response.has_chunk());
    const uint64_t total = range_.size() * sizeof(float);
    bytes->clear();
    while (bytes->size() <= total) {
      absl::StatusOr<PayloadFrame> frame = ReceiveFrameHeader(link.socket, Soon());
      EXPECT_FALSE(absl::IsInvalidArgument(frame.status())) << frame.status();
      if (!frame.ok()) break;
      EXPECT_EQ(frame->transfer, transfer);
      EXPECT_EQ(frame->offset, bytes->size());
      if (frame->flags == PayloadFrame::kEnded) {
        frames->ended = true;
        frames->ended_at = frame->offset;
        break;
      }
      if (frame->bytes == 0) ++frames->empty;
      std::string data(frame->bytes, '\0');
      if (!ReceiveAll(link.socket, data.data(), data.size(), Soon()).ok()) break;
      bytes->append(data);
    }
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

  uint16_t port_ = 0;
  std::vector<int> opened_;
};

TEST_F(PayloadSocketBadInputTest, RefusedPushesAndPullsLeaveTheShardAsItWas) {
  const State before = Capture();
  const std::string good = Raw(Gradient(1.0f));

  Link unknown_link{-1, std::string(kLinkTokenChars, 'c')};
  v1::PushHeader unknown = SocketHeader(0, 1, unknown_link, 1);
  ExpectRejected(Push(&unknown, {}), grpc::FAILED_PRECONDITION, kLinkNotOpen, before);

  // The socket carries another transfer's bytes: refused, and the link is
  // closed (what follows on it is not a transfer's).
  Link link = Open();
  SendRawFrame(link, 8, good, good.size());
  v1::PushHeader other = SocketHeader(0, 1, link, 7);
  ExpectRejected(Push(&other, {}), grpc::INVALID_ARGUMENT, "transfer 8", before);
  EXPECT_TRUE(Closed(link));
  ExpectRejected(Push(&other, {}), grpc::FAILED_PRECONDITION, kLinkNotOpen, before);

  // A frame of another size than the header announced.
  link = Open();
  SendRawFrame(link, 1, good.substr(4), good.size() - 4);
  v1::PushHeader short_frame = SocketHeader(0, 1, link, 1);
  ExpectRejected(Push(&short_frame, {}), grpc::INVALID_ARGUMENT, "where the push announced",
                 before);

  // Chunks in the stream besides the socket's payload.
  link = Open();
  SendRawFrame(link, 1, good, good.size());
  v1::PushHeader with_chunk = SocketHeader(0, 1, link, 1);
  ExpectRejected(Push(&with_chunk, GoodChunks(Gradient(1.0f))), grpc::INVALID_ARGUMENT,
                 "payload socket sent a chunk too", before);

  // A NaN on the socket, as in a stream.
  std::vector<float> bad = Gradient(1.0f);
  bad[3] = std::numeric_limits<float>::quiet_NaN();
  link = Open();
  SendRawFrame(link, 1, Raw(bad), good.size());
  v1::PushHeader nan = SocketHeader(0, 1, link, 1);
  ExpectRejected(Push(&nan, {}), grpc::INVALID_ARGUMENT, "is nan", before);

  // The trainer's end closes half way through its payload, while the shard
  // reads it. (Closed before the shard took the link, it is refused as not
  // open: tried again then.)
  int cut_short = 0;
  for (int attempt = 0; attempt < 5 && cut_short == 0; ++attempt) {
    link = Open();
    SendRawFrame(link, 1, good.substr(0, good.size() / 2), good.size());
    v1::PushHeader cut = SocketHeader(0, 1, link, 1);
    grpc::Status status;
    std::thread push([&] { status = Push(&cut, {}); });
    absl::SleepFor(absl::Milliseconds(300 * (attempt + 1)));
    CloseForkPrivate(link.socket);
    opened_.pop_back();
    push.join();
    if (status.error_code() == grpc::FAILED_PRECONDITION) {
      ExpectRejected(status, grpc::FAILED_PRECONDITION, kLinkNotOpen, before);
    } else {
      ExpectRejected(status, grpc::UNAVAILABLE, "closed it after", before);
      ++cut_short;
    }
  }
  EXPECT_EQ(cut_short, 1);

  // Shared memory and a socket at once.
  link = Open();
  v1::PushHeader both = SocketHeader(0, 1, link, 1);
  both.mutable_shared_memory()->set_attachment("00");
  ExpectRejected(Push(&both, {}), grpc::INVALID_ARGUMENT, "shared-memory payload and a payload",
                 before);
  CloseForkPrivate(link.socket);
  opened_.pop_back();

  // A push refused before its payload is read (a rank the model lacks)
  // closes the link, so that the trainer's sending ends at once.
  link = Open();
  SendRawFrame(link, 1, good, good.size());
  v1::PushHeader stranger = SocketHeader(kTrainers, 1, link, 1);
  ExpectRejected(Push(&stranger, {}), grpc::INVALID_ARGUMENT, "rank", before);
  EXPECT_TRUE(Closed(link));

  std::string pulled;
  int64_t version = -1;
  ExpectRejected(SocketPull(0, unknown_link, 1, &pulled, &version), grpc::FAILED_PRECONDITION,
                 kLinkNotOpen, before);

  // A link used right: both trainers push step 1 over it, one at a time.
  link = Open();
  v1::PushGradientsResponse response;
  SendRawFrame(link, 11, good, good.size());
  v1::PushHeader good0 = SocketHeader(0, 1, link, 11);
  ASSERT_TRUE(Push(&good0, {}, &response).ok());
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_ACCEPTED);
  // A pull of step 1 before trainer 1 pushed it: the shard says it is alive
  // while it waits, gives up at max_wait_ms with an end frame where it
  // stopped (the status says what it waits for), and the link stays good.
  PullFrames waited;
  grpc::Status waiting = SocketPull(1, link, 20, &pulled, &version, &waited, 2500);
  EXPECT_EQ(waiting.error_code(), grpc::DEADLINE_EXCEEDED) << waiting.error_message();
  EXPECT_GE(waited.empty, 1);
  EXPECT_TRUE(waited.ended);
  EXPECT_EQ(waited.ended_at, 0u);
  EXPECT_TRUE(pulled.empty());
  SendRawFrame(link, 12, good, good.size());
  v1::PushHeader good1 = SocketHeader(1, 1, link, 12);
  ASSERT_TRUE(Push(&good1, {}, &response).ok());
  EXPECT_EQ(response.outcome(), v1::PushGradientsResponse::OUTCOME_APPLIED);
  // Pulled over it: the same bits as a streamed pull.
  PullFrames whole;
  ASSERT_TRUE(SocketPull(1, link, 13, &pulled, &version, &whole).ok());
  EXPECT_EQ(version, 1);
  EXPECT_TRUE(whole.ended) << "an end frame at the byte count";
  EXPECT_EQ(whole.ended_at, pulled.size());
  std::vector<float> streamed;
  int64_t streamed_version = -1;
  ASSERT_TRUE(Pull(1, &streamed, &streamed_version).ok());
  ASSERT_EQ(pulled.size(), streamed.size() * sizeof(float));
  EXPECT_EQ(std::memcmp(streamed.data(), pulled.data(), pulled.size()), 0);
  EXPECT_NE(std::memcmp(streamed.data(), initial_.data(), pulled.size()), 0) << "applied";
  // (The links closed above go as the shard notices.)
  const absl::Time settle = absl::Now() + absl::Seconds(10);
  while (Info().payload_socket_links() != 1 && absl::Now() < settle) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  EXPECT_EQ(Info().payload_socket_links(), 1u);

  // Closed by the trainer: the link is refused from then on.
  CloseForkPrivate(link.socket);
  opened_.pop_back();
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (Info().payload_socket_links() != 0) {
    ASSERT_LT(absl::Now(), deadline) << "the shard kept the link of a closed socket";
    absl::SleepFor(absl::Milliseconds(10));
  }
  const State after = Capture();
  v1::PushHeader late = SocketHeader(0, 2, link, 14);
  ExpectRejected(Push(&late, {}), grpc::FAILED_PRECONDITION, kLinkNotOpen, after);
}

}  // namespace
}  // namespace shardopt::testing
