// The client's payload-socket transport (client/socket_payload_transport.h)
// against a real shard process that refuses a call before it reads the
// push's header (a read-only token): the transport's send of a payload far
// larger than the sockets' buffers ends when the refusal comes, not at its
// stall bound, and the refusal is what the call returns; a refused pull
// returns the shard's status as well. Then the transport declines a shard
// whose payload socket is off.
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/channel_security.h"
#include "client/socket_payload_transport.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"

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

}  // namespace
}  // namespace shardopt::testing
