// TrainerClient's calls about the model as a whole: Checkpoint and
// InspectJson (see trainer_client.h).
#include <google/protobuf/util/json_util.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "client/streamed_push.h"
#include "client/trainer_client.h"

namespace shardopt {

absl::StatusOr<std::string> TrainerClient::Checkpoint(const std::string& directory, int64_t step) {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  if (step < 0 && asynchronous()) {
    absl::StatusOr<int64_t> latest = AsyncLatestCheckpointStep();
    if (!latest.ok()) return latest.status();
    step = *latest;
  } else if (step < 0) {
    absl::StatusOr<std::vector<std::string>> unused = InspectJson();
    if (!unused.ok()) return unused.status();
    step = std::max<int64_t>(0, latest_inspected_version_);
  }
  std::vector<std::string> manifests(shards_.size());
  absl::Status status = fanout_->Run(
      CallFor(absl::StrCat("Checkpoint step ", step)),
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::CheckpointRequest request;
        request.set_model_id(spec_->model_id);
        request.set_directory(directory);
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
  return absl::InternalError("every shard saved its part but none reports the manifest");
}

absl::StatusOr<std::vector<std::string>> TrainerClient::InspectJson() {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  std::vector<std::string> out(shards_.size());
  std::vector<int64_t> versions(shards_.size(), 0);
  absl::Status status = fanout_->Run(
      CallFor("Inspect"),
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::InspectRequest request;
        request.set_model_id(spec_->model_id);
        v1::InspectResponse response;
        absl::Status s = shard.Inspect(context, request, &response);
        if (!s.ok()) return s;
        versions[shard.index()] = response.version();
        google::protobuf::util::JsonPrintOptions options;
        options.preserve_proto_field_names = true;
        if (!google::protobuf::util::MessageToJsonString(response, &out[shard.index()], options)
                 .ok()) {
          return absl::InternalError("cannot print the InspectResponse as JSON");
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  latest_inspected_version_ = *std::max_element(versions.begin(), versions.end());
  return out;
}

}  // namespace shardopt
