// The periodic checkpoints of one model: a directory of "step-N"
// subdirectories (as --checkpoint_dir lays them out), each a checkpoint of
// common/checkpoint_files.h.
//
// Restoring picks the newest committed checkpoint whose every part verifies
// (every block's checksum, not only the restoring shard's), so that every
// shard restarting from the same directory chooses the same one. A
// checkpoint found damaged is set aside - renamed to
// ".damaged.step-N.<id>", out of the step-N namespace - so that no shard
// loads it (one reading it while it is renamed fails too, and falls back
// alike), later periodic checkpoints of that step start afresh, and an
// operator can still look at it. Checkpoints given up by a rollback are set
// aside the same way (".abandoned.step-N.<id>").
#ifndef SHARDOPT_COMMON_CHECKPOINT_CATALOG_H_
#define SHARDOPT_COMMON_CHECKPOINT_CATALOG_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/checkpoint_files.h"
#include "common/file.h"

namespace shardopt {

// A step directory holding a manifest.
using CommittedCheckpoint = StepDirectory;

// INVALID_ARGUMENT for a model id whose directory under a checkpoint root
// would read as a checkpoint's own entry (a "step-" directory, a "shard-"
// part, the manifest): --restore_from of the root would take the root for
// one model's or one checkpoint's directory.
absl::Status CheckModelIdFitsCheckpointRoot(absl::string_view model_id);

// The step directories of `model_root` that hold a manifest, newest first
// (an absent root has none).
absl::StatusOr<std::vector<CommittedCheckpoint>> ListCommittedCheckpoints(
    const std::string& model_root, FileEnv* env = FileEnv::Default());

// Renames checkpoint directory `directory` to ".<why>.step-N.<random>" in
// its parent. OK when it is already gone (another shard set it aside).
absl::Status SetAsideCheckpoint(const std::string& directory, absl::string_view why,
                                FileEnv* env = FileEnv::Default());

// Sets aside every step directory of `model_root` (committed or not) for a
// step after `step`: what a rollback to `step` gives up, parts of unfinished
// checkpoints included (they would otherwise be combined with the parts the
// same steps get again).
absl::Status SetAsideCheckpointsAfter(const std::string& model_root, int64_t step,
                                      absl::string_view why, FileEnv* env = FileEnv::Default());

// The operator's going back to step `step` (a restart on a checkpoint named
// in --restore_from) with periodic checkpoints in `model_root`: the later
// step directories are given up (set aside) and a marker
// (".went-back-to-step-N") records it. CheckGoingBack returns the newest
// later step directory there is (-1: none), or FAILED_PRECONDITION when the
// marker says the job went back to `step` already and it has committed a
// later checkpoint since: a restart command left naming that checkpoint
// would give up this timeline's own steps (the restart of a crashed server
// names the root). Later directories without a manifest (saves the job
// stopped in) do not count. RecordGoingBack writes the marker.
absl::StatusOr<int64_t> CheckGoingBack(const std::string& model_root, int64_t step,
                                       FileEnv* env = FileEnv::Default());
absl::Status RecordGoingBack(const std::string& model_root, int64_t step,
                             FileEnv* env = FileEnv::Default());

// Opens and fully verifies (CheckpointReader::VerifyEveryBlock) the checkpoint
// in `directory`.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenVerifiedCheckpoint(
    const std::string& directory, FileEnv* env = FileEnv::Default());

// The newest committed checkpoint of `model_root` that verifies whole. Each
// newer one that does not is passed to `on_damaged` (directory, why) and set
// aside. NOT_FOUND when none is committed; DATA_LOSS naming every damaged
// checkpoint and its problem when none verifies.
absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenNewestVerifiedCheckpoint(
    const std::string& model_root,
    const std::function<void(const std::string& directory, const absl::Status& why)>& on_damaged,
    FileEnv* env = FileEnv::Default());

// The oldest version a shard of this model could come back at after a
// restart now: the step of the older of the two newest committed
// checkpoints (the one restore falls back to when the newest is damaged),
// the newest when there is one, 0 when there is none yet.
int64_t RecoveryFloor(const std::vector<CommittedCheckpoint>& committed);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_CHECKPOINT_CATALOG_H_
