// The client's payload-socket transport (client/socket_payload_transport.h)
// against a real shard process that refuses a call before it reads the
// push's header (a read-only token): the transport's send of a payload far
// larger than the sockets' buffers ends when the refusal comes, not at its
// stall bound, and the refusal is what the call returns; a refused pull
// returns the shard's status as well. Then the transport declines a shard
// whose payload socket is off. Then a job of several 1 MiB pieces per
// transfer gets the stream's bits over the sockets (fp32, bf16, fp16), and
// a push framed otherwise than in pieces is refused without changing the
// shard.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/channel_security.h"
#include "client/socket_payload_transport.h"
#include "client/trainer_client.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/payload_socket.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"

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

// One trainer's job of a model of three and a bit 1 MiB pieces of fp32 per
// transfer (Adam) twice, on two single-shard servers: over the payload
// socket and over the gRPC stream, in `wire` on the wire both ways.
class PiecesJob {
 public:
  static constexpr uint64_t kElements = 3 * (kSocketPieceBytes / sizeof(float)) + 4099;

  void Start(DType wire) {
    for (auto& server : servers_) {
      auto started = ServerProcess::Start(0, 1);
      ASSERT_TRUE(started.ok()) << started.status();
      server = *std::move(started);
    }
    spec_.model_id = "pieces";
    spec_.tensors = {{"w", {static_cast<int64_t>(kElements)}, DType::kFloat32}};
    spec_.optimizer = OptimizerConfig::Adam(1e-3);
    // The flat buffers hold the tensor and its padding (zeros).
    total_ = ModelLayout::Create(spec_.tensors, spec_.alignment, 1)->total_elements();
    initial_.assign(total_, 0.0f);
    for (uint64_t i = 0; i < kElements; ++i) {
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
    for (uint64_t i = 0; i < kElements; ++i) {
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
    EXPECT_NE(std::memcmp(params_[0].data(), initial_.data(), kElements * sizeof(float)), 0);
  }

  const std::string& socket_shard() const { return servers_[0]->address(); }
  const ModelSpec& spec() const { return spec_; }
  uint64_t total() const { return total_; }

 private:
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
  v1::ServerInfo info;
  {
    grpc::ClientContext context;
    ASSERT_TRUE(NewStub(address)->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  }
  const std::string token(kLinkTokenChars, 'e');
  absl::StatusOr<int> link = OpenLink(
      "127.0.0.1", static_cast<uint16_t>(info.payload_socket_port()), token, absl::Seconds(10));
  ASSERT_TRUE(link.ok()) << link.status();
  std::vector<float> whole_grad(job.total(), 0.0f);
  std::fill(whole_grad.begin(), whole_grad.begin() + PiecesJob::kElements, 1e-3f);
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
  close(*link);
  EXPECT_EQ(refused.error_code(), grpc::INVALID_ARGUMENT) << refused.error_message();
  EXPECT_NE(refused.error_message().find("in pieces of"), std::string::npos)
      << refused.error_message();
  // Nothing of it stayed: step 4 from the trainers still matches the stream.
  job.StepBoth(4);
  job.ExpectTrained(8);
}

}  // namespace
}  // namespace shardopt::testing
