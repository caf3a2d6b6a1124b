// The shard daemon as an operator sees it: health and reflection answer (so
// grpcurl works), GetServerInfo describes it, bad flags fail at start, and
// SIGTERM / SIGINT stop it cleanly, waking blocked pulls with UNAVAILABLE.
#include <arpa/inet.h>
#include <google/protobuf/descriptor.pb.h>
#include <grpcpp/grpcpp.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/time/clock.h"
#include "client/retry.h"
#include "client/trainer_client.h"
#include "common/grpc_status.h"
#include "common/loopback_listener_testing.h"
#include "gtest/gtest.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

namespace refl = ::grpc::reflection::v1alpha;

std::shared_ptr<grpc::Channel> Channel(const std::string& address) {
  return grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
}

TEST(ServerLifecycleTest, HealthServiceReportsServing) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  auto health = ::grpc::health::v1::Health::NewStub(Channel((*server)->address()));
  grpc::ClientContext context;
  ::grpc::health::v1::HealthCheckRequest request;
  ::grpc::health::v1::HealthCheckResponse response;
  grpc::Status s = health->Check(&context, request, &response);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(response.status(), ::grpc::health::v1::HealthCheckResponse::SERVING);
}

TEST(ServerLifecycleTest, ReflectionListsServicesAndServesTheContract) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  auto reflection = refl::ServerReflection::NewStub(Channel((*server)->address()));
  grpc::ClientContext context;
  auto stream = reflection->ServerReflectionInfo(&context);

  refl::ServerReflectionRequest list;
  list.set_list_services("");
  ASSERT_TRUE(stream->Write(list));
  refl::ServerReflectionResponse response;
  ASSERT_TRUE(stream->Read(&response));
  std::vector<std::string> services;
  for (const auto& s : response.list_services_response().service()) services.push_back(s.name());
  EXPECT_NE(std::find(services.begin(), services.end(), "shardopt.v1.ShardService"),
            services.end());
  EXPECT_NE(std::find(services.begin(), services.end(), "grpc.health.v1.Health"), services.end());

  refl::ServerReflectionRequest symbol;
  symbol.set_file_containing_symbol("shardopt.v1.ShardService");
  ASSERT_TRUE(stream->Write(symbol));
  ASSERT_TRUE(stream->Read(&response));
  ASSERT_GT(response.file_descriptor_response().file_descriptor_proto_size(), 0);
  google::protobuf::FileDescriptorProto file;
  ASSERT_TRUE(file.ParseFromString(response.file_descriptor_response().file_descriptor_proto(0)));
  EXPECT_EQ(file.package(), "shardopt.v1");
  bool has_push = false;
  for (const auto& service : file.service()) {
    for (const auto& method : service.method()) has_push |= method.name() == "PushGradients";
  }
  EXPECT_TRUE(has_push);
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Reflection needs no token, and each of its streams holds a server thread
// while open: more than MaxOpenReflectionStreams (a quarter of the threads,
// here 8) at once are cancelled at their start, and idle ones at --stream_idle_timeout_s, so that
// streams nobody uses cannot take every thread (they did: 40 idle streams left a server of 32
// threads answering RESOURCE_EXHAUSTED).
TEST(ServerLifecycleTest, IdleReflectionStreamsCannotTakeEveryThread) {
  auto server = ServerProcess::Start(0, 1, {"--max_threads=32", "--stream_idle_timeout_s=3"});
  ASSERT_TRUE(server.ok()) << server.status();
  constexpr int kStreams = 40;
  struct Held {
    grpc::ClientContext context;
    std::unique_ptr<
        grpc::ClientReaderWriter<refl::ServerReflectionRequest, refl::ServerReflectionResponse>>
        stream;
    absl::Duration lasted;
    grpc::Status status;
  };
  std::vector<Held> held(kStreams);
  std::vector<std::thread> readers;
  const absl::Time opened = absl::Now();
  // One channel each: streams of one connection would share its limits.
  std::vector<std::unique_ptr<refl::ServerReflection::Stub>> stubs;
  for (Held& h : held) {
    grpc::ChannelArguments args;
    args.SetInt("shardopt.test_channel", static_cast<int>(stubs.size()));
    stubs.push_back(refl::ServerReflection::NewStub(
        grpc::CreateCustomChannel((*server)->address(), grpc::InsecureChannelCredentials(), args)));
    h.context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
    h.stream = stubs.back()->ServerReflectionInfo(&h.context);
    readers.emplace_back([&h, opened] {
      refl::ServerReflectionResponse unused;
      while (h.stream->Read(&unused)) {
      }
      h.status = h.stream->Finish();
      h.lasted = absl::Now() - opened;
    });
  }
  absl::SleepFor(absl::Seconds(1));
  // The shard still serves its own calls.
  auto stub = v1::ShardService::NewStub(Channel((*server)->address()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  v1::ServerInfo info;
  const grpc::Status served = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
  EXPECT_TRUE(served.ok()) << served.error_code() << ": " << served.error_message();
  for (std::thread& t : readers) t.join();
  int cancelled_at_once = 0;
  for (const Held& h : held) {
    EXPECT_EQ(h.status.error_code(), grpc::StatusCode::CANCELLED) << h.status.error_message();
    if (h.lasted < absl::Seconds(2)) ++cancelled_at_once;
    EXPECT_LT(h.lasted, absl::Seconds(15)) << "an idle reflection stream stayed open";
  }
  EXPECT_GE(cancelled_at_once, kStreams - 8);
}

TEST(ServerLifecycleTest, ServerInfoDescribesShardAndModels) {
  auto servers = StartCluster(2);
  ASSERT_TRUE(servers.ok()) << servers.status();
  TrainerClientOptions options;
  auto client = TrainerClient::Connect(Addresses(*servers), options);
  ASSERT_TRUE(client.ok());
  const ModelSpec spec = SyntheticModelSpec("info", OptimizerConfig::AdamW(), 1);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 2).value();
  ASSERT_TRUE((*client)->Register(spec, SyntheticInitialParams(layout, 1)).ok());

  auto stub = v1::ShardService::NewStub(Channel((*servers)[1]->address()));
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.shard_index(), 1u);
  EXPECT_EQ(info.shard_count(), 2u);
  EXPECT_EQ(info.device(), "cpu");
  EXPECT_EQ(info.threads(), 2u);
  ASSERT_EQ(info.models_size(), 1);
  EXPECT_EQ(info.models(0).model_id(), "info");
  EXPECT_EQ(info.models(0).optimizer(), "adamw");
  EXPECT_EQ(info.models(0).range().begin(), layout.ShardRange(1).begin);
  EXPECT_EQ(info.models(0).bytes().parameter_bytes(), layout.ShardSize(0) * 4);
}

TEST(ServerLifecycleTest, SigtermStopsCleanlyAndWakesBlockedPulls) {
  for (int signal_number : {SIGTERM, SIGINT}) {
    auto servers = StartCluster(1);
    ASSERT_TRUE(servers.ok()) << servers.status();
    TrainerClientOptions options;
    options.retry_budget = absl::ZeroDuration();  // Report the first failure.
    auto client = TrainerClient::Connect(Addresses(*servers), options);
    ASSERT_TRUE(client.ok());
    const ModelSpec spec = SyntheticModelSpec("m", OptimizerConfig::Sgd(0.1), 2);
    const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
    std::vector<float> params = SyntheticInitialParams(layout, 1);
    ASSERT_TRUE((*client)->Register(spec, params).ok());

    // Version 1 never comes (trainer 1 never pushes): the pull blocks.
    absl::StatusOr<int64_t> pulled;
    absl::Time pull_returned;
    std::thread puller([&] {
      pulled = (*client)->Pull(1, absl::MakeSpan(params));
      pull_returned = absl::Now();
    });
    absl::SleepFor(absl::Milliseconds(300));
    const absl::Time signalled = absl::Now();
    (*servers)[0]->process().Signal(signal_number);
    std::optional<int> rc = (*servers)[0]->process().Wait(absl::Seconds(20));
    const absl::Duration stop_time = absl::Now() - signalled;
    puller.join();
    ASSERT_TRUE(rc.has_value()) << "server did not stop";
    EXPECT_EQ(*rc, 0);
    // Nothing was in flight but the pull: no need for the 5 s grace period.
    EXPECT_LT(stop_time, absl::Seconds(3));
    // Woken by the server's shutdown itself, not by the grace period (5 s)
    // running out and the connection being torn down.
    EXPECT_EQ(pulled.status().code(), absl::StatusCode::kUnavailable) << pulled.status();
    EXPECT_NE(pulled.status().message().find("shutting down"), std::string::npos)
        << pulled.status();
    EXPECT_LT(pull_returned - signalled, absl::Seconds(3));
  }
}

// SIGTERM while clients hold push streams open without finishing them (half
// a push each, as a stalled or hostile client leaves them): the server still
// exits within the README's 5 s for calls in flight, plus a margin.
TEST(ServerLifecycleTest, SigtermWithStalledPushStreamsExitsWithinTheGracePeriod) {
  auto servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  TrainerClientOptions options;
  auto client = TrainerClient::Connect(Addresses(*servers), options);
  ASSERT_TRUE(client.ok());
  const ModelSpec spec = SyntheticModelSpec("m", OptimizerConfig::Sgd(0.1), 4);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  std::vector<float> params = SyntheticInitialParams(layout, 1);
  ASSERT_TRUE((*client)->Register(spec, params).ok());

  auto stub = v1::ShardService::NewStub(Channel((*servers)[0]->address()));
  std::vector<std::unique_ptr<grpc::ClientContext>> contexts;
  std::vector<std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>>> streams;
  std::vector<v1::PushGradientsResponse> responses(4);
  for (uint32_t rank = 0; rank < 4; ++rank) {
    contexts.push_back(std::make_unique<grpc::ClientContext>());
    streams.push_back(stub->PushGradients(contexts.back().get(), &responses[rank]));
    v1::PushGradientsRequest header;
    header.mutable_header()->set_model_id("m");
    header.mutable_header()->set_trainer_rank(rank);
    header.mutable_header()->set_step(1);
    header.mutable_header()->set_num_elements(layout.ShardSize(0));
    ASSERT_TRUE(streams.back()->Write(header));
    v1::PushGradientsRequest chunk;
    chunk.mutable_chunk()->set_offset(0);
    chunk.mutable_chunk()->set_data(std::string(16 * sizeof(float), '\0'));
    ASSERT_TRUE(streams.back()->Write(chunk));
  }
  absl::SleepFor(absl::Milliseconds(300));
  const absl::Time signalled = absl::Now();
  (*servers)[0]->process().Signal(SIGTERM);
  std::optional<int> rc = (*servers)[0]->process().Wait(absl::Seconds(30));
  const absl::Duration stop_time = absl::Now() - signalled;
  ASSERT_TRUE(rc.has_value()) << "server did not stop";
  EXPECT_EQ(*rc, 0);
  EXPECT_LT(stop_time, absl::Seconds(7)) << "took " << stop_time;
  for (auto& stream : streams) EXPECT_FALSE(stream->Finish().ok());
}

TEST(ServerLifecycleTest, DeviceFallbackToCpuOnlyWhenAsked) {
  // No machine has GPU 1023: refused without the flag (BadFlags below),
  // served from the CPU with it.
  auto server = ServerProcess::Start(0, 1, {"--device=cuda:1023", "--device_fallback_to_cpu"});
  ASSERT_TRUE(server.ok()) << server.status();
  auto stub = v1::ShardService::NewStub(Channel((*server)->address()));
  grpc::ClientContext context;
  v1::ServerInfo info;
  ASSERT_TRUE(stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info).ok());
  EXPECT_EQ(info.device(), "cpu");
}

TEST(ServerLifecycleTest, BadFlagsFailAtStartWithAMessage) {
  for (const std::vector<std::string>& args :
       std::vector<std::vector<std::string>>{{"--shard_index=2", "--shard_count=2"},
                                             {"--device=cuda:1023"},
                                             {"--device=tpu"},
                                             {"--restore_partition=rows"},
                                             {"--threads=-1"},
                                             {"--stream_idle_timeout_s=-5"},
                                             {"--max_threads=2"}}) {
    std::vector<std::string> full = {"--listen=127.0.0.1:0"};
    full.insert(full.end(), args.begin(), args.end());
    auto proc = ChildProcess::Start(Runfile("server/shardopt_server"), full);
    ASSERT_TRUE(proc.ok());
    std::optional<int> rc = (*proc)->Wait(absl::Seconds(20));
    ASSERT_TRUE(rc.has_value());
    EXPECT_EQ(*rc, 2) << args[0];
  }
}

// The exit status of a server started with `args` that should not come up.
std::optional<int> ExitStatusAtStart(const std::vector<std::string>& args) {
  std::vector<std::string> full = {"--listen=127.0.0.1:0"};
  full.insert(full.end(), args.begin(), args.end());
  auto proc = ChildProcess::Start(Runfile("server/shardopt_server"), full);
  if (!proc.ok()) return std::nullopt;
  std::optional<int> rc = (*proc)->Wait(absl::Seconds(20));
  if (!rc.has_value()) (*proc)->Signal(SIGKILL);
  return rc;
}

// A free TCP port on 127.0.0.1 (free when asked; nothing holds it after).
int FreeLoopbackPort() { return LoopbackListener().port(); }

// A second server on the gRPC or metrics port of a running one is refused
// (both used to start: gRPC and httplib set SO_REUSEPORT, and the kernel
// split the connections between the two).
TEST(ServerLifecycleTest, APortAnotherServerHoldsIsRefused) {
  const int metrics_port = FreeLoopbackPort();
  ASSERT_GT(metrics_port, 0);
  const std::string metrics_address = absl::StrCat("127.0.0.1:", metrics_port);
  auto first = ServerProcess::Start(0, 2, {"--metrics_listen=" + metrics_address});
  ASSERT_TRUE(first.ok()) << first.status();
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--listen=" + (*first)->address(), "--shard_index=1", "--shard_count=2"},
           {"--listen=127.0.0.1:0", "--metrics_listen=" + metrics_address}}) {
    auto proc = ChildProcess::Start(Runfile("server/shardopt_server"), args);
    ASSERT_TRUE(proc.ok());
    const std::optional<int> rc = (*proc)->Wait(absl::Seconds(20));
    if (!rc.has_value()) (*proc)->Signal(SIGKILL);
    EXPECT_TRUE(rc.has_value() && *rc != 0) << args[0] << " " << args.back() << ": it started";
  }
  // The first one still serves.
  grpc::health::v1::HealthCheckResponse health;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  EXPECT_TRUE(grpc::health::v1::Health::NewStub(Channel((*first)->address()))
                  ->Check(&context, {}, &health)
                  .ok());
  EXPECT_EQ(health.status(), grpc::health::v1::HealthCheckResponse::SERVING);
}

// The server's own metrics or payload port on its gRPC port (which it holds
// without listening until gRPC serves) is refused before the restore: here
// the restore path does not exist, and the port is what the server names.
TEST(ServerLifecycleTest, ItsOwnOtherPortsOnItsGrpcPortAreRefusedBeforeTheRestore) {
  const int port = FreeLoopbackPort();
  ASSERT_GT(port, 0);
  const std::string address = absl::StrCat("127.0.0.1:", port);
  for (const std::string& other :
       {"--metrics_listen=" + address, absl::StrCat("--payload_socket_port=", port)}) {
    const std::string run = absl::StrCat(
        "timeout -s KILL 20 ", Runfile("server/shardopt_server"), " --listen=", address, " ", other,
        " --restore_from=", MakeTempDir("own_port"), "/no-such-checkpoint 2>&1");
    auto [rc, output] = RunShell(run);
    EXPECT_EQ(rc, 1) << other << ": " << output;
    EXPECT_NE(output.find(absl::StrCat("port ", port, " is in use")), std::string::npos)
        << other << ": " << output;
    EXPECT_EQ(output.find("no-such-checkpoint"), std::string::npos)
        << other << ": it restored first: " << output;
  }
}

// A server's payload socket, which takes a free port before the restore,
// never takes the server's gRPC port (held from the start until gRPC
// listens): in a network namespace of its own whose ephemeral range is two
// ports, the server listens on the one the kernel gives a listener first,
// and still serves (without the hold its payload socket took that port and
// gRPC could not listen).
TEST(ServerLifecycleTest, ItsPayloadSocketNeverTakesItsGrpcPort) {
  if (RunShell("unshare -n true 2>&1").first != 0) {
    GTEST_SKIP() << "no network namespace here (unshare -n needs CAP_SYS_ADMIN)";
  }
  const std::string port_file = MakeTempDir("own_port_ns") + "/port";
  // The kernel's first pick for a listener as ListenTcp makes it.
  const std::string probe =
      "import socket; s = socket.socket(); "
      "s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1); "
      "s.bind((\"127.0.0.1\", 0)); s.listen(); print(s.getsockname()[1])";
  const std::string script = absl::StrCat(
      "echo '40000 40001' > /proc/sys/net/ipv4/ip_local_port_range && ip link set lo up && "
      "port=$(/usr/bin/python3 -c '",
      probe, "') && echo picked $port && ", Runfile("server/shardopt_server"),
      " --listen=127.0.0.1:$port --shard_index=0 --shard_count=1 --port_file=", port_file,
      " & pid=$!; for i in $(seq 200); do [ -s ", port_file,
      " ] && break; sleep 0.1; done; kill $pid; wait $pid; cat ", port_file);
  std::string quoted = script;
  absl::StrReplaceAll({{"\"", "\\\""}, {"$", "\\$"}}, &quoted);
  auto [rc, output] = RunShell("timeout -s KILL 60 unshare -n sh -c \"" + quoted + "\" 2>&1");
  const size_t picked = output.find("picked ");
  ASSERT_NE(picked, std::string::npos) << output;
  const std::string port = output.substr(picked + 7, 5);
  EXPECT_TRUE(port == "40000" || port == "40001") << output;
  EXPECT_EQ(rc, 0) << output;
  EXPECT_TRUE(absl::EndsWith(absl::StripTrailingAsciiWhitespace(output), port))
      << "the server did not serve on " << port << ": " << output;
}

// A shard restarted on its port answers nothing but retryable statuses
// until it serves: a trainer retrying through the restart must never read one
// that ends it. (The start-up's trial gRPC listener, which tries the TLS
// credentials before the restore, stood on the port itself for a moment and
// answered UNIMPLEMENTED; a trainer that reached it then failed.)
TEST(ServerLifecycleTest, ARestartOnThePortAnswersOnlyRetryableStatusesUntilItServes) {
  auto server = ServerProcess::Start(0, 1);
  ASSERT_TRUE(server.ok()) << server.status();
  const std::string address = (*server)->address();
  std::atomic<bool> stop{false};
  std::atomic<int> answered{0};
  std::mutex mu;
  std::vector<std::string> ending;  // Guarded by mu.
  auto call_until_stopped = [&] {
    while (!stop.load()) {
      // A channel of its own each time (no shared subchannel): every call
      // connects afresh, as a trainer's does when its backoff ends.
      grpc::ChannelArguments arguments;
      arguments.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = v1::ShardService::NewStub(
          grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), arguments));
      grpc::ClientContext context;
      context.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
      v1::ServerInfo info;
      const grpc::Status s = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
      if (s.ok()) {
        ++answered;
      } else if (!IsRetryable(ToAbslStatus(s))) {
        std::lock_guard<std::mutex> lock(mu);
        ending.push_back(absl::StrCat(s.error_code(), ": ", s.error_message()));
      } else {
        absl::SleepFor(absl::Milliseconds(1));
      }
    }
  };
  std::vector<std::thread> callers;
  for (int i = 0; i < 2; ++i) callers.emplace_back(call_until_stopped);
  absl::Cleanup join_callers = [&] {
    stop = true;
    for (std::thread& t : callers) t.join();
  };
  for (int restart = 0; restart < 5; ++restart) {
    (*server)->process().Signal(SIGKILL);
    ASSERT_TRUE((*server)->process().Wait(absl::Seconds(10)).has_value());
    server = StartServerAt(address, 0, 1, {});
    ASSERT_TRUE(server.ok()) << server.status();
  }
  // Until the last one has answered (bounded: a loaded machine is slow).
  const int before = answered.load();
  for (const absl::Time give_up = absl::Now() + absl::Seconds(20);
       answered.load() <= before && absl::Now() < give_up;) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  std::move(join_callers).Invoke();
  EXPECT_GT(answered.load(), 0);
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_TRUE(ending.empty()) << ending.size() << " calls ended with a status trainers do not "
                              << "retry, the first: " << ending.front();
}

// --restore_from names something to load: a path that does not exist is
// refused (a typo started a fresh model), except the --checkpoint_dir of a
// job's first start (which the server makes at start, before it restores).
TEST(ServerLifecycleTest, AMissingRestorePathIsRefusedUnlessItIsTheCheckpointDir) {
  const std::string root = MakeTempDir("restore_missing");
  for (const std::vector<std::string>& args : std::vector<std::vector<std::string>>{
           {"--restore_from=" + root + "/ckpt/m/step-00000007"},
           {"--checkpoint_dir=" + root + "/a", "--checkpoint_every=2",
            "--restore_from=" + root + "/b"}}) {
    const std::optional<int> rc = ExitStatusAtStart(args);
    EXPECT_TRUE(rc.has_value() && *rc != 0) << args.back() << ": it started";
  }
  auto server = ServerProcess::Start(0, 1,
                                     {"--checkpoint_dir=" + root + "/c", "--checkpoint_every=2",
                                      "--restore_from=" + root + "/./c/"});
  EXPECT_TRUE(server.ok()) << server.status();
}

// A restore root on a shared filesystem may hold a directory this user
// cannot list (a root-owned lost+found): it is no model's (a model id has
// no '+'), so it is passed over, not a failed start. A model's directory
// that cannot be listed still fails the start, naming it.
TEST(ServerLifecycleTest, ARestoreRootsDirectoryThatIsNoModelsIsPassedOver) {
  const std::string root = MakeTempDir("lost_found_root");
  ASSERT_EQ(mkdir((root + "/lost+found").c_str(), 0700), 0);
  ASSERT_EQ(mkdir((root + "/mlp").c_str(), 0700), 0);
  ServerPlacement placement;
  placement.binary = "tests/fault_injecting_server";
  auto server = ServerProcess::Start(
      0, 1, {"--restore_from=" + root, "--unlistable_directory=lost+found"}, placement);
  EXPECT_TRUE(server.ok()) << server.status();
  server->reset();
  const std::string run = absl::StrCat(
      "timeout -s KILL 20 ", Runfile("tests/fault_injecting_server"),
      " --listen=127.0.0.1:0 --shard_index=0 --shard_count=1 --restore_from=", root,
      " --unlistable_directory=mlp 2>&1");
  auto [rc, output] = RunShell(run);
  EXPECT_EQ(rc, 1) << output;
  EXPECT_NE(output.find(root + "/mlp"), std::string::npos) << output;
}

// A --checkpoint_dir that cannot hold files is refused at start (it ran,
// and every periodic checkpoint failed); one that does not exist yet is
// made.
TEST(ServerLifecycleTest, ACheckpointDirThatCannotHoldFilesIsRefusedAtStart) {
  const std::string root = MakeTempDir("unwritable_ckpt");
  {
    std::ofstream file(root + "/a_file");
    file << "not a directory\n";
  }
  EXPECT_EQ(
      ExitStatusAtStart({"--checkpoint_dir=" + root + "/a_file/ckpt", "--checkpoint_every=2"}),
      std::optional<int>(2));
  auto server = ServerProcess::Start(
      0, 1, {"--checkpoint_dir=" + root + "/new/ckpt", "--checkpoint_every=2"});
  ASSERT_TRUE(server.ok()) << server.status();
  struct stat info;
  EXPECT_EQ(stat((root + "/new/ckpt").c_str(), &info), 0);
  EXPECT_TRUE(S_ISDIR(info.st_mode));
}

// A port file of an earlier run is removed before this one starts: a
// server that then fails to start leaves none to be read as its port.
TEST(ServerLifecycleTest, AStalePortFileIsRemovedAtStart) {
  const std::string port_file = MakeTempDir("stale_port") + "/port";
  {
    std::ofstream file(port_file);
    file << "12345\n";
  }
  std::vector<std::string> args = {"--listen=256.0.0.1:0", "--port_file=" + port_file};
  auto proc = ChildProcess::Start(Runfile("server/shardopt_server"), args);
  ASSERT_TRUE(proc.ok());
  const std::optional<int> rc = (*proc)->Wait(absl::Seconds(20));
  EXPECT_TRUE(rc.has_value() && *rc != 0);
  struct stat info;
  EXPECT_NE(stat(port_file.c_str(), &info), 0) << "the stale port file stayed";
}

}  // namespace
}  // namespace shardopt::testing
