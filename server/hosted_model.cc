#include "server/hosted_model.h"

#include <algorithm>

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_catalog.h"
#include "common/logging.h"
#include "server/checkpointing.h"

namespace shardopt {
namespace {

uint64_t NewIncarnation() {
  absl::BitGen random;
  uint64_t id = 0;
  while (id == 0) id = absl::Uniform<uint64_t>(random);  // 0 reads as "unset".
  return id;
}

}  // namespace

HostedModel::HostedModel(v1::ModelConfig config, std::unique_ptr<ModelShard> shard,
                         StateBudget::Reservation reservation,
                         PeriodicCheckpointOptions checkpoints)
    : config_(std::move(config)),
      shard_(std::move(shard)),
      reservation_(std::move(reservation)),
      checkpoints_(std::move(checkpoints)),
      incarnation_(NewIncarnation()) {
  if (periodic_checkpoints()) RefreshCheckpointList();
  if (periodic_checkpoints() && checkpoints_.every > 0) {
    // The first multiple of `every` not yet applied (the current version
    // counts: a restored shard finds that checkpoint already there), held
    // from before anyone can find the model: a trainer that pushes at once
    // (catching up after a restore) cannot pass it before the saving thread
    // runs, which made the shard skip it.
    const int64_t every = checkpoints_.every;
    first_hold_ = shard_->HoldStep((shard_->checkpoint_step() + every - 1) / every * every);
  }
  if (absl::StatusOr<ShardSnapshot> made = shard_->Snapshot("", 0, 0, /*with_tensor_stats=*/false);
      made.ok()) {
    made_with_ = AppliedSteps{made->optimizer_steps, made->skipped_steps};
  }
}

HostedModel::AppliedSteps HostedModel::AppliedHere(const ShardSnapshot& now) const {
  return AppliedSteps{replaced_applied_.applied + now.optimizer_steps - made_with_.applied,
                      replaced_applied_.skipped + now.skipped_steps - made_with_.skipped};
}

void HostedModel::TakeOverAppliedSteps(HostedModel& replaced) {
  absl::StatusOr<ShardSnapshot> now =
      replaced.shard().Snapshot("", 0, 0, /*with_tensor_stats=*/false);
  replaced_applied_ = now.ok() ? replaced.AppliedHere(*now) : replaced.replaced_applied_;
}

HostedModel::~HostedModel() { Stop(); }

void HostedModel::Renew() { incarnation_.store(NewIncarnation()); }

void HostedModel::StartCheckpoints() {
  absl::MutexLock lock(&mu_);
  // (No first hold: no periodic checkpoints, or started or stopped already.)
  if (!first_hold_.held()) return;
  saver_ =
      std::thread([this, hold = std::move(first_hold_)]() mutable { SaveLoop(std::move(hold)); });
}

void HostedModel::Stop() {
  ModelShard::StepHold never_started;
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
    never_started = std::move(first_hold_);
  }
  // (Released outside mu_: it takes the shard's lock, and a writer holding
  // the shard's locks takes mu_.)
  never_started.Release();
  shard_->Shutdown();
  if (saver_.joinable()) saver_.join();
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](bool* writing) { return !*writing; }, &writing_));
}

bool HostedModel::stopping() const {
  absl::MutexLock lock(&mu_);
  return stop_;
}

std::vector<int64_t> HostedModel::committed_checkpoints() const {
  absl::MutexLock lock(&mu_);
  return committed_;
}

void HostedModel::RefreshCheckpointList() {
  absl::MutexLock refreshing(&refresh_mu_);
  ListCheckpoints();
}

void HostedModel::RefreshCheckpointListUnlessBusy() {
  if (!refresh_mu_.TryLock()) return;
  ListCheckpoints();
  refresh_mu_.Unlock();
}

void HostedModel::ListCheckpoints() {
  absl::StatusOr<std::vector<CommittedCheckpoint>> listed =
      ListCommittedCheckpoints(checkpoints_.model_root, checkpoints_.env);
  if (!listed.ok()) {
    LogWarning("model '%s': cannot list its checkpoints: %s", config_.model_id(),
               listed.status().ToString());
    return;
  }
  std::vector<int64_t> steps;
  for (const CommittedCheckpoint& c : *listed) steps.push_back(c.step);
  recovery_floor_.store(RecoveryFloor(*listed));
  absl::MutexLock lock(&mu_);
  committed_ = std::move(steps);
}

absl::Status HostedModel::AbandonCheckpointsAfter(int64_t step) {
  {
    absl::MutexLock lock(&mu_);
    // (A part set aside is written again when the job gets there again.)
    if (written_step_ > step) written_step_ = -1;
  }
  absl::Status set_aside =
      SetAsideCheckpointsAfter(checkpoints_.model_root, step, "abandoned", checkpoints_.env);
  RefreshCheckpointList();  // Also after a partial set-aside.
  return set_aside;
}

absl::StatusOr<CheckpointPartWritten> HostedModel::SaveStep(int64_t step, absl::Time deadline,
                                                            const std::function<bool()>& cancelled,
                                                            absl::Duration* write_time) {
  if (!periodic_checkpoints()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", checkpoints_.shard_index, " keeps no periodic checkpoints of model '",
        config_.model_id(), "' (--checkpoint_dir, --checkpoint_every)"));
  }
  absl::StatusOr<CheckpointPartWritten> written =
      WriteStep(step, deadline, cancelled, ModelShard::StepHold(), write_time);
  if (written.ok()) AfterWrite(step);
  return written;
}

absl::StatusOr<CheckpointPartWritten> HostedModel::WriteStep(int64_t step, absl::Time deadline,
                                                             const std::function<bool()>& cancelled,
                                                             ModelShard::StepHold hold,
                                                             absl::Duration* write_time) {
  const std::string dir = JoinPath(checkpoints_.model_root, CheckpointStepDirName(step));
  const std::string record =
      JoinPath(dir, CheckpointPartRecordName(shard_->options().shard_index, config_.shard_count()));
  if (write_time != nullptr) *write_time = absl::ZeroDuration();
  absl::StatusOr<CheckpointPartWritten> result = absl::InternalError("checkpoint not written");
  absl::Status status = shard_->CheckpointAt(
      step, deadline, cancelled,
      [&](const ShardProgress& progress, const ShardStateReadFn& read) -> absl::Status {
        if (absl::Status s = AcquireWriting(deadline, cancelled); !s.ok()) return s;
        absl::Cleanup release = [this] { ReleaseWriting(); };
        bool written_here = false;
        {
          absl::MutexLock lock(&mu_);
          written_here = written_step_ == step;
        }
        if (written_here && FileExists(checkpoints_.env, record)) {
          // The same state at the same step (held): only the commit is left.
          // (Named by the model's version: an asynchronous one's differs.)
          result = CommitCheckpointPart(dir, config_, shard_->options().shard_index,
                                        progress.version, progress.run_id, checkpoints_.env);
          return result.status();
        }
        const absl::Time start = absl::Now();
        result = WriteShardPart(*shard_, config_, dir, progress, read, checkpoints_.env);
        if (write_time != nullptr) *write_time = absl::Now() - start;
        if (result.ok()) {
          absl::MutexLock lock(&mu_);
          written_step_ = step;
        }
        return result.status();
      },
      std::move(hold));
  if (!status.ok()) return status;
  return result;
}

absl::Status HostedModel::AcquireWriting(absl::Time deadline,
                                         const std::function<bool()>& cancelled) {
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      // (Woken at least every 50 ms to ask `cancelled`, which may lock mu_.)
      mu_.AwaitWithDeadline(absl::Condition(
                                +[](HostedModel* m) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                                  return !m->writing_ || m->stop_;
                                },
                                this),
                            std::min(deadline, absl::Now() + absl::Milliseconds(50)));
      if (stop_) return absl::UnavailableError("the shard server is shutting down");
      if (!writing_) {
        writing_ = true;
        return absl::OkStatus();
      }
    }
    if (absl::Now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("another checkpoint of model '", config_.model_id(),
                       "' was still being written on this shard at the deadline"));
    }
    if (cancelled()) return absl::CancelledError("the checkpoint was cancelled");
  }
}

void HostedModel::ReleaseWriting() {
  absl::MutexLock lock(&mu_);
  writing_ = false;
}

void HostedModel::AfterWrite(int64_t step) {
  if (checkpoints_.keep > 0) {
    absl::StatusOr<int> pruned = PruneCheckpoints(checkpoints_.model_root, checkpoints_.shard_index,
                                                  checkpoints_.shard_count, checkpoints_.keep,
                                                  /*newest_step=*/step, checkpoints_.env);
    if (!pruned.ok()) {
      LogError("model '%s': removing old checkpoints: %s", config_.model_id(),
               pruned.status().ToString());
    }
  }
  RefreshCheckpointList();
}

void HostedModel::SaveLoop(ModelShard::StepHold hold) {
  ModelShard& shard = *shard_;
  const int64_t every = checkpoints_.every;
  const std::string& model_id = config_.model_id();
  auto stop = [this] { return stopping(); };
  // Each checkpoint takes the next one's hold before releasing its own, so
  // that no step boundary slips past between two of them.
  int64_t next = hold.step();
  while (!stopping()) {
    ModelShard::StepHold next_hold = shard.HoldStep(next + every);
    absl::Duration write_time;
    absl::StatusOr<CheckpointPartWritten> written =
        WriteStep(next, absl::InfiniteFuture(), stop, std::move(hold), &write_time);
    hold = std::move(next_hold);
    const bool stopped = !written.ok() && (stopping() || absl::IsUnavailable(written.status()) ||
                                           absl::IsCancelled(written.status()));
    if (checkpoints_.metrics != nullptr && !stopped && (!written.ok() || written->bytes > 0)) {
      checkpoints_.metrics->RecordCheckpoint(model_id, written.ok(),
                                             absl::ToDoubleSeconds(write_time));
    }
    if (written.ok()) {
      if (written->bytes > 0) {
        LogInfo("model '%s': saved step %d to %s (%d bytes)%s", model_id, next, written->data_file,
                written->bytes, written->committed ? "; checkpoint committed" : "");
      }
      AfterWrite(next);
    } else if (stopped) {
      return;
    } else {
      // A full or failing disk must not end checkpointing for good: log,
      // wait a little (bounded by shutdown), and go on with the next one.
      LogError("model '%s': checkpoint of step %d failed: %s", model_id, next,
               written.status().ToString());
      for (int i = 0; i < 10 && !stopping(); ++i) absl::SleepFor(absl::Milliseconds(100));
    }
    next += every;
  }
}

}  // namespace shardopt
