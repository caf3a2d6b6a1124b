// ShardServiceImpl: the calls that read or replace a model's state as a
// whole - Inspect, GetServerInfo, Checkpoint, RollBack - and /metrics (the
// restore before serving: shard_service_restore.cc).
#include <algorithm>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/checkpoint_catalog.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"
#include "server/metrics_page.h"
#include "server/service_replies.h"
#include "server/shard_service.h"

namespace shardopt {
namespace {

constexpr uint32_t kDefaultSliceLength = 8;
constexpr uint32_t kMaxSliceLength = 4096;
// Committed checkpoints listed per model in ModelSummary.
constexpr size_t kMaxListedCheckpoints = 16;

// What Inspect and /metrics report of a trainer's last push: seconds since
// it, -1 when unknown (after a restore).
double SecondsSincePush(const TrainerActivity& activity, absl::Time now) {
  return activity.last_push_time ? absl::ToDoubleSeconds(now - *activity.last_push_time) : -1.0;
}

// The newest committed checkpoint of `model`, listed afresh (another shard
// may have committed one), -1 when there is none. `wait`: false for a
// metrics scrape, which takes the list as it is while another caller lists.
int64_t NewestCommittedCheckpoint(HostedModel& model, bool wait = true) {
  if (model.periodic_checkpoints()) {
    if (wait) {
      model.RefreshCheckpointList();
    } else {
      model.RefreshCheckpointListUnlessBusy();
    }
  }
  const std::vector<int64_t> committed = model.committed_checkpoints();
  return committed.empty() ? -1 : committed.front();
}

}  // namespace

grpc::Status ShardServiceImpl::Inspect(grpc::ServerContext* context,
                                       const v1::InspectRequest* request,
                                       v1::InspectResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kRead); !s.ok()) return Error(s);
  if (request->slice_length() > kMaxSliceLength) {
    return Error(absl::InvalidArgumentError(absl::StrCat("slice_length ", request->slice_length(),
                                                         " is above the most, ", kMaxSliceLength)));
  }
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(request->model_id());
  if (!model.ok()) return Error(model.status());
  ModelShard& shard = (*model)->shard();
  const uint32_t length =
      request->slice_length() == 0 ? kDefaultSliceLength : request->slice_length();
  absl::StatusOr<ShardSnapshot> snap =
      shard.Snapshot(request->tensor_name(), request->slice_offset(), length,
                     /*with_tensor_stats=*/true);
  if (!snap.ok()) return Error(snap.status());

  const v1::ModelConfig& config = (*model)->config();
  response->set_model_id(config.model_id());
  response->set_shard_index(options_.shard_index);
  response->set_shard_count(options_.shard_count);
  SetRange(shard.range(), response->mutable_range());
  response->set_version(snap->version);
  response->set_next_step(snap->version + 1);
  response->set_num_trainers(config.num_trainers());
  for (uint32_t r : snap->trainers_pushed) response->add_trainers_pushed(r);
  for (int64_t step : snap->trainer_steps) response->add_trainer_steps(step);
  response->set_max_staleness(snap->max_staleness);
  response->set_consistency(config.consistency());
  response->set_staleness(config.staleness());
  response->set_partition(config.layout().partition());
  response->set_imbalance(shard.layout().Imbalance());
  response->set_imbalance_note(shard.layout().DescribeImbalance());
  for (const auto& [rank, step] : snap->applied_order) {
    v1::AppliedPush* applied = response->add_applied_order();
    applied->set_trainer_rank(rank);
    applied->set_step(step);
  }
  *response->mutable_optimizer() = config.optimizer();
  response->set_reduction(config.reduction());
  for (const TensorPieceStats& t : snap->tensors) {
    const TensorPlacement& placement = shard.layout().tensors()[t.piece.tensor_index];
    v1::TensorStats* stats = response->add_tensors();
    stats->set_name(placement.spec.name);
    for (int64_t d : placement.spec.shape) stats->add_shape(d);
    stats->set_tensor_offset(t.piece.tensor_offset);
    stats->set_num_elements(t.piece.size);
    stats->set_l2_norm(t.l2_norm);
    stats->set_min(t.min);
    stats->set_max(t.max);
    stats->set_mean(t.mean);
  }
  response->set_slice_offset(request->slice_offset());
  for (float v : snap->values) response->add_values(v);
  FillByteCounts(*snap, response->mutable_bytes());
  *response->mutable_layout() = config.layout();
  *response->mutable_current_optimizer() = OptimizerConfigToProto(snap->current.optimizer);
  *response->mutable_lr_schedule() = LrScheduleToProto(snap->current.lr_schedule);
  response->set_last_lr(snap->last_lr);
  for (int64_t step : snap->scheduled_changes) response->add_scheduled_changes(step);
  *response->mutable_next_optimizer() = OptimizerConfigToProto(snap->next.optimizer);
  *response->mutable_next_lr_schedule() = LrScheduleToProto(snap->next.lr_schedule);
  *response->mutable_gradient_control() = config.gradient_control();
  response->set_last_decided_step(snap->last_step.step);
  *response->mutable_last_decision() = StepDecisionToProto(snap->last_step.decision);
  response->set_last_loss_scale(snap->last_step.loss_scale);
  response->set_optimizer_steps(snap->optimizer_steps);
  response->set_skipped_steps(snap->skipped_steps);
  const absl::Time now = absl::Now();
  for (uint32_t r = 0; r < snap->trainers.size(); ++r) {
    const TrainerActivity& a = snap->trainers[r];
    v1::TrainerActivity* t = response->add_trainers();
    t->set_rank(r);
    t->set_last_pushed_step(a.last_pushed_step);
    t->set_seconds_since_last_push(SecondsSincePush(a, now));
  }
  response->set_newest_committed_checkpoint(NewestCommittedCheckpoint(**model));
  response->set_incarnation((*model)->incarnation());
  if (std::optional<StepTimes> times = shard.NewestTimeline()) {
    v1::StepTimeline* timeline = response->mutable_step_timeline();
    timeline->set_step(times->step);
    timeline->set_last_push_committed_ms(times->committed_ms);
    for (const RangeTimes& r : times->ranges) {
      v1::RangeTimeline* range = timeline->add_ranges();
      range->set_arrived_ms(r.arrived_ms);
      range->set_updated_ms(r.updated_ms);
      range->set_pulled_ms(r.pulled_ms);
    }
  }
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::GetServerInfo(grpc::ServerContext* context,
                                             const v1::GetServerInfoRequest* request,
                                             v1::ServerInfo* response) {
  if (absl::Status s = Authorize(*context, Access::kRead); !s.ok()) return Error(s);
  response->set_shard_index(options_.shard_index);
  response->set_shard_count(options_.shard_count);
  response->set_device(options_.gpu_index < 0 ? "cpu" : absl::StrCat("cuda:", options_.gpu_index));
  response->set_threads(pool_.threads());
  response->set_uptime_seconds(absl::ToDoubleSeconds(absl::Now() - start_time_));
  if (shared_memory_ != nullptr) {
    response->set_shared_memory_socket(shared_memory_->socket_name());
    response->set_shared_memory_fences(true);
    response->set_shared_memory_attachments(static_cast<uint32_t>(shared_memory_->attachments()));
    response->set_shared_memory_pull_places(static_cast<uint32_t>(pull_claims_.places()));
  }
  if (device_pairs_ != nullptr) {
    response->set_device_pair_kind(device_pairs_->kind().name());
    response->set_device_pairs(static_cast<uint32_t>(device_pairs_->pairs()));
    response->set_device_pairs_busy(static_cast<uint32_t>(device_pairs_->busy()));
  }
  if (payload_sockets_ != nullptr) {
    response->set_payload_socket_port(payload_sockets_->port());
    response->set_payload_socket_links(static_cast<uint32_t>(payload_sockets_->links()));
  }
  for (const std::shared_ptr<HostedModel>& model : models_.All()) {
    v1::ModelSummary* summary = response->add_models();
    summary->set_model_id(model->config().model_id());
    summary->set_num_trainers(model->config().num_trainers());
    summary->set_optimizer(OptimizerKindName(model->shard().options().optimizer.kind));
    summary->set_partition(model->config().layout().partition());
    SetRange(model->shard().range(), summary->mutable_range());
    absl::StatusOr<ShardSnapshot> snap =
        model->shard().Snapshot("", 0, 0, /*with_tensor_stats=*/false);
    if (snap.ok()) {
      summary->set_version(snap->version);
      FillByteCounts(*snap, summary->mutable_bytes());
      for (uint32_t r : snap->trainers_pushed) summary->add_trainers_pushed(r);
      summary->set_partly_run(snap->partly_run);
      for (int64_t step : snap->trainer_steps) summary->add_trainer_steps(step);
      summary->set_max_staleness(snap->max_staleness);
      summary->set_consistency(model->config().consistency());
      summary->set_staleness(model->config().staleness());
    }
    summary->set_incarnation(model->incarnation());
    // Listed afresh: recovery decides on these.
    if (model->periodic_checkpoints()) model->RefreshCheckpointList();
    const std::vector<int64_t> committed = model->committed_checkpoints();
    for (size_t i = 0; i < committed.size() && i < kMaxListedCheckpoints; ++i) {
      summary->add_committed_checkpoints(committed[i]);
    }
    summary->set_recovery_floor(model->recovery_floor());
    summary->set_rolled_back_to(model->rolled_back_to());
    summary->set_periodic_checkpoints(model->periodic_checkpoints());
  }
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::Checkpoint(grpc::ServerContext* context,
                                          const v1::CheckpointRequest* request,
                                          v1::CheckpointResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(request->model_id());
  if (!model.ok()) return Error(model.status());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  if (request->step() < -1) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("step ", request->step(), ": give a version, or -1 for the current one")));
  }
  ModelShard& shard = (*model)->shard();
  if (request->step() == -1 && shard.asynchronous()) {
    // Each shard's own newest would differ: the parts must be of one cut.
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "model '", request->model_id(), "' is ", ConsistencyName(shard.options().consistency),
        ": name the step to checkpoint (every trainer's step N; TrainerClient::Checkpoint takes "
        "the highest step any shard applied)")));
  }
  const int64_t step = request->step() == -1 ? shard.version() : request->step();
  if (request->periodic()) {
    if (!request->directory().empty()) {
      return Error(absl::InvalidArgumentError(
          absl::StrCat("a periodic checkpoint goes to the server's --checkpoint_dir: leave "
                       "directory empty (it is '",
                       request->directory(), "')")));
    }
    return SavePeriodicCheckpoint(*context, **model, step, request->max_wait_ms(), response);
  }
  // Before anything is created: the system would cut a name at a NUL byte.
  if (absl::Status s = options_.checkpoint_request_root.empty()
                           ? CheckPath("directory", request->directory())
                           : CheckPathInside("directory", request->directory(),
                                             options_.checkpoint_request_root);
      !s.ok()) {
    return Error(s);
  }
  if (absl::Status s =
          CheckRequestedCheckpointPlace(request->directory(), request->model_id(), step);
      !s.ok()) {
    return Error(s);
  }
  if ((*model)->periodic_checkpoints() &&
      NormalPath(request->directory()) ==
          NormalPath(
              JoinPath((*model)->checkpoint_options().model_root, CheckpointStepDirName(step)))) {
    // Named by its path: the same as asking for it (one writer with the
    // saving thread).
    return SavePeriodicCheckpoint(*context, **model, step, request->max_wait_ms(), response);
  }
  absl::Duration write_time;
  absl::StatusOr<CheckpointPartWritten> written = SaveCheckpoint(
      shard, (*model)->config(), request->directory(), step,
      WaitDeadline(*context, request->max_wait_ms()), [context] { return context->IsCancelled(); },
      ModelShard::StepHold(), options_.file_env, &write_time);
  return AnswerCheckpoint(*context, request->model_id(), step, write_time, written, "", response);
}

grpc::Status ShardServiceImpl::SavePeriodicCheckpoint(const grpc::ServerContext& context,
                                                      HostedModel& model, int64_t step,
                                                      int64_t max_wait_ms,
                                                      v1::CheckpointResponse* response) {
  absl::Duration write_time;
  absl::StatusOr<CheckpointPartWritten> written = model.SaveStep(
      step, WaitDeadline(context, max_wait_ms), [&context] { return context.IsCancelled(); },
      &write_time);
  return AnswerCheckpoint(context, model.config().model_id(), step, write_time, written,
                          "periodic ", response);
}

grpc::Status ShardServiceImpl::AnswerCheckpoint(
    const grpc::ServerContext& context, const std::string& model_id, int64_t step,
    absl::Duration write_time, const absl::StatusOr<CheckpointPartWritten>& written,
    const char* kind, v1::CheckpointResponse* response) {
  // Only what wrote (or failed writing) files: not a refused request, nor a
  // repeat of a part or checkpoint written already.
  if (!context.IsCancelled() && write_time > absl::ZeroDuration() &&
      (!written.ok() || written->bytes > 0)) {
    metrics_.RecordCheckpoint(model_id, written.ok(), absl::ToDoubleSeconds(write_time));
  }
  if (!written.ok()) return Error(written.status());
  LogInfo("model '%s': %scheckpoint of step %d: %s%s%s", model_id, kind, step, written->data_file,
          written->bytes == 0 ? " (written already)" : "",
          written->committed ? " (committed the manifest)" : "");
  response->set_step(step);
  response->set_part_file(written->data_file);
  response->set_bytes_written(written->bytes);
  response->set_committed(written->committed);
  response->set_manifest(written->manifest);
  return grpc::Status::OK;
}

grpc::Status ShardServiceImpl::RollBack(grpc::ServerContext* context,
                                        const v1::RollBackRequest* request,
                                        v1::RollBackResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  if (absl::Status s = CheckShardIndex(request->shard_index()); !s.ok()) return Error(s);
  if (request->to_step() < 0) {
    return Error(absl::InvalidArgumentError(
        absl::StrCat("to_step ", request->to_step(), " is negative")));
  }
  // One at a time: trainers that find replay impossible all ask.
  absl::MutexLock rollback_lock(&rollback_mu_);
  absl::StatusOr<std::shared_ptr<HostedModel>> model = models_.Find(request->model_id());
  if (!model.ok()) return Error(model.status());
  const std::string& model_id = request->model_id();
  if (!(*model)->periodic_checkpoints()) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat("shard ", options_.shard_index, " keeps no periodic checkpoints of model '",
                     model_id, "' (--checkpoint_dir, --checkpoint_every): nothing to roll back to")));
  }
  if ((*model)->shard().asynchronous()) {
    return Error(absl::FailedPreconditionError(absl::StrCat(
        "model '", model_id, "' is ", ConsistencyName((*model)->shard().options().consistency),
        ": a rollback is only for synchronous models (restart the shards from a checkpoint, "
        "--restore_from, instead)")));
  }
  const int64_t version = (*model)->shard().version();
  response->set_version(version);
  response->set_incarnation((*model)->incarnation());
  if ((*model)->incarnation() != request->expected_incarnation()) {
    return Error(absl::AbortedError(absl::StrCat(
        "model '", model_id, "' on shard ", options_.shard_index,
        " changed since the rollback was decided (it restarted or rolled back; now at version ",
        version, "): look again")));
  }
  const std::string& root = (*model)->checkpoint_options().model_root;
  const std::string dir = JoinPath(root, CheckpointStepDirName(request->to_step()));
  if (version == request->to_step() &&
      !FileExists(options_.file_env, JoinPath(dir, kCheckpointManifestFile))) {
    // Nothing to go back to: the next step's pushes and the later step
    // directories are not this caller's to drop.
    return Error(absl::NotFoundError(
        absl::StrCat("no committed checkpoint of step ", request->to_step(), " in ", root)));
  }
  // (At the version read above: a step completed since is looked at again.)
  const absl::Status discarded = version == request->to_step()
                                     ? (*model)->shard().DiscardPendingPushes(version)
                                     : absl::OkStatus();
  if (version == request->to_step() && !absl::IsFailedPrecondition(discarded)) {
    // Already there: what it holds of the next step belongs to the steps
    // given up, and so do the later step directories. (A pipelined step that
    // ran ranges cannot be dropped: the checkpoint is loaded below instead.)
    if (!discarded.ok()) return Error(discarded);
    // Pushes dropped: whatever follows, this is not the state surveyed.
    (*model)->Renew();
    if (absl::Status s = (*model)->AbandonCheckpointsAfter(request->to_step()); !s.ok()) {
      return Error(s);
    }
    (*model)->set_rolled_back_to(request->to_step());
    response->set_incarnation((*model)->incarnation());
    response->set_rolled_back(false);
    return grpc::Status::OK;
  }
  if (version < request->to_step()) {
    return Error(absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_index, " is at version ", version, ", behind step ",
        request->to_step(), ": a rollback cannot go forward")));
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> checkpoint =
      OpenVerifiedCheckpoint(dir, options_.file_env);
  if (absl::IsDataLoss(checkpoint.status())) {
    // No shard may load it: the trainer looks again and picks an older one.
    LogDamagedCheckpoint(dir, checkpoint.status());
    SetAsideCheckpoint(dir, "damaged", options_.file_env).IgnoreError();
  }
  if (!checkpoint.ok()) return Error(checkpoint.status());
  if ((*checkpoint)->manifest().parts(0).progress().run_id() !=
      (*model)->shard().GetAttachInfo().run_id) {
    return Error(absl::FailedPreconditionError(
        absl::StrCat(dir, " holds another training run of model '", model_id, "'")));
  }
  absl::StatusOr<std::shared_ptr<HostedModel>> replacement =
      LoadModel(**checkpoint, (*model)->shard().layout().partition());
  if (!replacement.ok()) return Error(replacement.status());
  // The old model stops (its checkpoint thread with it) before the later
  // step directories, which hold the steps given up, are set aside: no
  // restart may take them for this run's future, nor the new steps' saves
  // for their own.
  if (absl::Status s = models_.Replace(*model, *replacement); !s.ok()) return Error(s);
  if (absl::Status s = (*replacement)->AbandonCheckpointsAfter(request->to_step()); !s.ok()) {
    // Not marked rolled back: the trainer's next survey finds this shard at
    // the step but not there by a rollback and sends it again (the
    // already-there case below sets the rest aside), instead of taking it
    // for done with the old steps' directories left in place.
    LogWarning("model '%s': rolled back to step %d, but the later step directories were not "
               "all set aside (%s); a trainer's RollBack tries again",
               model_id, request->to_step(), std::string(s.message()));
    return Error(s);
  }
  (*replacement)->set_rolled_back_to(request->to_step());
  LogWarning("model '%s': rolled back from version %d to step %d (%s): %s", model_id, version,
             request->to_step(), dir, request->reason());
  response->set_version((*replacement)->shard().version());
  response->set_incarnation((*replacement)->incarnation());
  response->set_rolled_back(true);
  return grpc::Status::OK;
}

std::string ShardServiceImpl::RenderMetrics() const {
  ServerGauges server;
  server.shard_index = options_.shard_index;
  server.shard_count = options_.shard_count;
  server.device = options_.gpu_index < 0 ? "cpu" : absl::StrCat("cuda:", options_.gpu_index);
  server.uptime_seconds = absl::ToDoubleSeconds(absl::Now() - start_time_);
  server.state_budget_bytes = options_.max_state_bytes;
  std::vector<ModelGauges> models;
  const absl::Time now = absl::Now();
  for (const std::shared_ptr<HostedModel>& model : models_.All()) {
    // The snapshot Inspect answers from, without values or tensor statistics.
    absl::StatusOr<ShardSnapshot> snap =
        model->shard().Snapshot("", 0, 0, /*with_tensor_stats=*/false);
    if (!snap.ok()) continue;  // Shut down meanwhile.
    ModelGauges m;
    m.model_id = model->config().model_id();
    m.version = snap->version;
    m.steps_applied = snap->optimizer_steps;
    m.steps_skipped = snap->skipped_steps;
    const HostedModel::AppliedSteps here = model->AppliedHere(*snap);
    m.steps_applied_here = here.applied;
    m.steps_skipped_here = here.skipped;
    m.gradient_bytes_received = snap->gradient_bytes_received;
    m.parameter_bytes_sent = snap->parameter_bytes_sent;
    m.parameter_bytes = snap->parameter_bytes;
    m.optimizer_state_bytes = snap->optimizer_state_bytes;
    m.staging_bytes = snap->staging_bytes;
    m.loss_scale = snap->last_step.loss_scale;
    m.grad_norm = snap->last_step.decision.grad_norm;
    m.last_lr = snap->last_lr;
    m.newest_committed_checkpoint = NewestCommittedCheckpoint(*model, /*wait=*/false);
    for (const TrainerActivity& a : snap->trainers) {
      m.trainers.push_back(TrainerGauges{a.last_pushed_step, SecondsSincePush(a, now)});
    }
    models.push_back(std::move(m));
  }
  return RenderMetricsPage(metrics_.Read(), server, models);
}

}  // namespace shardopt
