// TrainerClient: what a trainer process links to train against shardopt.
//
// One TrainerClient is one trainer (rank r of T) of one model, connected to
// the model's S shard servers (addresses in shard order). It never includes
// server code: it speaks only the wire contract in proto/.
//
//   auto client = TrainerClient::Connect(addresses, options);   // rank, model
//   (*client)->Register(spec, initial_flat_params);  // rank 0
//   (*client)->Attach(spec);                         // every other rank
//   for (step = 1..N):
//     compute grads into a flat buffer laid out by (*client)->layout()
//     (*client)->Step(step, grads, params);  // push to all shards, pull version `step`
//
// Tensors live in flat buffers of layout().total_elements() floats (see
// common/layout.h); the client slices them by shard, talks to all shards
// concurrently, streams chunks of `chunk_bytes`, and writes pulled values
// straight into the caller's buffer. Calls that are idempotent on the server
// (register, attach, push per (rank, step), pull) are retried with
// exponential backoff on UNAVAILABLE, ABORTED and DEADLINE_EXCEEDED of a
// single attempt. Errors name the shard, its address and the cause. A
// TrainerClient is not thread-safe: one trainer thread drives it.
#ifndef SHARDOPT_CLIENT_TRAINER_CLIENT_H_
#define SHARDOPT_CLIENT_TRAINER_CLIENT_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"
#include "client/retry.h"
#include "common/dtype.h"
#include "common/layout.h"
#include "common/loss_scaler.h"
#include "common/lr_schedule.h"
#include "common/optimizer_config.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace grpc {
class ClientContext;
}  // namespace grpc

namespace shardopt {
namespace v1 {
class PushGradientsResponse;
}  // namespace v1
class PayloadPins;

enum class GradientReduction { kMean, kSum };

// The model every trainer of a job declares identically.
struct ModelSpec {
  std::string model_id;
  std::vector<TensorSpec> tensors;
  uint32_t alignment = 0;  // 0: ModelLayout::kDefaultAlignment.
  OptimizerConfig optimizer;
  LrSchedule lr_schedule;  // Default: constant (optimizer.lr every step).
  // Gradient control (GradientControl in the proto): with either on, Step()
  // fetches every shard's statistics and sends all shards one decision.
  double max_grad_norm = 0;   // > 0: clip the global L2 norm to this.
  bool loss_scaling = false;  // Dynamic loss scaling (see LossScaler).
  LossScalerOptions loss_scaler;
  uint32_t num_trainers = 1;
  GradientReduction reduction = GradientReduction::kMean;
};

struct TrainerClientOptions {
  uint32_t trainer_rank = 0;
  // Deadline of each single RPC attempt (a pull waiting for slower trainers
  // counts against it).
  absl::Duration rpc_timeout = absl::Seconds(60);
  // Total time a call keeps retrying retryable failures.
  absl::Duration retry_budget = absl::Seconds(60);
  absl::Duration initial_backoff = absl::Milliseconds(20);
  absl::Duration max_backoff = absl::Seconds(2);
  // How long Attach() waits for rank 0 to register the model.
  absl::Duration attach_timeout = absl::Seconds(60);
  // Bytes of tensor data per streamed message.
  size_t chunk_bytes = 4 << 20;
  // Element types on the wire. Trainer buffers stay fp32; with bf16 / fp16
  // the client rounds gradients to nearest even before pushing (refusing a
  // step whose gradient overflows the type) and widens pulled parameters
  // exactly. The server's master weights and optimizer state stay fp32.
  DType push_dtype = DType::kFloat32;
  DType pull_dtype = DType::kFloat32;
  // Crash recovery: keep this trainer's gradients (as pushed) and decisions
  // of the last `replay_steps` steps. A shard restarted from a checkpoint at
  // version v refuses later steps (OUT_OF_RANGE); the client then re-pushes
  // steps v + 1 .. (each applied once, however many trainers re-push) and
  // goes on. Make it larger than the servers' --checkpoint_every (twice that
  // also covers a crash during a checkpoint). 0: off (a restarted shard then
  // fails the step). Costs replay_steps gradient copies of memory.
  int replay_steps = 0;
  // Trainer restarts: before each push, the gradient is saved to this file
  // (see client/push_journal.h); a restarted trainer that finds the shards
  // one step apart because it died mid-push re-sends it to the shards that
  // missed it. Empty: off. Give each trainer its own file.
  std::string journal_path;
};

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
  // instead of assuming the initial values). FAILED_PRECONDITION when a
  // shard holds a different model under the same id.
  absl::Status Register(const ModelSpec& spec, absl::Span<const float> initial_params);
  // Joins a model that another trainer registers, waiting up to
  // attach_timeout for it to appear on every shard.
  absl::Status Attach(const ModelSpec& spec);

  // The layout `spec` gets on this client's shards: where rank 0 puts the
  // initial values it passes to Register. INVALID_ARGUMENT for a bad spec.
  absl::StatusOr<ModelLayout> LayoutFor(const ModelSpec& spec) const;

  // Valid after Register or Attach.
  const ModelLayout& layout() const { return *layout_; }
  uint32_t trainer_rank() const { return options_.trainer_rank; }
  uint32_t shard_count() const { return static_cast<uint32_t>(shards_.size()); }
  // The shard versions seen by the last Register/Attach (min over shards).
  int64_t registered_version() const { return registered_version_; }

  // Pushes this trainer's gradient for `step` to every shard.
  absl::StatusOr<StepResult> Push(int64_t step, absl::Span<const float> flat_grads);
  // Pulls every shard's parameters at version >= min_version into
  // `flat_params`; returns the version (the same on every shard, else
  // FAILED_PRECONDITION).
  absl::StatusOr<int64_t> Pull(int64_t min_version, absl::Span<float> flat_params);
  // The loss scale to multiply this step's loss (or gradients) by: 1 without
  // loss scaling. Step() updates it from the step's outcome.
  double loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

  // Push(step) then Pull(step); with gradient control, in between, every
  // shard's statistics and one decision for all of them (StepResult says it).
  absl::StatusOr<StepResult> Step(int64_t step, absl::Span<const float> flat_grads,
                                  absl::Span<float> flat_params);

  // From step `effective_step` on, every shard uses `optimizer` and
  // `lr_schedule` (same optimizer kind; see SetHyperparametersRequest in the
  // proto). Safe to call from several trainers with the same arguments.
  // `effective_step` must be later than every step this trainer has pushed
  // (FAILED_PRECONDITION otherwise): since no shard can apply a step before
  // every trainer has pushed it, every shard then accepts the change.
  absl::Status SetHyperparameters(int64_t effective_step, const OptimizerConfig& optimizer,
                                  const LrSchedule& lr_schedule);
  // Removes a change scheduled for `effective_step` on every shard.
  absl::Status CancelHyperparameters(int64_t effective_step);

  // Every shard saves the model at version `step` (-1: the latest version
  // any shard has reached; shards behind it wait for it) into `directory`
  // (a filesystem all shards share; see docs/checkpoints.md). Returns the
  // committed manifest's path.
  absl::StatusOr<std::string> Checkpoint(const std::string& directory, int64_t step = -1);
  // Every shard's InspectResponse for the model, as JSON (protobuf's
  // mapping, field names as in the proto), in shard order.
  absl::StatusOr<std::vector<std::string>> InspectJson();

  // Earlier steps re-pushed to restarted shards so far (see replay_steps).
  int64_t replayed_pushes() const { return replayed_pushes_.load(); }
  // Attempts of calls to shards (register, attach, push, pull, statistics,
  // hyperparameters, checkpoints) that failed UNAVAILABLE or
  // DEADLINE_EXCEEDED so far: the shard was down, unreachable, or slower
  // than rpc_timeout (such attempts are retried within retry_budget). In
  // all, or to shard `shard` only.
  int64_t failed_attempts() const;
  int64_t failed_attempts(size_t shard) const;

  // A zero-filled flat buffer of the layout's size.
  std::vector<float> NewFlatBuffer() const;

 private:
  struct Shard;
  TrainerClient(const TrainerClientOptions& options, std::vector<std::unique_ptr<Shard>> shards);

  absl::Status RegisterOrAttach(const ModelSpec& spec,
                                std::optional<absl::Span<const float>> initial_params);
  absl::Status CheckBuffer(size_t size, const char* what) const;
  RetryPolicy DefaultRetryPolicy() const;
  // Runs `call` against every shard concurrently: each attempt gets its own
  // context and deadline (rpc_timeout), failures `retryable` accepts are
  // retried under `policy`, errors name `what` and the shard, and the first
  // shard to fail for good cancels the calls to the others.
  // With `catch_up.last_step` >= 0, a shard that answers OUT_OF_RANGE (it
  // is behind: restarted from a checkpoint) is caught up through that step
  // (see CatchUp) before the next attempt, whose deadline starts after it.
  struct CatchUpPlan {
    int64_t last_step = -1;
    bool wait_for_last = false;
  };
  absl::Status CallEveryShard(
      const std::string& what, const RetryPolicy& policy,
      const std::function<absl::Status(Shard&, grpc::ClientContext&)>& call,
      const std::function<bool(const absl::Status&)>& retryable = IsRetryable,
      CatchUpPlan catch_up = {-1, false});
  absl::Status SendHyperparameters(v1::SetHyperparametersRequest request);
  struct Decision {
    bool skip = false;
    double clip_coef = 1.0;
    double grad_norm = 0;
  };
  absl::StatusOr<Decision> DecideStep(int64_t step);
  // `lr` (if set) receives the lr of the pulled version.
  absl::StatusOr<int64_t> PullInternal(int64_t min_version, absl::Span<float> flat_params,
                                       const Decision* decision, double* lr = nullptr);
  // One attempt of a push (`payload`: the whole flat gradient in
  // `wire_dtype`) or of a pull (into the shard's part of the flat buffer).
  absl::Status PushToShard(Shard& shard, grpc::ClientContext& context, int64_t step,
                           const void* payload, DType wire_dtype, double loss_scale,
                           PayloadPins* pins, v1::PushGradientsResponse* response);
  // A push outside CallEveryShard (replays): its own context, pins waited for.
  absl::Status PushOnce(Shard& shard, int64_t step, const void* payload, DType wire_dtype,
                        double loss_scale, v1::PushGradientsResponse* response);
  absl::Status PullFromShard(Shard& shard, grpc::ClientContext& context, int64_t min_version,
                             const Decision* decision, int64_t pushed_step, float* destination,
                             int64_t* version, double* lr);

  // Crash recovery (see TrainerClientOptions::replay_steps).
  struct PushedStep {
    int64_t step = 0;
    DType dtype = DType::kFloat32;
    double loss_scale = 1.0;
    // Shared: a catch-up copies the entry, not the gradient.
    std::shared_ptr<const std::vector<char>> payload;
    std::optional<Decision> decision;
  };
  // OUT_OF_RANGE with replay on: the shard is behind this trainer.
  bool IsBehind(const absl::Status& status) const;
  // Notes a shard that is behind (its next attempt catches it up); returns
  // `status`.
  absl::Status MarkIfBehind(Shard& shard, const absl::Status& status);
  void Remember(int64_t step, const void* payload, size_t bytes, double loss_scale);
  void RememberDecision(int64_t step, const Decision& decision);
  // Re-pushes to `shard` every remembered step after its version up to
  // `last_step`, waiting for each to be applied (the last one only if
  // `wait_for_last`).
  absl::Status CatchUp(Shard& shard, int64_t last_step, bool wait_for_last);
  // Re-sends this trainer's journaled push to the shards at the lower of two
  // adjacent versions when it is the push of the higher one (see
  // journal_path).
  absl::Status ReplayJournal(const std::string& model_id, const ModelLayout& layout,
                             const std::vector<int64_t>& versions);
  // With gradient control: waits until `shard` holds every trainer's
  // gradient of `step` (or has decided it), so that its decision is taken.
  absl::Status AwaitAllGradients(Shard& shard, int64_t step);

  TrainerClientOptions options_;
  std::vector<std::unique_ptr<Shard>> shards_;
  std::optional<ModelLayout> layout_;
  std::string model_id_;
  int64_t registered_version_ = 0;
  int64_t last_pushed_step_ = 0;  // Highest step Push() was called with.
  double max_grad_norm_ = 0;
  bool needs_decision_ = false;
  std::optional<LossScaler> scaler_;
  absl::Mutex history_mu_;  // Shards catch up concurrently.
  std::deque<PushedStep> history_ ABSL_GUARDED_BY(history_mu_);
  // Hyperparameter changes sent (by effective step), for restarted shards.
  std::map<int64_t, v1::SetHyperparametersRequest> changes_ ABSL_GUARDED_BY(history_mu_);
  std::atomic<int64_t> replayed_pushes_{0};
  int64_t latest_inspected_version_ = 0;  // Highest shard version InspectJson saw.
  int64_t scaler_step_ = 0;               // The last step whose decision updated scaler_.
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_TRAINER_CLIENT_H_
