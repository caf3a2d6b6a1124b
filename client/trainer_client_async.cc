// TrainerClient in the asynchronous and bounded-staleness modes (see the
// class comment): the step, the pull of every shard's newest parameters,
// the catch-up of shards that came back from a checkpoint, resuming, and
// the wait for every trainer at the end of a job.
#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "client/push_history.h"
#include "client/push_payload.h"
#include "client/recovery.h"
#include "client/shard_connection.h"
#include "client/step_calls.h"
#include "client/trainer_client.h"
#include "common/step_protocol.h"

namespace shardopt {
namespace {

// This trainer's last step a shard applied, from its summary.
absl::StatusOr<int64_t> AppliedBy(const v1::ModelSummary& summary, uint32_t rank,
                                  size_t shard_index) {
  if (static_cast<uint32_t>(summary.trainer_steps_size()) <= rank) {
    return absl::FailedPreconditionError(
        absl::StrCat("shard ", shard_index, " reports no trainer steps for model '",
                     summary.model_id(), "': it does not hold it as an asynchronous model"));
  }
  return summary.trainer_steps(rank);
}

// This trainer's part of a decision, over its whole (scaled) gradient: the
// sum of squares of the unscaled values, in double, and whether any was not
// finite (as a shard sums its range in CpuBackend::SumOfSquares).
StepStats OwnGradientStats(int64_t step, absl::Span<const float> grads, double loss_scale) {
  StepStats stats;
  stats.step = step;
  stats.loss_scale = loss_scale;
  const float unscale = static_cast<float>(1.0 / loss_scale);
  for (float g : grads) {
    if (!std::isfinite(g)) {
      stats.found_inf = true;
      continue;
    }
    const double x = static_cast<double>(g * unscale);
    stats.sum_of_squares += x * x;
  }
  return stats;
}

}  // namespace

absl::StatusOr<StepResult> TrainerClient::AsyncPush(int64_t step,
                                                    absl::Span<const float> flat_grads) {
  if (step <= 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  if (std::optional<PushedStep> earlier = RecordedPushTheScalerPassed(step)) {
    absl::StatusOr<StepResult> again =
        PushPayload(step, earlier->payload->data(), earlier->loss_scale,
                    /*skip=*/earlier->payload->empty());
    if (again.ok() && again->skipped) again->bytes_pushed = 0;
    return again;
  }
  const bool controlled = spec_->max_grad_norm > 0 || scaler_.has_value();
  const double scale = loss_scale();
  // Gradient control is this trainer's (it holds its whole gradient): the
  // same decision rule as the shards' in synchronous mode, on its own
  // gradient alone. Only a loss scaler skips: without one an inf/NaN is
  // refused below, naming the element, as in every other mode.
  StepDecision decision;
  if (controlled) {
    const StepStats own = OwnGradientStats(step, flat_grads, scale);
    decision = DecideStep(absl::MakeConstSpan(&own, 1), spec_->max_grad_norm);
  }
  bool skip = decision.skip && scaler_.has_value();
  std::vector<float> multiplied;
  absl::Span<const float> grads = flat_grads;
  // Clipped here. A loss-scaled gradient goes on the wire still scaled, as
  // in synchronous mode, and the shards unscale it (exactly: a power of
  // two), so that a 16-bit wire type keeps the small values the scale is
  // there for. (The same bits as one multiply by clip / scale here.)
  const float multiplier = controlled ? static_cast<float>(decision.clip_coef) : 1.0f;
  if (!skip && multiplier != 1.0f) {
    multiplied.resize(flat_grads.size());
    for (size_t i = 0; i < flat_grads.size(); ++i) multiplied[i] = flat_grads[i] * multiplier;
    grads = multiplied;
  }
  std::vector<char> narrowed;
  const void* payload = nullptr;
  if (!skip) {
    bool overflowed = false;
    if (absl::Status s =
            PreparePushPayload(*layout_, step, grads, options_.push_dtype,
                               /*loss_scaling=*/scaler_.has_value(), &narrowed, &payload,
                               &overflowed);
        !s.ok()) {
      return s;
    }
    // The scaled gradient overflows the wire type: this trainer's overflow,
    // skipped as a GradScaler skips inf in 16-bit gradients.
    if (overflowed) {
      skip = true;
      decision.skip = true;
      payload = nullptr;
    }
  }
  absl::StatusOr<StepResult> result =
      PushPayload(step, payload, scaler_.has_value() ? scale : 1.0, skip);
  if (!result.ok()) return result;
  // What went out decides (a restarted trainer re-sends its journaled push,
  // which may be the other kind than this recomputed one). Once per step,
  // whether or not what follows succeeds (a retry must not move it again).
  if (scaler_ && scaler_step_ < step) {
    scaler_->Update(result->skipped);
    scaler_step_ = step;
  }
  if (result->skipped == skip) {
    result->grad_norm = decision.grad_norm;
    result->clip_coef = skip ? 1.0 : decision.clip_coef;
  }
  result->loss_scale = scale;
  if (result->skipped) result->bytes_pushed = 0;
  return result;
}

absl::StatusOr<StepResult> TrainerClient::AsyncStep(int64_t step,
                                                    absl::Span<const float> flat_grads,
                                                    absl::Span<float> flat_params) {
  absl::StatusOr<StepResult> result = AsyncPush(step, flat_grads);
  if (!result.ok()) return result;
  std::vector<PulledVersion> each;
  absl::StatusOr<int64_t> version = AsyncPull(flat_params, &each);
  if (!version.ok()) return version.status();
  result->version = *version;
  for (const PulledVersion& p : each) result->shard_versions.push_back(p.version);
  // The schedule counts this trainer's steps (ModelConfig.consistency).
  result->lr = spec_->lr_schedule.LearningRate(spec_->optimizer.lr, step);
  result->bytes_pulled = flat_params.size() * DTypeSize(options_.pull_dtype);
  return result;
}

absl::StatusOr<int64_t> TrainerClient::AsyncPull(absl::Span<float> flat_params,
                                                 std::vector<PulledVersion>* each) {
  absl::StatusOr<std::vector<PulledVersion>> pulled = steps_->PullEach(flat_params.data());
  if (!pulled.ok()) return pulled.status();
  int64_t lowest = (*pulled)[0].version;
  for (const PulledVersion& p : *pulled) lowest = std::min(lowest, p.version);
  if (each != nullptr) *each = *std::move(pulled);
  return lowest;
}

absl::Status TrainerClient::CatchUpShards(int64_t step) {
  absl::StatusOr<std::vector<v1::ModelSummary>> shards = recovery_->Survey();
  if (!shards.ok()) return shards.status();
  const uint32_t rank = options_.trainer_rank;
  for (size_t i = 0; i < shards->size(); ++i) {
    absl::StatusOr<int64_t> applied = AppliedBy((*shards)[i], rank, i);
    if (!applied.ok()) return applied.status();
    for (int64_t k = *applied + 1; k < step; ++k) {
      absl::StatusOr<PushedStep> entry = history_->Find(k);
      if (!entry.ok()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "shard ", i, " (", shards_[i]->address(), ") holds trainer ", rank,
            "'s steps only up to ", *applied, " (it came back from a checkpoint) and needs steps ",
            k, "..", step - 1, ": ", entry.status().message(),
            "; keep more of them (replay_steps, journal_path) or restart every shard from one "
            "checkpoint"));
      }
      std::vector<v1::PushGradientsResponse> responses;
      // (An empty entry is a step this trainer skipped.)
      if (absl::Status s = steps_->Push(k, entry->payload->data(), entry->dtype, entry->loss_scale,
                                        {}, &responses, {static_cast<uint32_t>(i)}, nullptr,
                                        /*skip=*/entry->payload->empty());
          !s.ok()) {
        return s;
      }
      ++caught_up_pushes_;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<int64_t> TrainerClient::AsyncPullToResume(absl::Span<float> flat_params) {
  CancelStreamedPush();
  if (absl::Status s = CheckBuffer(flat_params.size(), "parameter buffer"); !s.ok()) return s;
  absl::StatusOr<std::vector<v1::ModelSummary>> shards = recovery_->Survey();
  if (!shards.ok()) return shards.status();
  // Every shard holds this trainer's steps up to the lowest of them; a
  // shard ahead acknowledges the repeats (nothing is applied twice).
  int64_t from = -1;
  for (size_t i = 0; i < shards->size(); ++i) {
    absl::StatusOr<int64_t> applied = AppliedBy((*shards)[i], options_.trainer_rank, i);
    if (!applied.ok()) return applied.status();
    from = from < 0 ? *applied : std::min(from, *applied);
  }
  if (absl::StatusOr<int64_t> pulled = AsyncPull(flat_params); !pulled.ok()) {
    return pulled.status();
  }
  last_pushed_step_ = std::max(last_pushed_step_, from);
  return from;
}

absl::StatusOr<int64_t> TrainerClient::AsyncLatestCheckpointStep() {
  absl::StatusOr<std::vector<v1::ModelSummary>> shards = recovery_->Survey();
  if (!shards.ok()) return shards.status();
  int64_t latest = 0;
  for (const v1::ModelSummary& s : *shards) {
    for (int64_t step : s.trainer_steps()) latest = std::max(latest, step);
  }
  return latest;
}

absl::Status TrainerClient::WaitForEveryTrainer(int64_t step) {
  CancelStreamedPush();
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  if (!asynchronous()) return absl::OkStatus();  // (Lockstep: every trainer is there.)
  absl::Time give_up = absl::Now() + options_.retry_budget;
  absl::Time next_report = absl::Now() + options_.wait_report_interval;
  // The most steps applied over every shard and trainer seen so far.
  int64_t progress = -1;
  for (;;) {
    absl::StatusOr<std::vector<v1::ModelSummary>> shards = recovery_->Survey();
    if (!shards.ok()) return shards.status();
    int64_t applied = 0;
    for (const v1::ModelSummary& s : *shards) {
      for (int64_t k : s.trainer_steps()) applied += k;
    }
    // (The budget is for waits without progress: slow trainers still move.
    // A shard that restarts and loses steps is none: it would otherwise
    // renew the budget at every restart.)
    if (applied > progress) {
      give_up = absl::Now() + options_.retry_budget;
      progress = applied;
    }
    std::vector<std::string> behind;
    bool mine_lost = false;
    for (size_t i = 0; i < shards->size(); ++i) {
      const v1::ModelSummary& s = (*shards)[i];
      for (uint32_t t = 0; t < static_cast<uint32_t>(s.trainer_steps_size()); ++t) {
        if (s.trainer_steps(t) >= step) continue;
        behind.push_back(absl::StrCat("trainer ", t, " on shard ", i, " (applied step ",
                                      s.trainer_steps(t), ")"));
        mine_lost = mine_lost || t == options_.trainer_rank;
      }
      if (s.trainer_steps_size() == 0) {
        return AppliedBy(s, options_.trainer_rank, i).status();
      }
    }
    if (behind.empty()) return absl::OkStatus();
    // A shard that came back from a checkpoint lacks this trainer's last
    // steps, which no later push of it would bring: send them now.
    if (mine_lost) {
      if (absl::Status s = CatchUpShards(step + 1); !s.ok() && !absl::IsOutOfRange(s)) return s;
    }
    const std::string waiting = absl::StrJoin(behind, ", ");
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(absl::StrCat(
          "no progress in ", absl::FormatDuration(options_.retry_budget),
          " towards every trainer's step ", step, " on every shard; still waiting for ", waiting));
    }
    if (absl::Now() >= next_report) {
      options_.on_wait(absl::StrCat("trainer ", options_.trainer_rank,
                                    " waiting for every trainer's step ", step, ": ", waiting));
      next_report = absl::Now() + options_.wait_report_interval;
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

}  // namespace shardopt
