#include "common/checkpoint_catalog.h"

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/names.h"

namespace shardopt {

absl::Status CheckModelIdFitsCheckpointRoot(absl::string_view model_id) {
  if (absl::StartsWith(model_id, "step-") || absl::StartsWith(model_id, "shard-") ||
      model_id == kCheckpointManifestFile) {
    return absl::InvalidArgumentError(absl::StrCat(
        "model_id ", Quoted(model_id),
        " would read as a checkpoint's own entry in a checkpoint root (a 'step-' directory, a "
        "'shard-' part or the manifest): choose another"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<CommittedCheckpoint>> ListCommittedCheckpoints(
    const std::string& model_root, FileEnv* env) {
  absl::StatusOr<std::vector<StepDirectory>> steps = ListStepDirectories(model_root, env);
  if (!steps.ok()) return steps.status();
  std::vector<CommittedCheckpoint> committed;
  for (auto it = steps->rbegin(); it != steps->rend(); ++it) {  // Newest first.
    if (FileExists(env, JoinPath(it->directory, kCheckpointManifestFile))) {
      committed.push_back(std::move(*it));
    }
  }
  return committed;
}

namespace {

// The rename of SetAsideCheckpoint, without the sync of the parent.
absl::Status RenameAside(const std::string& directory, absl::string_view why, FileEnv* env) {
  absl::BitGen random;
  const std::string aside =
      JoinPath(DirectoryOf(directory), absl::StrCat(".", why, ".", BaseName(directory), ".",
                                                    absl::Hex(absl::Uniform<uint64_t>(random))));
  absl::Status renamed = env->Rename(directory, aside);
  return absl::IsNotFound(renamed) ? absl::OkStatus() : renamed;
}

}  // namespace

absl::Status SetAsideCheckpoint(const std::string& directory, absl::string_view why,
                                FileEnv* env) {
  if (absl::Status s = RenameAside(directory, why, env); !s.ok()) return s;
  return env->SyncDirectory(DirectoryOf(directory));
}

absl::Status SetAsideCheckpointsAfter(const std::string& model_root, int64_t step,
                                      absl::string_view why, FileEnv* env) {
  absl::StatusOr<std::vector<StepDirectory>> steps = ListStepDirectories(model_root, env);
  if (!steps.ok()) return steps.status();
  bool renamed = false;
  for (const StepDirectory& s : *steps) {
    if (s.step <= step) continue;
    if (absl::Status r = RenameAside(s.directory, why, env); !r.ok()) return r;
    renamed = true;
  }
  return renamed ? env->SyncDirectory(model_root) : absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenVerifiedCheckpoint(
    const std::string& directory, FileEnv* env) {
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(directory, env);
  if (!reader.ok()) return reader.status();
  if (absl::Status s = (*reader)->VerifyEveryBlock(); !s.ok()) return s;
  return reader;
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> OpenNewestVerifiedCheckpoint(
    const std::string& model_root,
    const std::function<void(const std::string& directory, const absl::Status& why)>& on_damaged,
    FileEnv* env) {
  absl::StatusOr<std::vector<CommittedCheckpoint>> committed =
      ListCommittedCheckpoints(model_root, env);
  if (!committed.ok()) return committed.status();
  if (committed->empty()) {
    return absl::NotFoundError(absl::StrCat("no committed checkpoint in ", model_root));
  }
  std::vector<std::string> damaged;
  for (const CommittedCheckpoint& c : *committed) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> reader =
        OpenVerifiedCheckpoint(c.directory, env);
    if (reader.ok()) return reader;
    // Gone meanwhile (pruned, or set aside by another shard): the next one.
    if (absl::IsNotFound(reader.status())) continue;
    // Only damage sets a checkpoint aside; anything else (an unknown format
    // version, permissions, I/O) is not the checkpoint's fault: stop.
    if (!absl::IsDataLoss(reader.status())) return reader.status();
    if (on_damaged) on_damaged(c.directory, reader.status());
    damaged.push_back(absl::StrCat(c.directory, ": ", reader.status().message()));
    if (absl::Status s = SetAsideCheckpoint(c.directory, "damaged", env); !s.ok()) return s;
  }
  return absl::DataLossError(absl::StrCat("no committed checkpoint of ", model_root,
                                          " verifies: ", absl::StrJoin(damaged, "; ")));
}

namespace {

std::string GoingBackMarker(const std::string& model_root, int64_t step) {
  return JoinPath(model_root, absl::StrCat(".went-back-to-", CheckpointStepDirName(step)));
}

}  // namespace

absl::StatusOr<int64_t> CheckGoingBack(const std::string& model_root, int64_t step,
                                       FileEnv* env) {
  absl::StatusOr<std::vector<StepDirectory>> steps = ListStepDirectories(model_root, env);
  if (!steps.ok()) return steps.status();
  if (steps->empty() || steps->back().step <= step) return -1;
  const std::string marker = GoingBackMarker(model_root, step);
  if (FileExists(env, marker)) {
    // Only a committed later step is this timeline's own: an unfinished one
    // (the job stopped while saving it) is set aside like the old timeline's.
    absl::StatusOr<std::vector<CommittedCheckpoint>> committed =
        ListCommittedCheckpoints(model_root, env);
    if (!committed.ok()) return committed.status();
    if (!committed->empty() && committed->front().step > step) {
      return absl::FailedPreconditionError(
          absl::StrCat("the job went back to step ", step, " already (", marker,
                       ") and has saved step ", committed->front().step,
                       " since: restart with --restore_from=<the --checkpoint_dir> "
                       "to go on, or remove ",
                       marker, " to give those steps up and go back to step ", step, " again"));
    }
  }
  return steps->back().step;
}

absl::Status RecordGoingBack(const std::string& model_root, int64_t step, FileEnv* env) {
  if (absl::Status s = env->CreateDirs(model_root); !s.ok()) return s;
  return WriteFileAtomically(env, GoingBackMarker(model_root, step),
                             absl::StrCat("went back to step ", step, "\n"));
}

int64_t RecoveryFloor(const std::vector<CommittedCheckpoint>& committed) {
  if (committed.empty()) return 0;
  return committed.size() >= 2 ? committed[1].step : committed[0].step;
}

}  // namespace shardopt
