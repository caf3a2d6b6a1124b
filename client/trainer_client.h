// TrainerClient: what a trainer process links to train against shardopt.
//
// One TrainerClient is one trainer (rank r of T) of one model, connected to
// the model's S shard servers (addresses in shard order). It never includes
// server code: it speaks only the wire contract in proto/.
//
//   auto client = TrainerClient::Connect(addresses, options);   // rank, model
//   (*client)->Register(spec, initial_flat_params);  // rank 0
//   (*client)->Attach(spec);                         // every other rank
//   from = (*client)->PullToResume(params);          // 0, or where the job is
//   for (step = from + 1 .. N):
//     compute grads into a flat buffer laid out by (*client)->layout()
//     (*client)->Step(step, grads, params);  // push to all shards, pull version `step`
//
// Tensors live in flat buffers of layout().total_elements() floats (see
// common/layout.h); the client slices them by shard, talks to all shards at
// once (one worker thread per shard, ShardFanOut), streams chunks of
// `chunk_bytes`, and writes pulled values straight into the caller's
// buffer. Calls that are idempotent on the server (register, attach, push
// per (rank, step), pull) are retried with exponential backoff on
// UNAVAILABLE, ABORTED and DEADLINE_EXCEEDED of a single attempt. Errors
// name the shard, its address and the cause; a wait that runs out names the
// trainers that have not pushed and the last step each did push.
//
// Crash recovery is one procedure over all shards (client/recovery.h): when
// a shard came back from an older checkpoint, the client re-pushes what it
// lacks from the trainer's history (replay_steps, journal_path) and goes on.
// When that history is gone, the whole job rolls back to a checkpoint every
// shard holds: Step, Push and Pull then fail with ABORTED and
// rolled_back_to() says the version to resume from (PullToResume, then
// continue with the next step). A TrainerClient is not thread-safe: one trainer thread
// drives it.
//
// Asynchronous and bounded-staleness models (ModelSpec::consistency; see
// client/trainer_client_async.cc): Step(k) pushes this trainer's step k,
// which each shard applies alone as an optimizer step of its own (the push
// returns once applied, or, bounded, DEADLINE_EXCEEDED naming the trainers
// it waited for), then pulls every shard's newest parameters (versions
// differ between shards; StepResult.shard_versions). A shard that restarted
// from a checkpoint answers OUT_OF_RANGE naming the steps of this trainer it
// lacks: the client re-pushes them from its history to that shard alone,
// then goes on. PullToResume returns the step this trainer goes on from
// (the lowest step of this trainer every shard applied). No gradient
// control, streamed pushes, hyperparameter changes or rollbacks there.
#ifndef SHARDOPT_CLIENT_TRAINER_CLIENT_H_
#define SHARDOPT_CLIENT_TRAINER_CLIENT_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/types/span.h"
#include "client/device_twins.h"
#include "client/shard_fanout.h"
#include "client/trainer_options.h"
#include "common/device_pair.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

class PushHistory;
struct PushedStep;
class PayloadTransport;
class TrainerSegment;
class Recovery;
class ShardConnection;
class EarlyPull;
class ShardFanOut;
class StepCalls;
struct RetryPolicy;

// What one step did, as the shards reported it.
struct StepResult {
  int64_t step = 0;
  int64_t version = 0;        // Version pulled (== step when pulled).
  bool applied_here = false;  // This trainer's push completed the step on some shard.
  int duplicate_pushes = 0;   // Shards that already had this push (e.g. after a retry).
  // With gradient control: what every shard did with the step.
  bool skipped = false;       // Some gradient had inf/NaN: nothing changed.
  double grad_norm = 0;       // Global L2 norm of the unscaled gradient.
  double clip_coef = 1.0;     // Applied multiplier (1: no clipping).
  double loss_scale = 1.0;    // The scale this step's gradients carried.
  double lr = 0;              // The learning rate the step ran with.
  uint64_t bytes_pushed = 0;  // Payload bytes on the wire (push_dtype).
  uint64_t bytes_pulled = 0;  // Payload bytes on the wire (pull_dtype).
  int replayed_pushes = 0;    // Earlier steps re-pushed to restarted shards.
  // A streamed push (FinishStreamedStep): of bytes_pushed, those handed to
  // gRPC before FinishStreamedStep was called, i.e. while backward still ran.
  uint64_t bytes_pushed_early = 0;
  // Asynchronous modes: the largest staleness any shard applied the push
  // with (PushGradientsResponse.staleness), and each shard's version pulled
  // (`version` is the lowest of them).
  int64_t staleness = 0;
  std::vector<int64_t> shard_versions;
};

class TrainerClient {
 public:
  // Opens one channel per shard. Does not contact the servers.
  static absl::StatusOr<std::unique_ptr<TrainerClient>> Connect(
      const std::vector<std::string>& shard_addresses, const TrainerClientOptions& options);
  ~TrainerClient();

  // Registers the model on every shard with `initial_params` (a flat buffer
  // laid out by LayoutFor(spec); padding must be zero). Idempotent: a shard
  // that already holds an equal model keeps its state, and
  // registered_version() then tells how far that model has trained (pull it
  // instead of assuming the initial values). Shards found at different
  // versions (some restarted from a checkpoint, or this trainer died in the
  // middle of a step) are brought to a common one first (see Recovery).
  // FAILED_PRECONDITION when a shard holds a different model under the same
  // id (naming the fields that differ), or when a shard had to create the
  // model while others hold it.
  absl::Status Register(const ModelSpec& spec, absl::Span<const float> initial_params);
  // Joins a model that another trainer registers, waiting up to
  // attach_timeout for it to appear on every shard.
  absl::Status Attach(const ModelSpec& spec);

  // The layout `spec` gets on this client's shards: where rank 0 puts the
  // initial values it passes to Register. INVALID_ARGUMENT for a bad spec.
  absl::StatusOr<ModelLayout> LayoutFor(const ModelSpec& spec) const;

  // Valid after a Register or Attach that succeeded (one of another model
  // or other sizes that failed leaves no model, also where there was one:
  // calls then say to register).
  const ModelLayout& layout() const { return *layout_; }
  uint32_t trainer_rank() const { return options_.trainer_rank; }
  uint32_t shard_count() const { return static_cast<uint32_t>(shards_.size()); }
  // The version every shard was at after the last Register/Attach (in the
  // asynchronous modes: shard 0's).
  int64_t registered_version() const { return registered_version_; }
  // The highest step Push() was called with (a change for it or an earlier
  // step may already be in force on some shard: SetHyperparameters refuses
  // it).
  int64_t last_pushed_step() const { return last_pushed_step_; }
  // The model's mode is asynchronous or bounded (after Register/Attach).
  bool asynchronous() const { return spec_ && IsAsynchronous(spec_->consistency); }

  // Pushes this trainer's gradient for `step` to every shard.
  absl::StatusOr<StepResult> Push(int64_t step, absl::Span<const float> flat_grads);
  // Pulls every shard's parameters at version >= min_version into
  // `flat_params`; returns the version (the same on every shard, else
  // FAILED_PRECONDITION). After Push(min_version) with gradient control it
  // first takes the step's decision, as Step does between its push and its
  // pull.
  absl::StatusOr<int64_t> Pull(int64_t min_version, absl::Span<float> flat_params);
  // The loss scale to multiply this step's loss (or gradients) by: 1 without
  // loss scaling. Step() updates it from the step's outcome.
  double loss_scale() const;

  // Push(step) then Pull(step); with gradient control, in between, every
  // shard's statistics and one decision for all of them (StepResult says it).
  absl::StatusOr<StepResult> Step(int64_t step, absl::Span<const float> flat_grads,
                                  absl::Span<float> flat_params);

  // Step for a trainer whose gradient and parameters live in device memory
  // of its device pairs' kind (TrainerClientOptions::device_pairs; for
  // "nccl" CUDA device device_pair_gpu; "loopback" memory is host memory),
  // layout().total_elements() floats each (trainer_client_device.cc). The
  // gradient is copied once into a host mirror, which the client's checks,
  // its history and the shards no pair reaches read; shards reached over
  // pairs take it from the device and send the parameters straight into
  // `device_params`; the others' parts land in a host mirror and are copied
  // to the device once the step succeeded. FAILED_PRECONDITION without
  // device pairs. The gradient must be complete when it is called (for a
  // CUDA device: the work that wrote it synchronised; the client copies it
  // on the legacy default stream). After a failure the parameters may hold
  // some shards' new values, as after a failed Step (the step is retried
  // as a whole).
  absl::StatusOr<StepResult> StepOnDevice(int64_t step, const float* device_grads,
                                          float* device_params);

  // ---- A push sent while the gradient is still being computed
  // (shardopt.torch's backward hooks). BeginStreamedPush starts the push of
  // `step` from `flat_grads` on every shard at once; its chunks go out as
  // MarkGradientReady covers them (flat-buffer elements, any order, from
  // any thread); the shards use none of it before the whole push is in
  // (PushHeader.defer_until_complete), and the streams end only in
  // FinishStreamedStep, which checks the whole gradient as Step does, then
  // pulls (the pull overlapping the shards' range-by-range update). Anything
  // wrong with the streamed push (a stream failed, a shard restarted, a chunk
  // already sent no longer equal to `flat_grads` at FinishStreamedStep, e.g.
  // clipped after backward: a digest of every sent chunk is compared): it is
  // abandoned and FinishStreamedStep runs Step, so its result is Step's in
  // every case. FAILED_PRECONDITION where it does not apply (gradient
  // control, a 16-bit push type, a journal, one already open): use Step.
  // Any other call first abandons an open streamed push (nothing of it is
  // used), as does CancelStreamedPush.
  absl::Status BeginStreamedPush(int64_t step, absl::Span<const float> flat_grads);
  void MarkGradientReady(uint64_t begin, uint64_t end);
  absl::StatusOr<StepResult> FinishStreamedStep(int64_t step, absl::Span<const float> flat_grads,
                                                absl::Span<float> flat_params);
  void CancelStreamedPush();
  // Streamed pushes that completed (FinishStreamedStep did not fall back).
  int64_t streamed_pushes() const { return streamed_pushes_; }
  // Streamed pushes abandoned because the gradient changed after a chunk of
  // it was sent.
  int64_t streamed_pushes_changed() const { return changed_after_send_; }
  // Payload bytes the open streamed push has handed to gRPC so far (0 when
  // none is open; retried attempts count again).
  uint64_t streamed_bytes_sent();

  // Asynchronous modes, at the end of a job: returns once every shard holds
  // every trainer's steps up to `step`, re-pushing this trainer's own that a
  // shard which came back from a checkpoint lacks (no later push would bring
  // them). DEADLINE_EXCEEDED after retry_budget without progress, naming the
  // trainers and shards waited for. OK at once in synchronous mode.
  absl::Status WaitForEveryTrainer(int64_t step);

  // At the end of a job, after this trainer's last step `step` (every
  // trainer calls it, with the same step): returns once every shard holds
  // every trainer's steps up to `step` (bringing back a shard that restarted
  // meanwhile, as Step does) and, where the shards keep periodic checkpoints
  // (--checkpoint_dir), a committed periodic checkpoint of `step` exists
  // (CheckpointRequest.periodic; the shards' own if `step` is one of their
  // multiples). From then on no trainer is needed to recover any shard: a
  // shard that restarts comes back at `step`, so a trainer may exit. Without
  // periodic checkpoints it only waits. ABORTED with rolled_back_to() set
  // when the job had to roll back (PullToResume, train on, Finish again);
  // FAILED_PRECONDITION when `step` is past this trainer's last step, a
  // shard is already past `step`, or only some shards keep periodic
  // checkpoints (naming them); DEADLINE_EXCEEDED after
  // retry_budget without progress, naming what it waited for.
  absl::Status Finish(int64_t step);

  // After a call failed because the job rolled back (see the class
  // comment): the version every shard went back to. Pull it and continue
  // with step rolled_back_to() + 1. nullopt when the last call did not roll
  // the job back.
  std::optional<int64_t> rolled_back_to() const { return rolled_back_to_; }

  // Pulls the parameters a trainer goes on from into `flat_params` and
  // returns their version; the trainer continues with the next step. After
  // Register/Attach that is registered_version(), or one more (a step this
  // trainer's earlier process pushed was applied meanwhile); after a call
  // that rolled the job back, exactly rolled_back_to(). Where a shard ran
  // part of the next step (pipelined) with pushes that broke off, so that
  // the version is gone there: a trainer with a journal sends its push of
  // that step again and returns the step's version; one without rolls the
  // job back to the newest checkpoint every shard holds (or follows a
  // trainer that did) and returns that version (the other trainers' steps
  // send their pushes again). INTERNAL for any other version.
  absl::StatusOr<int64_t> PullToResume(absl::Span<float> flat_params);

  // From step `effective_step` on, every shard uses `optimizer` and
  // `lr_schedule` (same optimizer kind; see SetHyperparametersRequest in the
  // proto). Safe to call from several trainers with the same arguments.
  // `effective_step` must be later than every step this trainer has pushed
  // (FAILED_PRECONDITION otherwise): since no shard can apply a step before
  // every trainer has pushed it, every shard then accepts the change. The
  // pushes in its journal count (an earlier process of this trainer made
  // them); an identical repeat of this trainer's last word for that step
  // (what its earlier process sent) is let through. A change that some
  // shards took while the others could not be reached is still an error
  // (naming the shards that took it), but recorded: this trainer's next push
  // carries it to the others, recovery sends it to a restarted one, and a
  // repeat passes. (Not when a shard refused it: a push would be refused
  // there too.)
  absl::Status SetHyperparameters(int64_t effective_step, const OptimizerConfig& optimizer,
                                  const LrSchedule& lr_schedule);
  // Removes a change scheduled for `effective_step` on every shard;
  // FAILED_PRECONDITION, as SetHyperparameters, for a step this trainer
  // pushed (it may have started on some shards, which keep the change).
  absl::Status CancelHyperparameters(int64_t effective_step);

  // Every shard saves the model at version `step` (-1: the latest version
  // any shard has reached; shards behind it wait for it) into `directory`
  // (a filesystem all shards share; see docs/checkpoints.md). Returns the
  // committed manifest's path.
  absl::StatusOr<std::string> Checkpoint(const std::string& directory, int64_t step = -1);
  // Every shard's InspectResponse for the model, as JSON (protobuf's
  // mapping, field names as in the proto), in shard order.
  absl::StatusOr<std::vector<std::string>> InspectJson();
  // What the model's next step (version + 1) runs with, as the shards say
  // (InspectResponse.next_optimizer): for a trainer that joins a running
  // job, whose hyperparameters may have changed since registration (a
  // change scheduled for that step included).
  // UNAVAILABLE when the shards disagree (a step in flight: ask again);
  // UNIMPLEMENTED when they do not say (older servers).
  struct NextHyperparameters {
    int64_t version = 0;
    OptimizerConfig optimizer;
  };
  absl::StatusOr<NextHyperparameters> NextStepHyperparameters();

  // Earlier steps re-pushed to restarted shards so far (see replay_steps),
  // and journaled pushes PullToResume sent again.
  int64_t replayed_pushes() const;

  // From another thread (a Ctrl-C handler): the calls to shards in progress
  // end with CANCELLED, and so does every later one until ClearInterrupt. A
  // step interrupted so is retried as a whole, as after any failure.
  void Interrupt();
  void ClearInterrupt();
  // Attempts of calls to shards (register, attach, push, pull, statistics,
  // hyperparameters, checkpoints) that failed UNAVAILABLE or
  // DEADLINE_EXCEEDED so far: the shard was down, unreachable, or slower than
  // rpc_timeout (such attempts are retried within retry_budget). In all, or
  // to shard `shard` only.
  int64_t failed_attempts() const;
  int64_t failed_attempts(size_t shard) const;

  // A zero-filled flat buffer of the layout's size.
  std::vector<float> NewFlatBuffer() const;

  // With shared memory (TrainerClientOptions::shared_memory; after
  // Register/Attach): flat buffers in the segment the co-located shards
  // map. A gradient computed in shared_gradients() is pushed without any
  // copy on this side, and a pull into shared_parameters() is written there
  // by the shards; any other buffers work too (the client copies through
  // the segment; a pull into another buffer overwrites
  // shared_parameters()). Empty without shared memory.
  absl::Span<float> shared_gradients() const;
  absl::Span<float> shared_parameters() const;
  // The segment itself (null without shared memory): a holder keeps its
  // memory mapped past this client's end (the Python binding's buffers).
  std::shared_ptr<const TrainerSegment> shared_segment() const { return segment_; }
  // Pushes and pulls to single shards that went through shared memory, and
  // over payload sockets.
  int64_t shared_memory_transfers() const;
  int64_t socket_transfers() const;
  // Pushes and pulls that went over device pairs; of them, those that
  // moved straight from or into StepOnDevice's device buffers.
  int64_t device_pair_transfers() const;
  int64_t device_buffer_transfers() const { return twins_->transfers(); }
  // The kind of device pair in use ("nccl", "loopback"), or "" when none
  // (device_pairs off, or the kind cannot run here: NCCL did not load).
  std::string device_pair_kind() const { return pair_kind_ ? pair_kind_->name() : ""; }

 private:
  // How long a shard waits before it reports what a call waits for: the
  // options' interval, but within half an attempt's deadline, so that a
  // call that runs out of budget ends with the shard's report (which
  // trainer, which step) and not a bare DEADLINE_EXCEEDED.
  absl::Duration WaitReportInterval() const {
    return std::min(options_.wait_report_interval, options_.rpc_timeout / 2);
  }
  // Every shard's InspectResponse for the model, in shard order.
  absl::StatusOr<std::vector<v1::InspectResponse>> InspectEveryShard();
  TrainerClient(const TrainerClientOptions& options,
                std::vector<std::unique_ptr<ShardConnection>> shards,
                std::unique_ptr<EarlyPull> early_pull);

  absl::Status RegisterOrAttach(const ModelSpec& spec, const float* initial_params);
  // Sets up the model's history, recovery and step calls (after the spec
  // and layout are known).
  absl::Status PrepareModel(const ModelSpec& spec, const ModelLayout& layout);
  absl::Status CheckBuffer(size_t size, const char* what) const;
  // The segment and the shards' data planes for `layout` (kept across
  // re-registrations of the same layout).
  void PrepareTransports(const ModelLayout& layout);
  // The push recorded for `step` when the loss scaler has moved past it (a
  // retry of a step whose push went out and whose scaler moved since): it
  // goes again as it was, not a gradient scaled with the new scale. nullopt
  // without the scaler's move or a record.
  std::optional<PushedStep> RecordedPushTheScalerPassed(int64_t step) const;
  // What a synchronous push of `step` (Step, Push) sends: `flat_grads`
  // narrowed to the push type with the scale now; or, when the step's
  // decision already moved the scaler (a Step whose pull failed, again),
  // what was pushed, as it went, with the scale it was made with (the
  // shards' scaler replica checks it against that, and a gradient scaled
  // with the next step's scale would also replace it in the history).
  struct PreparedPush {
    double scale = 1.0;
    const void* payload = nullptr;  // Into one of the below, or flat_grads.
    std::vector<char> narrowed;
    std::shared_ptr<const std::vector<char>> recorded;
  };
  absl::Status PreparePush(int64_t step, absl::Span<const float> flat_grads,
                           PreparedPush* out) const;
  // SendHyperparameters unless the step may have started on some shard
  // (FAILED_PRECONDITION then).
  absl::Status SendUnlessStarted(v1::SetHyperparametersRequest request);
  absl::Status SendHyperparameters(v1::SetHyperparametersRequest request);
  // With gradient control: the decision of `step`, pushed with loss scale
  // `scale`, from every shard's statistics; journaled before any shard sees
  // it and taken into this trainer's scaler once per step (a retry of the
  // step does not move it again). Step and Pull after Push take it.
  bool ModelNeedsDecisions() const;
  absl::StatusOr<StepDecision> TakeStepDecision(int64_t step, double scale);
  // Pushes `payload` as step `step` (recording it first), recovering shards
  // that are behind.
  // `skip` (asynchronous modes): the step is skipped, `payload` unused.
  absl::StatusOr<StepResult> PushPayload(int64_t step, const void* payload, double loss_scale,
                                         bool skip = false);
  // Brings every shard to `target` (Recovery); after a rollback, re-attaches
  // and returns the RolledBackError.
  absl::Status Recover(int64_t target);
  // After `status` rolled the job back (RolledBackError): this trainer's
  // history, step count and registration follow, and rolled_back_to() is
  // set; returns `status`. Any other status is returned as it is.
  absl::Status FollowRollBack(absl::Status status);
  // The Checkpoint RPC of `step` on every shard, into `directory`, or into
  // the shards' periodic checkpoints when it is empty; the manifest any
  // shard reports ("" when none does). `end_on_wait_report`: a shard's
  // report that it still waits for `step` ends the call (its error).
  absl::StatusOr<std::string> CheckpointEveryShard(int64_t step, const std::string& directory,
                                                   bool end_on_wait_report);
  // Finish's checkpoint: every shard saves its part of the periodic
  // checkpoint of `step`; OK once one reports it committed.
  absl::Status SaveLastStep(int64_t step);
  // A (re)attaching trainer whose journal holds pushes past `version`, the
  // shards' (synchronous): those of steps the job gave up while this
  // trainer was away (a rollback to `version`: all after `version` + 1,
  // Recovery's NewestPushAfterRollBackAt) go, so that it pushes fresh
  // gradients for them and takes hyperparameter changes for them again.
  absl::Status ForgetPushesGivenUpAt(int64_t version);
  // PullToResume's way past a pipelined step that ran in part (see there);
  // sets `rolled_back` when the job rolled back.
  absl::StatusOr<int64_t> ResumeOverPartlyRunStep(int64_t from, absl::Span<float> flat_params,
                                                  std::optional<int64_t>* rolled_back);
  // A call to every shard made as the options say (retries, deadlines,
  // wait reports), `what` naming it in errors.
  ShardFanOut::Call CallFor(std::string what) const;
  StepResult ResultOfPush(int64_t step, const std::vector<v1::PushGradientsResponse>& responses,
                          DType wire_dtype) const;
  // ---- Asynchronous modes (trainer_client_async.cc).
  // The trainer's own gradient control (ModelConfig.consistency: clip by its
  // own norm, skip an overflow, of the wire type too, and back its scaler
  // off), then the push, still loss-scaled (the shards unscale it).
  absl::StatusOr<StepResult> AsyncPush(int64_t step, absl::Span<const float> flat_grads);
  absl::StatusOr<StepResult> AsyncStep(int64_t step, absl::Span<const float> flat_grads,
                                       absl::Span<float> flat_params);
  // Re-pushes, from the history, this trainer's steps before `step` that some
  // shard lacks (it restarted from a checkpoint) to that shard alone.
  absl::Status CatchUpShards(int64_t step);
  absl::StatusOr<int64_t> AsyncPull(absl::Span<float> flat_params,
                                    std::vector<PulledVersion>* each = nullptr);
  absl::StatusOr<int64_t> AsyncPullToResume(absl::Span<float> flat_params);
  // The newest checkpoint step reachable now: the highest step any shard
  // applied of any trainer.
  absl::StatusOr<int64_t> AsyncLatestCheckpointStep();

  // After a successful push: drops history no shard can need any more.
  void DropOldHistory(int64_t step, const std::vector<v1::PushGradientsResponse>& responses);

  // Rounds of recovery one call goes through before giving up (each round
  // follows a shard that went back again while the call ran).
  static constexpr int kMaxRecoveries = 10;

  TrainerClientOptions options_;
  std::vector<std::unique_ptr<ShardConnection>> shards_;
  // (Before fanout_, whose calls name it: destroyed after them.)
  mutable RunCanceller interrupt_;  // (Named by calls made in const methods.)
  std::unique_ptr<ShardFanOut> fanout_;
  std::unique_ptr<EarlyPull> early_pull_;  // With overlap_pull.
  std::shared_ptr<const TrainerSegment> segment_;                  // With shared memory.
  // The pairs' data planes besides the stream (shard order; empty: none),
  // and their parts of each kind.
  std::vector<std::shared_ptr<PayloadTransport>> transports_;
  std::vector<std::shared_ptr<PayloadTransport>> shared_memory_transports_;
  std::vector<std::shared_ptr<PayloadTransport>> socket_transports_;
  std::vector<std::shared_ptr<PayloadTransport>> device_pair_transports_;
  // StepOnDevice's state: the pairs' kind (null without pairs), the device
  // twins the pair transports use, and the host mirrors.
  const DevicePairKind* pair_kind_ = nullptr;
  std::shared_ptr<DeviceTwins> twins_ = std::make_shared<DeviceTwins>();
  std::vector<float> device_step_grads_, device_step_params_;
  bool tls_ = false;
  struct StreamedPush;  // client/streamed_push.h
  // Ends `push` without any shard committing it (see CancelStreamedPush).
  void Abandon(std::unique_ptr<StreamedPush> push);
  absl::Mutex streamed_mu_;  // MarkGradientReady may come from other threads.
  std::unique_ptr<StreamedPush> streamed_ ABSL_GUARDED_BY(streamed_mu_);
  int64_t streamed_pushes_ = 0;
  // Journaled pushes PullToResume sent again (counted in replayed_pushes();
  // read from other threads by tests).
  std::atomic<int64_t> resent_on_resume_{0};
  std::atomic<int64_t> caught_up_pushes_{0};  // CatchUpShards' re-pushes.
  int64_t changed_after_send_ = 0;
  std::optional<ModelLayout> layout_;
  std::optional<ModelSpec> spec_;
  int64_t registered_version_ = 0;
  int64_t last_pushed_step_ = 0;  // Highest step Push() was called with.
  std::optional<LossScaler> scaler_;
  int64_t scaler_step_ = 0;  // The last step whose decision updated scaler_.
  // The loss scale step scaler_step_ was pushed with (set once this process
  // took that decision): a retry of that step pushes with it again.
  std::optional<double> scaler_step_scale_;
  std::unique_ptr<PushHistory> history_;
  std::unique_ptr<Recovery> recovery_;
  std::unique_ptr<StepCalls> steps_;
  std::optional<int64_t> rolled_back_to_;
  // The step Push() sent with gradient control whose decision no call has
  // taken yet (0: none): Pull of that step takes it.
  int64_t undecided_push_ = 0;
  int64_t latest_inspected_version_ = 0;  // Highest shard version an Inspect saw.
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_TRAINER_CLIENT_H_
