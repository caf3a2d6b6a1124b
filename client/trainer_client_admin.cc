// TrainerClient's calls about the model as a whole: Checkpoint, Finish and
// InspectJson (see trainer_client.h).
#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/recovery.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "client/streamed_push.h"
#include "client/trainer_client.h"
#include "common/proto_convert.h"

namespace shardopt {

namespace {

// Whether every shard holds every trainer's steps up to `step`.
bool EveryShardAt(const std::vector<v1::ModelSummary>& shards, int64_t step) {
  for (const v1::ModelSummary& s : shards) {
    if (s.trainer_steps_size() == 0 && s.version() < step) return false;  // (Synchronous.)
    for (int64_t applied : s.trainer_steps()) {
      if (applied < step) return false;
    }
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> TrainerClient::Checkpoint(const std::string& directory, int64_t step) {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  if (directory.empty()) return absl::InvalidArgumentError("name the checkpoint's directory");
  if (step < 0 && asynchronous()) {
    absl::StatusOr<int64_t> latest = AsyncLatestCheckpointStep();
    if (!latest.ok()) return latest.status();
    step = *latest;
  } else if (step < 0) {
    absl::StatusOr<std::vector<std::string>> unused = InspectJson();
    if (!unused.ok()) return unused.status();
    step = std::max<int64_t>(0, latest_inspected_version_);
  }
  absl::StatusOr<std::string> manifest = CheckpointEveryShard(step, directory, false);
  if (manifest.ok() && manifest->empty()) {
    return absl::InternalError("every shard saved its part but none reports the manifest");
  }
  return manifest;
}

absl::StatusOr<std::string> TrainerClient::CheckpointEveryShard(int64_t step,
                                                                const std::string& directory,
                                                                bool end_on_wait_report) {
  std::vector<std::string> manifests(shards_.size());
  ShardFanOut::Call call =
      CallFor(directory.empty() ? absl::StrCat("Checkpoint of the last step ", step)
                                : absl::StrCat("Checkpoint step ", step));
  call.end_on_wait_report = end_on_wait_report;
  absl::Status status =
      fanout_->Run(call, [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::CheckpointRequest request;
        request.set_model_id(spec_->model_id);
        request.set_directory(directory);
        request.set_periodic(directory.empty());
        request.set_step(step);
        request.set_shard_index(shard.index());
        // (Its "still waiting" report names the trainers it waits for.)
        request.set_max_wait_ms(absl::ToInt64Milliseconds(WaitReportInterval()));
        v1::CheckpointResponse response;
        absl::Status s = shard.Checkpoint(context, request, &response);
        manifests[shard.index()] = response.manifest();
        return s;
      });
  if (!status.ok()) return status;
  for (const std::string& m : manifests) {
    if (!m.empty()) return m;
  }
  return std::string();
}

absl::Status TrainerClient::Finish(int64_t step) {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  if (step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
  }
  if (step > std::max(last_pushed_step_, registered_version_)) {
    // (Recovery would take the steps this trainer never pushed for lost
    // ones, and roll the job back.)
    return absl::FailedPreconditionError(absl::StrCat(
        "Finish(", step, "): this trainer's last step is ",
        std::max(last_pushed_step_, registered_version_), "; finish the step it ended with"));
  }
  rolled_back_to_.reset();
  // Saves that every shard is there for but that wait (another caller's
  // write holds a shard: its saving thread, another trainer's save) go on
  // within the retry budget; shards that went back count as rounds.
  absl::Time busy_until = absl::InfiniteFuture();
  for (int went_back = 0;;) {
    // Every trainer's steps up to `step` everywhere: a shard that came back
    // from an older checkpoint gets them again from the trainers' histories
    // (each trainer is still here: none returns before it saw the end saved
    // with every shard there).
    absl::Status there = asynchronous() ? WaitForEveryTrainer(step) : Recover(step);
    if (!there.ok()) return there;
    absl::StatusOr<std::vector<v1::ModelSummary>> shards = recovery_->Survey();
    if (!shards.ok()) return shards.status();
    std::vector<std::string> without;
    for (size_t i = 0; i < shards->size(); ++i) {
      if (!(*shards)[i].periodic_checkpoints()) without.push_back(absl::StrCat(i));
    }
    if (without.size() == shards->size()) return absl::OkStatus();  // Nothing kept to save.
    if (!without.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", spec_->model_id, "': shard(s) ", absl::StrJoin(without, ", "),
          " keep no periodic checkpoints (--checkpoint_dir, --checkpoint_every) and the others "
          "do: the end of the job, step ",
          step, ", cannot be saved where every shard would restore it"));
    }
    absl::Status saved = SaveLastStep(step);
    if (!saved.ok() && !absl::IsDeadlineExceeded(saved)) return saved;
    // Saved, or a shard reports it waits for `step`. Either way a shard may
    // have gone back meanwhile (a part it wrote before it restarted can
    // complete the commit): done only with every shard there.
    shards = recovery_->Survey();
    if (!shards.ok()) return shards.status();
    if (EveryShardAt(*shards, step)) {
      if (saved.ok()) return saved;
      if (busy_until == absl::InfiniteFuture()) busy_until = absl::Now() + options_.retry_budget;
      if (absl::Now() >= busy_until) return saved;
      continue;
    }
    busy_until = absl::InfiniteFuture();
    if (++went_back > kMaxRecoveries) {
      return absl::DeadlineExceededError(
          absl::StrCat("model '", spec_->model_id, "': shards went back below step ", step,
                       " in each of ", went_back, " rounds of saving the end of the job"));
    }
  }
}

absl::Status TrainerClient::SaveLastStep(int64_t step) {
  // A second pass finds every part written by the first (or by the other
  // trainers' calls) and commits, should no answer of the first report it.
  for (int pass = 0; pass < 2; ++pass) {
    absl::StatusOr<std::string> manifest = CheckpointEveryShard(step, "", true);
    if (!manifest.ok()) return manifest.status();
    if (!manifest->empty()) return absl::OkStatus();
  }
  return absl::InternalError(absl::StrCat("every shard saved its part of step ", step,
                                          " twice but none reports the checkpoint committed"));
}

absl::StatusOr<std::vector<v1::InspectResponse>> TrainerClient::InspectEveryShard() {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  std::vector<v1::InspectResponse> out(shards_.size());
  absl::Status status = fanout_->Run(
      CallFor("Inspect"),
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::InspectRequest request;
        request.set_model_id(spec_->model_id);
        return shard.Inspect(context, request, &out[shard.index()]);
      });
  if (!status.ok()) return status;
  for (const v1::InspectResponse& r : out) {
    latest_inspected_version_ = std::max(latest_inspected_version_, r.version());
  }
  return out;
}

absl::StatusOr<std::vector<std::string>> TrainerClient::InspectJson() {
  absl::StatusOr<std::vector<v1::InspectResponse>> responses = InspectEveryShard();
  if (!responses.ok()) return responses.status();
  std::vector<std::string> out(responses->size());
  google::protobuf::util::JsonPrintOptions options;
  options.preserve_proto_field_names = true;
  for (size_t i = 0; i < out.size(); ++i) {
    if (!google::protobuf::util::MessageToJsonString((*responses)[i], &out[i], options).ok()) {
      return absl::InternalError("cannot print the InspectResponse as JSON");
    }
  }
  return out;
}

absl::StatusOr<TrainerClient::NextHyperparameters> TrainerClient::NextStepHyperparameters() {
  absl::StatusOr<std::vector<v1::InspectResponse>> responses = InspectEveryShard();
  if (!responses.ok()) return responses.status();
  const v1::InspectResponse& first = responses->front();
  for (const v1::InspectResponse& r : *responses) {
    if (r.next_optimizer().kind_case() == v1::OptimizerConfig::KIND_NOT_SET) {
      return absl::UnimplementedError(absl::StrCat(
          "the shards of model '", spec_->model_id,
          "' do not say what the next step runs with (InspectResponse.next_optimizer: an older "
          "server)"));
    }
    if (r.version() != first.version() ||
        r.next_optimizer().SerializeAsString() != first.next_optimizer().SerializeAsString()) {
      return absl::UnavailableError(absl::StrCat(
          "the shards of model '", spec_->model_id, "' are at versions ", first.version(), " and ",
          r.version(), " or disagree on the next step's hyperparameters (a step in flight)"));
    }
  }
  absl::StatusOr<OptimizerConfig> optimizer = OptimizerConfigFromProto(first.next_optimizer());
  if (!optimizer.ok()) return optimizer.status();
  NextHyperparameters next;
  next.version = first.version();
  next.optimizer = *optimizer;
  return next;
}

}  // namespace shardopt
