// Fuzzes the shard service as it receives calls: every method of
// shardopt.v1.ShardService on a real ShardServer (in this process, through
// its in-process channel, so the interceptor, access control and every
// handler run as for a remote trainer), holding model "m" of 2 trainers.
//
// Input: a byte choosing the method, then up to 16 records (16-bit length +
// bytes), each one serialized request message; a record that does not parse
// is sent raw to the unary methods (the "does not parse" path), and skipped
// on the streams. An empty model_id becomes "m", so that most calls reach the
// model's state. The server requires tokens (--auth_token_file); the
// method byte's next bits choose the call's: the trainer's, the read-only
// one, none, or a wrong one. Checkpoint directories that pass the path rules are moved
// under a scratch directory (the fuzzer runs as root; a fuzzed path must not
// write anywhere). Every call has a 50 ms deadline. After each input the
// server must still answer Inspect of "m".
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/auth_metadata.h"
#include "common/layout.h"
#include "common/names.h"
#include "common/optimizer_config.h"
#include "common/proto_convert.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "server/access_control.h"
#include "server/shard_server.h"
#include "tests/support/raw_calls.h"
#include "tools/fuzz/fuzz_input.h"

namespace shardopt::fuzz {
namespace {

struct Fixture {
  std::unique_ptr<ShardServer> server;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ShardService::Stub> stub;
  std::string scratch;
};

constexpr char kTrainerToken[] = "trainer-token-for-fuzzing";
constexpr char kReaderToken[] = "reader-token-for-fuzzing";
// The bearer value this input's calls carry (empty: none).
std::string g_authorization;

constexpr int kDeadlineMs = 50;

void WithDeadline(grpc::ClientContext* context) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + absl::Milliseconds(kDeadlineMs)));
  if (!g_authorization.empty()) context->AddMetadata("authorization", g_authorization);
}

Fixture* MakeFixture() {
  auto* f = new Fixture;
  char scratch[] = "/tmp/shardopt_service_fuzz_XXXXXX";
  f->scratch = mkdtemp(scratch);
  ShardServerOptions options;
  options.threads = 1;
  options.max_state_bytes = 64 << 20;  // Fuzzed registrations stay small.
  options.stream_idle_timeout = absl::Seconds(1);
  options.access = AccessControl::FromTokenFileContents(
                       absl::StrCat("trainer ", kTrainerToken, "\nreadonly ", kReaderToken, "\n"))
                       .value();
  g_authorization = BearerMetadataValue(kTrainerToken);
  absl::StatusOr<std::unique_ptr<ShardServer>> server = ShardServer::Start("127.0.0.1:0", options);
  if (!server.ok()) std::abort();
  f->server = *std::move(server);
  f->channel = f->server->InProcessChannel();
  f->stub = v1::ShardService::NewStub(f->channel);
  const ModelLayout layout = ModelLayout::Create({{"w", {5, 3}}, {"b", {3}}}, 4, 1).value();
  v1::ModelConfig config;
  config.set_model_id("m");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Adam(0.01));
  config.set_num_trainers(2);
  config.set_shard_count(1);
  grpc::ClientContext context;
  context.AddMetadata("authorization", g_authorization);
  v1::RegisterModelResponse response;
  auto writer = f->stub->RegisterModel(&context, &response);
  v1::RegisterModelRequest request;
  *request.mutable_header()->mutable_config() = config;
  writer->Write(request);
  std::vector<float> zeros(layout.ShardSize(0), 0.0f);
  request.Clear();
  request.mutable_values()->set_data(zeros.data(), zeros.size() * sizeof(float));
  writer->Write(request);
  writer->WritesDone();
  if (!writer->Finish().ok()) std::abort();
  return f;
}

Fixture& F() {
  static Fixture* fixture = MakeFixture();
  return *fixture;
}

template <typename Request>
void DefaultModel(Request* request) {
  if (request->model_id().empty()) request->set_model_id("m");
}

// A fuzzed path that the rules accept is moved under the scratch directory.
std::string SafeDirectory(const std::string& directory) {
  if (!CheckPath("directory", directory).ok()) return directory;  // Refused before any I/O.
  return absl::StrCat(F().scratch, "/ck", std::hash<std::string>()(directory) % 8);
}

void RawUnary(const std::string& method, const std::string& bytes) {
  testing::RawUnaryCall(F().channel.get(), "/shardopt.v1.ShardService/" + method, bytes,
                        kDeadlineMs, nullptr, g_authorization);
}

template <typename Request, typename Call>
void Unary(const std::string& method, const std::string& bytes, Call call) {
  Request request;
  if (!request.ParseFromString(bytes)) {
    RawUnary(method, bytes);
    return;
  }
  call(request);
}

void Stream(uint8_t method, FuzzInput& input) {
  Fixture& f = F();
  grpc::ClientContext context;
  WithDeadline(&context);
  if (method == 0) {
    v1::RegisterModelResponse response;
    auto writer = f.stub->RegisterModel(&context, &response);
    for (int i = 0; i < 16 && !input.empty(); ++i) {
      v1::RegisterModelRequest request;
      if (!request.ParseFromString(input.Record())) continue;
      if (request.has_header()) {
        // At most a few models besides "m" come to exist.
        v1::ModelConfig* config = request.mutable_header()->mutable_config();
        if (!config->model_id().empty()) {
          config->set_model_id(absl::StrCat("f", std::hash<std::string>()(config->model_id()) % 3));
        } else {
          config->set_model_id("m");
        }
      }
      if (!writer->Write(request)) break;
    }
    writer->WritesDone();
    writer->Finish();
  } else {
    v1::PushGradientsResponse response;
    auto writer = f.stub->PushGradients(&context, &response);
    for (int i = 0; i < 16 && !input.empty(); ++i) {
      v1::PushGradientsRequest request;
      if (!request.ParseFromString(input.Record())) continue;
      if (request.has_header()) DefaultModel(request.mutable_header());
      if (!writer->Write(request)) break;
    }
    writer->WritesDone();
    writer->Finish();
  }
}

}  // namespace
}  // namespace shardopt::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace shardopt;
  using namespace shardopt::fuzz;
  Fixture& f = F();
  FuzzInput input(data, size);
  const uint8_t choice = input.Byte();
  const uint8_t method = choice % 8;
  const std::string tokens[] = {BearerMetadataValue(kTrainerToken),
                                BearerMetadataValue(kReaderToken), "",
                                BearerMetadataValue("not-a-token-of-this-server")};
  g_authorization = tokens[(choice >> 3) % 4];
  if (method <= 1) {
    Stream(method, input);
  } else {
    const std::string bytes = input.Record();
    grpc::ClientContext context;
    WithDeadline(&context);
    switch (method) {
      case 2:
        Unary<v1::PullParametersRequest>("PullParameters", bytes, [&](v1::PullParametersRequest r) {
          DefaultModel(&r);
          auto reader = f.stub->PullParameters(&context, r);
          v1::PullParametersResponse response;
          while (reader->Read(&response)) {
          }
          reader->Finish();
        });
        break;
      case 3:
        Unary<v1::GetStepStatsRequest>("GetStepStats", bytes, [&](v1::GetStepStatsRequest r) {
          DefaultModel(&r);
          v1::StepStats response;
          f.stub->GetStepStats(&context, r, &response);
        });
        break;
      case 4:
        Unary<v1::SetHyperparametersRequest>("SetHyperparameters", bytes,
                                             [&](v1::SetHyperparametersRequest r) {
                                               DefaultModel(&r);
                                               v1::SetHyperparametersResponse response;
                                               f.stub->SetHyperparameters(&context, r, &response);
                                             });
        break;
      case 5:
        Unary<v1::CheckpointRequest>("Checkpoint", bytes, [&](v1::CheckpointRequest r) {
          DefaultModel(&r);
          r.set_directory(SafeDirectory(r.directory()));
          v1::CheckpointResponse response;
          f.stub->Checkpoint(&context, r, &response);
        });
        break;
      case 6:
        Unary<v1::InspectRequest>("Inspect", bytes, [&](v1::InspectRequest r) {
          DefaultModel(&r);
          v1::InspectResponse response;
          f.stub->Inspect(&context, r, &response);
        });
        break;
      default:
        Unary<v1::RollBackRequest>("RollBack", bytes, [&](v1::RollBackRequest r) {
          DefaultModel(&r);
          v1::RollBackResponse response;
          f.stub->RollBack(&context, r, &response);
        });
        break;
    }
  }
  // The server survived, and still holds the model.
  g_authorization = BearerMetadataValue(kTrainerToken);
  grpc::ClientContext context;
  context.AddMetadata("authorization", g_authorization);
  context.set_deadline(absl::ToChronoTime(absl::Now() + absl::Seconds(10)));
  v1::InspectRequest inspect;
  inspect.set_model_id("m");
  v1::InspectResponse response;
  if (!f.stub->Inspect(&context, inspect, &response).ok()) std::abort();
  return 0;
}
