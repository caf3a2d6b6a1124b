#include "server/checkpointing.h"

#include <cctype>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"
#include "common/step_protocol.h"
#include "server/optim/optimizer.h"

namespace shardopt {

absl::StatusOr<Hyperparameters> HyperparametersFromProto(const v1::OptimizerConfig& optimizer,
                                                         const v1::LrSchedule& schedule) {
  absl::StatusOr<OptimizerConfig> o = OptimizerConfigFromProto(optimizer);
  if (!o.ok()) return o.status();
  absl::StatusOr<LrSchedule> s = LrScheduleFromProto(schedule);
  if (!s.ok()) return s.status();
  return Hyperparameters{*o, *s};
}

namespace {

constexpr uint32_t kMaxTrainers = 4096;

v1::HyperparameterChange ChangeToProto(int64_t step, const Hyperparameters& h) {
  v1::HyperparameterChange proto;
  proto.set_step(step);
  *proto.mutable_optimizer() = OptimizerConfigToProto(h.optimizer);
  *proto.mutable_lr_schedule() = LrScheduleToProto(h.lr_schedule);
  return proto;
}

absl::Status ChangesFromProto(
    const google::protobuf::RepeatedPtrField<v1::HyperparameterChange>& changes,
    std::map<int64_t, Hyperparameters>* out) {
  for (const v1::HyperparameterChange& c : changes) {
    absl::StatusOr<Hyperparameters> h = HyperparametersFromProto(c.optimizer(), c.lr_schedule());
    if (!h.ok()) return h.status();
    out->emplace(c.step(), *h);
  }
  return absl::OkStatus();
}

}  // namespace

v1::CheckpointProgress ProgressToProto(const ShardProgress& p) {
  v1::CheckpointProgress proto;
  proto.set_version(p.version);
  proto.set_optimizer_steps(p.optimizer_steps);
  proto.set_skipped_steps(p.skipped_steps);
  *proto.mutable_current_optimizer() = OptimizerConfigToProto(p.current.optimizer);
  *proto.mutable_current_lr_schedule() = LrScheduleToProto(p.current.lr_schedule);
  for (const auto& [step, h] : p.scheduled) *proto.add_scheduled() = ChangeToProto(step, h);
  for (const auto& [step, h] : p.took_effect) *proto.add_took_effect() = ChangeToProto(step, h);
  proto.set_last_lr(p.last_lr);
  proto.set_version_lr(p.version_lr);
  proto.set_last_step(p.last_step.step);
  *proto.mutable_last_decision() = StepDecisionToProto(p.last_step.decision);
  proto.set_last_loss_scale(p.last_step.loss_scale);
  proto.set_last_step_lr(p.last_step.lr);
  proto.set_run_id(p.run_id);
  if (p.loss_scaler) {
    proto.mutable_loss_scaler()->set_scale(p.loss_scaler->scale);
    proto.mutable_loss_scaler()->set_growth_tracker(p.loss_scaler->growth_tracker);
    proto.mutable_loss_scaler()->set_hysteresis_tracker(p.loss_scaler->hysteresis_tracker);
  }
  *proto.mutable_shard_last_stats() = StepStatsToProto(p.last_stats);
  for (int64_t step : p.trainer_steps) proto.add_trainer_steps(step);
  return proto;
}

absl::StatusOr<ShardProgress> ProgressFromProto(const v1::CheckpointProgress& proto) {
  ShardProgress p;
  p.version = proto.version();
  p.optimizer_steps = proto.optimizer_steps();
  p.skipped_steps = proto.skipped_steps();
  absl::StatusOr<Hyperparameters> current =
      HyperparametersFromProto(proto.current_optimizer(), proto.current_lr_schedule());
  if (!current.ok()) return current.status();
  p.current = *current;
  if (absl::Status s = ChangesFromProto(proto.scheduled(), &p.scheduled); !s.ok()) return s;
  if (absl::Status s = ChangesFromProto(proto.took_effect(), &p.took_effect); !s.ok()) return s;
  p.last_lr = proto.last_lr();
  p.version_lr = proto.version_lr();
  p.last_step.step = proto.last_step();
  p.last_step.decision = StepDecisionFromProto(proto.last_decision());
  p.last_step.loss_scale = proto.last_loss_scale();
  p.last_step.lr = proto.last_step_lr();
  p.run_id = proto.run_id();
  if (proto.has_loss_scaler()) {
    p.loss_scaler =
        LossScaler::State{proto.loss_scaler().scale(), proto.loss_scaler().growth_tracker(),
                          proto.loss_scaler().hysteresis_tracker()};
  }
  p.trainer_steps.assign(proto.trainer_steps().begin(), proto.trainer_steps().end());
  return p;
}

absl::StatusOr<CheckpointPartWritten> WriteShardPart(const ModelShard& shard,
                                                     const v1::ModelConfig& config,
                                                     const std::string& directory,
                                                     const ShardProgress& progress,
                                                     const ShardStateReadFn& read, FileEnv* env) {
  return WriteCheckpointPart(
      directory, config, shard.options().shard_index, ProgressToProto(progress),
      [&](int section, uint64_t offset, uint64_t count, float* out) {
        return read(section - 1, offset, count, out);
      },
      env);
}

absl::StatusOr<CheckpointPartWritten> SaveCheckpoint(
    ModelShard& shard, const v1::ModelConfig& config, const std::string& directory, int64_t step,
    absl::Time deadline, const std::function<bool()>& cancelled, ModelShard::StepHold held,
    FileEnv* env, absl::Duration* write_time) {
  absl::StatusOr<CheckpointPartWritten> result = absl::InternalError("checkpoint not written");
  absl::Status status = shard.CheckpointAt(
      step, deadline, cancelled,
      [&](const ShardProgress& progress, const ShardStateReadFn& read) -> absl::Status {
        const absl::Time start = absl::Now();
        result = WriteShardPart(shard, config, directory, progress, read, env);
        if (write_time != nullptr) *write_time = absl::Now() - start;
        return result.status();
      },
      std::move(held));
  if (!status.ok()) return status;
  return result;
}

absl::StatusOr<ShardPlan> PlanShard(v1::ModelConfig config, uint32_t shard_index,
                                    uint32_t shard_count) {
  config.set_shard_count(shard_count);
  if (absl::Status s = CheckId("model_id", config.model_id()); !s.ok()) return s;
  if (config.num_trainers() == 0 || config.num_trainers() > kMaxTrainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_trainers ", config.num_trainers(), " is not in [1, ", kMaxTrainers, "]"));
  }
  if (!v1::GradientReduction_IsValid(config.reduction())) {
    return absl::InvalidArgumentError("unknown gradient reduction");
  }
  absl::StatusOr<ModelLayout> layout = LayoutFromProto(config.layout(), shard_count);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<OptimizerConfig> optimizer = OptimizerConfigFromProto(config.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  if (absl::Status s = CheckOptimizerFitsPartition(optimizer->kind,
                                                   layout->partition() == Partition::kWholeTensors);
      !s.ok()) {
    return s;
  }
  for (const TensorPlacement& t : layout->tensors()) {
    if (absl::Status s = CheckOptimizerFitsTensor(optimizer->kind, t.spec.name, t.spec.shape);
        !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<LrSchedule> schedule = LrScheduleFromProto(config.lr_schedule());
  if (!schedule.ok()) return schedule.status();
  absl::StatusOr<Consistency> consistency = ConsistencyFromConfig(config);
  if (!consistency.ok()) return consistency.status();
  if (absl::Status s = CheckTrustNormsFit(optimizer->kind, *layout, *consistency); !s.ok()) {
    return s;
  }
  const double max_grad_norm = config.gradient_control().max_grad_norm();
  if (!(max_grad_norm >= 0) || !std::isfinite(max_grad_norm)) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_grad_norm ", max_grad_norm, " must be finite and >= 0"));
  }
  // The canonical form, so that spellings of the same model (alignment 0 vs
  // 64, dtype unspecified vs float32) compare equal.
  *config.mutable_layout() = LayoutToProto(*layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(*optimizer);
  *config.mutable_lr_schedule() = LrScheduleToProto(*schedule);
  config.mutable_gradient_control();  // Present either way: unset equals all zero.
  const uint64_t size = layout->ShardSize(shard_index);
  std::optional<LossScalerOptions> scaler;
  if (config.gradient_control().has_loss_scaler()) {
    const v1::LossScalerConfig& c = config.gradient_control().loss_scaler();
    if (!config.gradient_control().loss_scaling()) {
      return absl::InvalidArgumentError("a loss scaler is configured without loss scaling");
    }
    scaler = LossScalerOptions{c.initial_scale(),  c.min_scale(),       c.growth_factor(),
                               c.backoff_factor(), c.growth_interval(), c.hysteresis()};
    if (c.max_scale() > 0) scaler->max_scale = c.max_scale();
    if (absl::Status s = scaler->Validate(); !s.ok()) return s;
  }
  // Parameters and one staging buffer per trainer, the optimizer state as
  // the optimizer will hold it (packed slots store less) and its step's
  // working memory (Muon's; the GPU backend holds it for the model's life).
  const std::vector<RangeTensor> pieces = TensorPiecesOfShard(*layout, shard_index);
  const uint64_t state_bytes =
      size * sizeof(float) * (1 + static_cast<uint64_t>(config.num_trainers())) +
      Optimizer::PlannedStateBytes(*optimizer, size, pieces) +
      Optimizer::PlannedWorkspaceBytes(*optimizer, pieces);
  ModelShardOptions options{config.model_id(),
                            *layout,
                            shard_index,
                            *optimizer,
                            config.num_trainers(),
                            config.reduction() == v1::GRADIENT_REDUCTION_MEAN,
                            *schedule,
                            max_grad_norm,
                            config.gradient_control().loss_scaling()};
  options.loss_scaler = scaler;
  options.consistency = *consistency;
  options.staleness = config.staleness();
  return ShardPlan{std::move(config), std::move(options), state_bytes};
}

absl::StatusOr<std::unique_ptr<ModelShard>> RestoreShard(
    const CheckpointReader& checkpoint, const ShardPlan& plan,
    const ModelShard::BackendFactory& backend) {
  const FlatRange range = plan.options.layout.ShardRange(plan.options.shard_index);
  std::vector<float> params(range.size());
  const ModelLayout& layout = plan.options.layout;
  if (absl::Status s = checkpoint.ReadFor(layout, 0, range.begin, range.size(), params.data());
      !s.ok()) {
    return s;
  }
  // Part 0's state, with the changes scheduled in any part (see
  // ScheduledChangesOf).
  v1::CheckpointProgress saved = checkpoint.manifest().parts(0).progress();
  saved.clear_scheduled();
  for (const v1::HyperparameterChange& c : ScheduledChangesOf(checkpoint.manifest())) {
    *saved.add_scheduled() = c;
  }
  absl::StatusOr<ShardProgress> progress = ProgressFromProto(saved);
  // A shard's own statistics of the last decided step (and in asynchronous
  // modes its step counts, see StepCountsPerShard) carry over only to a
  // shard with the same range; a resharded one takes part 0's counts.
  if (progress.ok()) {
    progress->last_stats = StepStats();
    bool own_part = false;
    for (const v1::CheckpointPart& part : checkpoint.manifest().parts()) {
      // (With whole tensors, equal ranges of another shard count can hold
      // other tensors.)
      if (checkpoint.layout().partition() == layout.partition() &&
          (layout.partition() == Partition::kFlat ||
           checkpoint.layout().shard_count() == layout.shard_count()) &&
          part.range().begin() == range.begin && part.range().end() == range.end) {
        absl::StatusOr<StepStats> stats = StepStatsFromProto(part.progress().shard_last_stats());
        if (!stats.ok()) {
          return absl::DataLossError(absl::StrCat(
              checkpoint.directory(), ": bad saved statistics: ", stats.status().message()));
        }
        progress->last_stats = std::move(*stats);
        own_part = true;
        if (StepCountsPerShard(checkpoint.manifest().config())) {
          progress->optimizer_steps = part.progress().optimizer_steps();
          progress->skipped_steps = part.progress().skipped_steps();
        }
      }
    }
    if (!own_part && !PartsCountStepsAlike(checkpoint.manifest())) {
      LogWarning(
          "%s: its parts count their optimizer steps differently (a step some shards skipped "
          "and others applied); range [%d, %d), none of them, goes on with part 0's count (%d "
          "steps, %d skipped), which changes bias corrections on the elements of other parts",
          checkpoint.directory(), range.begin, range.end, progress->optimizer_steps,
          progress->skipped_steps);
    }
  }
  if (!progress.ok()) {
    return absl::DataLossError(absl::StrCat(checkpoint.directory(),
                                            ": bad saved progress: ", progress.status().message()));
  }
  absl::StatusOr<std::unique_ptr<ModelShard>> shard =
      ModelShard::Create(plan.options, std::move(params), backend);
  if (!shard.ok()) return shard.status();
  if (absl::Status s = (*shard)->Restore(
          *progress,
          [&](int slot, uint64_t offset, uint64_t count, float* out) {
            return checkpoint.ReadFor(layout, slot + 1, range.begin + offset, count, out);
          });
      !s.ok()) {
    return s;
  }
  return shard;
}

}  // namespace shardopt
