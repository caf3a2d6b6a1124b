#include "client/step_calls.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/proto_convert.h"

namespace shardopt {

StepCalls::StepCalls(ShardFanOut* fanout, StepCallsContext context)
    : fanout_(fanout), context_(std::move(context)) {}

ShardFanOut::Call CallFrom(const StepCallsContext& context, const std::string& what) {
  ShardFanOut::Call call;
  // (Errors and logs name the trainer: a process may run several.)
  call.what = absl::StrCat(context.label, what, " (trainer ", context.trainer_rank, ")");
  call.policy = context.policy;
  call.attempt_timeout = context.rpc_timeout;
  call.on_wait = context.on_wait;
  call.end_on_wait_report = context.end_on_wait_report;
  call.canceller = context.canceller;
  return call;
}

ShardFanOut::Call StepCalls::CallFor(const std::string& what) const {
  return CallFrom(context_, what);
}

absl::Status StepCalls::Push(int64_t step, const void* payload, DType dtype, double loss_scale,
                             const std::vector<v1::SetHyperparametersRequest>& changes,
                             std::vector<v1::PushGradientsResponse>* responses,
                             const ShardSubset& which, const ReadyRanges* ready, bool skip) {
  responses->assign(fanout_->size(), v1::PushGradientsResponse());
  const size_t element = DTypeSize(dtype);
  // gRPC may hold the zero-copy payload slices a little past each call's
  // Finish(); the payload must outlive them.
  PayloadPins pins;
  ShardFanOut::Call call = CallFor(absl::StrCat("PushGradients step ", step));
  if (ready != nullptr) {
    // Open while the gradient is computed: that time is not the shard's.
    call.attempt_timeout = std::max(call.attempt_timeout, context_.streamed_push_timeout);
  }
  absl::Status status = fanout_->Run(
      call,
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::PushGradientsRequest header;
        v1::PushHeader* h = header.mutable_header();
        h->set_model_id(context_.model_id);
        h->set_trainer_rank(context_.trainer_rank);
        h->set_step(step);
        h->set_shard_index(shard.index());
        h->set_num_elements(shard.range().size());
        h->set_dtype(DTypeToProto(dtype));
        if (context_.send_loss_scale || loss_scale != 1.0) h->set_loss_scale(loss_scale);
        for (const v1::SetHyperparametersRequest& c : changes) {
          *h->add_hyperparameter_changes() = c;
        }
        h->set_defer_until_complete(ready != nullptr);
        h->set_skip_step(skip);
        // (Asynchronous modes: a push held back reports what it waits for.)
        h->set_max_wait_ms(absl::ToInt64Milliseconds(context_.wait_report_interval));
        return shard.Push(
            context, header,
            skip ? nullptr : static_cast<const char*>(payload) + shard.range().begin * element,
            element, context_.chunk_bytes, &pins, &(*responses)[shard.index()], ready);
      },
      which);
  pins.WaitUntilReleased();
  return status;
}

absl::StatusOr<std::vector<StepStats>> StepCalls::Stats(int64_t step, int64_t pushed_step,
                                                        const ShardSubset& which,
                                                        const StepDecision* clip_decision) {
  std::vector<StepStats> stats(fanout_->size());
  absl::Status status = fanout_->Run(
      CallFor(absl::StrCat("GetStepStats step ", step)),
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::GetStepStatsRequest request;
        request.set_model_id(context_.model_id);
        request.set_step(step);
        request.set_shard_index(shard.index());
        request.set_trainer_rank(context_.trainer_rank);
        request.set_pushed_step(
            context_.pushed_step_now != nullptr ? context_.pushed_step_now->load() : pushed_step);
        request.set_max_wait_ms(absl::ToInt64Milliseconds(context_.wait_report_interval));
        if (clip_decision != nullptr) {
          *request.mutable_decision() = StepDecisionToProto(*clip_decision);
        }
        v1::StepStats s;
        if (absl::Status got = shard.GetStepStats(context, request, &s); !got.ok()) return got;
        absl::StatusOr<StepStats> converted = StepStatsFromProto(s);
        if (!converted.ok()) {
          return absl::DataLossError(absl::StrCat(
              "shard ", shard.index(), "'s step statistics: ", converted.status().message()));
        }
        stats[shard.index()] = *std::move(converted);
        return absl::OkStatus();
      },
      which);
  if (!status.ok()) return status;
  return stats;
}

absl::StatusOr<StepDecision> StepCalls::TakeDecision(int64_t step, int64_t pushed_step,
                                                     double max_grad_norm,
                                                     const ModelLayout* trust_layout) {
  absl::StatusOr<std::vector<StepStats>> stats = Stats(step, pushed_step);
  if (!stats.ok()) return stats.status();
  // Every trainer computes this from the same numbers, in the same order:
  // they all send the same decision.
  StepDecision decision = DecideStep(*stats, max_grad_norm);
  if (trust_layout == nullptr || decision.skip) return decision;
  absl::StatusOr<std::vector<StepStats>> partials = Stats(step, pushed_step, {}, &decision);
  if (!partials.ok()) return partials.status();
  absl::StatusOr<std::vector<TensorNorms>> norms = CombineTrustPartials(*partials, *trust_layout);
  if (!norms.ok()) {
    return absl::DataLossError(
        absl::StrCat("the shards' trust partials of step ", step, ": ", norms.status().message()));
  }
  decision.tensor_norms = *std::move(norms);
  return decision;
}

absl::StatusOr<PulledVersion> StepCalls::Pull(int64_t min_version, int64_t pushed_step,
                                              const StepDecision* decision, float* flat_params,
                                              const ShardSubset& which) {
  // Shards caught in the middle of applying a step answer the versions on
  // either side of it: pull again at the newest (the others get there).
  constexpr int kRounds = 3;
  absl::StatusOr<PulledVersion> pulled;
  for (int round = 0; round < kRounds; ++round) {
    int64_t newest = min_version;
    pulled = PullOnce(min_version, pushed_step, decision, flat_params, which, &newest);
    if (pulled.ok() || newest == min_version) break;
    min_version = newest;
    decision = nullptr;  // Sent already; it was for the older version.
  }
  return pulled;
}

absl::StatusOr<PulledVersion> StepCalls::PullOnce(int64_t min_version, int64_t pushed_step,
                                                  const StepDecision* decision,
                                                  float* flat_params, const ShardSubset& which,
                                                  int64_t* newest) {
  std::vector<PulledVersion> pulled;
  if (absl::Status s = RunPull(min_version, pushed_step, decision, flat_params, which, &pulled);
      !s.ok()) {
    return s;
  }
  const std::vector<uint32_t> asked = fanout_->Targets(which);
  for (uint32_t i : asked) *newest = std::max(*newest, pulled[i].version);
  const uint32_t first = asked[0];
  for (uint32_t i : asked) {
    if (pulled[i].version != pulled[first].version) {
      return absl::FailedPreconditionError(absl::StrCat("shards disagree on the version: shard ",
                                                        first, " is at ", pulled[first].version,
                                                        ", shard ", i, " at ", pulled[i].version));
    }
  }
  return pulled[first];
}

absl::StatusOr<std::vector<PulledVersion>> StepCalls::PullEach(float* flat_params,
                                                               const ShardSubset& which) {
  std::vector<PulledVersion> pulled;
  if (absl::Status s = RunPull(0, 0, nullptr, flat_params, which, &pulled); !s.ok()) return s;
  return pulled;
}

absl::Status StepCalls::CheckShardsHoldPush(int64_t pushed_step) const {
  for (ShardConnection* shard : fanout_->shards()) {
    v1::PullParametersRequest request;
    request.set_model_id(context_.model_id);
    request.set_min_version(0);
    request.set_shard_index(shard->index());
    request.set_trainer_rank(context_.trainer_rank);
    request.set_pushed_step(pushed_step);
    request.set_wait_only(true);
    // (Run between a pull's attempts: cancelled with them.)
    ShardFanOut::FollowUpContext probe(kHoldsPushProbeTimeout);
    PulledVersion ignored;
    const absl::Status s =
        shard->Pull(probe.get(), request, context_.pull_dtype, nullptr, &ignored);
    // (Only a shard's word that it lacks the push counts: one that is down
    // or slow is its own pull's business.)
    if (absl::IsOutOfRange(s)) {
      return absl::OutOfRangeError(absl::StrCat("shard ", shard->index(), " (",
                                                shard->address(), ") lost this trainer's push: ",
                                                s.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status StepCalls::RunPull(int64_t min_version, int64_t pushed_step,
                                const StepDecision* decision, float* flat_params,
                                const ShardSubset& which, std::vector<PulledVersion>* out) {
  std::vector<PulledVersion>& pulled = *out;
  pulled.assign(fanout_->size(), PulledVersion());
  ShardFanOut::Call call = CallFor(absl::StrCat("PullParameters version >= ", min_version));
  // A pull that waits for other trainers may wait for one that waits for
  // this trainer at another shard: one that lost this trainer's push (it
  // came back from a checkpoint after this shard's part of the pull was
  // done). Each wait report looks at every shard; the pull then ends
  // OUT_OF_RANGE, and the caller recovers that shard.
  call.on_wait_check = [this, pushed_step]() {
    const int64_t pushed =
        context_.pushed_step_now != nullptr ? context_.pushed_step_now->load() : pushed_step;
    return pushed > 0 ? CheckShardsHoldPush(pushed) : absl::OkStatus();
  };
  return fanout_->Run(
      call,
      [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        v1::PullParametersRequest request;
        request.set_model_id(context_.model_id);
        request.set_min_version(min_version);
        request.set_shard_index(shard.index());
        request.set_dtype(DTypeToProto(context_.pull_dtype));
        request.set_trainer_rank(context_.trainer_rank);
        request.set_pushed_step(
            context_.pushed_step_now != nullptr ? context_.pushed_step_now->load() : pushed_step);
        request.set_max_wait_ms(absl::ToInt64Milliseconds(context_.wait_report_interval));
        request.set_wait_only(flat_params == nullptr);
        if (decision != nullptr) *request.mutable_decision() = StepDecisionToProto(*decision);
        return shard.Pull(context, request, context_.pull_dtype,
                          flat_params ? flat_params + shard.range().begin : nullptr,
                          &pulled[shard.index()]);
      },
      which);
}

}  // namespace shardopt
