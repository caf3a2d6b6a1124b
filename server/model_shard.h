// ModelShard: one model's optimizer state on one shard, and the synchronous
// step protocol around it. Knows nothing of gRPC; the service translates.
// The protocol's states and transitions are StepState's (server/step_state.h);
// ModelShard drives them under its lock and runs the backend's work.
//
// State: fp32 master parameters of this shard's flat range, the optimizer's
// slots, and one staging buffer per trainer. Versions: 0 is the initial
// values; applying step k makes version k.
//
// Push protocol (exactly once per (trainer, step)):
// - BeginPush(rank, step) answers at once for a step already applied
//   (kAlreadyApplied) or already pushed by this rank (kDuplicate); rejects a
//   step beyond version + 1 (OUT_OF_RANGE) or a rank whose push for
//   the step is in flight (ABORTED, retry later); otherwise hands out a
//   PushWriter that owns the rank's staging buffer.
// - The writer takes chunks in order; each is checked for size and for
//   NaN/inf before the next. Commit() marks the rank complete only if every
//   element arrived. A writer destroyed before Commit() (bad chunk, broken
//   stream) frees its slot: nothing of it is ever used.
// - The step reduces the T staging buffers in rank order (sum, then / T for
//   the mean), applies the optimizer on the thread pool, and publishes
//   version k. Arithmetic does not depend on arrival order.
// - Pipelined steps (options.pipeline_range_elements, a backend with range
//   support): the step runs range by range (StepState's ranges) as soon as
//   every trainer's gradient of a range has arrived, on whichever thread
//   needs progress (a writer, the last committer, a waiting pull). A push
//   refused or broken off after some of its ranges were applied keeps those
//   ranges (they are not applied again); the trainer's next push of the step
//   completes it. Without range support a step runs whole once every push is
//   committed.
//
// Asynchronous and bounded-staleness modes (options.consistency; the
// protocol's states are AsyncState's, server/async_state.h, driven in
// model_shard_async.cc): each trainer's push of its own step k is admitted
// once (k == its last applied step + 1), applied alone as an optimizer step
// of its own (ApplyOneRange: no reduction, no pipelining, no decisions),
// one at a time in commit order, and the push's call returns once it is
// applied (Commit waits, within its deadline, for the staleness bound and
// for checkpoint cuts). Versions count the pushes applied. A pull pins the
// newest version (ReadPin) so that no push is applied while it reads;
// pushes that became eligible are applied before a new pin is granted, so
// pulls cannot starve them. Checkpoints of step N are the uniform cut where
// every trainer's step N and no later one is applied (HoldStep holds it).
//
// Pulls: PullTarget picks the version a pull returns, WaitForRanges waits
// until the parameters of a piece reach it (range by range), ReadParameters
// copies a piece if it is at the expected version (else ABORTED), so a pull
// that spans an update is detected (SendParametersInPlace checks after its
// send, so the bytes already gone may be torn; the pull fails ABORTED).
// WaitForVersion waits for a whole version.
#ifndef SHARDOPT_SERVER_MODEL_SHARD_H_
#define SHARDOPT_SERVER_MODEL_SHARD_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/consistency.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "server/async_state.h"
#include "server/model_shard_handles.h"
#include "server/model_shard_types.h"
#include "server/parallel_for.h"
#include "server/step_state.h"
#include "server/step_timeline.h"
#include "server/update_backend.h"

namespace shardopt {

class ModelShard {
 public:
  class PushWriter;

  // Makes the backend that holds the shard's data, from the validated
  // initial values of the whole range.
  using BackendFactory = std::function<absl::StatusOr<std::unique_ptr<UpdateBackend>>(
      const ModelShardOptions& options, std::vector<float> initial_values)>;

  // `initial_values` holds the whole range (layout.ShardSize(shard_index) elements);
  // `options.optimizer` has been validated where it came in (PlanShard).
  // INVALID_ARGUMENT for no trainers, a shard index out of range, a wrong
  // size or a non-finite initial value; the factory's error otherwise.
  static absl::StatusOr<std::unique_ptr<ModelShard>> Create(ModelShardOptions options,
                                                            std::vector<float> initial_values,
                                                            const BackendFactory& backend);
  // The same with a CpuBackend on `pool` (which must outlive the shard).
  static absl::StatusOr<std::unique_ptr<ModelShard>> Create(ModelShardOptions options,
                                                            std::vector<float> initial_values,
                                                            ThreadPool* pool);
  // Makes CpuBackends on `pool`.
  static BackendFactory CpuBackendFactory(ThreadPool* pool);
  ~ModelShard();

  // Either `immediate` (nothing to send) or `writer` is set.
  struct PushStart {
    std::optional<PushResult> immediate;
    std::unique_ptr<PushWriter> writer;
  };
  // `dtype`: the element type of the chunks the writer will receive.
  // `loss_scale`: what the gradients were multiplied by (with loss scaling;
  // every trainer's push of a step must carry the same one).
  // `changes`: the hyperparameter changes the push carries (see
  // StepState::AdoptChanges), adopted first; INVALID_ARGUMENT or
  // FAILED_PRECONDITION for one that is invalid or cannot change the live
  // state.
  // `defer`: none of the push's elements count for a pipelined step's
  // ranges before Commit (PushHeader.defer_until_complete).
  // `skip`: asynchronous modes only (INVALID_ARGUMENT otherwise): the
  // trainer skips its step (PushHeader.skip_step); the writer takes no
  // chunk, and Commit applies the step as a no-op.
  absl::StatusOr<PushStart> BeginPush(uint32_t trainer_rank, int64_t step, uint64_t num_elements,
                                      DType dtype = DType::kFloat32, double loss_scale = 1.0,
                                      const std::vector<StepState::CarriedChange>& changes = {},
                                      bool defer = false, bool skip = false);

  // With gradient control: blocks until every trainer's gradient for `step`
  // is in (or the deadline, cancellation, shutdown) and returns this shard's
  // stats. Also answers for the last decided step. FAILED_PRECONDITION for
  // other steps or without gradient control.
  // `pushed`: the push (rank, step) the waiting trainer made; the wait ends
  // with OUT_OF_RANGE as soon as the shard no longer holds it (it was
  // dropped by a rollback to this version) instead of waiting on for a step
  // that cannot come.
  struct PushedBy {
    uint32_t rank = 0;
    int64_t step = 0;
  };
  // With `clip_decision` (trust norms: the clip half of the step's
  // decision, which passed CheckDecision), the shard takes that half,
  // measures its trust partials under it and returns them too
  // (StepStats.trust_partials); INVALID_ARGUMENT for a model without trust
  // norms or a skip, FAILED_PRECONDITION for another clip half than the
  // step's.
  absl::StatusOr<StepStats> WaitForStepStats(int64_t step, absl::Time deadline,
                                             const std::function<bool()>& cancelled,
                                             std::optional<PushedBy> pushed = std::nullopt,
                                             const StepDecision* clip_decision = nullptr);
  // Applies (or skips) `step` as decided. The first decision for a step is
  // applied; a repeat of it is OK; a different one is FAILED_PRECONDITION,
  // as is a step whose gradients are not all in. Returns once the step is
  // applied, or (`wait` false) once the decision is taken: the ranges are
  // then updated by whoever waits for them (WaitForRanges, WaitForVersion).
  // A decision that comes while its step is still being reduced waits for
  // that, until `deadline` (then DEADLINE_EXCEEDED saying what the step waits
  // for) or `cancelled()`.
  // With trust norms (LAMB on the flat partition), a decision that applies
  // the step carries every tensor's norms (INVALID_ARGUMENT without them, or
  // when they contradict this shard's own partials, state untouched); the
  // shard measures its partials under the clip half first if it has not.
  absl::Status Decide(int64_t step, const StepDecision& decision, bool wait = true,
                      absl::Time deadline = absl::InfiniteFuture(),
                      const std::function<bool()>& cancelled = nullptr);

  // Returns the version reached (>= min_version). DEADLINE_EXCEEDED at
  // `deadline`, CANCELLED once `cancelled()` is true (polled), UNAVAILABLE
  // after Shutdown().
  // `pushed` as in WaitForStepStats.
  absl::StatusOr<int64_t> WaitForVersion(int64_t min_version, absl::Time deadline,
                                         const std::function<bool()>& cancelled,
                                         std::optional<PushedBy> pushed = std::nullopt);

  // The version a pull asking for `min_version` returns: waits until step
  // `min_version` is at most the next one; then `min_version`, or the next
  // version if some range already reached it. Errors as WaitForVersion.
  // Asynchronous modes: waits until the version is >= min_version and no
  // push that may be applied waits, then returns the newest version and sets
  // `pin` (required there) so that it stays until the pin is released.
  absl::StatusOr<int64_t> PullTarget(int64_t min_version, absl::Time deadline,
                                     const std::function<bool()>& cancelled,
                                     std::optional<PushedBy> pushed = std::nullopt,
                                     ReadPin* pin = nullptr);
  // Waits until parameters [offset, offset + count) are at `version` or
  // later, running range work that is ready meanwhile. Errors as
  // WaitForVersion.
  absl::Status WaitForRanges(int64_t version, uint64_t offset, uint64_t count, absl::Time deadline,
                             const std::function<bool()>& cancelled,
                             std::optional<PushedBy> pushed = std::nullopt);

  // Copies parameters [offset, offset + count) of the range into `out`, as
  // `dtype` (rounded to nearest even for the 16-bit types). ABORTED when the
  // parameters are no longer at `version`.
  absl::Status ReadParameters(int64_t version, uint64_t offset, uint64_t count, float* out);
  absl::Status ReadParameters(int64_t version, uint64_t offset, uint64_t count, DType dtype,
                              void* out);
  // The same in fp32 into `own_out` in the backend's own memory
  // (UpdateBackend::ReadOwn; a GPU's for a GPU backend): what the device data
  // plane sends.
  absl::Status ReadParametersInOwnMemory(int64_t version, uint64_t offset, uint64_t count,
                                         float* own_out);
  // Synchronous models: calls `send` with the fp32 parameters [offset,
  // offset + count) at `version` where they lie in host memory, without a
  // copy and without holding a lock while it runs (a trainer's socket may
  // drain slowly), then checks that they are still at `version`: ABORTED,
  // as a read, when they moved meanwhile (only a caller that is not one of
  // the trainers can see that: an update needs every trainer's next push).
  // false, without calling it, where the parameters are not in host memory
  // or the model is asynchronous.
  absl::StatusOr<bool> SendParametersInPlace(
      int64_t version, uint64_t offset, uint64_t count,
      const std::function<absl::Status(const float* params)>& send);

  // Statistics of every tensor piece (or only `tensor_name`'s, NOT_FOUND if
  // it has none here) and values [slice_offset, slice_offset + slice_length)
  // clipped to the range (OUT_OF_RANGE when slice_offset is past the end).
  // Without `with_tensor_stats` only the version, ranks and byte counts are
  // filled (cheap: no pass over the parameters).
  absl::StatusOr<ShardSnapshot> Snapshot(const std::string& tensor_name, uint64_t slice_offset,
                                         uint32_t slice_length, bool with_tensor_stats);

  // From step `effective_step` on, use `next` (validated by the caller; it
  // must fit the live state: OptimizerConfig::CheckCanChangeTo). FAILED_PRECONDITION
  // when that step is applied or being applied, or has another change
  // scheduled or in force; an identical repeat is OK, also after the change
  // took effect. Shards decide alone: a request for a step some shard has
  // already applied is accepted by the others, so callers must name a step
  // that no trainer has pushed yet (then every shard accepts it and switches
  // at that step); TrainerClient enforces that.
  absl::Status SetHyperparameters(int64_t effective_step, const Hyperparameters& next);
  // Removes the change scheduled for `effective_step`, if any (OK when there
  // is none); FAILED_PRECONDITION once it has taken effect.
  absl::Status CancelHyperparameters(int64_t effective_step);

  // Keeps step `step` + 1 from being applied once the shard reaches version
  // `step`, for as long as the StepHold lives (see CheckpointAt).
  using StepHold = shardopt::StepHold;
  StepHold HoldStep(int64_t step);

  // Runs `write` with the shard's progress and a reader of its state exactly
  // at version `step`, after waiting (up to `deadline`, or until
  // `cancelled()`) for that version: step `step` + 1 is not applied until
  // `write` returns, so every shard asked for the same step saves the same
  // step boundary. `held`: a hold of `step` the caller took earlier (else
  // one is taken now); released when this returns, whatever the outcome.
  // Periodic checkpoints take the next one's hold before calling, so that no
  // boundary slips past between two of them. FAILED_PRECONDITION when the
  // shard is already past `step`. `write`'s error is returned as is.
  absl::Status CheckpointAt(
      int64_t step, absl::Time deadline, const std::function<bool()>& cancelled,
      const std::function<absl::Status(const ShardProgress&, const ShardStateReadFn&)>& write,
      StepHold held = StepHold());

  // Sets a shard just created (no push yet) to a saved state: the progress,
  // and every optimizer slot read through `read_slot` (range-local offsets;
  // the parameters came as Create's initial values). FAILED_PRECONDITION once
  // the shard has taken a push.
  absl::Status Restore(const ShardProgress& progress, const ShardStateReadFn& read_slot);

  // OK when the shard has applied `step` or holds `trainer_rank`'s complete
  // push of it; OUT_OF_RANGE otherwise (it lost the push: restarted).
  absl::Status CheckHoldsPush(uint32_t trainer_rank, int64_t step) const;

  // What a (re)attaching trainer needs, read at once.
  struct AttachInfo {
    int64_t version = 0;
    std::optional<LossScaler::State> loss_scaler;  // At `version`.
    std::string run_id;
  };
  AttachInfo GetAttachInfo() const;

  int64_t version() const;
  // The step a checkpoint is named by that the shard is at: the version
  // (synchronous), else the lowest step every trainer has applied.
  int64_t checkpoint_step() const;
  bool asynchronous() const { return IsAsynchronous(options_.consistency); }
  // The lr of the step that made `version` when known (the current version,
  // or the next while it is applied range by range), else 0.
  double LrOfVersion(int64_t version) const;
  // With options.step_timeline: the newest step every range of which was
  // pulled.
  std::optional<StepTimes> NewestTimeline() const;
  // Drops the pushes held for step version + 1 (see StepState::DiscardPending);
  // ABORTED when `at_version` >= 0 and the shard is no longer there (a step
  // completed since the caller looked).
  absl::Status DiscardPendingPushes(int64_t at_version = -1);
  // Wakes every waiter with UNAVAILABLE; later waits fail at once.
  void Shutdown();

  const ModelShardOptions& options() const { return options_; }
  std::string device() const { return backend_->device(); }
  const ModelLayout& layout() const { return options_.layout; }
  FlatRange range() const { return range_; }
  uint64_t size() const { return range_.size(); }
  // Where the backend keeps its numbers, and its device ("cpu", "cuda:0").
  PairMemory own_memory() const { return backend_->own_memory(); }
  std::string backend_device() const { return backend_->device(); }

 private:
  friend class shardopt::StepHold;
  friend class shardopt::ReadPin;
  ModelShard(ModelShardOptions options, std::unique_ptr<UpdateBackend> backend);

  // ---- Asynchronous modes (model_shard_async.cc).
  absl::StatusOr<PushStart> BeginAsyncPush(uint32_t trainer_rank, int64_t step, DType dtype,
                                           double loss_scale,
                                           const std::vector<StepState::CarriedChange>& changes,
                                           bool skip);
  // Queues the push and returns once it is applied (running applications
  // meanwhile); at `deadline`, cancellation or shutdown a push still queued
  // is withdrawn (DEADLINE_EXCEEDED saying what it waited for, CANCELLED,
  // UNAVAILABLE).
  absl::StatusOr<PushResult> CommitAsyncPush(uint32_t rank, int64_t step, bool skip,
                                             double loss_scale, absl::Time deadline,
                                             const std::function<bool()>& cancelled);
  // A push may be applied now (none is, no pull pins the parameters).
  bool AsyncWorkReady() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Claims the next eligible push and applies it with mu_ released.
  void RunOneAsyncApply() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until `ready()` (OK), running applications meanwhile; else as
  // AwaitOrCancel, or the failure, or UNAVAILABLE at shutdown.
  absl::Status AwaitAsync(const std::function<bool()>& ready, absl::Time deadline,
                          const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<int64_t> AsyncPullTarget(int64_t min_version, absl::Time deadline,
                                          const std::function<bool()>& cancelled,
                                          const std::optional<PushedBy>& pushed, ReadPin* pin);
  // OUT_OF_RANGE once the shard no longer holds `pushed` (it restarted).
  absl::Status AsyncCheckHolds(const std::optional<PushedBy>& pushed) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits for the uniform cut of `step` (CheckpointAt); the progress to save.
  absl::StatusOr<ShardProgress> AwaitAsyncCut(int64_t step, absl::Time deadline,
                                              const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Synchronous: waits for version `step` (CheckpointAt); the progress to
  // save.
  absl::StatusOr<ShardProgress> AwaitStepBoundary(int64_t step, absl::Time deadline,
                                                  const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Restore's checks, in either mode.
  absl::Status CheckRestoreLocked(const ShardProgress& progress) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Puts a record CheckRestoreLocked accepted in place.
  void RestoreAsyncProgress(const ShardProgress& progress) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // FAILED_PRECONDITION naming `what` for calls the asynchronous modes lack.
  absl::Status NotInAsyncMode(const char* what) const;

  // Waits until `ready` holds (OK), the deadline passes (DEADLINE_EXCEEDED)
  // or `cancelled()` says so (CANCELLED; polled without holding mu_).
  absl::Status AwaitOrCancel(const absl::Condition& ready, absl::Time deadline,
                             const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The one wait of pulls, statistics and checkpoints: until `ready()` holds
  // or the shard shuts down or fails (OK), else as AwaitOrCancel.
  // Range work that becomes ready meanwhile is run by the waiter; with
  // `stop_at_shutdown` false the wait goes on through a shutdown (a step
  // already committed is finished).
  template <typename Ready>
  absl::Status AwaitState(const Ready& ready, absl::Time deadline,
                          const std::function<bool()>& cancelled, bool stop_at_shutdown = true)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    const auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return (stop_at_shutdown && shutdown_) || state_.failed() || ready();
    };
    const auto done_or_work = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
      return done() || state_.CanClaim(shutdown_);
    };
    for (;;) {
      if (absl::Status s = AwaitOrCancel(absl::Condition(&done_or_work), deadline, cancelled);
          !s.ok()) {
        return s;
      }
      if (done()) return absl::OkStatus();
      RunOneRange();
    }
  }
  // Claims the next range's work, if any, and runs it with mu_ released.
  void RunOneRange() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Runs range work until none is ready (pushes call it as ranges arrive).
  void RunReadyRanges() ABSL_LOCKS_EXCLUDED(mu_);
  absl::Status RunRangeWork(const StepState::RangeWork& work, std::vector<double>* block_sums,
                            std::vector<TrustPartial>* trust_partials);
  // Trust norms: takes `clip`, the clip half of `step`'s decision, and waits
  // until this shard measured its trust partials under it.
  absl::Status MeasureUnderClip(int64_t step, const StepDecision& clip, absl::Time deadline,
                                const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Waits until a decision of `step` may be taken (DecisionMayProceed).
  absl::Status AwaitDecisionRoom(int64_t step, absl::Time deadline,
                                 const std::function<bool()>& cancelled)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The version every range of [offset, offset + count) is at, or -1 when
  // they differ.
  // (Under params_mu_ and the locks of those ranges, shared.)
  int64_t ParamsVersion(uint64_t offset, uint64_t count) const
      ABSL_SHARED_LOCKS_REQUIRED(params_mu_);
  // The one wait of pulls: OK once `reached()` holds; else the failure, or
  // UNAVAILABLE at shutdown, OUT_OF_RANGE once the shard no longer holds
  // `pushed`, DEADLINE_EXCEEDED saying what version `version` waits for.
  absl::Status AwaitPullable(const std::function<bool()>& reached, int64_t version,
                             absl::Time deadline, const std::function<bool()>& cancelled,
                             const std::optional<PushedBy>& pushed)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // INVALID_ARGUMENT for a rank the model has no trainer of.
  absl::Status CheckRank(uint32_t trainer_rank) const;
  // DEADLINE_EXCEEDED saying what `what` waited for: the trainers that have
  // not pushed, the decision, the checkpoint.
  absl::Status WaitExpired(const std::string& what, int64_t min_version) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::StatusOr<PushResult> CommitPush(uint32_t rank, int64_t step, bool found_inf,
                                        double loss_scale);
  // Records a writer's progress and runs the ranges it made ready.
  void RecordDelivered(uint32_t rank, int64_t step, uint64_t delivered,
                       std::optional<uint64_t> first_inf);
  void AbortPush(uint32_t rank, int64_t step);
  // With the timeline: the ranges that arrived since `arrived_before` of
  // them had (StepState::RangesArrived).
  void RecordArrivals(int64_t step, size_t arrived_before) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Describes flat-range element `index` as "tensor 'w'[12]" for messages.
  std::string DescribeElement(uint64_t index) const;

  const ModelShardOptions options_;
  const FlatRange range_;

  // Lock order: mu_ before params_mu_. Work on the backend's data (reduce,
  // update, reads) runs without mu_.
  mutable absl::Mutex mu_ ABSL_ACQUIRED_BEFORE(params_mu_);
  StepState state_ ABSL_GUARDED_BY(mu_);
  // The ranges' geometry (StepState's, fixed at construction).
  const uint64_t range_elements_;
  const size_t range_count_;
  bool shutdown_ ABSL_GUARDED_BY(mu_) = false;
  // Asynchronous modes only: the protocol's state, and the pulls pinning
  // the parameters (ReadPin).
  std::optional<AsyncState> async_ ABSL_GUARDED_BY(mu_);
  int read_pins_ ABSL_GUARDED_BY(mu_) = 0;
  // The lr of the newest trainer step applied (see RunOneAsyncApply).
  double last_async_lr_ ABSL_GUARDED_BY(mu_) = 0;
  // When each trainer's last push was applied (Inspect's activity).
  std::vector<std::optional<absl::Time>> async_push_times_ ABSL_GUARDED_BY(mu_);
  // Per trainer: its queued push is a skipped step. And the skipped steps
  // applied so far (the optimizer's step count is the version less them).
  std::vector<bool> async_skip_ ABSL_GUARDED_BY(mu_);
  // Per trainer: the loss scale its queued push was made with (unscaled here).
  std::vector<double> async_loss_scale_ ABSL_GUARDED_BY(mu_);
  int64_t async_skipped_ ABSL_GUARDED_BY(mu_) = 0;

  // Guards the backend's parameters and optimizer state in two levels, so
  // that a pull can read a range that is done while the next range is
  // updated: range work and reads hold params_mu_ shared and then the
  // locks of their ranges (RangeLocks: in index order, an update
  // exclusively, a read shared); a restore holds params_mu_ exclusively.
  // Staging of rank r is written only by rank r's PushWriter while its slot
  // is kReceiving, at elements no claimed range holds, and read only by
  // range work, so it needs no lock.
  mutable absl::Mutex params_mu_;
  std::unique_ptr<absl::Mutex[]> range_mu_;
  // [i]: the version range i holds; written under range_mu_[i] exclusively
  // (or params_mu_ exclusively), read under either shared.
  std::vector<int64_t> range_versions_;
  // Holds the locks of ranges [first, last) for its lifetime.
  class RangeLocks {
   public:
    RangeLocks(const ModelShard& shard, size_t first, size_t last, bool exclusive)
        : shard_(shard), first_(first), last_(last), exclusive_(exclusive) {
      for (size_t i = first_; i < last_; ++i) {
        if (exclusive_) {
          shard_.range_mu_[i].Lock();
        } else {
          shard_.range_mu_[i].ReaderLock();
        }
      }
    }
    ~RangeLocks() {
      for (size_t i = last_; i > first_; --i) {
        if (exclusive_) {
          shard_.range_mu_[i - 1].Unlock();
        } else {
          shard_.range_mu_[i - 1].ReaderUnlock();
        }
      }
    }
    RangeLocks(const RangeLocks&) = delete;
    RangeLocks& operator=(const RangeLocks&) = delete;

   private:
    const ModelShard& shard_;
    const size_t first_, last_;
    const bool exclusive_;
  };
  absl::Status ReadParametersInto(int64_t version, uint64_t offset, uint64_t count, DType dtype,
                                  void* out, bool own_memory);
  // A pull's piece went: the bytes sent (metrics) and the timeline.
  void NotePulled(int64_t version, uint64_t offset, uint64_t count, uint64_t bytes);
  std::unique_ptr<UpdateBackend> backend_;

  std::unique_ptr<StepTimeline> timeline_;  // With options.step_timeline.

  std::atomic<uint64_t> gradient_bytes_received_{0};
  std::atomic<uint64_t> parameter_bytes_sent_{0};
};

// Receives one trainer's gradient for one step into its staging buffer.
class ModelShard::PushWriter {
 public:
  ~PushWriter();
  PushWriter(const PushWriter&) = delete;
  PushWriter& operator=(const PushWriter&) = delete;

  // Where Write's bytes lie: the shard's own (a message it received), or
  // memory the trainer can still write while they are read (its shared
  // segment), whose padding is checked on the staged copy instead, so that
  // what is staged is what was checked.
  enum class Source { kShardOwned, kTrainerWritable };
  // `bytes` of little-endian elements of the push's dtype starting at
  // range-local element `offset`, which must be where the previous chunk
  // ended. INVALID_ARGUMENT otherwise, or when the chunk overruns the range,
  // holds a NaN/inf, or anything but +0/-0 on a padding element.
  absl::Status Write(uint64_t offset, const void* data, size_t bytes,
                     Source source = Source::kShardOwned);

  // The next `count` elements received in place, without Write's copy: an
  // fp32 push whose elements from received() on are neither consumed
  // already nor beyond the range, on a backend that stages in this
  // process's memory, gets where they go (nullptr otherwise: use Write).
  // The caller fills all `count` of them, then calls WriteReceived(count),
  // which checks them as Write checks a chunk; until it returns OK they
  // count for nothing (a push refused or broken off there leaves only its
  // own undelivered staging written).
  float* ReceiveInPlace(uint64_t count);
  // The same in the backend's own memory (UpdateBackend::OwnStaging, maybe
  // a GPU's) when that is `memory`, for the device data plane; nullptr
  // otherwise. WriteReceived checks the elements where they landed.
  void* ReceiveInOwnMemory(uint64_t count, PairMemory memory);
  absl::Status WriteReceived(uint64_t count);
  uint64_t received() const { return received_; }

  // INVALID_ARGUMENT unless every element arrived. In the asynchronous
  // modes it returns once the push is applied, waiting until `deadline` or
  // `cancelled()` (see ModelShard's header comment).
  absl::StatusOr<PushResult> Commit(absl::Time deadline = absl::InfiniteFuture(),
                                    const std::function<bool()>& cancelled = nullptr);

 private:
  friend class ModelShard;
  // Write's checks of chunk [offset, offset + count) before staging: order
  // and size.
  absl::Status CheckChunk(uint64_t offset, uint64_t count) const;
  // The padding spans among range-local [offset, offset + count), range-local.
  std::vector<FlatRange> PaddingSpans(uint64_t offset, uint64_t count) const;
  // The first padding element (flat index) among rank's staged range-local
  // [offset, offset + count) holding anything but +0/-0, read where the copy
  // landed.
  absl::StatusOr<std::optional<uint64_t>> FindStagedPadding(uint64_t offset, uint64_t count) const;
  // The refusal of a push with `value` on padding element `flat_index`.
  absl::Status PaddingRefused(uint64_t flat_index, float value) const;
  bool CanReceiveInPlace(uint64_t count) const;
  // Its bookkeeping after staging: `bad` is the chunk's first NaN/inf among
  // its staged elements [skip, count) (count when none), `value_of` reads
  // element i of the chunk as a float for the refusal's message.
  absl::Status Admit(uint64_t offset, uint64_t count, uint64_t skip, uint64_t bad,
                     const std::function<float(uint64_t)>& value_of);

  PushWriter(ModelShard* shard, uint32_t rank, int64_t step, DType dtype, double loss_scale,
             uint64_t consumed, bool defer, bool skip = false)
      : shard_(shard),
        rank_(rank),
        step_(step),
        dtype_(dtype),
        loss_scale_(loss_scale),
        consumed_(consumed),
        defer_(defer),
        skip_(skip) {}

  ModelShard* const shard_;
  const uint32_t rank_;
  const int64_t step_;
  const DType dtype_;
  const double loss_scale_;
  // Leading elements an earlier push of the step delivered and ranges
  // already consumed: received again, checked for size, not staged.
  const uint64_t consumed_;
  const bool defer_;  // Delivered only at Commit.
  const bool skip_;   // A skipped step (asynchronous): no chunks.
  uint64_t received_ = 0;
  std::optional<uint64_t> first_inf_;  // With defer_: reported at Commit.
  bool finished_ = false;
  bool found_inf_ = false;  // With loss scaling: inf/NaN seen, and kept.
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_MODEL_SHARD_H_
