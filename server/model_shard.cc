#include "server/model_shard.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "common/finite.h"
#include "server/cpu_backend.h"

namespace shardopt {
namespace {

// Parameters read at a time for inspection statistics.
constexpr uint64_t kStatsBlockElements = 1 << 16;
// Parameters converted at a time for 16-bit pulls.
constexpr uint64_t kConvertBlockElements = 1 << 16;

// A parameter that a 16-bit pull cannot carry: a master weight beyond the
// type's range, or one that is itself not finite.
absl::Status PullOverflowError(const std::string& element, float value, DType dtype) {
  if (!std::isfinite(value)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter ", element, " is ", value, ": the master weights are no longer finite"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("parameter ", element, " is ", value, ", which overflows ", DTypeName(dtype),
                   dtype == DType::kFloat16 ? "; pull float32 or bfloat16" : "; pull float32"));
}
// WaitForVersion re-checks cancellation this often.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

}  // namespace

absl::StatusOr<std::unique_ptr<ModelShard>> ModelShard::Create(ModelShardOptions options,
                                                               std::vector<float> initial_values,
                                                               const BackendFactory& backend) {
  if (options.num_trainers == 0) {
    return absl::InvalidArgumentError("num_trainers must be at least 1");
  }
  if (options.shard_index >= options.layout.shard_count()) {
    return absl::InvalidArgumentError(absl::StrCat("shard index ", options.shard_index,
                                                   " is not below the shard count ",
                                                   options.layout.shard_count()));
  }
  if (absl::Status s = options.optimizer.Validate(); !s.ok()) return s;
  const uint64_t size = options.layout.shard_size();
  if (initial_values.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", size, " initial values for the shard range, got ", initial_values.size()));
  }
  if (size_t bad = FindNonFinite(initial_values.data(), size); bad != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial value ", bad, " of the range is ", initial_values[bad]));
  }
  absl::StatusOr<std::unique_ptr<UpdateBackend>> made = backend(options, std::move(initial_values));
  if (!made.ok()) return made.status();
  return std::unique_ptr<ModelShard>(new ModelShard(std::move(options), std::move(*made)));
}

absl::StatusOr<std::unique_ptr<ModelShard>> ModelShard::Create(ModelShardOptions options,
                                                               std::vector<float> initial_values,
                                                               ThreadPool* pool) {
  return Create(std::move(options), std::move(initial_values), CpuBackendFactory(pool));
}

ModelShard::BackendFactory ModelShard::CpuBackendFactory(ThreadPool* pool) {
  return [pool](const ModelShardOptions& o,
                std::vector<float> values) -> absl::StatusOr<std::unique_ptr<UpdateBackend>> {
    absl::StatusOr<std::unique_ptr<CpuBackend>> cpu =
        CpuBackend::Create(o.optimizer, o.num_trainers, std::move(values), pool);
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<UpdateBackend>(std::move(*cpu));
  };
}

ModelShard::ModelShard(ModelShardOptions options, std::unique_ptr<UpdateBackend> backend)
    : options_(std::move(options)),
      range_(options_.layout.ShardRange(options_.shard_index)),
      slots_(options_.num_trainers, SlotState::kEmpty),
      current_{options_.optimizer, options_.lr_schedule},
      run_id_(options_.run_id),
      loss_scaler_(options_.loss_scaler ? std::optional<LossScaler>(*options_.loss_scaler)
                                        : std::nullopt),
      backend_(std::move(backend)) {}

ModelShard::~ModelShard() { Shutdown(); }

double ModelShard::LrOfVersion(int64_t version) const {
  absl::MutexLock lock(&mu_);
  return version == version_ ? version_lr_ : 0.0;
}

ModelShard::AttachInfo ModelShard::GetAttachInfo() const {
  absl::MutexLock lock(&mu_);
  AttachInfo info;
  info.version = version_;
  if (loss_scaler_) info.loss_scaler = loss_scaler_->state();
  info.run_id = run_id_;
  return info;
}

std::optional<LossScaler::State> ModelShard::LossScalerState() const {
  absl::MutexLock lock(&mu_);
  if (!loss_scaler_) return std::nullopt;
  return loss_scaler_->state();
}

absl::Status ModelShard::CheckHoldsPush(uint32_t trainer_rank, int64_t step) const {
  if (trainer_rank >= options_.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", trainer_rank, " is not below num_trainers ", options_.num_trainers));
  }
  absl::MutexLock lock(&mu_);
  if (step <= version_ || (step == version_ + 1 && trainer_rank < slots_.size() &&
                           slots_[trainer_rank] == SlotState::kComplete)) {
    return absl::OkStatus();
  }
  return absl::OutOfRangeError(
      absl::StrCat("shard ", options_.shard_index, " does not hold trainer ", trainer_rank,
                   "'s push of step ", step, ": it is at version ", version_,
                   " (restarted from a checkpoint?); push the steps after it again"));
}

int64_t ModelShard::version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

void ModelShard::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

uint32_t ModelShard::PendingLocked() const {
  return static_cast<uint32_t>(std::count_if(
      slots_.begin(), slots_.end(), [](SlotState s) { return s != SlotState::kComplete; }));
}

absl::StatusOr<ModelShard::PushStart> ModelShard::BeginPush(uint32_t trainer_rank, int64_t step,
                                                            uint64_t num_elements, DType dtype,
                                                            double loss_scale) {
  int exponent = 0;
  if (!(loss_scale > 0) || !std::isfinite(loss_scale) || std::frexp(loss_scale, &exponent) != 0.5 ||
      exponent < -100 || exponent > 101) {
    // Powers of two keep unscaling exact (g * 2^-k), so clipping after it is
    // one rounding, as g / scale * coef would be.
    return absl::InvalidArgumentError(
        absl::StrCat("loss scale ", loss_scale, " is not a power of two in [2^-100, 2^100]"));
  }
  if (loss_scale != 1.0 && !options_.loss_scaling) {
    return absl::InvalidArgumentError(absl::StrCat("loss scale ", loss_scale, ": model '",
                                                   options_.model_id,
                                                   "' was registered without loss scaling"));
  }
  if (trainer_rank >= options_.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", trainer_rank, " is not below num_trainers ", options_.num_trainers));
  }
  if (step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  }
  if (num_elements != range_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("push declares ", num_elements,
                                                   " elements; shard ", options_.shard_index,
                                                   " owns ", range_.size()));
  }
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  PushStart start;
  if (step <= version_) {
    start.immediate = PushResult{PushOutcome::kAlreadyApplied, step, version_, PendingLocked()};
    return start;
  }
  if (step > version_ + 1) {
    // OUT_OF_RANGE: the trainer can fix it by pushing the missing steps (a
    // shard restarted from a checkpoint is behind its trainers).
    return absl::OutOfRangeError(absl::StrCat("step ", step,
                                              " is ahead of the shard: it is at version ", version_,
                                              " and waits for step ", version_ + 1));
  }
  switch (slots_[trainer_rank]) {
    case SlotState::kComplete:
      start.immediate = PushResult{PushOutcome::kDuplicate, step, version_, PendingLocked()};
      return start;
    case SlotState::kReceiving:
      return absl::AbortedError(absl::StrCat("a push from trainer ", trainer_rank, " for step ",
                                             step, " is already in progress; retry"));
    case SlotState::kEmpty:
      break;
  }
  if (loss_scaler_ && loss_scale != loss_scaler_->scale()) {
    // The replica says what every trainer's scaler holds now: a trainer
    // that disagrees restarted or diverged.
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", trainer_rank, " pushes step ", step, " with loss scale ",
                     loss_scale, " but the model's loss scaler is at ", loss_scaler_->scale(),
                     " (re-attach to take the scaler's state)"));
  }
  if (has_pending_loss_scale_ && loss_scale != pending_stats_.loss_scale) {
    // Refused before any byte is streamed (CommitPush checks again).
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", trainer_rank, " pushes step ", step, " with loss scale ",
                     loss_scale, " but another trainer's push of it used ",
                     pending_stats_.loss_scale, "; all trainers must run identical scalers"));
  }
  slots_[trainer_rank] = SlotState::kReceiving;
  pushed_ = true;
  start.writer.reset(new PushWriter(this, trainer_rank, step, dtype, loss_scale));
  return start;
}

std::string ModelShard::DescribeElement(uint64_t index) const {
  return options_.layout.DescribeElement(range_.begin + index);
}

ModelShard::PushWriter::~PushWriter() {
  if (!finished_) shard_->AbortPush(rank_, step_);
}

absl::Status ModelShard::PushWriter::Write(uint64_t offset, const void* data, size_t bytes) {
  const size_t element = DTypeSize(dtype_);
  if (bytes % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", bytes, " bytes is not a whole number of ", DTypeName(dtype_), " elements"));
  }
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk starts at element ", offset, " but ", received_,
                     " were received: chunks must arrive in order, without gaps or overlaps"));
  }
  const uint64_t count = bytes / element;
  if (count > shard_->range_.size() - received_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk [", offset, ", ", offset + count,
                                                   ") overruns the shard range of ",
                                                   shard_->range_.size(), " elements"));
  }
  absl::StatusOr<size_t> bad = shard_->backend_->Stage(rank_, offset, data, dtype_, count);
  if (!bad.ok()) return bad.status();
  if (*bad != count && shard_->options_.loss_scaling) {
    // Overflow under loss scaling: legitimate, staged, and the step will be
    // skipped on every shard.
    found_inf_ = true;
  } else if (*bad != count) {
    float value;
    ConvertToFloatAndFindNonFinite(static_cast<const char*>(data) + *bad * element, 1, dtype_,
                                   &value);
    return absl::InvalidArgumentError(
        absl::StrCat("gradient of ", shard_->DescribeElement(offset + *bad), " from trainer ",
                     rank_, " for step ", step_, " is ", value, "; the push is rejected"));
  }
  received_ += count;
  shard_->gradient_bytes_received_.fetch_add(bytes, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<PushResult> ModelShard::PushWriter::Commit() {
  if (received_ != shard_->range_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push ended after ", received_, " of ", shard_->range_.size(), " elements"));
  }
  if (absl::Status s = shard_->backend_->FinishStaging(rank_); !s.ok()) return s;
  finished_ = true;
  return shard_->CommitPush(rank_, step_, found_inf_, loss_scale_);
}

void ModelShard::AbortPush(uint32_t rank, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (version_ + 1 == step && slots_[rank] == SlotState::kReceiving) {
    slots_[rank] = SlotState::kEmpty;
  }
}

OptimizerConfig ModelShard::ConfigForStepLocked(int64_t step) {
  while (!scheduled_.empty() && scheduled_.begin()->first <= step) {
    current_ = scheduled_.begin()->second;
    took_effect_.insert(*scheduled_.begin());
    scheduled_.erase(scheduled_.begin());
  }
  OptimizerConfig config = current_.optimizer;
  config.lr = current_.lr_schedule.LearningRate(current_.optimizer.lr, step);
  return config;
}

absl::Status ModelShard::FailLocked(int64_t step, const absl::Status& status) {
  broken_ = absl::InternalError(absl::StrCat("shard ", options_.shard_index, " of model '",
                                             options_.model_id, "' failed at step ", step,
                                             " and stopped: ", status.message()));
  shutdown_ = true;  // Wakes and fails every waiting pull.
  return broken_;
}

absl::StatusOr<PushResult> ModelShard::CommitPush(uint32_t rank, int64_t step, bool found_inf,
                                                  double loss_scale) {
  OptimizerConfig config;
  double scale = 1.0;
  {
    absl::MutexLock lock(&mu_);
    if (has_pending_loss_scale_ && loss_scale != pending_stats_.loss_scale) {
      slots_[rank] = SlotState::kEmpty;
      return absl::FailedPreconditionError(
          absl::StrCat("trainer ", rank, " pushed step ", step, " with loss scale ", loss_scale,
                       " but another trainer used ", pending_stats_.loss_scale));
    }
    has_pending_loss_scale_ = true;
    pending_stats_.loss_scale = loss_scale;
    pending_stats_.found_inf = pending_stats_.found_inf || found_inf;
    slots_[rank] = SlotState::kComplete;
    const uint32_t pending = PendingLocked();
    if (pending > 0) {
      return PushResult{PushOutcome::kAccepted, step, version_, pending};
    }
    AwaitNoCheckpointHoldLocked();
    if (!broken_.ok()) return broken_;
    applying_ = true;
    params_changing_ = !options_.needs_decision();
    scale = pending_stats_.loss_scale;
    if (!options_.needs_decision()) {
      config = ConfigForStepLocked(step);
      last_lr_ = config.lr;
    }
  }
  // Every slot is complete, so no writer touches staging and no other commit
  // can reach here for this step: the work runs without holding mu_, and
  // pushes for step + 1 are refused until version_ moves on.
  if (options_.needs_decision()) {
    // Reduce now and report this shard's part of the decision.
    absl::Status reduced = backend_->Reduce(options_.mean_reduction);
    absl::StatusOr<double> sum_of_squares =
        reduced.ok() ? backend_->SumOfSquares(static_cast<float>(1.0 / scale)) : reduced;
    absl::MutexLock lock(&mu_);
    applying_ = false;
    if (!sum_of_squares.ok()) return FailLocked(step, sum_of_squares.status());
    pending_stats_.step = step;
    pending_stats_.sum_of_squares = *sum_of_squares;
    awaiting_decision_ = true;
    return PushResult{PushOutcome::kAwaitingDecision, step, version_, 0};
  }
  const absl::Status applied = ApplyStep(step, config);
  absl::MutexLock lock(&mu_);
  applying_ = false;
  params_changing_ = false;
  if (!applied.ok()) return FailLocked(step, applied);
  version_ = step;
  version_lr_ = config.lr;
  optimizer_steps_ = step;
  std::fill(slots_.begin(), slots_.end(), SlotState::kEmpty);
  has_pending_loss_scale_ = false;
  pending_stats_ = StepStats();
  return PushResult{PushOutcome::kApplied, step, version_, PendingLocked()};
}

absl::StatusOr<StepStats> ModelShard::WaitForStepStats(int64_t step, absl::Time deadline,
                                                       const std::function<bool()>& cancelled) {
  if (step <= 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  if (!options_.needs_decision()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", options_.model_id,
                     "' has no gradient clipping or loss scaling: its steps "
                     "need no decision"));
  }
  struct Waiting {
    const ModelShard* shard;
    int64_t step;
  } waiting{this, step};
  const absl::Condition ready(
      +[](Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        const ModelShard& s = *w->shard;
        return s.shutdown_ || s.version_ >= w->step ||
               (s.awaiting_decision_ && s.pending_stats_.step == w->step);
      },
      &waiting);
  absl::MutexLock lock(&mu_);
  if (step > version_ + 1) {
    // It cannot come without earlier steps (a restarted shard is behind).
    return absl::OutOfRangeError(
        absl::StrCat("step ", step, " is ahead of the shard (version ", version_, ")"));
  }
  const absl::Status waited = AwaitOrCancel(ready, deadline, cancelled);
  if (!broken_.ok()) return broken_;
  if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
  if (awaiting_decision_ && pending_stats_.step == step) return pending_stats_;
  if (version_ >= step) {
    if (last_stats_.step == step) return last_stats_;
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " was decided before the last one (", last_stats_.step, ")"));
  }
  if (step > version_ + 1) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", step, " is ahead of the shard (version ", version_, ")"));
  }
  if (absl::IsDeadlineExceeded(waited)) {
    return absl::DeadlineExceededError(
        absl::StrCat("the gradients of step ", step, " were not all in before the deadline"));
  }
  return waited;
}

absl::Status ModelShard::Decide(int64_t step, const StepDecision& decision) {
  if (!options_.needs_decision()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", options_.model_id,
                     "' has no gradient clipping or loss scaling: its steps "
                     "take no decision"));
  }
  if (!decision.skip) {
    // The coefficient must be the one its norm gives: a client cannot make
    // one shard clip differently from the others.
    const double expected =
        options_.max_grad_norm > 0
            ? std::min(1.0, options_.max_grad_norm / (decision.grad_norm + 1e-6))
            : 1.0;
    if (!std::isfinite(decision.grad_norm) || decision.grad_norm < 0 ||
        static_cast<float>(decision.clip_coef) != static_cast<float>(expected) ||
        !(static_cast<float>(decision.clip_coef) >= std::numeric_limits<float>::min())) {
      return absl::InvalidArgumentError(
          absl::StrCat("clip coefficient ", decision.clip_coef, " does not follow from grad norm ",
                       decision.grad_norm, " and max_grad_norm ", options_.max_grad_norm,
                       " (expected ", expected, ")"));
    }
  }
  OptimizerConfig config;
  double scale;
  int64_t optimizer_step;
  {
    absl::MutexLock lock(&mu_);
    // Another trainer's decision for this step may be being applied right
    // now: wait for it, then this one is a repeat to compare. A checkpoint
    // of the current version holds the next step: wait for it first too, so
    // that everything below is checked against the state that will be used.
    mu_.Await(absl::Condition(
        +[](ModelShard* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return (!s->applying_ &&
                  (s->checkpoint_holds_.count(s->version_) == 0 || s->shutdown_)) ||
                 !s->broken_.ok();
        },
        this));
    if (!broken_.ok()) return broken_;
    if (step <= version_) {
      if (step == last_step_.step && last_step_.decision == decision) return absl::OkStatus();
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step, " was already decided differently (or long ago)"));
    }
    if (step != version_ + 1 || !awaiting_decision_) {
      return absl::FailedPreconditionError(
          absl::StrCat("step ", step, " cannot be decided: the shard is at version ", version_,
                       awaiting_decision_ ? "" : " and not every trainer's gradient is in"));
    }
    if (pending_stats_.found_inf && !decision.skip) {
      return absl::FailedPreconditionError(absl::StrCat("step ", step,
                                                        " must be skipped: a gradient on shard ",
                                                        options_.shard_index, " had inf or NaN"));
    }
    awaiting_decision_ = false;
    applying_ = true;
    params_changing_ = true;
    config = ConfigForStepLocked(step);
    scale = pending_stats_.loss_scale;
    optimizer_step = optimizer_steps_ + 1;
  }
  absl::Status updated;
  {
    absl::WriterMutexLock lock(&params_mu_);
    if (!decision.skip) {
      // Unscale and clip in one multiply: both factors are exact powers of
      // two or a single rounding, as (g / scale) * coef would be.
      const float multiplier =
          static_cast<float>(decision.clip_coef) * static_cast<float>(1.0 / scale);
      updated = backend_->Update(optimizer_step, config, multiplier);
    }
    if (updated.ok()) params_version_ = step;
  }
  absl::MutexLock lock(&mu_);
  applying_ = false;
  params_changing_ = false;
  if (!updated.ok()) return FailLocked(step, updated);
  version_ = step;
  if (decision.skip) {
    ++skipped_steps_;
  } else {
    ++optimizer_steps_;
    last_lr_ = config.lr;
  }
  last_step_ = StepRecord{step, decision, scale, config.lr};
  version_lr_ = config.lr;
  last_stats_ = pending_stats_;
  if (loss_scaler_) loss_scaler_->Update(decision.skip);
  pending_stats_ = StepStats();
  has_pending_loss_scale_ = false;
  std::fill(slots_.begin(), slots_.end(), SlotState::kEmpty);
  return absl::OkStatus();
}

absl::Status ModelShard::SetHyperparameters(int64_t effective_step, const Hyperparameters& next) {
  if (absl::Status s = next.optimizer.Validate(); !s.ok()) return s;
  if (absl::Status s = next.lr_schedule.Validate(); !s.ok()) return s;
  if (absl::Status s = options_.optimizer.CheckCanChangeTo(next.optimizer); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (!broken_.ok()) return broken_;
  if (auto done = took_effect_.find(effective_step); done != took_effect_.end()) {
    // A repeat (e.g. a retry after a lost reply) of a change already in force.
    if (done->second.optimizer == next.optimizer && done->second.lr_schedule == next.lr_schedule) {
      return absl::OkStatus();
    }
    return absl::FailedPreconditionError(
        absl::StrCat("a different hyperparameter change took effect at step ", effective_step));
  }
  // An identical repeat of a scheduled change (a restarted shard's trainers
  // send what it lost) is harmless even while its step is being applied.
  if (auto pending = scheduled_.find(effective_step);
      pending != scheduled_.end() && pending->second.optimizer == next.optimizer &&
      pending->second.lr_schedule == next.lr_schedule) {
    return absl::OkStatus();
  }
  // A step waiting for its decision counts as being applied: some shards may
  // have decided it already.
  if (effective_step <= version_ ||
      (effective_step == version_ + 1 && (applying_ || awaiting_decision_))) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", effective_step, " is already ",
                     effective_step <= version_ ? "applied" : "being applied", " (version ",
                     version_, "); choose a later step"));
  }
  auto [it, inserted] = scheduled_.emplace(effective_step, next);
  if (!inserted) {
    const Hyperparameters& existing = it->second;
    if (existing.optimizer != next.optimizer || !(existing.lr_schedule == next.lr_schedule)) {
      return absl::FailedPreconditionError(absl::StrCat(
          "a different hyperparameter change is already scheduled for step ", effective_step));
    }
  }
  return absl::OkStatus();
}

absl::Status ModelShard::CancelHyperparameters(int64_t effective_step) {
  absl::MutexLock lock(&mu_);
  if (took_effect_.count(effective_step) > 0 ||
      (effective_step == version_ + 1 && (applying_ || awaiting_decision_) &&
       scheduled_.count(effective_step) > 0)) {
    return absl::FailedPreconditionError(
        absl::StrCat("the change for step ", effective_step, " has already taken effect"));
  }
  scheduled_.erase(effective_step);
  return absl::OkStatus();
}

void ModelShard::AwaitNoCheckpointHoldLocked() {
  mu_.Await(absl::Condition(
      +[](ModelShard* s) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return s->checkpoint_holds_.count(s->version_) == 0 || !s->broken_.ok() || s->shutdown_;
      },
      this));
}

void ModelShard::HoldStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  ++checkpoint_holds_[step];
}

void ModelShard::ReleaseStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  ReleaseStepLocked(step);
}

void ModelShard::ReleaseStepLocked(int64_t step) {
  auto it = checkpoint_holds_.find(step);
  if (it != checkpoint_holds_.end() && --it->second == 0) checkpoint_holds_.erase(it);
}

absl::Status ModelShard::CheckpointAt(
    int64_t step, absl::Time deadline, const std::function<bool()>& cancelled,
    const std::function<absl::Status(const ShardProgress&, const ShardStateReadFn&)>& write,
    CheckpointHolds holds) {
  ShardProgress progress;
  {
    absl::MutexLock lock(&mu_);
    if (!holds.already_held) ++checkpoint_holds_[step];
    // Taken first, whatever happens below: the caller counts on it.
    if (holds.hold_next >= 0) ++checkpoint_holds_[holds.hold_next];
    if (step < 0) {
      ReleaseStepLocked(step);
      return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
    }
    if (!broken_.ok()) {
      ReleaseStepLocked(step);
      return broken_;
    }
    // (A step that is only being reduced, waiting for its decision, has not
    // touched the parameters: its version can still be saved.)
    if (version_ > step || (version_ == step && params_changing_)) {
      ReleaseStepLocked(step);
      return absl::FailedPreconditionError(absl::StrCat(
          "shard ", options_.shard_index, " of model '", options_.model_id, "' is at version ",
          version_, params_changing_ ? " (applying the next step)" : "", ", past step ", step,
          ": checkpoint a later step"));
    }
    struct Waiting {
      const ModelShard* shard;
      int64_t step;
    } waiting{this, step};
    const absl::Condition reached(
        +[](Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return w->shard->shutdown_ || w->shard->version_ >= w->step;
        },
        &waiting);
    absl::Status waited = AwaitOrCancel(reached, deadline, cancelled);
    if (waited.ok() && version_ != step) {
      waited =
          !broken_.ok() ? broken_ : absl::UnavailableError("the shard server is shutting down");
    }
    if (!waited.ok()) {
      ReleaseStepLocked(step);
      if (absl::IsDeadlineExceeded(waited)) {
        return absl::DeadlineExceededError(absl::StrCat(
            "version ", step, " was not reached before the deadline (at ", version_, ")"));
      }
      return waited;
    }
    progress.version = version_;
    progress.optimizer_steps = optimizer_steps_;
    progress.skipped_steps = skipped_steps_;
    progress.current = current_;
    progress.scheduled = scheduled_;
    progress.took_effect = took_effect_;
    progress.last_lr = last_lr_;
    progress.version_lr = version_lr_;
    progress.last_step = last_step_;
    progress.run_id = run_id_;
    progress.last_stats = last_stats_;
    if (loss_scaler_) progress.loss_scaler = loss_scaler_->state();
  }
  absl::Status written;
  {
    absl::ReaderMutexLock lock(&params_mu_);
    const ShardStateReadFn read = [this](int slot, uint64_t offset, uint64_t count,
                                         float* out) -> absl::Status {
      if (slot < 0) {
        if (offset > range_.size() || count > range_.size() - offset) {
          return absl::OutOfRangeError("read outside the range");
        }
        return backend_->Read(offset, count, out);
      }
      return backend_->ReadSlot(slot, offset, count, out);
    };
    written = write(progress, read);
  }
  absl::MutexLock lock(&mu_);
  ReleaseStepLocked(step);
  return written;
}

absl::Status ModelShard::Restore(const ShardProgress& progress, const ShardStateReadFn& read_slot) {
  {
    absl::MutexLock lock(&mu_);
    if (pushed_ || version_ != 0) {
      return absl::FailedPreconditionError("a shard that has taken pushes cannot be restored");
    }
  }
  if (progress.version < 0 || progress.optimizer_steps < 0 || progress.skipped_steps < 0 ||
      progress.optimizer_steps + progress.skipped_steps > progress.version) {
    return absl::InvalidArgumentError(absl::StrCat(
        "inconsistent progress: version ", progress.version, ", ", progress.optimizer_steps,
        " updates and ", progress.skipped_steps, " skipped steps"));
  }
  if (absl::Status s = progress.current.optimizer.Validate(); !s.ok()) return s;
  if (absl::Status s = options_.optimizer.CheckCanChangeTo(progress.current.optimizer); !s.ok()) {
    return s;
  }
  // Through a bounded buffer: a range can be gigabytes.
  constexpr uint64_t kBlock = uint64_t{1} << 20;
  std::vector<float> block;
  const int slots = options_.optimizer.StateSlotsPerElement();
  for (int slot = 0; slot < slots; ++slot) {
    for (uint64_t done = 0; done < range_.size(); done += kBlock) {
      const uint64_t n = std::min<uint64_t>(kBlock, range_.size() - done);
      block.resize(n);
      if (absl::Status s = read_slot(slot, done, n, block.data()); !s.ok()) return s;
      if (size_t bad = FindNonFinite(block.data(), n); bad != n) {
        return absl::DataLossError(absl::StrCat("saved optimizer state ",
                                                options_.optimizer.StateSlotNames()[slot], " of ",
                                                DescribeElement(done + bad), " is ", block[bad]));
      }
      if (absl::Status s = backend_->WriteSlot(slot, done, n, block.data()); !s.ok()) return s;
    }
  }
  absl::MutexLock lock(&mu_);
  version_ = progress.version;
  optimizer_steps_ = progress.optimizer_steps;
  skipped_steps_ = progress.skipped_steps;
  current_ = progress.current;
  scheduled_ = progress.scheduled;
  took_effect_ = progress.took_effect;
  last_lr_ = progress.last_lr;
  version_lr_ = progress.version_lr;
  last_step_ = progress.last_step;
  run_id_ = progress.run_id;
  last_stats_ = progress.last_stats;
  if (loss_scaler_ && progress.loss_scaler) loss_scaler_->set_state(*progress.loss_scaler);
  absl::MutexLock params_lock(&params_mu_);
  params_version_ = progress.version;
  return absl::OkStatus();
}

absl::Status ModelShard::ApplyStep(int64_t step, const OptimizerConfig& config) {
  absl::WriterMutexLock lock(&params_mu_);
  if (absl::Status s = backend_->Apply(step, options_.mean_reduction, config); !s.ok()) return s;
  params_version_ = step;
  return absl::OkStatus();
}

absl::Status ModelShard::AwaitOrCancel(const absl::Condition& ready, absl::Time deadline,
                                       const std::function<bool()>& cancelled) {
  while (!mu_.AwaitWithDeadline(ready, std::min(deadline, absl::Now() + kCancelPoll))) {
    if (absl::Now() >= deadline) return absl::DeadlineExceededError("deadline");
    // Polled without mu_: asking gRPC may take its own locks.
    mu_.Unlock();
    const bool stop = cancelled && cancelled();
    mu_.Lock();
    if (stop) return absl::CancelledError("cancelled by the client");
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> ModelShard::WaitForVersion(int64_t min_version, absl::Time deadline,
                                                   const std::function<bool()>& cancelled) {
  struct Waiting {
    const ModelShard* shard;
    int64_t min_version;
  } waiting{this, min_version};
  const absl::Condition ready(
      +[](Waiting* w) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return w->shard->shutdown_ || w->shard->version_ >= w->min_version;
      },
      &waiting);
  absl::MutexLock lock(&mu_);
  const absl::Status waited = AwaitOrCancel(ready, deadline, cancelled);
  if (!broken_.ok()) return broken_;
  if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
  if (version_ >= min_version) return version_;
  if (absl::IsDeadlineExceeded(waited)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", min_version, " not reached before the deadline (at ", version_, ")"));
  }
  return waited;
}

absl::Status ModelShard::ReadParameters(int64_t version, uint64_t offset, uint64_t count,
                                        float* out) {
  return ReadParameters(version, offset, count, DType::kFloat32, out);
}

absl::Status ModelShard::ReadParameters(int64_t version, uint64_t offset, uint64_t count,
                                        DType dtype, void* out) {
  if (offset > range_.size() || count > range_.size() - offset) {
    return absl::OutOfRangeError(
        absl::StrCat("read [", offset, ", ", offset + count, ") is outside the range"));
  }
  absl::ReaderMutexLock lock(&params_mu_);
  if (params_version_ != version) {
    return absl::AbortedError(absl::StrCat("parameters moved from version ", version, " to ",
                                           params_version_, " during the pull; retry"));
  }
  absl::StatusOr<bool> native_bf16 = false;
  if (dtype == DType::kBFloat16) native_bf16 = backend_->ReadBFloat16(offset, count, out);
  if (!native_bf16.ok()) return native_bf16.status();
  if (dtype == DType::kFloat32) {
    if (absl::Status s = backend_->Read(offset, count, static_cast<float*>(out)); !s.ok()) {
      return s;
    }
  } else if (*native_bf16) {
    // The backend's own bf16 copy: checked as the conversion below checks.
    if (size_t bad = FindNonFiniteOfType(out, count, dtype); bad != count) {
      float value = 0;
      if (absl::Status s = backend_->Read(offset + bad, 1, &value); !s.ok()) return s;
      return PullOverflowError(DescribeElement(offset + bad), value, dtype);
    }
  } else {
    // Through a bounded fp32 buffer per thread, block by block.
    thread_local std::vector<float> wide(kConvertBlockElements);
    char* narrow = static_cast<char*>(out);
    for (uint64_t done = 0; done < count; done += kConvertBlockElements) {
      const uint64_t n = std::min<uint64_t>(kConvertBlockElements, count - done);
      if (absl::Status s = backend_->Read(offset + done, n, wide.data()); !s.ok()) return s;
      char* block = narrow + done * DTypeSize(dtype);
      // fp16 tops out at 65504: a larger master weight would arrive as inf.
      if (size_t bad = ConvertFromFloatAndFindNonFinite(wide.data(), n, dtype, block); bad != n) {
        return PullOverflowError(DescribeElement(offset + done + bad), wide[bad], dtype);
      }
    }
  }
  parameter_bytes_sent_.fetch_add(count * DTypeSize(dtype), std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::StatusOr<ShardSnapshot> ModelShard::Snapshot(const std::string& tensor_name,
                                                   uint64_t slice_offset, uint32_t slice_length,
                                                   bool with_tensor_stats) {
  if (slice_offset >= range_.size() && slice_length > 0) {
    return absl::OutOfRangeError(absl::StrCat(
        "slice offset ", slice_offset, " is past the range of ", range_.size(), " elements"));
  }
  std::optional<size_t> only;
  if (!tensor_name.empty()) {
    absl::StatusOr<size_t> index = options_.layout.Find(tensor_name);
    if (!index.ok()) return index.status();
    only = *index;
  }
  ShardSnapshot snap;
  {
    absl::MutexLock lock(&mu_);
    snap.version = version_;
    for (uint32_t r = 0; r < slots_.size(); ++r) {
      if (slots_[r] == SlotState::kComplete) snap.trainers_pushed.push_back(r);
    }
    snap.current = current_;
    snap.last_lr = last_lr_;
    snap.last_step = last_step_;
    snap.optimizer_steps = optimizer_steps_;
    snap.skipped_steps = skipped_steps_;
    for (const auto& [step, change] : scheduled_) snap.scheduled_changes.push_back(step);
  }
  snap.parameter_bytes = backend_->parameter_bytes();
  snap.optimizer_state_bytes = backend_->optimizer_state_bytes();
  snap.staging_bytes = backend_->staging_bytes();
  snap.gradient_bytes_received = gradient_bytes_received_.load(std::memory_order_relaxed);
  snap.parameter_bytes_sent = parameter_bytes_sent_.load(std::memory_order_relaxed);
  if (!with_tensor_stats && slice_length == 0) return snap;

  // Statistics and values must describe one version: read that version under
  // the same lock as the values (an update may have finished since above).
  absl::ReaderMutexLock lock(&params_mu_);
  snap.version = params_version_;
  std::vector<float> block;
  for (const TensorPiece& piece : options_.layout.PiecesIn(range_)) {
    if (!with_tensor_stats) break;
    if (only && piece.tensor_index != *only) continue;
    TensorPieceStats stats;
    stats.piece = piece;
    double sum = 0, sum_sq = 0;
    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    // In blocks: the backend may hold the parameters in device memory.
    for (uint64_t done = 0; done < piece.size;) {
      const uint64_t n = std::min<uint64_t>(piece.size - done, kStatsBlockElements);
      block.resize(n);
      absl::Status read = backend_->Read(piece.flat_offset - range_.begin + done, n, block.data());
      if (!read.ok()) return read;
      for (float f : block) {
        const double x = f;
        sum += x;
        sum_sq += x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      done += n;
    }
    stats.l2_norm = std::sqrt(sum_sq);
    stats.min = lo;
    stats.max = hi;
    stats.mean = sum / static_cast<double>(piece.size);
    snap.tensors.push_back(stats);
  }
  if (with_tensor_stats && only && snap.tensors.empty()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", tensor_name, "' has no elements on shard ", options_.shard_index));
  }
  if (slice_length > 0) {
    const uint64_t end = std::min<uint64_t>(range_.size(), slice_offset + slice_length);
    snap.values.resize(end - slice_offset);
    absl::Status read = backend_->Read(slice_offset, end - slice_offset, snap.values.data());
    if (!read.ok()) return read;
  }
  return snap;
}

}  // namespace shardopt
