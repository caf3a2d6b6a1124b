// TrainerClient's streamed pushes (see trainer_client.h): a push that goes
// out while the gradient is still being computed.
#include "absl/strings/str_cat.h"
#include "client/early_pull.h"
#include "client/push_history.h"
#include "client/push_payload.h"
#include "client/streamed_push.h"
#include "client/shard_fanout.h"
#include "client/step_calls.h"
#include "client/trainer_client.h"

namespace shardopt {

absl::Status TrainerClient::BeginStreamedPush(int64_t step, absl::Span<const float> flat_grads) {
  if (absl::Status s = CheckBuffer(flat_grads.size(), "gradient buffer"); !s.ok()) return s;
  if (step <= 0) return absl::InvalidArgumentError(absl::StrCat("step ", step, " is not positive"));
  const char* why = nullptr;
  if (asynchronous()) {
    why = "asynchronous pushes are applied whole, as they arrive";
  } else if (StepsNeedDecisions(spec_->max_grad_norm, spec_->loss_scaling)) {
    why = "gradient control needs the whole gradient's statistics first";
  } else if (StepsNeedTrustNorms(spec_->optimizer.kind, *layout_)) {
    why = "lamb on the flat partition takes each step's tensor norms from every shard first";
  } else if (options_.push_dtype != DType::kFloat32) {
    why = "a 16-bit push type is rounded from the whole gradient";
  } else if (history_->persistent()) {
    why = "with a journal every push is saved before it is sent";
  }
  absl::MutexLock lock(&streamed_mu_);
  if (streamed_) why = "a streamed push is open already";
  if (why != nullptr) {
    return absl::FailedPreconditionError(absl::StrCat("no streamed push of step ", step, ": ", why));
  }
  auto push = std::make_unique<StreamedPush>();
  push->step = step;
  push->grads = flat_grads.data();
  push->last_pushed_before = last_pushed_step_;
  // Counted before any shard can see the step (see SetHyperparameters).
  last_pushed_step_ = std::max(last_pushed_step_, step);
  StreamedPush* raw = push.get();
  push->thread = std::thread([this, raw, changes = history_->ChangesAfter(step - 1)] {
    raw->status = steps_->Push(raw->step, raw->grads, DType::kFloat32, 1.0, changes,
                               &raw->responses, {}, &raw->ready);
  });
  streamed_ = std::move(push);
  return absl::OkStatus();
}

void TrainerClient::MarkGradientReady(uint64_t begin, uint64_t end) {
  absl::MutexLock lock(&streamed_mu_);
  if (streamed_) streamed_->ready.MarkReady(begin, end);
}

uint64_t TrainerClient::streamed_bytes_sent() {
  absl::MutexLock lock(&streamed_mu_);
  return streamed_ ? streamed_->ready.sent() : 0;
}

void TrainerClient::CancelStreamedPush() {
  std::unique_ptr<StreamedPush> push;
  {
    absl::MutexLock lock(&streamed_mu_);
    push = std::move(streamed_);
  }
  if (push) Abandon(std::move(push));
}

void TrainerClient::Abandon(std::unique_ptr<StreamedPush> push) {
  push->ready.Fail();  // No stream ends: no shard commits any of it.
  push->thread.join();
  last_pushed_step_ = std::max(push->last_pushed_before, registered_version_);
}

absl::StatusOr<StepResult> TrainerClient::FinishStreamedStep(int64_t step,
                                                             absl::Span<const float> flat_grads,
                                                             absl::Span<float> flat_params) {
  std::unique_ptr<StreamedPush> push;
  {
    absl::MutexLock lock(&streamed_mu_);
    if (streamed_ && streamed_->step == step && streamed_->grads == flat_grads.data()) {
      push = std::move(streamed_);
    }
  }
  if (!push) return Step(step, flat_grads, flat_params);  // (Abandons another.)
  const uint64_t sent_early = push->ready.sent();
  if (absl::Status s = CheckBuffer(flat_params.size(), "parameter buffer"); !s.ok()) {
    Abandon(std::move(push));
    return s;
  }
  // Checked whole before any stream may end, as Step checks it before any
  // shard sees it.
  std::vector<char> narrowed;
  const void* payload = nullptr;
  if (absl::Status s = PreparePushPayload(*layout_, step, flat_grads, DType::kFloat32, false,
                                          &narrowed, &payload);
      !s.ok()) {
    Abandon(std::move(push));
    return s;
  }
  // What was sent while backward ran must still be the gradient (code
  // between backward() and the step may have clipped or scaled it): else
  // no shard commits any of it and the gradient goes whole.
  if (push->ready.FirstChangedChunk(flat_grads.data())) {
    Abandon(std::move(push));
    ++changed_after_send_;
    return Step(step, flat_grads, flat_params);
  }
  push->ready.MarkReady(0, layout_->total_elements());
  push->ready.AllowCommit();
  // The backward pass is over: the parameters may be written now.
  const bool early = early_pull_ != nullptr;
  if (early) early_pull_->Start(step, flat_params);
  push->thread.join();
  absl::StatusOr<PulledVersion> pulled =
      early ? early_pull_->PushEnded(push->status.ok()) : absl::UnknownError("not pulled");
  if (push->status.ok() && !early) pulled = steps_->Pull(step, step, nullptr, flat_params.data());
  if (!push->status.ok() || !pulled.ok() || pulled->version != step) {
    // The usual way, recovery included; the shards that took the streamed
    // push acknowledge it as a duplicate.
    return Step(step, flat_grads, flat_params);
  }
  rolled_back_to_.reset();
  const size_t bytes = layout_->total_elements() * sizeof(float);
  if (absl::Status s = history_->Record(step, DType::kFloat32, 1.0, flat_grads.data(), bytes);
      !s.ok()) {
    return s;
  }
  DropOldHistory(step, push->responses);
  ++streamed_pushes_;
  StepResult result = ResultOfPush(step, push->responses, DType::kFloat32);
  result.version = pulled->version;
  result.lr = pulled->lr;
  result.bytes_pulled = flat_params.size() * DTypeSize(options_.pull_dtype);
  result.bytes_pushed_early = std::min<uint64_t>(sent_early, result.bytes_pushed);
  return result;
}

}  // namespace shardopt
