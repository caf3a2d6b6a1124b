// Retention of a directory of periodic checkpoints ("step-N"
// subdirectories): listing them and pruning the old ones
// (common/checkpoint_files.h declares both).
#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/strip.h"
#include "common/checkpoint_files.h"
#include "common/file.h"

namespace shardopt {
namespace {

// The names in `dir`; none when it cannot be listed (a directory that does
// not exist holds no checkpoint).
std::vector<std::string> ListOrEmpty(FileEnv* env, const std::string& dir) {
  absl::StatusOr<std::vector<std::string>> names = env->ListDirectory(dir);
  return names.ok() ? std::move(*names) : std::vector<std::string>();
}

}  // namespace

absl::StatusOr<std::vector<StepDirectory>> ListStepDirectories(const std::string& root,
                                                               FileEnv* env) {
  std::vector<StepDirectory> steps;
  absl::StatusOr<std::vector<std::string>> names = env->ListDirectory(root);
  if (absl::IsNotFound(names.status())) return steps;
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    int64_t step = 0;
    if (!absl::StartsWith(name, "step-") || !absl::SimpleAtoi(name.substr(5), &step)) continue;
    steps.push_back(StepDirectory{step, JoinPath(root, name)});
  }
  std::sort(steps.begin(), steps.end(),
            [](const StepDirectory& a, const StepDirectory& b) { return a.step < b.step; });
  return steps;
}

absl::StatusOr<int> PruneCheckpoints(const std::string& directory, uint32_t shard_index,
                                     uint32_t shard_count, int keep, int64_t newest_step,
                                     FileEnv* env) {
  if (keep < 1) return absl::InvalidArgumentError("keep at least one checkpoint");
  absl::StatusOr<std::vector<StepDirectory>> steps = ListStepDirectories(directory, env);
  if (!steps.ok()) return steps.status();
  std::vector<int64_t> committed;  // Ascending, as `steps`.
  for (const StepDirectory& s : *steps) {
    if (s.step <= newest_step && FileExists(env, JoinPath(s.directory, kCheckpointManifestFile)))
      committed.push_back(s.step);
  }
  if (committed.empty()) return 0;
  // Everything older than the keep-th newest committed checkpoint goes (with
  // fewer, only what is older than the oldest: torn leftovers, and the parts
  // of checkpoints another shard has already pruned).
  const int64_t oldest_kept =
      committed[committed.size() - std::min<size_t>(committed.size(), keep)];
  // This shard's files, and with shard 0 those no shard of this count owns.
  const auto mine = [&](absl::string_view name) {
    absl::ConsumePrefix(&name, ".");  // (A temporary file of a killed write.)
    uint32_t index = 0;
    if (!absl::ConsumePrefix(&name, "shard-") || name.size() < 5 ||
        !absl::SimpleAtoi(name.substr(0, 5), &index) || !absl::StartsWith(name.substr(5), "-of-")) {
      return false;
    }
    return index == shard_index || (shard_index == 0 && index >= shard_count);
  };
  int pruned = 0;
  // Removals race with the other shards' (and their errors are theirs too):
  // what one cannot remove, a later prune or another shard does.
  for (const auto& [step, dir] : *steps) {
    if (step >= oldest_kept) continue;
    const std::vector<std::string> names = ListOrEmpty(env, dir);
    for (const std::string& name : names) {
      // The manifest first: the directory is no longer a checkpoint. (And
      // what a shard killed while committing it left.)
      if (name == kCheckpointManifestFile || IsAtomicTempFile(name, kCheckpointManifestFile)) {
        env->RemoveFile(JoinPath(dir, name)).IgnoreError();
      }
    }
    // A manifest that stays (it could not be removed) still makes the
    // directory a checkpoint: without this shard's part it would be a
    // damaged one. Its parts stay too, for a later prune.
    if (FileExists(env, JoinPath(dir, kCheckpointManifestFile))) continue;
    for (const std::string& name : names) {
      if (mine(name)) {
        env->RemoveFile(JoinPath(dir, name)).IgnoreError();
      }
    }
    env->RemoveDirectory(dir).IgnoreError();  // Succeeds once every shard has removed its files.
    ++pruned;
  }
  if (pruned > 0) {
    if (absl::Status s = env->SyncDirectory(directory); !s.ok()) return s;
  }
  return pruned;
}

}  // namespace shardopt
