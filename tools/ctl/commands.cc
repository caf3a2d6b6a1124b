#include "tools/ctl/commands.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/grpcpp.h>

#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/proto_convert.h"
#include "proto/grpc/health/v1/health.grpc.pb.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"
#include "tools/ctl/table.h"

namespace shardopt::ctl {
namespace {

using ::grpc::health::v1::Health;
using ::grpc::health::v1::HealthCheckRequest;
using ::grpc::health::v1::HealthCheckResponse;

std::shared_ptr<grpc::Channel> Channel(const CommandOptions& options, const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  return options.channels.NewChannel(address, args);
}

void SetDeadline(grpc::ClientContext* context, absl::Duration timeout) {
  context->set_deadline(absl::ToChronoTime(absl::Now() + timeout));
}

std::string Mib(uint64_t bytes) { return absl::StrFormat("%.1f", bytes / 1048576.0); }

std::string Range(const v1::ShardRange& r) {
  return absl::StrCat("[", r.begin(), ", ", r.end(), ")");
}

std::string Failure(const grpc::Status& s) {
  return absl::StrCat("error: ", s.error_code(), " ", s.error_message());
}

std::string SecondsSince(const v1::TrainerActivity& t) {
  return t.seconds_since_last_push() < 0 ? "-"
                                         : absl::StrFormat("%.1f", t.seconds_since_last_push());
}

// "sync", "async" or "bounded(s=4)".
std::string Mode(const v1::ModelSummary& m) {
  switch (m.consistency()) {
    case v1::CONSISTENCY_ASYNC:
      return "async";
    case v1::CONSISTENCY_BOUNDED:
      return absl::StrCat("bounded(s=", m.staleness(), ")");
    default:
      return "sync";
  }
}

std::string NewestCheckpoint(const v1::InspectResponse& info) {
  return info.newest_committed_checkpoint() < 0
             ? "-"
             : absl::StrCat(info.newest_committed_checkpoint());
}

}  // namespace

int Status(const CommandOptions& options, FILE* out) {
  int rc = 0;
  Table servers(
      {"SHARD", "ADDRESS", "HEALTH", "DEVICE", "THREADS", "MODELS", "UPTIME_S", "SHM_ATTACHED"});
  Table models({"MODEL", "SHARD", "RANGE", "MODE", "VERSION", "TRAINERS", "PUSHED", "MAX_STALENESS",
                "CHECKPOINT", "OPTIMIZER", "PARTITION", "PARAM_MB", "STATE_MB", "STAGING_MB",
                "RX_MB", "TX_MB"});
  // APPLIED_STEP: the asynchronous modes' per-trainer record ("-" in sync).
  Table trainers(
      {"MODEL", "SHARD", "TRAINER", "LAST_PUSHED_STEP", "APPLIED_STEP", "SECONDS_SINCE"});
  for (const std::string& address : options.servers) {
    std::shared_ptr<grpc::Channel> channel = Channel(options, address);
    std::string health;
    bool health_answered = false;
    {
      grpc::ClientContext context;
      SetDeadline(&context, options.timeout);
      HealthCheckResponse response;
      grpc::Status s = Health::NewStub(channel)->Check(&context, HealthCheckRequest(), &response);
      health_answered = s.ok();
      health = s.ok() ? HealthCheckResponse::ServingStatus_Name(response.status()) : Failure(s);
    }
    auto stub = v1::ShardService::NewStub(channel);
    grpc::ClientContext context;
    SetDeadline(&context, options.timeout);
    v1::ServerInfo info;
    grpc::Status s = stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info);
    if (!s.ok()) {
      rc = 1;
      // (A server that answers health checks may still refuse this call:
      // no token, another version or service.)
      servers.AddRow({"?", address,
                      health_answered ? absl::StrCat(health, "; GetServerInfo: ", Failure(s))
                                      : health,  // (Down: said once.)
                      "", "", "", "", ""});
      continue;
    }
    servers.AddRow({absl::StrCat(info.shard_index(), "/", info.shard_count()), address, health,
                    info.device(), absl::StrCat(info.threads()), absl::StrCat(info.models_size()),
                    absl::StrFormat("%.0f", info.uptime_seconds()),
                    // Trainer processes whose payloads go through shared memory.
                    info.shared_memory_socket().empty()
                        ? std::string("off")
                        : absl::StrCat(info.shared_memory_attachments())});
    for (const v1::ModelSummary& m : info.models()) {
      // Which ranks have pushed the pending step, and when each last did,
      // come from Inspect.
      std::string pushed = "-";
      std::string checkpoint = "?";
      grpc::ClientContext inspect_context;
      SetDeadline(&inspect_context, options.timeout);
      v1::InspectRequest request;
      request.set_model_id(m.model_id());
      request.set_slice_length(1);
      request.set_tensor_name("");
      v1::InspectResponse inspect;
      const grpc::Status inspected = stub->Inspect(&inspect_context, request, &inspect);
      if (!inspected.ok()) {
        rc = 1;
        fprintf(stderr, "%s: Inspect of model '%s': %s\n", address.c_str(), m.model_id().c_str(),
                Failure(inspected).c_str());
      } else {
        pushed = absl::StrCat(inspect.trainers_pushed_size(), "/", m.num_trainers());
        checkpoint = NewestCheckpoint(inspect);
        for (const v1::TrainerActivity& t : inspect.trainers()) {
          const bool has_step = static_cast<int>(t.rank()) < inspect.trainer_steps_size();
          trainers.AddRow({m.model_id(), absl::StrCat(info.shard_index()), absl::StrCat(t.rank()),
                           absl::StrCat(t.last_pushed_step()),
                           has_step ? absl::StrCat(inspect.trainer_steps(t.rank())) : "-",
                           SecondsSince(t)});
        }
      }
      const bool asynchronous = m.consistency() != v1::CONSISTENCY_SYNC;
      models.AddRow(
          {m.model_id(), absl::StrCat(info.shard_index()), Range(m.range()), Mode(m),
           absl::StrCat(m.version()), absl::StrCat(m.num_trainers()), asynchronous ? "-" : pushed,
           asynchronous ? absl::StrCat(m.max_staleness()) : "-", checkpoint, m.optimizer(),
           m.partition() == v1::PARTITION_WHOLE_TENSORS ? "whole_tensors" : "flat",
           Mib(m.bytes().parameter_bytes()), Mib(m.bytes().optimizer_state_bytes()),
           Mib(m.bytes().staging_bytes()), Mib(m.bytes().gradient_bytes_received()),
           Mib(m.bytes().parameter_bytes_sent())});
    }
  }
  servers.Print(out);
  fprintf(out, "\n");
  models.Print(out);
  fprintf(out, "\n");
  trainers.Print(out);
  return rc;
}

int Inspect(const CommandOptions& options, FILE* out) {
  if (options.model.empty()) {
    fprintf(stderr, "shardoptctl inspect: --model is required\n");
    return 2;
  }
  int rc = 0;
  for (const std::string& address : options.servers) {
    auto stub = v1::ShardService::NewStub(Channel(options, address));
    grpc::ClientContext context;
    SetDeadline(&context, options.timeout);
    v1::InspectRequest request;
    request.set_model_id(options.model);
    request.set_tensor_name(options.tensor);
    request.set_slice_offset(options.offset);
    request.set_slice_length(options.length);
    v1::InspectResponse info;
    grpc::Status s = stub->Inspect(&context, request, &info);
    if (!s.ok()) {
      fprintf(out, "%s: %s\n", address.c_str(), Failure(s).c_str());
      rc = 1;
      continue;
    }
    if (options.json) {
      std::string json;
      google::protobuf::util::JsonPrintOptions print;
      print.add_whitespace = true;
      (void)google::protobuf::util::MessageToJsonString(info, &json, print);
      fprintf(out, "%s\n", json.c_str());
      continue;
    }
    fprintf(out,
            "%s  model %s  shard %u/%u  range %s  version %ld  next step %ld  pushed [%s] of %u\n",
            address.c_str(), info.model_id().c_str(), info.shard_index(), info.shard_count(),
            Range(info.range()).c_str(), static_cast<long>(info.version()),
            static_cast<long>(info.next_step()), absl::StrJoin(info.trainers_pushed(), ",").c_str(),
            info.num_trainers());
    std::vector<std::string> pushes;
    for (const v1::TrainerActivity& t : info.trainers()) {
      pushes.push_back(absl::StrCat(t.rank(), ": step ", t.last_pushed_step(),
                                    t.seconds_since_last_push() < 0
                                        ? ""
                                        : absl::StrCat(" (", SecondsSince(t), " s ago)")));
    }
    fprintf(out, "  last pushes by trainer [%s]  newest committed checkpoint %s\n",
            absl::StrJoin(pushes, ", ").c_str(), NewestCheckpoint(info).c_str());
    if (info.consistency() != v1::CONSISTENCY_SYNC) {
      // The asynchronous record: which of each trainer's steps are applied here.
      fprintf(out, "  %s: applied steps by trainer [%s]  largest staleness %ld\n",
              info.consistency() == v1::CONSISTENCY_ASYNC
                  ? "asynchronous"
                  : absl::StrCat("bounded staleness ", info.staleness()).c_str(),
              absl::StrJoin(info.trainer_steps(), ", ").c_str(),
              static_cast<long>(info.max_staleness()));
    }
    absl::StatusOr<OptimizerConfig> current = OptimizerConfigFromProto(info.current_optimizer());
    absl::StatusOr<LrSchedule> schedule = LrScheduleFromProto(info.lr_schedule());
    fprintf(out, "  optimizer %s  lr schedule %s  last lr %.6g  changes scheduled at [%s]\n",
            current.ok() ? current->DebugString().c_str() : "?",
            schedule.ok() ? schedule->DebugString().c_str() : "?", info.last_lr(),
            absl::StrJoin(info.scheduled_changes(), ",").c_str());
    Table tensors({"TENSOR", "SHAPE", "OFFSET", "ELEMENTS", "L2_NORM", "MIN", "MAX", "MEAN"});
    for (const v1::TensorStats& t : info.tensors()) {
      tensors.AddRow({t.name(), absl::StrCat("[", absl::StrJoin(t.shape(), ","), "]"),
                      absl::StrCat(t.tensor_offset()), absl::StrCat(t.num_elements()),
                      absl::StrFormat("%.6g", t.l2_norm()), absl::StrFormat("%.6g", t.min()),
                      absl::StrFormat("%.6g", t.max()), absl::StrFormat("%.6g", t.mean())});
    }
    tensors.Print(out);
    std::vector<std::string> values;
    for (float v : info.values()) values.push_back(absl::StrFormat("%.7g", v));
    fprintf(out, "values[%lu:%lu] = [%s]\n\n", static_cast<unsigned long>(info.slice_offset()),
            static_cast<unsigned long>(info.slice_offset() + info.values_size()),
            absl::StrJoin(values, ", ").c_str());
  }
  return rc;
}

}  // namespace shardopt::ctl
