// StepCalls: one round of a step's calls to every shard at once - the push,
// the statistics (with gradient control), the pull - without recovery. A
// shard that lacks an earlier step, or this trainer's push of the step,
// answers OUT_OF_RANGE at once (the calls carry the step this trainer
// pushed), which ends the round on every shard; TrainerClient then runs
// Recovery and repeats the round (every call of it is idempotent).
#ifndef SHARDOPT_CLIENT_STEP_CALLS_H_
#define SHARDOPT_CLIENT_STEP_CALLS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "client/retry.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "common/dtype.h"
#include "common/step_protocol.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

struct StepCallsContext {
  std::string model_id;
  uint32_t trainer_rank = 0;
  absl::Duration rpc_timeout = absl::Seconds(60);
  absl::Duration streamed_push_timeout = absl::Minutes(15);  // Pushes with ReadyRanges.
  RetryPolicy policy;
  absl::Duration wait_report_interval = absl::Seconds(5);
  std::function<void(const std::string&)> on_wait;
  size_t chunk_bytes = 4 << 20;
  DType pull_dtype = DType::kFloat32;
  bool send_loss_scale = false;  // The model uses loss scaling.
  std::string label;             // Prefixes what errors and reports say ("recovery: ").
  bool end_on_wait_report = false;  // See ShardFanOut::Call.
  RunCanceller* canceller = nullptr;  // See ShardFanOut::Call.
  // When set, every pull attempt carries this step as the one this trainer
  // pushed (read afresh per attempt) instead of Pull's `pushed_step`.
  const std::atomic<int64_t>* pushed_step_now = nullptr;
};

// The shards a call goes to: all of them when empty.
using ShardSubset = std::vector<uint32_t>;

// A call made as `context` says (retries, attempt timeout, wait reports),
// `what` prefixed with its label.
ShardFanOut::Call CallFrom(const StepCallsContext& context, const std::string& what);

class StepCalls {
 public:
  // `fanout` (over the shards, whose ranges are set) must outlive this.
  StepCalls(ShardFanOut* fanout, StepCallsContext context);

  // Pushes `payload` (the whole flat gradient in `dtype`; it must stay valid
  // until this returns) as this trainer's step `step`, carrying `changes`
  // (PushHeader.hyperparameter_changes); each shard's answer in `responses`
  // (shard order; only the shards of `which` answer).
  // With `ready` the pushes stream as it says (ShardConnection::Push) and
  // ask the shards to defer them (PushHeader.defer_until_complete). With
  // `skip` (asynchronous modes) the step is skipped: headers only
  // (PushHeader.skip_step; `payload` unused).
  absl::Status Push(int64_t step, const void* payload, DType dtype, double loss_scale,
                    const std::vector<v1::SetHyperparametersRequest>& changes,
                    std::vector<v1::PushGradientsResponse>* responses,
                    const ShardSubset& which = {}, const ReadyRanges* ready = nullptr,
                    bool skip = false);
  // Every shard's statistics of `step` (waiting until every trainer's
  // gradient is in), in shard order; `pushed_step` (0: none) is checked to
  // be held, as in Pull. With `clip_decision` (the first half of a decision
  // whose steps need trust norms), each shard also measures and returns its
  // trust partials under it (StepStats.trust_partials).
  absl::StatusOr<std::vector<StepStats>> Stats(int64_t step, int64_t pushed_step,
                                               const ShardSubset& which = {},
                                               const StepDecision* clip_decision = nullptr);
  // The decision of `step` every trainer takes alike: DecideStep on every
  // shard's Stats; then, when the model's steps need trust norms
  // (`trust_layout`: the model's layout, else null) and the step is not
  // skipped, every shard's trust partials under that clip half, combined
  // into the decision's tensor norms (CombineTrustPartials).
  absl::StatusOr<StepDecision> TakeDecision(int64_t step, int64_t pushed_step, double max_grad_norm,
                                            const ModelLayout* trust_layout);
  // Every shard's parameters at version >= min_version into `flat_params`
  // (with `decision`, sent for step min_version); `pushed_step` (0: none)
  // is checked to be held by every shard (else OUT_OF_RANGE at once).
  // Shards that answer different versions (one was applying a step) are
  // pulled again at the newest; FAILED_PRECONDITION when they still
  // disagree. With `flat_params` null, only waits (PullParametersRequest
  // .wait_only).
  absl::StatusOr<PulledVersion> Pull(int64_t min_version, int64_t pushed_step,
                                     const StepDecision* decision, float* flat_params,
                                     const ShardSubset& which = {});
  // Asynchronous modes: every shard's newest parameters into `flat_params`;
  // each shard's version and lr, in shard order (versions differ there:
  // each shard counts the pushes it applied).
  absl::StatusOr<std::vector<PulledVersion>> PullEach(float* flat_params,
                                                      const ShardSubset& which = {});

 private:
  // How long a shard may take to say whether it holds a push.
  static constexpr absl::Duration kHoldsPushProbeTimeout = absl::Seconds(2);
  // OUT_OF_RANGE naming the first shard that no longer holds this trainer's
  // push of `pushed_step` (it restarted from a checkpoint), else OK.
  absl::Status CheckShardsHoldPush(int64_t pushed_step) const;

  // One pull from each shard of `which` into `pulled` (shard order).
  absl::Status RunPull(int64_t min_version, int64_t pushed_step, const StepDecision* decision,
                       float* flat_params, const ShardSubset& which,
                       std::vector<PulledVersion>* pulled);
  ShardFanOut::Call CallFor(const std::string& what) const;
  // One round; `newest` gets the highest version any shard answered.
  absl::StatusOr<PulledVersion> PullOnce(int64_t min_version, int64_t pushed_step,
                                         const StepDecision* decision, float* flat_params,
                                         const ShardSubset& which, int64_t* newest);

  ShardFanOut* const fanout_;
  const StepCallsContext context_;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_STEP_CALLS_H_
