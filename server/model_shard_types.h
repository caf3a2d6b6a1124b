// What a ModelShard takes and gives (server/model_shard.h): its options,
// the result of a push, the state read for checkpoints, and the snapshot
// Inspect and ServerInfo show. Plain values, no behaviour.
#ifndef SHARDOPT_SERVER_MODEL_SHARD_TYPES_H_
#define SHARDOPT_SERVER_MODEL_SHARD_TYPES_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "common/consistency.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "server/hyperparameter_schedule.h"
#include "server/step_state.h"

namespace shardopt {

struct ModelShardOptions {
  std::string model_id;
  ModelLayout layout;
  uint32_t shard_index = 0;
  OptimizerConfig optimizer;
  uint32_t num_trainers = 1;
  bool mean_reduction = true;  // false: sum over trainers.
  LrSchedule lr_schedule;      // Applied to optimizer.lr each step.
  // Gradient control. With either on, a step is applied only after a
  // decision (Decide) that every shard receives alike: clipping needs the
  // global norm, loss scaling a skip when any shard saw inf/NaN.
  double max_grad_norm = 0;   // > 0: clip the global L2 norm to this.
  bool loss_scaling = false;  // Pushes carry a loss scale; non-finite allowed.
  std::string run_id;         // The training run (see RegisterHeader.run_id).
  // With loss scaling: the trainers' scaler, replicated here (see
  // GradientControl.loss_scaler in the proto).
  std::optional<LossScalerOptions> loss_scaler;
  // Elements per pipeline range (see the header comment); 0: whole steps.
  // Rounded up to a multiple of 16, and of the norm block with gradient
  // control (UpdateBackend::kNormBlockElements), so that bits do not change.
  uint64_t pipeline_range_elements = 0;
  // Keep (and log as each step ends) when the ranges of a step arrived, were
  // updated and pulled (server/step_timeline.h).
  bool step_timeline = false;
  // The step protocol (see the header comment); `staleness` with kBounded.
  Consistency consistency = Consistency::kSync;
  int64_t staleness = 0;

  // The shards decide steps (see ModelStepsNeedDecisions; not in the
  // asynchronous modes, where the trainers clip and skip their own).
  bool needs_decision() const {
    return ModelStepsNeedDecisions(consistency, max_grad_norm, loss_scaling, optimizer.kind,
                                   layout);
  }
  // Decisions come in two halves, the second with every tensor's norms
  // (StepsNeedTrustNorms: LAMB on the flat partition, synchronous).
  bool needs_trust_norms() const {
    return !IsAsynchronous(consistency) && StepsNeedTrustNorms(optimizer.kind, layout);
  }
};

// kAwaitingDecision: this push completed the step's gradients; the step
// waits for Decide().
enum class PushOutcome { kAccepted, kApplied, kDuplicate, kAlreadyApplied, kAwaitingDecision };

struct PushResult {
  PushOutcome outcome = PushOutcome::kAccepted;
  int64_t step = 0;
  int64_t version = 0;            // After this push.
  uint32_t trainers_pending = 0;  // For the step still waiting, if any.
  // Asynchronous modes: the push's staleness when applied (AsyncState::Claim)
  // and each trainer's last applied step then.
  int64_t staleness = 0;
  std::vector<int64_t> trainer_steps;
};

// Statistics of the part of one tensor in this shard's range.
struct TensorPieceStats {
  TensorPiece piece;
  double l2_norm = 0, min = 0, max = 0, mean = 0;
};

// Reads the state at one version (see ModelShard::CheckpointAt). `slot` -1 is
// the parameters, 0.. the optimizer slots in OptimizerConfig::StateSlotNames()
// order; offsets are range-local.
using ShardStateReadFn =
    std::function<absl::Status(int slot, uint64_t offset, uint64_t count, float* out)>;

// The shard as inspected. `version`, `tensors` and `values` describe one
// version; `trainers_pushed` and the byte counters were read just before.
struct ShardSnapshot {
  int64_t version = 0;
  std::vector<uint32_t> trainers_pushed;  // For the step after the version then.
  bool partly_run = false;                // StepState::PartlyRun() then.
  std::vector<TensorPieceStats> tensors;
  std::vector<float> values;  // The requested slice.
  uint64_t parameter_bytes = 0;
  uint64_t optimizer_state_bytes = 0;
  uint64_t staging_bytes = 0;
  uint64_t gradient_bytes_received = 0;
  uint64_t parameter_bytes_sent = 0;
  Hyperparameters current;                 // In force for the next step.
  Hyperparameters next;                    // What step version + 1 runs with.
  double last_lr = 0;                      // Of the last applied step.
  std::vector<int64_t> scheduled_changes;  // Steps where a change takes effect.
  StepRecord last_step;                    // With gradient control.
  int64_t optimizer_steps = 0;             // Updates applied (skips excluded).
  int64_t skipped_steps = 0;
  std::vector<TrainerActivity> trainers;  // By rank.
  // Asynchronous modes: AsyncState's applied steps, largest staleness and
  // recent order (rank, step).
  std::vector<int64_t> trainer_steps;
  int64_t max_staleness = 0;
  std::vector<std::pair<uint32_t, int64_t>> applied_order;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_MODEL_SHARD_TYPES_H_
