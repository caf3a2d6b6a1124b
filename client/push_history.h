// PushHistory: what this trainer pushed, kept so that shards that came back
// from older checkpoints can be given those steps again (see Recovery).
//
// Each entry is one step's gradient exactly as pushed (wire dtype, loss
// scale) and, with gradient control, the decision every shard applied to
// it. Hyperparameter changes the trainer sent are kept too, even without
// replay history: every push carries those still to come, since a shard
// restored from before a change has lost it.
//
// In memory it keeps the last `replay_steps` entries. With a journal
// directory every entry is written there (atomically, fsync'ed) before the
// push it records goes out, so the history survives the trainer's own
// restart; entries are then kept back to the recovery floor the shards
// report (the oldest version any of them could come back at), never fewer
// than the newest one. Thread-safe: recovery reads entries from several
// shard workers at once.
#ifndef SHARDOPT_CLIENT_PUSH_HISTORY_H_
#define SHARDOPT_CLIENT_PUSH_HISTORY_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/dtype.h"
#include "common/file.h"
#include "common/step_protocol.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

struct PushedStep {
  int64_t step = 0;
  DType dtype = DType::kFloat32;
  double loss_scale = 1.0;
  // The whole flat gradient as pushed (shared: replays copy the entry only).
  std::shared_ptr<const std::vector<char>> payload;
  std::optional<StepDecision> decision;
};

struct PushHistoryOptions {
  std::string model_id;
  uint32_t trainer_rank = 0;
  int replay_steps = 0;     // Entries kept in memory (without a journal).
  std::string journal_dir;  // Empty: no journal.
  FileEnv* env = FileEnv::Default();
};

class PushHistory {
 public:
  // With a journal, reads what an earlier process of this trainer left
  // there. FAILED_PRECONDITION when the directory holds another model's or
  // rank's journal, or `journal_dir` is a file; DATA_LOSS for a damaged one.
  static absl::StatusOr<std::unique_ptr<PushHistory>> Open(const PushHistoryOptions& options);

  // The training run this history belongs to (RegisterModelResponse.run_id).
  // A history of another run (the job started over with the same journal)
  // is emptied first: none of its pushes belong to this run.
  absl::Status BindToRun(const std::string& run_id);

  // Whether anything is kept at all.
  bool enabled() const { return options_.replay_steps > 0 || persistent(); }
  bool persistent() const { return !options_.journal_dir.empty(); }

  // Records the push of `step` (the whole flat gradient, `bytes` at
  // `payload`); a later step replaces nothing, a repeat of a step replaces it.
  absl::Status Record(int64_t step, DType dtype, double loss_scale, const void* payload,
                      size_t bytes);
  absl::Status RecordDecision(int64_t step, const StepDecision& decision);
  // NOT_FOUND (saying which steps are kept) when the step is not kept.
  absl::StatusOr<PushedStep> Find(int64_t step) const;
  // The newest step recorded (0: none).
  int64_t newest_step() const;

  // No shard can come back below `floor` any more: entries for steps <=
  // floor go (the newest entry stays).
  void DropThrough(int64_t floor);
  // The job rolled back to `version`: the pushes (and decisions) of later
  // steps belong to the steps given up, and go.
  void DropAfter(int64_t version);

  absl::Status RecordChange(const v1::SetHyperparametersRequest& request);
  // The changes (not cancels) still in force as this trainer last sent them,
  // for steps after `version`: what its pushes carry.
  std::vector<v1::SetHyperparametersRequest> ChangesAfter(int64_t version) const;
  // The last word for each step after `version`, cancels too: what a shard
  // that came back from a checkpoint is sent again (it may still hold a
  // change cancelled or replaced after that checkpoint).
  std::vector<v1::SetHyperparametersRequest> LastWordsAfter(int64_t version) const;
  // Whether `request` is this trainer's last word for its step already (a
  // trainer restarted on its journal sending again what it sent before).
  bool IsLastWord(const v1::SetHyperparametersRequest& request) const;

  // "steps 12..40 (journal /tmp/j)" / "no steps (replay_steps = 0, no
  // journal)", for messages.
  std::string Describe() const;

 private:
  explicit PushHistory(PushHistoryOptions options) : options_(std::move(options)) {}
  absl::Status Load();
  std::string PushPath(int64_t step) const;
  std::string DecisionPath(int64_t step) const;
  std::string ChangePath(int64_t step) const;
  std::string DescribeLocked() const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  const PushHistoryOptions options_;
  mutable absl::Mutex mu_;
  // In memory: the entries themselves. With a journal: only which steps are
  // there and their decisions (payloads are read back when needed).
  std::deque<PushedStep> memory_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> journaled_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, StepDecision> decisions_ ABSL_GUARDED_BY(mu_);
  std::map<int64_t, v1::SetHyperparametersRequest> changes_ ABSL_GUARDED_BY(mu_);
  std::string run_id_ ABSL_GUARDED_BY(mu_);  // "" until bound.
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_PUSH_HISTORY_H_
