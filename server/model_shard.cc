// ModelShard's step protocol: pushes, steps, hyperparameters and the waits
// on them. A push's chunks (PushWriter) are in model_shard_push_writer.cc;
// decisions in model_shard_decisions.cc; the waits of pulls in
// model_shard_pulls.cc; reads,
// inspection, checkpoints and restores in model_shard_state_io.cc; the
// asynchronous modes in model_shard_async.cc.
#include "server/model_shard.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "common/finite.h"
#include "common/logging.h"
#include "server/cpu_backend.h"

namespace shardopt {
namespace {

// Waits re-check cancellation this often.
constexpr absl::Duration kCancelPoll = absl::Milliseconds(50);

// Rounds `n` up to a multiple of `m`.
uint64_t RoundUp(uint64_t n, uint64_t m) { return (n + m - 1) / m * m; }

StepStateOptions StepOptionsOf(const ModelShardOptions& o, const UpdateBackend& backend) {
  StepStateOptions s;
  s.size = o.layout.ShardRange(o.shard_index).size();
  // (The asynchronous modes apply whole pushes, one at a time.)
  if (o.pipeline_range_elements > 0 && backend.supports_ranges() &&
      !IsAsynchronous(o.consistency)) {
    // Ranges must not move the element pieces handed to threads, nor the
    // blocks of the norm.
    s.range_elements = RoundUp(o.pipeline_range_elements,
                               o.needs_decision() ? UpdateBackend::kNormBlockElements : 16);
    s.pipelined = true;
  }
  s.model_id = o.model_id;
  s.shard_index = o.shard_index;
  s.num_trainers = o.num_trainers;
  s.needs_decision = o.needs_decision();
  s.needs_trust_norms = o.needs_trust_norms();
  s.trust_tensor_count = o.layout.tensors().size();
  s.initial = Hyperparameters{o.optimizer, o.lr_schedule};
  s.run_id = o.run_id;
  s.loss_scaler = o.loss_scaler;
  return s;
}

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
  // Validated where it came in (PlanShard, from the wire or a checkpoint).
  assert(options.optimizer.Validate().ok());
  const uint64_t size = options.layout.ShardSize(options.shard_index);
  if (initial_values.size() != size) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", size, " initial values for the shard range, got ", initial_values.size()));
  }
  if (size_t bad = FindNonFinite(initial_values.data(), size); bad != size) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial value ", bad, " of the range is ", initial_values[bad]));
  }
  if (absl::Status s = CheckConsistency(options.consistency, options.staleness); !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<UpdateBackend>> made = backend(options, std::move(initial_values));
  if (!made.ok()) return made.status();
  if (IsAsynchronous(options.consistency) && !(*made)->supports_one_trainer_updates()) {
    return absl::UnimplementedError(absl::StrCat("the ", (*made)->device(), " backend has no ",
                                                 ConsistencyName(options.consistency),
                                                 " updates (use the cpu backend)"));
  }
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
    std::vector<RangeTensor> tensors;
    if (o.optimizer.kind == OptimizerKind::kLamb) {
      // LAMB also updates pieces of tensors, with norms from every shard.
      tensors = TensorPiecesOfShard(o.layout, o.shard_index);
    } else if (NeedsWholeTensors(o.optimizer.kind)) {
      absl::StatusOr<std::vector<RangeTensor>> whole = WholeTensorsOfShard(o.layout, o.shard_index);
      if (!whole.ok()) return whole.status();
      tensors = std::move(*whole);
    }
    absl::StatusOr<std::unique_ptr<CpuBackend>> cpu = CpuBackend::Create(
        o.optimizer, o.num_trainers, std::move(values), pool, std::move(tensors));
    if (!cpu.ok()) return cpu.status();
    return std::unique_ptr<UpdateBackend>(std::move(*cpu));
  };
}

ModelShard::ModelShard(ModelShardOptions options, std::unique_ptr<UpdateBackend> backend)
    : options_(std::move(options)),
      range_(options_.layout.ShardRange(options_.shard_index)),
      state_(StepOptionsOf(options_, *backend)),
      range_elements_(state_.range_elements()),
      range_count_(state_.range_count()),
      range_mu_(new absl::Mutex[range_count_]),
      range_versions_(range_count_, 0),
      backend_(std::move(backend)) {
  if (asynchronous()) {
    async_.emplace(AsyncOptions{options_.num_trainers, options_.staleness});
    async_push_times_.resize(options_.num_trainers);
    async_skip_.resize(options_.num_trainers, false);
    async_loss_scale_.resize(options_.num_trainers, 1.0);
  }
  if (options_.step_timeline) {
    timeline_ = std::make_unique<StepTimeline>(
        range_count_,
        [model = options_.model_id, shard = options_.shard_index](const StepTimes& times) {
          LogInfo("model '%s' shard %d timeline: %s", model, shard, times.Describe());
        });
  }
}

std::optional<StepTimes> ModelShard::NewestTimeline() const {
  if (!timeline_) return std::nullopt;
  return timeline_->NewestPulled();
}

ModelShard::~ModelShard() { Shutdown(); }

double ModelShard::LrOfVersion(int64_t version) const {
  absl::MutexLock lock(&mu_);
  if (async_) return version == async_->version() ? last_async_lr_ : 0.0;
  return state_.LrOf(version).value_or(0.0);
}

ModelShard::AttachInfo ModelShard::GetAttachInfo() const {
  absl::MutexLock lock(&mu_);
  if (async_) return AttachInfo{async_->version(), std::nullopt, state_.run_id()};
  return AttachInfo{state_.version(), state_.loss_scaler_state(), state_.run_id()};
}

absl::Status ModelShard::CheckRank(uint32_t trainer_rank) const {
  if (trainer_rank < options_.num_trainers) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("trainer rank ", trainer_rank,
                                                 " is not below num_trainers ",
                                                 options_.num_trainers));
}

absl::Status ModelShard::CheckHoldsPush(uint32_t trainer_rank, int64_t step) const {
  if (absl::Status s = CheckRank(trainer_rank); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  if (async_) return AsyncCheckHolds(PushedBy{trainer_rank, step});
  return state_.CheckHoldsPush(trainer_rank, step);
}

int64_t ModelShard::version() const {
  absl::MutexLock lock(&mu_);
  return async_ ? async_->version() : state_.version();
}

int64_t ModelShard::checkpoint_step() const {
  absl::MutexLock lock(&mu_);
  return async_ ? async_->slowest_applied() : state_.version();
}

absl::Status ModelShard::DiscardPendingPushes(int64_t at_version) {
  if (asynchronous()) return NotInAsyncMode("discarding the pushes of the next step is");
  absl::MutexLock lock(&mu_);
  if (at_version >= 0 && state_.version() != at_version) {
    return absl::AbortedError(absl::StrCat("shard ", options_.shard_index, " of model '",
                                           options_.model_id, "' moved from version ", at_version,
                                           " to ", state_.version(), ": look again"));
  }
  return state_.DiscardPending();
}

void ModelShard::Shutdown() {
  absl::MutexLock lock(&mu_);
  shutdown_ = true;
}

absl::StatusOr<ModelShard::PushStart> ModelShard::BeginPush(
    uint32_t trainer_rank, int64_t step, uint64_t num_elements, DType dtype, double loss_scale,
    const std::vector<StepState::CarriedChange>& changes, bool defer, bool skip) {
  for (const StepState::CarriedChange& c : changes) {
    // Validated where they came in (the service, from the wire).
    assert(c.next.optimizer.Validate().ok() && c.next.lr_schedule.Validate().ok());
    if (absl::Status s = options_.optimizer.CheckCanChangeTo(c.next.optimizer); !s.ok()) return s;
  }
  if (absl::Status s = CheckLossScale(loss_scale); !s.ok()) return s;
  if (loss_scale != 1.0 && !options_.loss_scaling) {
    return absl::InvalidArgumentError(absl::StrCat("loss scale ", loss_scale, ": model '",
                                                   options_.model_id,
                                                   "' was registered without loss scaling"));
  }
  if (absl::Status s = CheckRank(trainer_rank); !s.ok()) return s;
  if (step <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  }
  if (num_elements != range_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("push declares ", num_elements,
                                                   " elements; shard ", options_.shard_index,
                                                   " owns ", range_.size()));
  }
  if (asynchronous()) return BeginAsyncPush(trainer_rank, step, dtype, loss_scale, changes, skip);
  if (skip) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model '", options_.model_id,
        "' is synchronous: a trainer does not skip a step alone (the shards decide skips)"));
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = state_.CheckCanAdopt(changes); !s.ok()) return s;
  absl::StatusOr<StepState::Admission> admitted =
      state_.BeginPush(trainer_rank, step, loss_scale);
  if (!admitted.ok()) return admitted.status();
  // (Under the same lock: before any of the push's bytes can start its
  // step. A push refused changes nothing, its changes included: one whose
  // bytes are refused later takes back what only it scheduled.)
  if (!state_.failed()) {
    state_.AdoptChanges(*admitted == StepState::Admission::kStart
                            ? std::optional<uint32_t>(trainer_rank)
                            : std::nullopt,
                        changes);
  }
  PushStart start;
  switch (*admitted) {
    case StepState::Admission::kAlreadyApplied:
      start.immediate =
          PushResult{PushOutcome::kAlreadyApplied, step, state_.version(), state_.Pending()};
      break;
    case StepState::Admission::kDuplicate:
      start.immediate =
          PushResult{PushOutcome::kDuplicate, step, state_.version(), state_.Pending()};
      break;
    case StepState::Admission::kStart:
      if (timeline_) timeline_->PushBegan(step, absl::Now());
      start.writer.reset(
          new PushWriter(this, trainer_rank, step, dtype, loss_scale, state_.Consumed(), defer));
      break;
  }
  return start;
}

std::string ModelShard::DescribeElement(uint64_t index) const {
  return options_.layout.DescribeElement(range_.begin + index);
}

void ModelShard::AbortPush(uint32_t rank, int64_t step) {
  absl::MutexLock lock(&mu_);
  if (async_) {
    async_->AbortPush(rank, step);
    return;
  }
  state_.AbortPush(rank, step);
}

void ModelShard::RecordDelivered(uint32_t rank, int64_t step, uint64_t delivered,
                                 std::optional<uint64_t> first_inf) {
  {
    absl::MutexLock lock(&mu_);
    const size_t arrived = timeline_ ? state_.RangesArrived() : 0;
    state_.RecordDelivered(rank, step, delivered, first_inf);
    RecordArrivals(step, arrived);
  }
  RunReadyRanges();
}

absl::StatusOr<PushResult> ModelShard::CommitPush(uint32_t rank, int64_t step, bool found_inf,
                                                  double loss_scale) {
  absl::MutexLock lock(&mu_);
  const size_t arrived = timeline_ ? state_.RangesArrived() : 0;
  absl::StatusOr<uint32_t> pending =
      state_.CommitPush(rank, step, found_inf, loss_scale, absl::Now());
  if (!pending.ok()) return pending.status();
  if (*pending > 0) return PushResult{PushOutcome::kAccepted, step, state_.version(), *pending};
  // (Without pipelining every range arrives with the last push.)
  RecordArrivals(step, arrived);
  if (timeline_) timeline_->Committed(step, absl::Now());
  // This push completed the step's gradients: see its first stage through
  // (a checkpoint of the current version may hold it back; a shard shutting
  // down still finishes it).
  state_.CompleteStepIfDone();
  const bool decides = options_.needs_decision();
  const auto stage_done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return state_.version() >= step ||
           (decides && state_.phase() != StepState::Phase::kCollecting &&
            state_.phase() != StepState::Phase::kReducing);
  };
  // (Unbounded and not stopped by shutdown: its outcome is read from the state.)
  AwaitState(stage_done, absl::InfiniteFuture(), nullptr, /*stop_at_shutdown=*/false)
      .IgnoreError();
  if (state_.failed()) return state_.failure();
  if (state_.version() >= step) {
    return PushResult{PushOutcome::kApplied, step, state_.version(), state_.Pending()};
  }
  return PushResult{PushOutcome::kAwaitingDecision, step, state_.version(), 0};
}

void ModelShard::RecordArrivals(int64_t step, size_t arrived_before) {
  if (!timeline_) return;
  const absl::Time now = absl::Now();
  for (size_t i = arrived_before; i < state_.RangesArrived(); ++i) {
    timeline_->Arrived(step, i, now);
  }
}

void ModelShard::RunReadyRanges() {
  absl::MutexLock lock(&mu_);
  while (state_.CanClaim(shutdown_)) RunOneRange();
}

void ModelShard::RunOneRange() {
  std::optional<StepState::RangeWork> work = state_.ClaimRange(shutdown_);
  if (!work) return;
  using Kind = StepState::RangeWork::Kind;
  std::vector<double> block_sums;
  std::vector<TrustPartial> trust_partials;
  mu_.Unlock();
  // The claim is exclusive: no other range work runs, and no writer stages
  // into the claimed elements (every trainer delivered them).
  const absl::Status done = RunRangeWork(*work, &block_sums, &trust_partials);
  mu_.Lock();
  if (!done.ok()) {
    state_.Fail(work->step, done).IgnoreError();  // (Waiters read it from the state.)
    return;
  }
  if (timeline_ && work->kind != Kind::kReduce && work->kind != Kind::kMeasure) {
    timeline_->Updated(work->step, work->index, absl::Now());
  }
  state_.FinishRange(*work, std::move(block_sums), std::move(trust_partials));
  state_.CompleteStepIfDone();
}

absl::Status ModelShard::RunRangeWork(const StepState::RangeWork& work,
                                      std::vector<double>* block_sums,
                                      std::vector<TrustPartial>* trust_partials) {
  const bool whole = !backend_->supports_ranges() || options_.needs_trust_norms();
  assert(!whole || (work.begin == 0 && work.end == range_.size()));
  using Kind = StepState::RangeWork::Kind;
  if (work.kind == Kind::kMeasure) {
    // (Reads parameters and state only: pulls may go on.)
    absl::ReaderMutexLock lock(&params_mu_);
    absl::StatusOr<std::vector<TrustPartial>> measured =
        backend_->MeasureTrust(work.optimizer_step, work.config, work.multiplier);
    if (!measured.ok()) return measured.status();
    *trust_partials = *std::move(measured);
    return absl::OkStatus();
  }
  if (work.kind == Kind::kReduce) {
    if (absl::Status s = whole
                             ? backend_->Reduce(options_.mean_reduction)
                             : backend_->ReduceRange(options_.mean_reduction, work.begin, work.end);
        !s.ok()) {
      return s;
    }
    const float scale = static_cast<float>(1.0 / work.loss_scale);
    if (whole) {
      absl::StatusOr<double> sum = backend_->SumOfSquares(scale);
      if (!sum.ok()) return sum.status();
      block_sums->assign(1, *sum);
      return absl::OkStatus();
    }
    const uint64_t blocks = (work.end - work.begin + UpdateBackend::kNormBlockElements - 1) /
                            UpdateBackend::kNormBlockElements;
    block_sums->assign(blocks, 0.0);
    return backend_->SumOfSquaresBlocks(scale, work.begin, work.end, block_sums->data());
  }
  absl::ReaderMutexLock lock(&params_mu_);
  // (Whole steps update every range at once.)
  const RangeLocks ranges(*this, whole ? 0 : work.index, whole ? range_count_ : work.index + 1,
                          /*exclusive=*/true);
  absl::Status s;
  if (work.kind == Kind::kApply) {
    s = whole ? backend_->Apply(work.optimizer_step, options_.mean_reduction, work.config)
              : backend_->ApplyRange(work.optimizer_step, options_.mean_reduction, work.config,
                                     work.begin, work.end);
  } else if (!work.skip && !work.tensor_norms.empty()) {
    s = backend_->UpdateWithTrust(work.optimizer_step, work.config, work.multiplier,
                                  work.tensor_norms);
  } else if (!work.skip) {
    s = whole ? backend_->Update(work.optimizer_step, work.config, work.multiplier)
              : backend_->UpdateRange(work.optimizer_step, work.config, work.multiplier, work.begin,
                                      work.end);
  }
  if (s.ok()) range_versions_[work.index] = work.step;
  return s;
}

absl::Status ModelShard::SetHyperparameters(int64_t effective_step, const Hyperparameters& next) {
  // Validated where it came in (the service, from the wire); whether it fits
  // the live state is this shard's to say.
  assert(next.optimizer.Validate().ok() && next.lr_schedule.Validate().ok());
  if (asynchronous()) return NotInAsyncMode("hyperparameter changes are");
  if (absl::Status s = options_.optimizer.CheckCanChangeTo(next.optimizer); !s.ok()) return s;
  absl::MutexLock lock(&mu_);
  return state_.ScheduleChange(effective_step, next);
}

absl::Status ModelShard::CancelHyperparameters(int64_t effective_step) {
  if (asynchronous()) return NotInAsyncMode("hyperparameter changes are");
  absl::MutexLock lock(&mu_);
  return state_.CancelChange(effective_step);
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

absl::Status ModelShard::WaitExpired(const std::string& what, int64_t min_version) const {
  return absl::DeadlineExceededError(absl::StrCat(what, " of model '", options_.model_id,
                                                  "' did not come before the deadline: ",
                                                  state_.DescribeWait(min_version)));
}

}  // namespace shardopt
