// ShardServiceImpl's restore of models from checkpoints: before serving
// (--restore_from, every form), a model made from a checkpoint (also a
// rollback's), and the operator's going back to a named checkpoint.
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/checkpoint_catalog.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"
#include "server/shard_service.h"

namespace shardopt {
namespace {

// Whether two paths name one directory: as spelled, or through links (a
// --restore_from that reaches --checkpoint_dir through a symlink is a
// restart from it, not a going back).
bool SameDirectory(const std::string& a, const std::string& b) {
  if (NormalPath(a) == NormalPath(b)) return true;
  std::error_code error;
  return std::filesystem::equivalent(a, b, error) && !error;
}

}  // namespace

void ShardServiceImpl::LogDamagedCheckpoint(const std::string& directory, const absl::Status& why) {
  LogWarning(
      "checkpoint %s is damaged and set aside (.damaged.*): %s; falling back to an older one",
      directory, why.ToString());
}

absl::StatusOr<std::shared_ptr<HostedModel>> ShardServiceImpl::LoadModel(
    const CheckpointReader& checkpoint, std::optional<Partition> partition) {
  v1::ModelConfig config = checkpoint.manifest().config();
  if (partition.has_value()) {
    config.mutable_layout()->set_partition(
        *partition == Partition::kWholeTensors ? v1::PARTITION_WHOLE_TENSORS : v1::PARTITION_FLAT);
  }
  const bool repartitioned =
      partition.has_value() &&
      config.layout().partition() != checkpoint.manifest().config().layout().partition();
  absl::StatusOr<ShardPlan> plan = PlanHere(std::move(config));
  if (!plan.ok() && repartitioned) {
    return absl::InvalidArgumentError(absl::StrCat(
        checkpoint.directory(), ": model '", checkpoint.manifest().config().model_id(),
        "' cannot take the partition ", PartitionName(*partition), ": ", plan.status().message()));
  }
  if (!plan.ok()) {
    return absl::DataLossError(absl::StrCat(checkpoint.directory(),
                                            ": the saved model config is unusable: ",
                                            plan.status().message()));
  }
  absl::StatusOr<StateBudget::Reservation> reservation =
      budget_.Reserve(plan->config.model_id(), StateBytes(*plan));
  if (!reservation.ok()) return reservation.status();
  absl::StatusOr<std::unique_ptr<ModelShard>> shard =
      RestoreShard(checkpoint, *plan, BackendFactory());
  if (!shard.ok()) return shard.status();
  return std::make_shared<HostedModel>(plan->config, std::move(*shard), std::move(*reservation),
                                       CheckpointOptionsFor(plan->config.model_id()));
}

absl::Status ShardServiceImpl::RestoreModel(const CheckpointReader& checkpoint, bool named) {
  const v1::CheckpointManifest& manifest = checkpoint.manifest();
  if (absl::Status s = CheckCheckpointRoot(manifest.config().model_id(), checkpoint.step(),
                                           manifest.parts(0).progress().run_id());
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::shared_ptr<HostedModel>> model =
      LoadModel(checkpoint, options_.restore_partition);
  if (!model.ok()) return model.status();
  // (Before its saver starts: it would find the old timeline's step
  // directories committed and take them for this one's.)
  const std::string own_root = (*model)->checkpoint_options().model_root;
  const bool from_own_root =
      (*model)->periodic_checkpoints() &&
      SameDirectory(DirectoryOf(NormalPath(checkpoint.directory())), own_root);
  if (named || !from_own_root) {
    if (absl::Status s = GoBack(**model, checkpoint.trainer_step()); !s.ok()) return s;
  }
  std::shared_ptr<HostedModel> installed = models_.Install(*model);
  if (installed == nullptr) return absl::UnavailableError("the shard server is shutting down");
  if (installed != *model) {
    return absl::AlreadyExistsError(
        absl::StrCat("model '", manifest.config().model_id(), "' is restored twice"));
  }
  LogInfo("restored model '%s' at version %d from %s (written by %d shards), range [%d, %d)",
          manifest.config().model_id(), installed->shard().version(), checkpoint.directory(),
          manifest.config().shard_count(), installed->shard().range().begin,
          installed->shard().range().end);
  if (const std::string note = installed->shard().layout().DescribeImbalance(); !note.empty()) {
    LogWarning("model '%s': %s", manifest.config().model_id(), note);
  }
  return absl::OkStatus();
}

absl::Status ShardServiceImpl::RestoreNewestOf(const std::string& model_root) {
  absl::StatusOr<std::vector<StepDirectory>> steps =
      ListStepDirectories(model_root, options_.file_env);
  if (!steps.ok()) return steps.status();
  const bool one_checkpoint =
      FileExists(options_.file_env, JoinPath(model_root, kCheckpointManifestFile));
  if (one_checkpoint && !steps->empty()) {
    // (One written into a model's periodic directory before the Checkpoint
    // RPC refused that: the periodic ones are the model's.)
    LogWarning("%s holds both one checkpoint and periodic step directories: the newest periodic "
               "one is restored",
               model_root);
  } else if (one_checkpoint) {
    // A model directory that is itself one checkpoint (the Checkpoint RPC's).
    absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint =
        OpenVerifiedCheckpoint(model_root, options_.file_env);
    if (!checkpoint.ok()) return checkpoint.status();
    return RestoreModel(**checkpoint, /*named=*/false);
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> newest =
      OpenNewestVerifiedCheckpoint(model_root, LogDamagedCheckpoint, options_.file_env);
  if (!newest.ok()) return newest.status();
  return RestoreModel(**newest, /*named=*/false);
}

absl::Status ShardServiceImpl::GoBack(HostedModel& model, int64_t step) {
  if (!model.periodic_checkpoints()) return absl::OkStatus();
  const std::string& root = model.checkpoint_options().model_root;
  absl::StatusOr<int64_t> later = CheckGoingBack(root, step, options_.file_env);
  if (!later.ok()) return later.status();
  if (*later >= 0) {
    LogWarning("model '%s': goes back to step %d: the step directories after it in %s (up to "
               "step %d) are set aside as abandoned",
               model.config().model_id(), step, root, *later);
    if (absl::Status s = model.AbandonCheckpointsAfter(step); !s.ok()) return s;
  }
  return RecordGoingBack(root, step, options_.file_env);
}

absl::Status ShardServiceImpl::CheckCheckpointRoot(const std::string& model_id, int64_t version,
                                                   const std::string& run_id) {
  if (options_.checkpoint_dir.empty() || options_.checkpoint_every <= 0) return absl::OkStatus();
  const std::string root = JoinPath(options_.checkpoint_dir, model_id);
  absl::StatusOr<std::vector<CommittedCheckpoint>> committed =
      ListCommittedCheckpoints(root, options_.file_env);
  if (!committed.ok()) return committed.status();
  if (committed->empty()) return absl::OkStatus();
  // Periodic checkpoints of two runs in one directory would be taken for
  // each other after a restart.
  if (version < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat("--checkpoint_dir already holds checkpoints of model '", model_id,
                     "' (latest: step ", committed->front().step, " in ",
                     committed->front().directory,
                     "): restore it with --restore_from, or give this new run "
                     "another --checkpoint_dir"));
  }
  // A later checkpoint of the same run is fine (committed while this shard
  // restored; the trainers bring it up); only another run's is refused. A
  // record that does not open is left to the restore's own checks.
  for (const CommittedCheckpoint& c : *committed) {
    absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint =
        CheckpointReader::Open(c.directory, options_.file_env);
    if (!checkpoint.ok()) continue;
    const std::string& saved_run = (*checkpoint)->manifest().parts(0).progress().run_id();
    if (saved_run != run_id) {
      return absl::FailedPreconditionError(
          absl::StrCat("--checkpoint_dir holds a checkpoint of model '", model_id,
                       "' of another training run in ", c.directory,
                       ": restoring here would mix the two; use another --checkpoint_dir"));
    }
    break;
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> ShardServiceImpl::RestoreCommittedOfRun(const std::string& model_id,
                                                             const std::string& run_id) {
  if (options_.checkpoint_dir.empty() || options_.checkpoint_every <= 0 || run_id.empty() ||
      options_.restore_from.empty() ||
      !SameDirectory(options_.restore_from, options_.checkpoint_dir)) {
    return false;
  }
  // One at a time: a registration retried while the first one's restore
  // still loads finds the model restored instead of loading it again (and
  // reserving its state twice).
  absl::MutexLock restoring(&registration_restore_mu_);
  if (models_.Find(model_id).ok()) return true;
  const std::string root = JoinPath(options_.checkpoint_dir, model_id);
  absl::StatusOr<std::vector<CommittedCheckpoint>> committed =
      ListCommittedCheckpoints(root, options_.file_env);
  if (!committed.ok() || committed->empty()) return false;
  absl::StatusOr<std::unique_ptr<CheckpointReader>> newest =
      CheckpointReader::Open(committed->front().directory, options_.file_env);
  if (!newest.ok() || (*newest)->manifest().parts(0).progress().run_id() != run_id) return false;
  LogWarning(
      "model '%s': registered for run '%s', whose checkpoint %s was committed after this "
      "server started (it came back before the model's first checkpoint was whole): "
      "restoring it",
      model_id, run_id, committed->front().directory);
  absl::Status restored = RestoreNewestOf(root);
  if (absl::IsAlreadyExists(restored)) return true;  // Another registration restored it.
  if (!restored.ok()) return restored;
  return true;
}

absl::Status ShardServiceImpl::CheckRequestedCheckpointPlace(const std::string& directory,
                                                             const std::string& model_id,
                                                             int64_t step) const {
  if (options_.checkpoint_dir.empty() || options_.checkpoint_every <= 0) return absl::OkStatus();
  const std::string dir = NormalPath(directory);
  const std::string root = NormalPath(options_.checkpoint_dir);
  auto refused = [&](absl::string_view what) {
    return absl::FailedPreconditionError(absl::StrCat(
        directory, " is ", what, ", which a restart from --checkpoint_dir ", root,
        " would take for periodic checkpoints: name a directory of its own (outside it, or "
        "ROOT/NAME for a NAME that is no model's)"));
  };
  if (dir == root) return refused("--checkpoint_dir itself");
  const std::string prefix = root == "/" ? root : root + "/";
  if (!absl::StartsWith(dir, prefix)) return absl::OkStatus();
  const std::vector<std::string> parts =
      absl::StrSplit(dir.substr(prefix.size()), '/', absl::SkipEmpty());
  const std::string& top = parts[0];
  const bool model_directory = top == model_id || models_.Find(top).ok();
  if (parts.size() == 1) {
    if (model_directory) return refused("the directory of a model's periodic checkpoints");
    if (absl::StartsWith(top, "step-") || absl::StartsWith(top, "shard-")) {
      return refused("a step or part name at the top of the root");
    }
    return absl::OkStatus();
  }
  if (parts.size() == 2 && top == model_id && parts[1] == CheckpointStepDirName(step)) {
    return absl::OkStatus();  // The periodic checkpoint of this very step.
  }
  if (model_directory) {
    return refused(absl::StrCat("inside the directory of the periodic checkpoints of model '", top,
                                "' (only its step directory of step ", step, ", ",
                                CheckpointStepDirName(step), ", may be named)"));
  }
  if (absl::StartsWith(parts[1], "step-")) return refused("a step directory");
  return absl::OkStatus();
}

absl::Status ShardServiceImpl::RestoreFrom(const std::string& path) {
  FileEnv* env = options_.file_env;
  absl::StatusOr<FileInfo> info = env->Stat(path);
  if (absl::IsNotFound(info.status())) {
    // The first start of a job whose restarts use the same command line
    // (--restore_from=ROOT --checkpoint_dir=ROOT). Any other path names
    // something to load: a typo must not start a fresh model.
    if (options_.checkpoint_dir.empty() ||
        NormalPath(path) != NormalPath(options_.checkpoint_dir)) {
      return absl::NotFoundError(
          absl::StrCat(path,
                       " does not exist (only the --checkpoint_dir of a job's first start "
                       "may be missing)"));
    }
    LogInfo("%s does not exist yet: nothing to restore", path);
    return absl::OkStatus();
  }
  if (!info.ok()) return info.status();
  if (info->type != FileType::kDirectory) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  if (FileExists(env, JoinPath(path, kCheckpointManifestFile))) {
    // The one the operator named: verified whole, never replaced by another.
    absl::StatusOr<std::unique_ptr<CheckpointReader>> named = OpenVerifiedCheckpoint(path, env);
    if (!named.ok()) return named.status();
    return RestoreModel(**named, /*named=*/true);
  }
  absl::StatusOr<std::vector<std::string>> names = env->ListDirectory(path);
  if (!names.ok()) return names.status();
  std::vector<std::string> model_dirs;
  bool has_parts = false, has_steps = false;
  for (const std::string& name : *names) {
    has_parts = has_parts || absl::StartsWith(name, "shard-");
    has_steps = has_steps || absl::StartsWith(name, "step-");
    // A model's directory is named after its id; anything else at the top
    // of a shared filesystem (a root-owned lost+found this user may not
    // list) is not a model's.
    absl::StatusOr<FileInfo> entry = env->Stat(JoinPath(path, name));
    if (entry.ok() && entry->type == FileType::kDirectory && name[0] != '.' &&
        CheckId("model_id", name).ok()) {
      model_dirs.push_back(JoinPath(path, name));
    }
  }
  if (has_parts) {
    // A checkpoint directory some shard never finished: refuse, never load in part.
    return CheckpointReader::Open(path, env).status();
  }
  if (has_steps) {  // One model's periodic checkpoints.
    absl::StatusOr<std::vector<CommittedCheckpoint>> committed =
        ListCommittedCheckpoints(path, env);
    if (!committed.ok()) return committed.status();
    if (committed->empty()) {
      // Every shard died while writing the first one: as for an empty root
      // (and as the root form does for such a model), a fresh start.
      LogInfo("%s: no committed checkpoint; nothing to restore", path);
      return absl::OkStatus();
    }
    return RestoreNewestOf(path);
  }
  for (const std::string& dir : model_dirs) {  // Sorted: ListDirectory sorts.
    absl::StatusOr<std::vector<StepDirectory>> steps = ListStepDirectories(dir, env);
    if (FileExists(env, JoinPath(dir, kCheckpointManifestFile)) && steps.ok() && steps->empty()) {
      // One checkpoint in a directory of its own (the Checkpoint RPC's, an
      // export next to the periodic ones): a model's only when named after it.
      absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir, env);
      if (reader.ok() && (*reader)->manifest().config().model_id() != BaseName(dir)) {
        LogWarning(
            "%s holds a checkpoint of model '%s' (step %d), not a model directory of "
            "this root: not restored (name it in --restore_from to restore it)",
            dir, (*reader)->manifest().config().model_id(), (*reader)->trainer_step());
        continue;
      }
    }
    absl::Status s = RestoreNewestOf(dir);
    if (absl::IsNotFound(s)) {
      LogInfo("%s: no committed checkpoint; nothing to restore", dir);
      continue;
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace shardopt
