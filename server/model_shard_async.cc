// ModelShard in the asynchronous and bounded-staleness modes: admission,
// application one push at a time, pinned pulls, consistent cuts (see the
// header comment; the transitions are AsyncState's).
#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/model_shard.h"

namespace shardopt {

ReadPin& ReadPin::operator=(ReadPin&& other) noexcept {
  if (this != &other) {
    Release();
    shard_ = other.shard_;
    other.shard_ = nullptr;
  }
  return *this;
}

void ReadPin::Release() {
  if (shard_ == nullptr) return;
  absl::MutexLock lock(&shard_->mu_);
  --shard_->read_pins_;
  shard_ = nullptr;
}

absl::Status ModelShard::NotInAsyncMode(const char* what) const {
  return absl::FailedPreconditionError(absl::StrCat("model '", options_.model_id, "' is ",
                                                    ConsistencyName(options_.consistency), ": ",
                                                    what, " only in synchronous mode"));
}

absl::StatusOr<ModelShard::PushStart> ModelShard::BeginAsyncPush(
    uint32_t trainer_rank, int64_t step, DType dtype, double loss_scale,
    const std::vector<StepState::CarriedChange>& changes, bool skip) {
  if (!changes.empty()) return NotInAsyncMode("hyperparameter changes are");
  if (skip && !options_.loss_scaling) {
    return absl::InvalidArgumentError(
        absl::StrCat("a skipped step: model '", options_.model_id,
                     "' was registered without loss scaling (a trainer skips a step only when its "
                     "loss-scaled gradient overflowed)"));
  }
  // (A loss scale was checked against the model by BeginPush: each trainer
  // decides its own steps, skips an overflow itself, and pushes its
  // gradient still scaled, as a synchronous one does, for this shard to
  // unscale: a 16-bit wire type keeps small gradients that way.)
  absl::MutexLock lock(&mu_);
  if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
  absl::StatusOr<AsyncAdmission> admitted = async_->BeginPush(trainer_rank, step);
  if (!admitted.ok()) return admitted.status();
  PushStart start;
  if (*admitted == AsyncAdmission::kAlreadyApplied) {
    start.immediate =
        PushResult{PushOutcome::kAlreadyApplied, step, async_->version(), 0, 0, async_->applied()};
    return start;
  }
  // Whole pushes: nothing of one is used before all of it is in.
  start.writer.reset(new PushWriter(this, trainer_rank, step, dtype, loss_scale, /*consumed=*/0,
                                    /*defer=*/true, skip));
  return start;
}

bool ModelShard::AsyncWorkReady() const { return read_pins_ == 0 && async_->CanClaim(); }

void ModelShard::RunOneAsyncApply() {
  if (read_pins_ > 0) return;
  std::optional<AsyncState::Claim> claim = async_->ClaimApply();
  if (!claim) return;
  // The schedule counts the pushing trainer's steps: every shard gives
  // trainer r's step k the same lr, whatever order it applies pushes in.
  OptimizerConfig config = options_.optimizer;
  config.lr = options_.lr_schedule.LearningRate(options_.optimizer.lr, claim->step);
  const bool skip = async_skip_[claim->rank];
  // (Exact: loss scales are powers of two.)
  const float unscale = static_cast<float>(1.0 / async_loss_scale_[claim->rank]);
  // Adam's bias correction counts this shard's updates (skips excluded).
  const int64_t optimizer_step = claim->version - async_skipped_;
  mu_.Unlock();
  absl::Status applied;
  {
    absl::ReaderMutexLock lock(&params_mu_);
    const RangeLocks ranges(*this, 0, range_count_, /*exclusive=*/true);
    // (A skipped step changes nothing but the version the parameters are at.)
    if (!skip) {
      applied =
          backend_->ApplyOneRange(claim->rank, optimizer_step, config, unscale, 0, range_.size());
    }
    if (applied.ok()) {
      std::fill(range_versions_.begin(), range_versions_.end(), claim->version);
    }
  }
  mu_.Lock();
  if (!applied.ok()) {
    async_->FailApply(*claim, applied);
    return;
  }
  async_->FinishApply(*claim);
  if (skip) ++async_skipped_;
  // The lr of the newest trainer step applied here (a skipped one's
  // included, as a synchronous step's version_lr): every shard has the same
  // at a uniform cut, whatever order it applied the pushes in, so that
  // their checkpoint parts agree.
  const std::vector<int64_t>& applied_steps = async_->applied();
  if (claim->step >= *std::max_element(applied_steps.begin(), applied_steps.end())) {
    last_async_lr_ = config.lr;
  }
  async_push_times_[claim->rank] = absl::Now();
}

absl::Status ModelShard::AwaitAsync(const std::function<bool()>& ready, absl::Time deadline,
                                    const std::function<bool()>& cancelled) {
  const auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return shutdown_ || async_->failed() || ready();
  };
  const auto done_or_work = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return done() || AsyncWorkReady();
  };
  for (;;) {
    if (absl::Status s = AwaitOrCancel(absl::Condition(&done_or_work), deadline, cancelled);
        !s.ok()) {
      return s;
    }
    if (ready()) return absl::OkStatus();
    if (async_->failed()) return async_->failure();
    if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
    RunOneAsyncApply();
  }
}

absl::StatusOr<PushResult> ModelShard::CommitAsyncPush(uint32_t rank, int64_t step, bool skip,
                                                       double loss_scale, absl::Time deadline,
                                                       const std::function<bool()>& cancelled) {
  absl::MutexLock lock(&mu_);
  if (absl::Status s = async_->CommitPush(rank, step); !s.ok()) return s;
  async_skip_[rank] = skip;
  async_loss_scale_[rank] = loss_scale;
  absl::Status waited =
      AwaitAsync([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return async_->IsApplied(rank, step); },
                 deadline, cancelled);
  if (!waited.ok() && !async_->failed()) {
    const std::string why = async_->DescribeWait(rank, step);
    if (async_->WithdrawQueued(rank, step)) {
      if (absl::IsDeadlineExceeded(waited)) {
        // (Nothing it waited for by rule: what held it up in passing.)
        const std::string busy =
            read_pins_ > 0 ? absl::StrCat(read_pins_, " pull(s) were reading the parameters")
                           : "other pushes were being applied";
        return absl::DeadlineExceededError(
            absl::StrCat("shard ", options_.shard_index, " of model '", options_.model_id,
                         "' did not apply the push before its deadline: ",
                         why.empty() ? absl::StrCat("trainer ", rank, "'s step ", step, ": ", busy)
                                     : why));
      }
      return waited;
    }
    // Being applied already: it finishes whatever the call does.
    waited = AwaitAsync(
        [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
          return async_->IsApplied(rank, step) || async_->failed();
        },
        absl::InfiniteFuture(), nullptr);
  }
  if (async_->failed()) return async_->failure();
  if (!async_->IsApplied(rank, step)) return waited;
  return PushResult{PushOutcome::kApplied, step, async_->version(), 0, async_->last_staleness(rank),
                    async_->applied()};
}

absl::Status ModelShard::AsyncCheckHolds(const std::optional<PushedBy>& pushed) const {
  if (!pushed || pushed->step <= 0 || async_->pushed(pushed->rank) >= pushed->step) {
    return absl::OkStatus();
  }
  return absl::OutOfRangeError(
      absl::StrCat("shard ", options_.shard_index, " does not hold trainer ", pushed->rank,
                   "'s push of step ", pushed->step, " (it applied that trainer's steps up to ",
                   async_->applied()[pushed->rank], "): it restarted; push again"));
}

absl::StatusOr<int64_t> ModelShard::AsyncPullTarget(int64_t min_version, absl::Time deadline,
                                                    const std::function<bool()>& cancelled,
                                                    const std::optional<PushedBy>& pushed,
                                                    ReadPin* pin) {
  if (pushed) {
    if (absl::Status s = CheckRank(pushed->rank); !s.ok()) return s;
  }
  if (pin != nullptr) pin->Release();  // (Before mu_: releasing takes it.)
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AsyncCheckHolds(pushed); !s.ok()) return s;
  // Pushes committed before this pull that may be applied go first (and one
  // being applied ends): pulls cannot starve pushes, later commits cannot
  // starve this pull, and it gets the parameters of every push that was in.
  const uint64_t arrived = async_->commits();
  const absl::Status waited = AwaitAsync(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        return async_->version() >= min_version && !async_->applying() &&
               !async_->CanClaimCommittedBefore(arrived);
      },
      deadline, cancelled);
  if (absl::IsDeadlineExceeded(waited)) {
    return absl::DeadlineExceededError(absl::StrCat(
        "version ", min_version, " of shard ", options_.shard_index, " of model '",
        options_.model_id, "' did not come before the deadline: it has applied ", async_->version(),
        " pushes (trainers' steps [", absl::StrJoin(async_->applied(), ", "), "])"));
  }
  if (!waited.ok()) return waited;
  if (pin != nullptr) {
    ++read_pins_;
    pin->shard_ = this;
  }
  return async_->version();
}

absl::StatusOr<ShardProgress> ModelShard::AwaitAsyncCut(int64_t step, absl::Time deadline,
                                                        const std::function<bool()>& cancelled) {
  if (!async_->UniformCutReachable(step)) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " of model '", options_.model_id,
                     "' applied trainers' steps [", absl::StrJoin(async_->applied(), ", "),
                     "], past step ", step, ": checkpoint a later step"));
  }
  const absl::Status waited =
      AwaitAsync([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return async_->UniformCutReached(step); },
                 deadline, cancelled);
  if (absl::IsDeadlineExceeded(waited)) {
    std::vector<std::string> behind;
    for (uint32_t t = 0; t < options_.num_trainers; ++t) {
      if (async_->applied()[t] < step) {
        behind.push_back(absl::StrCat("trainer ", t, " (applied step ", async_->applied()[t], ")"));
      }
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "the checkpoint of step ", step, " on shard ", options_.shard_index, " of model '",
        options_.model_id, "' did not come before the deadline: waiting for ",
        absl::StrJoin(behind, ", "), " to push up to step ", step));
  }
  if (!waited.ok()) return waited;
  ShardProgress progress = state_.Progress();
  progress.version = async_->version();
  progress.optimizer_steps = progress.version - async_skipped_;
  progress.skipped_steps = async_skipped_;
  progress.trainer_steps = async_->applied();
  progress.last_lr = last_async_lr_;
  progress.version_lr = last_async_lr_;
  return progress;
}

void ModelShard::RestoreAsyncProgress(const ShardProgress& progress) {
  async_->Restore(AsyncProgress{progress.trainer_steps, progress.version});
  last_async_lr_ = progress.last_lr;
  async_skipped_ = progress.skipped_steps;
}

}  // namespace shardopt
