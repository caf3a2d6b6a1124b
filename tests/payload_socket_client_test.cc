// The client's payload-socket transport (client/socket_payload_transport.h)
// against a real shard process that refuses a call before it reads the
// push's header (a read-only token): the transport's send of a payload far
// larger than the sockets' buffers ends when the refusal comes, not at its
// stall bound, and the refusal is what the call returns; a refused pull
// returns the shard's status as well. Then the transport declines a shard
// whose payload socket is off. Then a job of several 1 MiB pieces per
// transfer gets the stream's bits over the sockets (fp32, bf16, fp16), and
// a push framed otherwise than in pieces is refused without changing the
// shard. Last, a link that failed (a frozen shard) sends the retry over the
// stream for a while.
#include <signal.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/channel_security.h"
#include "client/socket_payload_transport.h"
#include "client/trainer_client.h"
#include "common/dtype.h"
#include "common/fork_private.h"
#include "common/layout.h"
#include "common/payload_socket.h"
#include "common/proto_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/shard_queries.h"

namespace shardopt::testing {
namespace {

constexpr char kReaderToken[] = "reader-token-0123456789abcdef";
constexpr char kTrainerToken[] = "trainer-token-0123456789abcdef";

std::unique_ptr<v1::ShardService::Stub> StubWithToken(const std::string& address,
                                                      const std::string& token) {
  ChannelSecurity security;
  security.auth_token = token;
  absl::StatusOr<ChannelFactory> channels = ChannelFactory::Create(security);
  EXPECT_TRUE(channels.ok()) << channels.status();
  return v1::ShardService::NewStub(channels->NewChannel(address, grpc::ChannelArguments()));
}

// Registers `spec`, every parameter 0.5, from a client whose payloads go
// over the gRPC stream; the layout's element count.
uint64_t RegisterOverTheStream(const std::string& address, const ModelSpec& spec) {
  const uint64_t total = ModelLayout::Create(spec.tensors, spec.alignment, 1)->total_elements();
  TrainerClientOptions options;
  options.shared_memory = false;
  options.socket_payloads = false;
  auto client = TrainerClient::Connect({address}, options);
  EXPECT_TRUE(client.ok()) << client.status();
  if (client.ok()) {
    EXPECT_TRUE((*client)->Register(spec, std::vector<float>(total, 0.5f)).ok());
  }
  return total;
}

TEST(SocketPayloadTransportTest, ARefusalEndsTheSendingAtOnce) {
  const std::string dir = MakeTempDir("socket_client");
  {
    std::ofstream tokens(dir + "/tokens");
    tokens << "trainer " << kTrainerToken << "\nreadonly " << kReaderToken << "\n";
  }
  auto server = ServerProcess::Start(0, 1, {"--auth_token_file=" + dir + "/tokens"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = StubWithToken((*server)->address(), kReaderToken);
  SocketPayloadTransport transport((*server)->address(), 0);

  // 64 MiB: far past what the sockets buffer while the shard reads nothing.
  const uint64_t elements = uint64_t{16} << 20;
  std::vector<float> payload(elements, 0.5f);
  v1::PushGradientsRequest header;
  header.mutable_header()->set_model_id("m");
  header.mutable_header()->set_step(1);
  header.mutable_header()->set_num_elements(elements);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(60)));
  v1::PushGradientsResponse response;
  const absl::Time start = absl::Now();
  std::optional<absl::Status> pushed =
      transport.Push(PayloadCall{context, *stub, FlatRange{0, elements}}, header,
                     reinterpret_cast<const char*>(payload.data()), sizeof(float), &response);
  const absl::Duration took = absl::Now() - start;
  ASSERT_TRUE(pushed.has_value()) << "the transport declined a shard with a payload socket";
  EXPECT_TRUE(absl::IsPermissionDenied(*pushed)) << *pushed;
  // (A liveness bound, not a speed one: without the answer ending it, the
  // send would sit out the stall bound.)
  EXPECT_LT(took, SocketPayloadTransport::kStallTimeout / 2) << took;
  EXPECT_EQ(transport.transfers(), 0);

  grpc::ClientContext pull_context;
  pull_context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
  v1::PullParametersRequest pull;
  pull.set_model_id("m");
  std::vector<float> into(elements);
  PulledVersion version;
  std::optional<absl::Status> pulled =
      transport.Pull(PayloadCall{pull_context, *stub, FlatRange{0, elements}}, pull,
                     DType::kFloat32, into.data(), &version);
  ASSERT_TRUE(pulled.has_value());
  EXPECT_TRUE(absl::IsPermissionDenied(*pulled)) << *pulled;
}

TEST(SocketPayloadTransportTest, DeclinesAShardWithoutAPayloadSocket) {
  auto server = ServerProcess::Start(0, 1, {"--nopayload_socket"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = StubWithToken((*server)->address(), "");
  SocketPayloadTransport transport((*server)->address(), 0);
  std::vector<float> payload(64, 0.5f);
  v1::PushGradientsRequest header;
  header.mutable_header()->set_model_id("m");
  header.mutable_header()->set_num_elements(64);
  grpc::ClientContext context;
  v1::PushGradientsResponse response;
  EXPECT_FALSE(transport
                   .Push(PayloadCall{context, *stub, FlatRange{0, 64}}, header,
                         reinterpret_cast<const char*>(payload.data()), sizeof(float), &response)
                   .has_value());
}

// One trainer's job of a model of `pieces` and a bit 1 MiB pieces of fp32
// per transfer (Adam) twice, on two single-shard servers: over the payload
// socket and over the gRPC stream, in `wire` on the wire both ways.
class PiecesJob {
 public:
  void Start(DType wire, uint64_t pieces = 3) {
    elements_ = pieces * (kSocketPieceBytes / sizeof(float)) + 4099;
    for (auto& server : servers_) {
      auto started = ServerProcess::Start(0, 1);
      ASSERT_TRUE(started.ok()) << started.status();
      server = *std::move(started);
    }
    spec_.model_id = "pieces";
    spec_.tensors = {{"w", {static_cast<int64_t>(elements_)}, DType::kFloat32}};
    spec_.optimizer = OptimizerConfig::Adam(1e-3);
    // The flat buffers hold the tensor and its padding (zeros).
    total_ = ModelLayout::Create(spec_.tensors, spec_.alignment, 1)->total_elements();
    initial_.assign(total_, 0.0f);
    for (uint64_t i = 0; i < elements_; ++i) {
      initial_[i] = std::sin(0.001f * static_cast<float>(i));
    }
    for (int plane = 0; plane < 2; ++plane) {
      TrainerClientOptions options;
      options.shared_memory = false;  // (It would take a shard on this host first.)
      options.socket_payloads = plane == 0;
      options.push_dtype = wire;
      options.pull_dtype = wire;
      auto client = TrainerClient::Connect({servers_[plane]->address()}, options);
      ASSERT_TRUE(client.ok()) << client.status();
      clients_[plane] = *std::move(client);
      const absl::Status registered = clients_[plane]->Register(spec_, initial_);
      ASSERT_TRUE(registered.ok()) << registered;
      params_[plane] = initial_;
    }
  }

  // Step `step` on both planes: the same bits after it.
  void StepBoth(int64_t step) {
    std::vector<float> grad(total_, 0.0f);
    for (uint64_t i = 0; i < elements_; ++i) {
      grad[i] = std::cos(0.003f * static_cast<float>(i) + static_cast<float>(step)) * 1e-2f;
    }
    for (int plane = 0; plane < 2; ++plane) {
      absl::StatusOr<StepResult> result =
          clients_[plane]->Step(step, grad, absl::MakeSpan(params_[plane]));
      ASSERT_TRUE(result.ok()) << "plane " << plane << " step " << step << ": " << result.status();
    }
    EXPECT_EQ(std::memcmp(params_[0].data(), params_[1].data(), total_ * sizeof(float)), 0)
        << "step " << step;
  }

  void ExpectTrained(int64_t transfers) const {
    EXPECT_EQ(clients_[0]->socket_transfers(), transfers) << "every push and pull over the socket";
    EXPECT_EQ(clients_[1]->socket_transfers(), 0);
    EXPECT_NE(std::memcmp(params_[0].data(), initial_.data(), elements_ * sizeof(float)), 0);
  }

  const std::string& socket_shard() const { return servers_[0]->address(); }
  // A payload link named `token` to the socket plane's shard, as a trainer
  // opens one (its port from ServerInfo).
  absl::StatusOr<int> OpenSocketLink(const std::string& token) const {
    const v1::ServerInfo info = ServerInfoOf(socket_shard());
    return OpenLink("127.0.0.1", static_cast<uint16_t>(info.payload_socket_port()), token,
                    absl::Seconds(10));
  }
  const ModelSpec& spec() const { return spec_; }
  uint64_t total() const { return total_; }
  uint64_t elements() const { return elements_; }
  const std::vector<float>& socket_params() const { return params_[0]; }

 private:
  uint64_t elements_ = 0;
  std::unique_ptr<ServerProcess> servers_[2];
  std::unique_ptr<TrainerClient> clients_[2];
  ModelSpec spec_;
  uint64_t total_ = 0;
  std::vector<float> initial_;
  std::vector<float> params_[2];
};

// Every 16-bit pull and push piece (512K elements) too.
TEST(SocketPayloadTransportTest, SixteenBitTransfersOfSeveralPiecesMatchTheStream) {
  for (DType wire : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(wire));
    PiecesJob job;
    job.Start(wire);
    if (HasFatalFailure()) return;
    for (int64_t step = 1; step <= 2; ++step) job.StepBoth(step);
    job.ExpectTrained(4);
  }
}

TEST(SocketPayloadTransportTest, TransfersOfSeveralPiecesMatchTheStreamBitForBit) {
  PiecesJob job;
  job.Start(DType::kFloat32);
  if (HasFatalFailure()) return;
  for (int64_t step = 1; step <= 3; ++step) job.StepBoth(step);
  job.ExpectTrained(6);

  // Step 4 pushed by hand as one frame of all its bytes (not in pieces):
  // refused before anything is staged.
  const std::string address = job.socket_shard();
  const std::string token(kLinkTokenChars, 'e');
  absl::StatusOr<int> link = job.OpenSocketLink(token);
  ASSERT_TRUE(link.ok()) << link.status();
  std::vector<float> whole_grad(job.total(), 0.0f);
  std::fill(whole_grad.begin(), whole_grad.begin() + job.elements(), 1e-3f);
  SocketWait wait;
  wait.deadline = absl::Now() + absl::Seconds(30);
  v1::PushHeader header;
  header.set_model_id(job.spec().model_id);
  header.set_trainer_rank(0);
  header.set_step(4);
  header.set_num_elements(job.total());
  header.mutable_socket_payload()->set_link(token);
  header.mutable_socket_payload()->set_transfer(5);
  grpc::Status refused;
  std::thread push([&] { refused = RawPush(*NewStub(address), &header, {}); });
  // (Fails once the shard closes the link on reading the header.)
  SendFrame(*link, PayloadFrame{PayloadFrame::kData, 5, 0, job.total() * sizeof(float)},
            reinterpret_cast<const char*>(whole_grad.data()), wait)
      .IgnoreError();
  push.join();
  CloseForkPrivate(*link);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("in pieces of"), std::string::npos)
      << refused.error_message();
  // Nothing of it stayed: step 4 from the trainers still matches the stream.
  job.StepBoth(4);
  job.ExpectTrained(8);
}

// A pull by a caller that is not the job's trainer (it names no push), over
// a link it does not read yet: the shard's send of a piece straight from the
// parameters blocks on the full socket, the trainer's next step is applied
// meanwhile (no lock is held), and the check after the send fails the pull
// ABORTED with an end frame after that piece; the link then serves the next
// pull, which gets the new version's bits.
TEST(SocketPayloadTransportTest, APullWhoseParametersMovedWhileSentIsAborted) {
  PiecesJob job;
  job.Start(DType::kFloat32, 24);  // 24 MiB: more than the sockets buffer.
  if (HasFatalFailure()) return;
  job.StepBoth(1);
  const std::string address = job.socket_shard();
  const std::string token(kLinkTokenChars, 'f');
  absl::StatusOr<int> link = job.OpenSocketLink(token);
  ASSERT_TRUE(link.ok()) << link.status();
  auto stub = NewStub(address);
  // Pulls version `min_version` over the link; the frames' bytes into
  // `bytes` (at their offsets), the end frame's offset into `ended_at`.
  const auto pull = [&](int64_t min_version, uint64_t transfer, std::vector<char>* bytes,
                        uint64_t* ended_at, const std::function<void()>& before_reading) {
    v1::PullParametersRequest request;
    request.set_model_id(job.spec().model_id);
    request.set_min_version(min_version);
    request.mutable_socket_payload()->set_link(token);
    request.mutable_socket_payload()->set_transfer(transfer);
    grpc::ClientContext context;
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
    auto reader = stub->PullParameters(&context, request);
    v1::PullParametersResponse response;
    EXPECT_TRUE(reader->Read(&response));
    before_reading();
    SocketWait wait;
    wait.deadline = absl::Now() + absl::Seconds(60);
    bytes->assign(job.total() * sizeof(float), 0);
    for (;;) {
      absl::StatusOr<PayloadFrame> frame = ReceiveFrameHeader(*link, wait);
      if (!frame.ok()) {
        ADD_FAILURE() << frame.status();
        break;
      }
      EXPECT_EQ(frame->transfer, transfer);
      if (frame->flags == PayloadFrame::kEnded) {
        *ended_at = frame->offset;
        break;
      }
      if (frame->offset + frame->bytes > bytes->size()) {
        ADD_FAILURE() << "a frame past the range";
        break;
      }
      EXPECT_TRUE(ReceiveAll(*link, bytes->data() + frame->offset, frame->bytes, wait).ok());
    }
    while (reader->Read(&response)) {
    }
    return reader->Finish();
  };
  std::vector<char> bytes;
  uint64_t ended_at = 0;
  const grpc::Status aborted = pull(1, 21, &bytes, &ended_at, [&] {
    // The shard fills the socket and blocks in a piece's send; step 2 is
    // applied meanwhile.
    absl::SleepFor(absl::Milliseconds(500));
    job.StepBoth(2);
  });
  EXPECT_EQ(aborted.error_code(), grpc::ABORTED) << aborted.error_message();
  EXPECT_NE(aborted.error_message().find("during the pull"), std::string::npos)
      << aborted.error_message();
  EXPECT_GT(ended_at, 0u);
  EXPECT_LT(ended_at, job.total() * sizeof(float)) << "the end frame comes after the moved piece";
  // The link is clean: the next pull over it gets version 2 whole.
  const grpc::Status whole = pull(2, 22, &bytes, &ended_at, [] {});
  ASSERT_TRUE(whole.ok()) << whole.error_message();
  EXPECT_EQ(ended_at, job.total() * sizeof(float));
  EXPECT_EQ(std::memcmp(bytes.data(), job.socket_params().data(), bytes.size()), 0);
  CloseForkPrivate(*link);
}

// A transfer that fails on the link itself (here the shard is frozen with
// SIGSTOP until the push's deadline passes) makes the transport decline for
// kFailureBackoff, idle links included: the retry goes over the gRPC stream
// instead of waiting on another link the same way. After the backoff the
// socket carries payloads again.
TEST(SocketPayloadTransportTest, ALinkThatFailedSendsTheRetryOverTheStream) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  ModelSpec spec;
  spec.model_id = "m";
  const uint64_t elements = uint64_t{4} << 20;  // 16 MiB: past the sockets' buffers.
  spec.tensors = {{"w", {static_cast<int64_t>(elements)}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Sgd(0.1);
  const uint64_t total = RegisterOverTheStream((*server)->address(), spec);
  ASSERT_FALSE(HasFailure());
  auto stub = StubWithToken((*server)->address(), "");
  SocketPayloadTransport transport((*server)->address(), 0);
  std::vector<float> params(total);
  const auto pull = [&]() {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::PullParametersRequest request;
    request.set_model_id("m");
    PulledVersion version;
    return transport.Pull(PayloadCall{context, *stub, FlatRange{0, total}}, request,
                          DType::kFloat32, params.data(), &version);
  };
  std::vector<float> gradient(total, 0.25f);
  const auto push = [&](absl::Duration deadline) {
    v1::PushGradientsRequest header;
    header.mutable_header()->set_model_id("m");
    header.mutable_header()->set_step(1);
    header.mutable_header()->set_num_elements(total);
    header.mutable_header()->set_dtype(DTypeToProto(DType::kFloat32));
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + deadline));
    v1::PushGradientsResponse response;
    return transport.Push(PayloadCall{context, *stub, FlatRange{0, total}}, header,
                          reinterpret_cast<const char*>(gradient.data()), sizeof(float), &response);
  };
  // A pull over the socket leaves a clean link in the pool.
  std::optional<absl::Status> pulled = pull();
  ASSERT_TRUE(pulled.has_value() && pulled->ok()) << (pulled ? pulled->ToString() : "declined");
  ASSERT_EQ(transport.transfers(), 1);

  ASSERT_EQ(kill((*server)->process().pid(), SIGSTOP), 0);
  std::optional<absl::Status> stalled = push(absl::Seconds(1));
  const absl::Time failed_at = absl::Now();
  std::optional<absl::Status> retried = push(absl::Seconds(1));
  const bool declined_in_time = absl::Now() - failed_at < SocketPayloadTransport::kFailureBackoff;
  ASSERT_EQ(kill((*server)->process().pid(), SIGCONT), 0);
  ASSERT_TRUE(stalled.has_value());
  EXPECT_TRUE(absl::IsUnavailable(*stalled) || absl::IsDeadlineExceeded(*stalled)) << *stalled;
  EXPECT_FALSE(retried.has_value()) << "the retry took the socket again: " << *retried;
  EXPECT_TRUE(declined_in_time);

  // After the backoff, the push of step 1 again (the shard may have applied
  // ranges of the one that stalled: those are not applied again) goes over
  // the socket and completes the step.
  absl::SleepFor(SocketPayloadTransport::kFailureBackoff + absl::Milliseconds(200));
  std::optional<absl::Status> pushed = push(absl::Seconds(30));
  ASSERT_TRUE(pushed.has_value()) << "still declined after the backoff";
  EXPECT_TRUE(pushed->ok()) << *pushed;
  EXPECT_EQ(transport.transfers(), 2);
}

// The shard's "still waiting" answer (a pull's max_wait_ms passed before the
// version's step began, so nothing went over the link: DEADLINE_EXCEEDED
// within the call's deadline) is not the link's failure: the next transfer
// goes over the socket at once.
TEST(SocketPayloadTransportTest, AWaitReportIsNotTheLinksFailure) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  ModelSpec spec;
  spec.model_id = "m";
  spec.tensors = {{"w", {1024}, DType::kFloat32}};
  spec.optimizer = OptimizerConfig::Sgd(0.1);
  spec.num_trainers = 2;  // Step 1 waits for a trainer that never comes.
  const uint64_t total = RegisterOverTheStream((*server)->address(), spec);
  ASSERT_FALSE(HasFailure());
  auto stub = StubWithToken((*server)->address(), "");
  SocketPayloadTransport transport((*server)->address(), 0);
  std::vector<float> params(total);
  const auto pull = [&](int64_t min_version, int64_t max_wait_ms) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(30)));
    v1::PullParametersRequest request;
    request.set_model_id("m");
    request.set_min_version(min_version);
    request.set_max_wait_ms(max_wait_ms);
    PulledVersion version;
    return transport.Pull(PayloadCall{context, *stub, FlatRange{0, total}}, request,
                          DType::kFloat32, params.data(), &version);
  };
  std::optional<absl::Status> waiting = pull(2, 200);
  ASSERT_TRUE(waiting.has_value()) << "declined a shard with a payload socket";
  EXPECT_TRUE(absl::IsDeadlineExceeded(*waiting)) << *waiting;
  std::optional<absl::Status> next = pull(0, 0);
  ASSERT_TRUE(next.has_value()) << "a wait report sent the next pull over the stream";
  EXPECT_TRUE(next->ok()) << *next;
  EXPECT_EQ(transport.transfers(), 1);
  EXPECT_EQ(params, std::vector<float>(total, 0.5f));
}

}  // namespace
}  // namespace shardopt::testing
