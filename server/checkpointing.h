// Checkpointing a ModelShard: between its state and the checkpoint files of
// common/checkpoint_files.h. Knows nothing of gRPC.
#ifndef SHARDOPT_SERVER_CHECKPOINTING_H_
#define SHARDOPT_SERVER_CHECKPOINTING_H_

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/checkpoint_files.h"
#include "proto/shardopt/v1/checkpoint.pb.h"
#include "server/model_shard.h"

namespace shardopt {

v1::CheckpointProgress ProgressToProto(const ShardProgress& progress);
absl::StatusOr<ShardProgress> ProgressFromProto(const v1::CheckpointProgress& proto);
// An optimizer config and lr schedule from the wire or a checkpoint,
// validated (checkpoints, SetHyperparameters, changes carried by pushes).
absl::StatusOr<Hyperparameters> HyperparametersFromProto(const v1::OptimizerConfig& optimizer,
                                                         const v1::LrSchedule& schedule);

// Writes `shard`'s part of the checkpoint of `config` at `progress` into
// `directory` through `env`, reading its state through `read` (what
// ModelShard::CheckpointAt hands its writer).
absl::StatusOr<CheckpointPartWritten> WriteShardPart(const ModelShard& shard,
                                                     const v1::ModelConfig& config,
                                                     const std::string& directory,
                                                     const ShardProgress& progress,
                                                     const ShardStateReadFn& read, FileEnv* env);

// Writes `shard`'s part of the checkpoint of `config` (the registered
// config) at version `step` into `directory` (see ModelShard::CheckpointAt
// for the waiting and `held` and WriteCheckpointPart for the files),
// through `env`. `write_time`, when given, receives the time the files took
// (not the wait for the step).
absl::StatusOr<CheckpointPartWritten> SaveCheckpoint(
    ModelShard& shard, const v1::ModelConfig& config, const std::string& directory, int64_t step,
    absl::Time deadline, const std::function<bool()>& cancelled,
    ModelShard::StepHold held = ModelShard::StepHold(), FileEnv* env = FileEnv::Default(),
    absl::Duration* write_time = nullptr);

// The options of shard `shard_index` of `shard_count` for `config` (any
// shard count: config.shard_count is ignored), validated. Also gives the
// canonical config for that shard count.
struct ShardPlan {
  v1::ModelConfig config;  // Canonical: compares equal to a trainer's registration.
  ModelShardOptions options;
  uint64_t state_bytes = 0;  // Parameters, optimizer slots and staging.
};
absl::StatusOr<ShardPlan> PlanShard(v1::ModelConfig config, uint32_t shard_index,
                                    uint32_t shard_count);

// Makes shard `plan.options.shard_index` from a checkpoint written by any
// number of shards: its parameters and optimizer state are read from the
// parts overlapping its range, its progress is the saved one.
absl::StatusOr<std::unique_ptr<ModelShard>> RestoreShard(const CheckpointReader& checkpoint,
                                                         const ShardPlan& plan,
                                                         const ModelShard::BackendFactory& backend);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CHECKPOINTING_H_
