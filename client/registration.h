// Registration: the ModelConfig every shard gets for a trainer's ModelSpec,
// and one round of register (or attach) calls to every shard.
#ifndef SHARDOPT_CLIENT_REGISTRATION_H_
#define SHARDOPT_CLIENT_REGISTRATION_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/shard_fanout.h"
#include "client/step_calls.h"
#include "client/trainer_options.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

// The config of `spec` laid out as `layout` over `shard_count` shards;
// INVALID_ARGUMENT for a bad optimizer, schedule or loss scaler.
absl::StatusOr<v1::ModelConfig> ModelConfigFor(const ModelSpec& spec, const ModelLayout& layout,
                                               uint32_t shard_count);

// A fresh random id naming a training run (RegisterHeader.run_id).
std::string NewRunId();

// What one shard answered.
struct ShardRegistration {
  int64_t version = 0;
  bool created = false;  // The shard had to create the model.
  std::optional<LossScaler::State> loss_scaler;
  std::string run_id;
};

// Registers `config` on every shard (with its part of `initial_params`, a
// whole flat buffer), or attaches (`initial_params` null: the model must
// exist). Checks each shard's range against `layout`.
absl::StatusOr<std::vector<ShardRegistration>> RegisterOnEveryShard(
    ShardFanOut& fanout, const ShardFanOut::Call& call, const v1::ModelConfig& config,
    const ModelLayout& layout, const float* initial_params, const std::string& run_id,
    size_t chunk_bytes);

// The run of the model `config` names on the shards that hold it already
// (attach-only registrations: nothing changes on any shard); nullopt when
// none does. A registration that must create the model on some shards (one
// came back empty before the model's first checkpoint was committed) gives
// them this run, so that the shards hold one run, not two.
absl::StatusOr<std::optional<std::string>> RunOfHeldModel(ShardFanOut& fanout,
                                                          const ShardFanOut::Call& call,
                                                          const v1::ModelConfig& config,
                                                          const ModelLayout& layout);

// After a registration that found the model held at version 0 (a restarted
// rank 0 before the first step; some shards may have come back empty and
// been created now, RunOfHeldModel): OK when the held shards' values are
// `initial_params` (pulled through `steps`, in `pull_dtype`),
// FAILED_PRECONDITION naming the first that differs otherwise (a rank 0
// that initialized otherwise: the shards would train one model made of two
// initializations). OK when some shard is past version 0 or none held it.
absl::Status CheckHeldInitialValues(StepCalls& steps, const std::vector<ShardRegistration>& shards,
                                    const ModelLayout& layout, const float* initial_params,
                                    DType pull_dtype, const std::string& model_id);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_REGISTRATION_H_
