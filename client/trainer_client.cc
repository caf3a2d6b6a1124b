// TrainerClient: the facade. Registration (client/registration.h), one
// round of step calls (client/step_calls.h) and recovery
// (client/recovery.h) do the work; this file holds their order: validate,
// record the push, run the round, and on OUT_OF_RANGE recover and repeat.
#include "client/trainer_client.h"

#include <google/protobuf/util/json_util.h>

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/device_pair_transport.h"
#include "client/early_pull.h"
#include "client/push_history.h"
#include "client/push_payload.h"
#include "client/recovery.h"
#include "client/registration.h"
#include "client/retry.h"
#include "client/shard_connection.h"
#include "client/shard_fanout.h"
#include "client/shared_memory_route.h"
#include "client/shared_memory_transport.h"
#include "client/socket_payload_transport.h"
#include "client/step_calls.h"
#include "client/streamed_push.h"
#include "client/transport_chain.h"
#include "common/dtype_convert.h"
#include "common/finite.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/proto_convert.h"

namespace shardopt {
namespace {

// Whether buffers and shard ranges of `b` are those of `a` (what steps read
// and write through).
bool SameSizes(const ModelLayout& a, const ModelLayout& b, uint32_t shard_count) {
  if (a.total_elements() != b.total_elements()) return false;
  for (uint32_t i = 0; i < shard_count; ++i) {
    const FlatRange ra = a.ShardRange(i), rb = b.ShardRange(i);
    if (ra.begin != rb.begin || ra.end != rb.end) return false;
  }
  return true;
}

// Room for a chunk plus its header (see ShardConnection).
constexpr size_t kMaxChunkBytes = 32 << 20;
RetryPolicy RetryPolicyOf(const TrainerClientOptions& options) {
  return RetryPolicy{options.retry_budget, options.initial_backoff, options.max_backoff};
}

}  // namespace

void TrainerClient::Interrupt() {
  interrupt_.Cancel();
  // (Its own calls: a step waits for it once its push ended.)
  if (early_pull_) early_pull_->Interrupt();
}

void TrainerClient::ClearInterrupt() {
  interrupt_.Reset();
  if (early_pull_) early_pull_->ClearInterrupt();
}

ShardFanOut::Call TrainerClient::CallFor(std::string what) const {
  ShardFanOut::Call call;
  // (Errors and logs name the trainer: a process may run several.)
  call.what = absl::StrCat(what, " (trainer ", options_.trainer_rank, ")");
  call.policy = RetryPolicyOf(options_);
  call.attempt_timeout = options_.rpc_timeout;
  call.on_wait = options_.on_wait;
  call.canceller = &interrupt_;
  return call;
}

int64_t TrainerClient::failed_attempts() const {
  int64_t total = 0;
  for (size_t i = 0; i < shards_.size(); ++i) total += failed_attempts(i);
  return total;
}

int64_t TrainerClient::failed_attempts(size_t shard) const {
  if (shard >= shards_.size()) return 0;
  return shards_[shard]->unreachable_attempts() +
         (early_pull_ ? early_pull_->failed_attempts(shard) : 0);
}

int64_t TrainerClient::replayed_pushes() const {
  return (recovery_ ? recovery_->replayed_pushes() : 0) + resent_on_resume_.load() +
         caught_up_pushes_.load();
}

double TrainerClient::loss_scale() const { return scaler_ ? scaler_->scale() : 1.0; }

absl::StatusOr<std::unique_ptr<TrainerClient>> TrainerClient::Connect(
    const std::vector<std::string>& shard_addresses, const TrainerClientOptions& options) {
  if (shard_addresses.empty()) {
    return absl::InvalidArgumentError("no shard addresses given");
  }
  if (options.chunk_bytes < sizeof(float) || options.chunk_bytes > kMaxChunkBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", options.chunk_bytes, " is not in [4, 32 MiB]"));
  }
  ConnectionOptions connection;
  absl::StatusOr<ChannelFactory> channels = ChannelFactory::Create(options.security);
  if (!channels.ok()) return channels.status();
  const bool tls = channels->tls();
  connection.channels = *std::move(channels);
  connection.initial_backoff = options.initial_backoff;
  connection.max_backoff = options.max_backoff;
  std::vector<std::unique_ptr<ShardConnection>> shards;
  for (size_t i = 0; i < shard_addresses.size(); ++i) {
    shards.push_back(std::make_unique<ShardConnection>(static_cast<uint32_t>(i), shard_addresses[i],
                                                       connection));
  }
  std::unique_ptr<EarlyPull> early_pull;
  if (options.overlap_pull) early_pull = std::make_unique<EarlyPull>(shard_addresses, connection);
  std::unique_ptr<TrainerClient> client(
      new TrainerClient(options, std::move(shards), std::move(early_pull)));
  client->tls_ = tls;
  return client;
}

TrainerClient::TrainerClient(const TrainerClientOptions& options,
                             std::vector<std::unique_ptr<ShardConnection>> shards,
                             std::unique_ptr<EarlyPull> early_pull)
    : options_(options), shards_(std::move(shards)), early_pull_(std::move(early_pull)) {
  if (!options_.on_wait) {
    options_.on_wait = [](const std::string& report) {
      LogWarning("still waiting: %s", report);  // (The report names the trainer.)
    };
  }
  std::vector<ShardConnection*> raw;
  for (auto& shard : shards_) raw.push_back(shard.get());
  fanout_ = std::make_unique<ShardFanOut>(std::move(raw));
}

TrainerClient::~TrainerClient() { CancelStreamedPush(); }

std::vector<float> TrainerClient::NewFlatBuffer() const {
  return std::vector<float>(layout_ ? layout_->total_elements() : 0, 0.0f);
}

absl::Status TrainerClient::CheckBuffer(size_t size, const char* what) const {
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  if (size != layout_->total_elements()) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has ", size, " elements; the layout needs ", layout_->total_elements()));
  }
  return absl::OkStatus();
}

absl::StatusOr<ModelLayout> TrainerClient::LayoutFor(const ModelSpec& spec) const {
  return ModelLayout::Create(spec.tensors, spec.alignment, shard_count(), spec.partition);
}

absl::Status TrainerClient::Register(const ModelSpec& spec,
                                     absl::Span<const float> initial_params) {
  absl::StatusOr<ModelLayout> layout = LayoutFor(spec);
  if (!layout.ok()) return layout.status();
  if (initial_params.size() != layout->total_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial parameters have ", initial_params.size(),
                     " elements; the layout needs ", layout->total_elements()));
  }
  if (auto bad = FindNonZeroPadding(*layout, {0, initial_params.size()}, initial_params.data(),
                                    DType::kFloat32)) {
    return absl::InvalidArgumentError(absl::StrCat("initial value of ",
                                                   layout->DescribeElement(*bad),
                                                   " is not zero: padding must hold zeros"));
  }
  if (absl::Status s = CheckId("model_id", spec.model_id); !s.ok()) return s;
  return RegisterOrAttach(spec, initial_params.data());
}

absl::Status TrainerClient::Attach(const ModelSpec& spec) {
  return RegisterOrAttach(spec, nullptr);
}

absl::Status TrainerClient::PrepareModel(const ModelSpec& spec, const ModelLayout& layout) {
  for (auto& shard : shards_) shard->set_range(layout.ShardRange(shard->index()));
  const bool same_model = history_ && spec_ && spec_->model_id == spec.model_id;
  if (!same_model) {
    PushHistoryOptions history;
    history.model_id = spec.model_id;
    history.trainer_rank = options_.trainer_rank;
    history.replay_steps = options_.replay_steps;
    history.journal_dir = options_.journal_path;
    absl::StatusOr<std::unique_ptr<PushHistory>> opened = PushHistory::Open(history);
    if (!opened.ok()) return opened.status();
    history_ = std::move(*opened);
  }
  StepCallsContext calls;
  calls.model_id = spec.model_id;
  calls.trainer_rank = options_.trainer_rank;
  calls.rpc_timeout = options_.rpc_timeout;
  calls.streamed_push_timeout = options_.streamed_push_timeout;
  calls.policy = RetryPolicyOf(options_);
  calls.wait_report_interval = WaitReportInterval();
  calls.on_wait = options_.on_wait;
  calls.canceller = &interrupt_;
  calls.chunk_bytes = options_.chunk_bytes;
  calls.pull_dtype = options_.pull_dtype;
  calls.send_loss_scale = spec.loss_scaling;
  if (!same_model) {
    recovery_ = std::make_unique<Recovery>(
        fanout_.get(), history_.get(),
        RecoveryContext{ModelStepsNeedDecisions(spec.consistency, spec.max_grad_norm,
                                                spec.loss_scaling, spec.optimizer.kind, layout),
                        calls});
  }
  steps_ = std::make_unique<StepCalls>(fanout_.get(), calls);
  PrepareTransports(layout);
  if (early_pull_) early_pull_->Prepare(layout, calls, transports_);
  return absl::OkStatus();
}

void TrainerClient::PrepareTransports(const ModelLayout& layout) {
  const bool sockets = options_.socket_payloads && !tls_;
  const DevicePairKind* pair_kind = nullptr;
  if (options_.device_pairs != "off") {
    absl::StatusOr<const DevicePairKind*> kind = FindDevicePairKind(options_.device_pairs);
    if (kind.ok()) {
      pair_kind = *kind;
      pair_kind_ = *kind;
    } else {
      LogWarning("trainer %d: no device pairs: %s", options_.trainer_rank,
                 kind.status().ToString());
    }
  }
  if (!options_.shared_memory && !sockets && pair_kind == nullptr) return;
  if (!transports_.empty() && (!options_.shared_memory || segment_ == nullptr ||
                               segment_->total_elements() == layout.total_elements())) {
    return;
  }
  transports_.clear();
  shared_memory_transports_.clear();
  socket_transports_.clear();
  device_pair_transports_.clear();
  for (auto& shard : shards_) shard->set_transport(nullptr);
  segment_.reset();
  if (options_.shared_memory) {
    absl::StatusOr<std::unique_ptr<TrainerSegment>> segment =
        TrainerSegment::Create(layout.total_elements(), options_.push_dtype, options_.pull_dtype,
                               static_cast<uint32_t>(shards_.size()));
    if (segment.ok()) {
      segment_ = *std::move(segment);
    } else {
      LogWarning("trainer %d: no shared memory (payloads go %s): %s", options_.trainer_rank,
                 sockets ? "over payload sockets or gRPC" : "over gRPC",
                 segment.status().ToString());
    }
  }
  if (segment_ == nullptr && !sockets && pair_kind == nullptr) return;
  for (auto& shard : shards_) {
    std::vector<std::shared_ptr<PayloadTransport>> parts;
    if (pair_kind != nullptr) {
      device_pair_transports_.push_back(std::make_shared<DevicePairTransport>(
          *pair_kind, options_.device_pair_gpu, shard->index(),
          absl::StrCat("trainer ", options_.trainer_rank), twins_));
      parts.push_back(device_pair_transports_.back());
    }
    if (segment_ != nullptr) {
      shared_memory_transports_.push_back(
          std::make_shared<SharedMemoryTransport>(segment_, shard->index()));
      parts.push_back(shared_memory_transports_.back());
    }
    if (sockets) {
      socket_transports_.push_back(
          std::make_shared<SocketPayloadTransport>(shard->address(), shard->index()));
      parts.push_back(socket_transports_.back());
    }
    transports_.push_back(parts.size() == 1 ? parts[0]
                                            : std::make_shared<TransportChain>(std::move(parts)));
    shard->set_transport(transports_.back());
  }
}

absl::Span<float> TrainerClient::shared_gradients() const {
  if (segment_ == nullptr) return {};
  return absl::MakeSpan(segment_->gradients(), segment_->total_elements());
}

absl::Span<float> TrainerClient::shared_parameters() const {
  if (segment_ == nullptr) return {};
  return absl::MakeSpan(segment_->parameters(), segment_->total_elements());
}

int64_t TrainerClient::shared_memory_transfers() const {
  int64_t transfers = 0;
  for (const auto& transport : shared_memory_transports_) transfers += transport->transfers();
  return transfers;
}

int64_t TrainerClient::device_pair_transfers() const {
  int64_t transfers = 0;
  for (const auto& transport : device_pair_transports_) transfers += transport->transfers();
  return transfers;
}

int64_t TrainerClient::socket_transfers() const {
  int64_t transfers = 0;
  for (const auto& transport : socket_transports_) transfers += transport->transfers();
  return transfers;
}

absl::Status TrainerClient::RegisterOrAttach(const ModelSpec& spec, const float* initial_params) {
  CancelStreamedPush();  // (PrepareModel replaces what its thread uses.)
  if (options_.trainer_rank >= spec.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", options_.trainer_rank, " is not below num_trainers ", spec.num_trainers));
  }
  absl::StatusOr<ModelLayout> layout = LayoutFor(spec);
  if (!layout.ok()) return layout.status();
  absl::StatusOr<v1::ModelConfig> config = ModelConfigFor(spec, *layout, shard_count());
  if (!config.ok()) return config.status();
  // PrepareModel replaces what steps use (ranges, calls, transports, the
  // shared segment, the model the calls name): for another model or other
  // sizes there is none until this registration succeeds, so that no step
  // runs with the old layout's sizes on the new parts or sends the old
  // model's gradients to the new one. (A re-attach of the same model, as
  // after a rollback, keeps the client usable if it fails.)
  const bool same_model = spec_ && spec_->model_id == spec.model_id;
  if (layout_ && !(same_model && SameSizes(*layout_, *layout, shard_count()))) layout_.reset();
  if (absl::Status s = PrepareModel(spec, *layout); !s.ok()) return s;
  ShardFanOut::Call call = CallFor(initial_params ? "RegisterModel" : "RegisterModel (attach)");
  if (!initial_params) {
    call.policy.budget = options_.attach_timeout;
    call.retryable = [](const absl::Status& s) { return IsRetryable(s) || absl::IsNotFound(s); };
  }
  // Names this run in the model's checkpoints (used only if the model is
  // new): the run of the shards that hold the model already, if any.
  std::string run_id = NewRunId();
  if (initial_params) {
    absl::StatusOr<std::optional<std::string>> held = RunOfHeldModel(
        *fanout_, CallFor("RegisterModel (run of the held model)"), *config, *layout);
    if (!held.ok()) return held.status();
    if (*held) run_id = **held;
  }
  std::vector<ShardRegistration> shards;
  for (int round = 0;; ++round) {
    absl::StatusOr<std::vector<ShardRegistration>> registered = RegisterOnEveryShard(
        *fanout_, call, *config, *layout, initial_params, run_id, options_.chunk_bytes);
    if (!registered.ok()) return registered.status();
    shards = std::move(*registered);
    if (std::all_of(shards.begin(), shards.end(),
                    [&](const ShardRegistration& s) { return s.run_id == shards[0].run_id; })) {
      // A journal of another run (the job started over) holds nothing of this one.
      if (absl::Status s = history_->BindToRun(shards[0].run_id); !s.ok()) return s;
      // What an earlier process of this trainer pushed counts as pushed (see
      // SetHyperparameters).
      last_pushed_step_ = std::max(last_pushed_step_, history_->newest_step());
    }
    if (IsAsynchronous(spec.consistency)) {
      // Shards count different pushes applied: their versions differ. Only
      // a shard that had to create the model while others hold it is wrong.
      const bool created = std::any_of(shards.begin(), shards.end(),
                                       [](const ShardRegistration& s) { return s.created; });
      const bool trained = std::any_of(shards.begin(), shards.end(),
                                       [](const ShardRegistration& s) { return s.version > 0; });
      if (!(created && trained)) break;
    }
    int64_t highest = shards[0].version;
    bool agree = true;
    for (const ShardRegistration& s : shards) {
      highest = std::max(highest, s.version);
      agree = agree && s.version == shards[0].version && s.loss_scaler == shards[0].loss_scaler;
    }
    if (agree) break;
    const bool any_created = std::any_of(shards.begin(), shards.end(),
                                         [](const ShardRegistration& s) { return s.created; });
    if (any_created || round >= kMaxRecoveries) {
      // A shard that had to create the model will not catch up by itself
      // (it restarted without --restore_from): they must not be trained as
      // one model.
      std::vector<std::string> each;
      for (size_t j = 0; j < shards.size(); ++j) {
        each.push_back(absl::StrCat("shard ", j, " (", shards_[j]->address(), ") at version ",
                                    shards[j].version, shards[j].created ? " (just created)" : ""));
      }
      return absl::FailedPreconditionError(
          absl::StrCat("model '", spec.model_id,
                       "': shards disagree on the version: ", absl::StrJoin(each, ", ")));
    }
    // Some shards restarted from an older checkpoint, or this trainer died
    // in the middle of a step: bring every shard to the highest version
    // (every trainer takes part; this one re-sends from its history). A
    // rollback is fine here: the trainer starts from wherever the job is.
    absl::Status brought = recovery_->BringTo(highest);
    if (std::optional<int64_t> back = RolledBackTo(brought)) {
      history_->DropAfter(*back);
      last_pushed_step_ = *back;
    } else if (!brought.ok()) {
      return brought;
    }
  }
  if (initial_params) {
    if (absl::Status s = CheckHeldInitialValues(*steps_, shards, *layout, initial_params,
                                                options_.pull_dtype, spec.model_id);
        !s.ok()) {
      return s;
    }
  }
  for (size_t i = 1; i < shards.size(); ++i) {
    if (shards[i].run_id != shards[0].run_id) {
      // Two registrations raced (one interrupted and repeated): their
      // checkpoints would never combine.
      return absl::FailedPreconditionError(
          absl::StrCat("model '", spec.model_id, "': shard 0 holds it for run '", shards[0].run_id,
                       "' but shard ", i, " for run '", shards[i].run_id,
                       "' (an interrupted registration?): re-register it"));
    }
  }
  if (!IsAsynchronous(spec.consistency) && history_->newest_step() > shards[0].version) {
    if (absl::Status s = ForgetPushesGivenUpAt(shards[0].version); !s.ok()) return s;
  }
  layout_ = std::move(*layout);
  spec_ = spec;
  registered_version_ = shards[0].version;
  undecided_push_ = 0;  // (Of the model, or the timeline, before.)
  scaler_step_scale_.reset();
  if (spec.loss_scaling) {
    scaler_.emplace(spec.loss_scaler);
    // Where the other trainers' scalers are (after a restart: not initial).
    if (shards[0].loss_scaler) scaler_->set_state(*shards[0].loss_scaler);
    // (Asynchronous: the version counts every trainer's pushes, and each
    // trainer's scaler is its own, from its initial scale.)
    scaler_step_ = IsAsynchronous(spec.consistency) ? 0 : shards[0].version;
  } else {
    scaler_.reset();
    scaler_step_ = 0;
  }
  return absl::OkStatus();
}

absl::Status TrainerClient::Recover(int64_t target) {
  return FollowRollBack(recovery_->BringTo(target));
}

absl::Status TrainerClient::FollowRollBack(absl::Status status) {
  std::optional<int64_t> rolled_back = RolledBackTo(status);
  if (!rolled_back) return status;
  // Every shard is at *rolled_back now: the pushes after it belong to the
  // steps given up; the scaler replica is taken from there.
  history_->DropAfter(*rolled_back);
  last_pushed_step_ = *rolled_back;  // The steps after it are to be pushed again.
  if (absl::Status s = RegisterOrAttach(*spec_, nullptr); !s.ok()) return s;
  rolled_back_to_ = registered_version_;
  return status;
}

bool TrainerClient::ModelNeedsDecisions() const {
  return ModelStepsNeedDecisions(spec_->consistency, spec_->max_grad_norm, spec_->loss_scaling,
                                 spec_->optimizer.kind, *layout_);
}

absl::StatusOr<StepDecision> TrainerClient::TakeStepDecision(int64_t step, double scale) {
  const ModelLayout* trust_layout =
      StepsNeedTrustNorms(spec_->optimizer.kind, *layout_) ? &*layout_ : nullptr;
  absl::StatusOr<StepDecision> decided =
      steps_->TakeDecision(step, step, spec_->max_grad_norm, trust_layout);
  if (!decided.ok()) return decided.status();
  // Journaled before any shard sees it: a restarted trainer replays it.
  if (absl::Status s = history_->RecordDecision(step, *decided); !s.ok()) return s;
  // The shards update their scaler replica as the decision reaches them:
  // so does this trainer's scaler, once per step, whether or not the pull
  // succeeds.
  if (scaler_ && scaler_step_ < step) {
    scaler_->Update(decided->skip);
    scaler_step_ = step;
    scaler_step_scale_ = scale;
  }
  return decided;
}

absl::StatusOr<int64_t> TrainerClient::Pull(int64_t min_version, absl::Span<float> flat_params) {
  CancelStreamedPush();
  if (absl::Status s = CheckBuffer(flat_params.size(), "parameter buffer"); !s.ok()) return s;
  rolled_back_to_.reset();
  if (asynchronous()) return AsyncPull(flat_params);
  // After Push(step) with gradient control the step waits for a decision
  // (Step takes it between its push and its pull): this pull takes it, in
  // every round (a shard that recovered needs it too).
  const bool decides = min_version > 0 && undecided_push_ == min_version;
  for (int round = 0;; ++round) {
    // A shard that lost this trainer's push of the step (it restarted) says
    // so at once instead of waiting for a version that cannot come.
    const int64_t pushed_step =
        min_version > 0 && last_pushed_step_ == min_version ? min_version : 0;
    std::optional<StepDecision> decision;
    absl::Status decided_status;
    if (decides && pushed_step > 0) {
      absl::StatusOr<PushedStep> mine = history_->Find(pushed_step);
      absl::StatusOr<StepDecision> decided =
          TakeStepDecision(pushed_step, mine.ok() ? mine->loss_scale : loss_scale());
      decided_status = decided.status();
      if (decided.ok()) decision = *std::move(decided);
    }
    // (A decision that failed, e.g. OUT_OF_RANGE from a restarted shard,
    // goes where a failed pull goes: recovery.)
    absl::StatusOr<PulledVersion> pulled =
        !decided_status.ok() ? absl::StatusOr<PulledVersion>(decided_status)
                             : steps_->Pull(min_version, pushed_step,
                                            decision ? &*decision : nullptr, flat_params.data());
    if (pulled.ok()) {
      if (decides) undecided_push_ = 0;
      return pulled->version;
    }
    if (!absl::IsOutOfRange(pulled.status()) || pushed_step == 0 || round >= kMaxRecoveries) {
      return pulled.status();
    }
    if (absl::Status s = Recover(pushed_step - 1); !s.ok()) return s;
    absl::StatusOr<PushedStep> mine = history_->Find(pushed_step);
    if (!mine.ok()) {
      return absl::FailedPreconditionError(
          absl::StrCat("a shard lost this trainer's push of step ", pushed_step, " and ",
                       mine.status().message(), ": push the step again (Step or Push), then pull"));
    }
    std::vector<v1::PushGradientsResponse> responses;
    if (absl::Status s =
            steps_->Push(pushed_step, mine->payload->data(), mine->dtype, mine->loss_scale,
                         history_->ChangesAfter(pushed_step - 1), &responses);
        !s.ok() && !absl::IsOutOfRange(s)) {
      return s;
    }
  }
}

absl::StatusOr<StepResult> TrainerClient::Step(int64_t step, absl::Span<const float> flat_grads,
                                               absl::Span<float> flat_params) {
  CancelStreamedPush();
  if (absl::Status s = CheckBuffer(flat_grads.size(), "gradient buffer"); !s.ok()) return s;
  if (absl::Status s = CheckBuffer(flat_params.size(), "parameter buffer"); !s.ok()) return s;
  if (asynchronous()) return AsyncStep(step, flat_grads, flat_params);
  PreparedPush prepared;
  if (absl::Status s = PreparePush(step, flat_grads, &prepared); !s.ok()) return s;
  const double scale = prepared.scale;
  const bool needs_decision = ModelNeedsDecisions();
  for (int round = 0;; ++round) {
    // The pull of the version this push makes, opened at once (see
    // EarlyPull); whatever goes wrong with it, the pull below runs as usual.
    absl::StatusOr<PulledVersion> early_pulled = absl::UnknownError("no early pull");
    const bool early = !needs_decision && early_pull_ && round == 0;
    if (early) early_pull_->Start(step, flat_params);
    absl::StatusOr<StepResult> result = PushPayload(step, prepared.payload, scale);
    if (early) early_pulled = early_pull_->PushEnded(result.ok());
    if (!result.ok()) return result;
    std::optional<StepDecision> decision;
    absl::Status status;
    if (needs_decision) {
      absl::StatusOr<StepDecision> decided = TakeStepDecision(step, scale);
      status = decided.status();
      if (decided.ok()) decision = *std::move(decided);
    }
    absl::StatusOr<PulledVersion> pulled =
        !status.ok() ? absl::StatusOr<PulledVersion>(status)
        : early_pulled.ok()
            ? early_pulled
            : steps_->Pull(step, step, decision ? &*decision : nullptr, flat_params.data());
    if (absl::IsOutOfRange(pulled.status()) && round < kMaxRecoveries) {
      // A shard lost this step's push (it restarted): bring every shard up
      // to the step before, then the whole step again (all of it idempotent).
      if (absl::Status s = Recover(step - 1); !s.ok()) return s;
      continue;
    }
    if (!pulled.ok()) return pulled.status();
    result->lr = pulled->lr;
    if (decision) {
      result->skipped = decision->skip;
      result->grad_norm = decision->grad_norm;
      result->clip_coef = decision->clip_coef;
      result->loss_scale = scale;
    }
    if (pulled->version != step) {
      // The shards are past this step: this trainer is behind (e.g.
      // restarted with a stale step count) and its gradient was not used.
      return absl::FailedPreconditionError(absl::StrCat(
          "trainer ", options_.trainer_rank, " pushed step ", step,
          " but the shards are at version ", pulled->version, ": the trainer is behind"));
    }
    result->version = pulled->version;
    result->bytes_pulled = flat_params.size() * DTypeSize(options_.pull_dtype);
    if (undecided_push_ == step) undecided_push_ = 0;  // (A Push(step) before.)
    return result;
  }
}

}  // namespace shardopt
