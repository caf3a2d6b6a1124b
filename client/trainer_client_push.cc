// TrainerClient's pushes (see trainer_client.h): recording the push in the
// trainer's history, sending it to every shard with recovery of shards that
// are behind, and what the shards answered.
#include <algorithm>

#include "client/push_history.h"
#include "client/push_payload.h"
#include "client/step_calls.h"
#include "client/trainer_client.h"

namespace shardopt {

absl::StatusOr<StepResult> TrainerClient::Push(int64_t step, absl::Span<const float> flat_grads) {
  CancelStreamedPush();
  if (absl::Status s = CheckBuffer(flat_grads.size(), "gradient buffer"); !s.ok()) return s;
  if (asynchronous()) return AsyncPush(step, flat_grads);
  PreparedPush prepared;
  if (absl::Status s = PreparePush(step, flat_grads, &prepared); !s.ok()) return s;
  // The Pull of the step takes its decision (Step takes it in between), also
  // after a push that failed on some shard (that pull then recovers it).
  if (ModelNeedsDecisions()) undecided_push_ = step;
  return PushPayload(step, prepared.payload, prepared.scale);
}

absl::Status TrainerClient::PreparePush(int64_t step, absl::Span<const float> flat_grads,
                                        PreparedPush* out) const {
  out->scale = loss_scale();
  if (std::optional<PushedStep> earlier = RecordedPushTheScalerPassed(step);
      earlier && earlier->dtype == options_.push_dtype) {
    out->recorded = earlier->payload;
    out->scale = earlier->loss_scale;
    out->payload = out->recorded->data();
    return absl::OkStatus();
  }
  // (No history: the caller's gradient, as it was, with the step's scale.)
  if (scaler_step_scale_ && step == scaler_step_) out->scale = *scaler_step_scale_;
  return PreparePushPayload(*layout_, step, flat_grads, options_.push_dtype, scaler_.has_value(),
                            &out->narrowed, &out->payload);
}

std::optional<PushedStep> TrainerClient::RecordedPushTheScalerPassed(int64_t step) const {
  if (!scaler_ || scaler_step_ < step) return std::nullopt;
  absl::StatusOr<PushedStep> earlier = history_->Find(step);
  if (!earlier.ok()) return std::nullopt;
  return *std::move(earlier);
}

absl::StatusOr<StepResult> TrainerClient::PushPayload(int64_t step, const void* payload,
                                                      double loss_scale, bool skip) {
  rolled_back_to_.reset();
  // Counted before any shard can see the step (see SetHyperparameters).
  last_pushed_step_ = std::max(last_pushed_step_, step);
  const DType wire_dtype = options_.push_dtype;
  const size_t full_bytes = layout_->total_elements() * DTypeSize(wire_dtype);
  // (A skipped step is recorded with no payload.)
  size_t bytes = skip ? 0 : full_bytes;
  // The first push of (trainer, step) is the one the shards may already
  // hold: a restarted trainer re-sends what it journaled, not a recomputed
  // gradient that could differ from it (asynchronous: a skip included).
  std::shared_ptr<const std::vector<char>> journaled;
  if (history_->persistent() && step <= history_->newest_step()) {
    absl::StatusOr<PushedStep> earlier = history_->Find(step);
    const bool same_kind =
        earlier.ok() &&
        (earlier->payload->size() == bytes ||
         (asynchronous() && (earlier->payload->empty() || earlier->payload->size() == full_bytes)));
    // (Asynchronous: each push carries its own scale, which the shards
    // divide out, and a restarted trainer's scaler starts afresh: the
    // journaled push goes with the scale it was made with.)
    if (same_kind && earlier->dtype == wire_dtype &&
        (asynchronous() || earlier->loss_scale == loss_scale)) {
      journaled = earlier->payload;
      payload = journaled->data();
      bytes = journaled->size();
      skip = journaled->empty();
      loss_scale = earlier->loss_scale;
    }
  }
  if (!journaled) {
    if (absl::Status s = history_->Record(step, wire_dtype, loss_scale, payload, bytes); !s.ok()) {
      return s;
    }
  }
  const int64_t replayed_before = replayed_pushes();
  std::vector<v1::PushGradientsResponse> responses;
  absl::Status status;
  for (int round = 0;; ++round) {
    status = steps_->Push(step, payload, wire_dtype, loss_scale, history_->ChangesAfter(step - 1),
                          &responses, {}, nullptr, skip);
    if (!absl::IsOutOfRange(status) || round >= kMaxRecoveries) break;
    // A shard restarted from an older checkpoint: steps up to `step` - 1 first.
    if (absl::Status s = asynchronous() ? CatchUpShards(step) : Recover(step - 1); !s.ok()) {
      // (A shard that went back again during the catch-up: look again.)
      if (asynchronous() && absl::IsOutOfRange(s)) continue;
      return s;
    }
  }
  if (!status.ok()) return status;
  DropOldHistory(step, responses);
  StepResult result = ResultOfPush(step, responses, wire_dtype);
  result.skipped = skip;  // What was sent (a journaled push may differ from the caller's).
  result.replayed_pushes = static_cast<int>(replayed_pushes() - replayed_before);
  return result;
}

StepResult TrainerClient::ResultOfPush(int64_t step,
                                       const std::vector<v1::PushGradientsResponse>& responses,
                                       DType wire_dtype) const {
  StepResult result;
  result.step = step;
  for (size_t i = 0; i < shards_.size(); ++i) {
    const v1::PushGradientsResponse& r = responses[i];
    if (r.outcome() == v1::PushGradientsResponse::OUTCOME_APPLIED ||
        r.outcome() == v1::PushGradientsResponse::OUTCOME_AWAITING_DECISION) {
      result.applied_here = true;  // This push completed the step's gradients.
    }
    result.staleness = std::max(result.staleness, r.staleness());
    if (r.outcome() == v1::PushGradientsResponse::OUTCOME_DUPLICATE ||
        r.outcome() == v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED) {
      ++result.duplicate_pushes;
    }
    result.bytes_pushed += shards_[i]->range().size() * DTypeSize(wire_dtype);
  }
  return result;
}

void TrainerClient::DropOldHistory(int64_t step,
                                   const std::vector<v1::PushGradientsResponse>& responses) {
  // No shard can come back below its recovery floor; a shard without
  // periodic checkpoints (-1) cannot come back at all.
  std::optional<int64_t> floor;
  for (const v1::PushGradientsResponse& r : responses) {
    if (r.recovery_floor() >= 0)
      floor = std::min(floor.value_or(r.recovery_floor()), r.recovery_floor());
  }
  if (floor) {
    history_->DropThrough(*floor);
  } else if (history_->persistent()) {
    history_->DropThrough(step - 1);  // Only a push cut off by this trainer's death matters.
  }
}

}  // namespace shardopt
