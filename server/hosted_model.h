// HostedModel: one model as a shard server holds it - its registered config,
// its ModelShard, the state budget it reserved, its incarnation - and, with
// periodic checkpoints, the thread that saves it at every multiple of
// checkpoint_every and what it knows of the model's committed checkpoints
// (for trainers' recovery: ModelSummary, PushGradientsResponse).
//
// The incarnation is a random id fixed when the model is made (registered,
// restored, rolled back): a shard's state replaced by a restart or a
// rollback never has the incarnation it had before, so a rollback decided
// on an older survey can be refused. Thread-safe.
#ifndef SHARDOPT_SERVER_HOSTED_MODEL_H_
#define SHARDOPT_SERVER_HOSTED_MODEL_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/checkpoint_files.h"
#include "common/file.h"
#include "proto/shardopt/v1/shard_service.pb.h"
#include "server/metrics.h"
#include "server/model_shard.h"
#include "server/state_budget.h"

namespace shardopt {

struct PeriodicCheckpointOptions {
  std::string model_root;  // checkpoint_dir/<model_id>; empty: no periodic checkpoints.
  int64_t every = 0;
  int keep = 0;  // 0 keeps all.
  uint32_t shard_index = 0;
  uint32_t shard_count = 1;
  FileEnv* env = FileEnv::Default();
  // Where each write's outcome and duration is counted (not owned; may be null).
  ServerMetrics* metrics = nullptr;
};

class HostedModel {
 public:
  HostedModel(v1::ModelConfig config, std::unique_ptr<ModelShard> shard,
              StateBudget::Reservation reservation, PeriodicCheckpointOptions checkpoints);
  // Stops first (see Stop).
  ~HostedModel();
  HostedModel(const HostedModel&) = delete;
  HostedModel& operator=(const HostedModel&) = delete;

  const v1::ModelConfig& config() const { return config_; }
  ModelShard& shard() { return *shard_; }
  const ModelShard& shard() const { return *shard_; }
  uint64_t incarnation() const { return incarnation_.load(); }
  // A new incarnation: the state changed wholesale (pushes dropped by a
  // rollback to this version).
  void Renew();
  // The step this incarnation was rolled back to, -1 if none (see
  // ModelSummary.rolled_back_to).
  int64_t rolled_back_to() const { return rolled_back_to_.load(); }
  void set_rolled_back_to(int64_t step) { rolled_back_to_.store(step); }
  bool periodic_checkpoints() const { return !checkpoints_.model_root.empty(); }
  const PeriodicCheckpointOptions& checkpoint_options() const { return checkpoints_; }

  // Starts saving every checkpoint_every steps (no-op without periodic
  // checkpoints). Once. (The first checkpoint's step is held from the
  // model's making: a model with periodic checkpoints is started or stopped,
  // or its pushes wait at that step.)
  void StartCheckpoints();
  // Wakes every waiter on the shard with UNAVAILABLE and stops saving;
  // returns once the saving thread and any part being written (SaveStep)
  // have finished. Idempotent.
  void Stop() ABSL_LOCKS_EXCLUDED(mu_);

  // Saves this shard's part of the periodic checkpoint of `step` now, any
  // step (see CheckpointRequest.periodic), waiting for it as
  // ModelShard::CheckpointAt does (up to `deadline`, or until `cancelled()`),
  // then prunes and lists as the saving thread does. One writer at a time
  // with the saving thread, and a part this model wrote already (the saving
  // thread's step, or an earlier call's) is not written again: only the
  // commit is tried. `write_time` receives the files' time (zero when
  // nothing was written). FAILED_PRECONDITION without periodic checkpoints.
  absl::StatusOr<CheckpointPartWritten> SaveStep(int64_t step, absl::Time deadline,
                                                 const std::function<bool()>& cancelled,
                                                 absl::Duration* write_time)
      ABSL_LOCKS_EXCLUDED(mu_);

  // The committed periodic checkpoints as last listed, newest first (the
  // list is refreshed after each of this shard's writes and by Refresh).
  std::vector<int64_t> committed_checkpoints() const;
  // See PushGradientsResponse.recovery_floor: -1 without periodic checkpoints.
  int64_t recovery_floor() const { return recovery_floor_.load(); }
  // Lists the checkpoint directory again.
  void RefreshCheckpointList();
  // The same unless another refresh of this model is listing now (the list
  // it stores will do): a metrics scrape does not queue behind a listing
  // that a stalled shared filesystem holds. (The scrape that lists still
  // waits for it: one thread per model with periodic checkpoints.)
  void RefreshCheckpointListUnlessBusy();
  // A rollback to `step` gives up the later steps: sets their directories
  // aside as "abandoned" (SetAsideCheckpointsAfter), then lists again, so
  // that they count neither as checkpoints nor for the recovery floor.
  absl::Status AbandonCheckpointsAfter(int64_t step) ABSL_LOCKS_EXCLUDED(mu_);

  // Optimizer updates and skipped steps this server applied to the model,
  // for /metrics' counters: the model's own counts (`now`'s, Inspect's)
  // start at a restored checkpoint's and go back with a rollback, which a
  // Prometheus counter must not. Those of the models it replaced (rollbacks)
  // and this one's since it was made.
  struct AppliedSteps {
    int64_t applied = 0;
    int64_t skipped = 0;
  };
  AppliedSteps AppliedHere(const ShardSnapshot& now) const;
  // Takes over what `replaced` applied here (before it stops).
  void TakeOverAppliedSteps(HostedModel& replaced);

 private:
  // Saves checkpoints of the held step, and every `every` steps after it.
  void SaveLoop(ModelShard::StepHold hold);
  // This shard's part of the periodic checkpoint of `step` (see SaveStep),
  // under `hold` when it holds `step`.
  absl::StatusOr<CheckpointPartWritten> WriteStep(int64_t step, absl::Time deadline,
                                                  const std::function<bool()>& cancelled,
                                                  ModelShard::StepHold hold,
                                                  absl::Duration* write_time)
      ABSL_LOCKS_EXCLUDED(mu_);
  // After a part of `step` was written: prunes (--checkpoint_keep) and lists.
  void AfterWrite(int64_t step);
  // Waits (up to `deadline`, or until `cancelled()`) until no other part is
  // being written, then marks one as being written; UNAVAILABLE once
  // stopping. ReleaseWriting ends it.
  absl::Status AcquireWriting(absl::Time deadline, const std::function<bool()>& cancelled)
      ABSL_LOCKS_EXCLUDED(mu_);
  void ReleaseWriting() ABSL_LOCKS_EXCLUDED(mu_);
  bool stopping() const;

  const v1::ModelConfig config_;
  std::unique_ptr<ModelShard> shard_;
  StateBudget::Reservation reservation_;
  const PeriodicCheckpointOptions checkpoints_;
  std::atomic<uint64_t> incarnation_;
  std::atomic<int64_t> rolled_back_to_{-1};
  // The model's own counts when it was made, and what the models it
  // replaced applied here (see AppliedHere).
  AppliedSteps made_with_;
  AppliedSteps replaced_applied_;

  mutable absl::Mutex mu_;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  // The first periodic checkpoint's hold, taken when the model is made and
  // handed to the saving thread (see the constructor).
  ModelShard::StepHold first_hold_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> committed_ ABSL_GUARDED_BY(mu_);
  // Held across one refresh's listing and its stores: a listing taken
  // before a rollback's set-aside is never stored after the set-aside's own.
  absl::Mutex refresh_mu_;
  std::atomic<int64_t> recovery_floor_{-1};
  // RefreshCheckpointList's listing and stores, under refresh_mu_.
  void ListCheckpoints() ABSL_EXCLUSIVE_LOCKS_REQUIRED(refresh_mu_);
  // One part written at a time (the saving thread and SaveStep may be asked
  // for the same step), and none once stopping: Stop waits for the one under
  // way, so that a replaced model writes nothing after its replacement set
  // the later steps aside.
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  // The step of the last part this model wrote (-1: none), cleared when a
  // rollback sets later steps aside.
  int64_t written_step_ ABSL_GUARDED_BY(mu_) = -1;
  std::thread saver_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_HOSTED_MODEL_H_
