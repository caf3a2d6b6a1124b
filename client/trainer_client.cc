#include "client/trainer_client.h"

#include <google/protobuf/util/json_util.h>
#include <grpcpp/channel.h>
#include <grpcpp/client_context.h>
#include <grpcpp/create_channel.h>
#include <grpcpp/security/credentials.h>
#include <grpcpp/support/channel_arguments.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <set>
#include <thread>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/push_journal.h"
#include "client/retry.h"
#include "client/wire_frames.h"
#include "common/dtype_convert.h"
#include "common/finite.h"
#include "common/grpc_status.h"
#include "common/proto_convert.h"
#include "proto/shardopt/v1/shard_service.grpc.pb.h"

namespace shardopt {
namespace {

// Room for a chunk plus its header, with margin for larger chunk_bytes.
constexpr int kMaxMessageBytes = 64 << 20;

// The calls of one client operation to all shards. When one shard fails for
// good, the calls to the others are cancelled: a pull waiting for a version
// that can no longer come would otherwise sit out its whole deadline.
class ShardCalls {
 public:
  // Registers an attempt's context; false once the operation has failed.
  bool Begin(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    if (failed_) return false;
    contexts_.insert(context);
    return true;
  }
  void End(grpc::ClientContext* context) {
    absl::MutexLock lock(&mu_);
    contexts_.erase(context);
  }
  void Fail() {
    absl::MutexLock lock(&mu_);
    failed_ = true;
    for (grpc::ClientContext* c : contexts_) c->TryCancel();
  }
  bool failed() {
    absl::MutexLock lock(&mu_);
    return failed_;
  }

 private:
  absl::Mutex mu_;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  std::set<grpc::ClientContext*> contexts_ ABSL_GUARDED_BY(mu_);
};

// One attempt's context, registered with its ShardCalls for its lifetime.
class AttemptContext {
 public:
  AttemptContext(ShardCalls* calls, absl::Duration timeout) : calls_(calls) {
    context_.set_deadline(absl::ToChronoTime(absl::Now() + timeout));
    active_ = calls_->Begin(&context_);
  }
  ~AttemptContext() {
    if (active_) calls_->End(&context_);
  }
  // False when another shard already failed: do not start the call.
  bool active() const { return active_; }
  grpc::ClientContext* get() { return &context_; }

 private:
  ShardCalls* const calls_;
  grpc::ClientContext context_;
  bool active_ = false;
};

absl::Status CancelledBySibling() {
  return absl::CancelledError("cancelled: another shard failed");
}

// Runs fn(i, calls) for i in [0, n) concurrently. The first shard to fail
// after its retries cancels the others; its error is returned.
absl::Status ForEachShard(size_t n, const std::function<absl::Status(size_t, ShardCalls*)>& fn) {
  ShardCalls calls;
  std::vector<absl::Status> statuses(n);
  absl::Mutex mu;
  int first_failure = -1;
  auto run = [&](size_t i) {
    absl::Status s = fn(i, &calls);
    if (!s.ok()) {
      {
        absl::MutexLock lock(&mu);
        if (first_failure < 0) first_failure = static_cast<int>(i);
      }
      calls.Fail();
    }
    statuses[i] = std::move(s);
  };
  if (n == 1) {
    run(0);
  } else {
    std::vector<std::thread> threads;
    threads.reserve(n);
    for (size_t i = 0; i < n; ++i) threads.emplace_back(run, i);
    for (std::thread& t : threads) t.join();
  }
  return first_failure < 0 ? absl::OkStatus() : statuses[first_failure];
}

// The streaming methods called with zero-copy frames (client/wire_frames.h)
// instead of the generated stub's message types.
const grpc::internal::RpcMethod::RpcType kClientStreaming =
    grpc::internal::RpcMethod::CLIENT_STREAMING;
const grpc::internal::RpcMethod::RpcType kServerStreaming =
    grpc::internal::RpcMethod::SERVER_STREAMING;
constexpr char kPushMethod[] = "/shardopt.v1.ShardService/PushGradients";
constexpr char kPullMethod[] = "/shardopt.v1.ShardService/PullParameters";

}  // namespace

struct TrainerClient::Shard {
  uint32_t index = 0;
  // The shard refused a step as ahead of it (it restarted from a checkpoint):
  // the next attempt re-pushes the steps it lacks first.
  std::atomic<bool> behind{false};
  // Attempts that failed UNAVAILABLE or DEADLINE_EXCEEDED (failed_attempts()).
  std::atomic<int64_t> unreachable_attempts{0};
  std::string address;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::ShardService::Stub> stub;
  std::unique_ptr<grpc::internal::RpcMethod> push_method;
  std::unique_ptr<grpc::internal::RpcMethod> pull_method;
  FlatRange range;

  grpc::ChannelArguments channel_args;
  // Set when the channel could not connect: the next attempt opens a fresh
  // one (see OpenChannel).
  bool reopen_channel = false;

  // A new channel to the shard. A channel that failed to connect to a shard
  // that was down can keep failing for many seconds after it is back (its
  // reconnect backoff, and a re-resolution held back by the resolver's
  // cooldown); a fresh channel connects at once.
  void OpenChannel() {
    channel = grpc::CreateCustomChannel(address, grpc::InsecureChannelCredentials(), channel_args);
    stub = v1::ShardService::NewStub(channel);
    push_method =
        std::make_unique<grpc::internal::RpcMethod>(kPushMethod, kClientStreaming, channel);
    pull_method =
        std::make_unique<grpc::internal::RpcMethod>(kPullMethod, kServerStreaming, channel);
  }

  // "shard 1 (127.0.0.1:5000): <what>: <cause>", keeping the cause's code.
  absl::Status Annotate(const absl::Status& status, const std::string& what) const {
    if (status.ok()) return status;
    return absl::Status(status.code(), absl::StrCat("shard ", index, " (", address, "): ", what,
                                                    ": ", status.message()));
  }
};

RetryPolicy TrainerClient::DefaultRetryPolicy() const {
  return RetryPolicy{options_.retry_budget, options_.initial_backoff, options_.max_backoff};
}

absl::Status TrainerClient::CallEveryShard(
    const std::string& what, const RetryPolicy& policy,
    const std::function<absl::Status(Shard&, grpc::ClientContext&)>& call,
    const std::function<bool(const absl::Status&)>& retryable, CatchUpPlan catch_up) {
  const auto retry_if = [&](const absl::Status& s) {
    return retryable(s) || (catch_up.last_step >= 0 && IsBehind(s));
  };
  return ForEachShard(shards_.size(), [&](size_t i, ShardCalls* calls) -> absl::Status {
    Shard& shard = *shards_[i];
    auto attempt = [&]() -> absl::Status {
      if (shard.behind && catch_up.last_step >= 0) {
        // Before the attempt's deadline starts: a catch-up can take a while.
        if (absl::Status s = CatchUp(shard, catch_up.last_step, catch_up.wait_for_last); !s.ok()) {
          return s;
        }
      }
      AttemptContext attempt_context(calls, options_.rpc_timeout);
      if (!attempt_context.active()) return CancelledBySibling();
      if (shard.reopen_channel) {
        shard.OpenChannel();
        shard.reopen_channel = false;
      }
      absl::Status st = call(shard, *attempt_context.get());
      if (absl::IsUnavailable(st) || absl::IsDeadlineExceeded(st)) {
        shard.unreachable_attempts.fetch_add(1, std::memory_order_relaxed);
      }
      if (catch_up.last_step >= 0) st = MarkIfBehind(shard, st);
      if (absl::IsUnavailable(st) &&
          shard.channel->GetState(false) == GRPC_CHANNEL_TRANSIENT_FAILURE) {
        shard.reopen_channel = true;
      }
      return st;
    };
    return shard.Annotate(RetryWithBackoff(policy, attempt, retry_if), what);
  });
}

int64_t TrainerClient::failed_attempts() const {
  int64_t total = 0;
  for (const auto& shard : shards_) total += shard->unreachable_attempts.load();
  return total;
}

int64_t TrainerClient::failed_attempts(size_t shard) const {
  return shard < shards_.size() ? shards_[shard]->unreachable_attempts.load() : 0;
}

absl::StatusOr<std::unique_ptr<TrainerClient>> TrainerClient::Connect(
    const std::vector<std::string>& shard_addresses, const TrainerClientOptions& options) {
  if (shard_addresses.empty()) {
    return absl::InvalidArgumentError("no shard addresses given");
  }
  if (options.chunk_bytes < sizeof(float) ||
      options.chunk_bytes > static_cast<size_t>(kMaxMessageBytes) / 2) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk_bytes ", options.chunk_bytes, " is not in [4, 32 MiB]"));
  }
  std::vector<std::unique_ptr<Shard>> shards;
  for (size_t i = 0; i < shard_addresses.size(); ++i) {
    grpc::ChannelArguments args;
    args.SetMaxReceiveMessageSize(kMaxMessageBytes);
    args.SetMaxSendMessageSize(kMaxMessageBytes);
    // Each shard gets its own connection even when addresses repeat.
    args.SetInt("shardopt.shard_index", static_cast<int>(i));
    // Detect a peer that died or froze while a call is open: its transport
    // is closed, failing the call (and releasing zero-copy payload slices).
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, 30000);
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, 20000);
    // Reconnect to a restarted shard as soon as the retries ask: gRPC's own
    // backoff (1 s growing to 120 s) would keep failing calls with the stale
    // "connection refused" long after the shard is back. (gRPC's "min
    // reconnect backoff" is the connect timeout: it stays at 5 s.)
    const int reconnect_ms =
        static_cast<int>(std::max<int64_t>(20, absl::ToInt64Milliseconds(options.initial_backoff)));
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, reconnect_ms);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 5000);
    args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS,
                static_cast<int>(std::max<int64_t>(
                    reconnect_ms, absl::ToInt64Milliseconds(options.max_backoff))));
    auto shard = std::make_unique<Shard>();
    shard->index = static_cast<uint32_t>(i);
    shard->address = shard_addresses[i];
    shard->channel_args = args;
    shard->OpenChannel();
    shards.push_back(std::move(shard));
  }
  return std::unique_ptr<TrainerClient>(new TrainerClient(options, std::move(shards)));
}

TrainerClient::TrainerClient(const TrainerClientOptions& options,
                             std::vector<std::unique_ptr<Shard>> shards)
    : options_(options), shards_(std::move(shards)) {}

TrainerClient::~TrainerClient() = default;

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
  return ModelLayout::Create(spec.tensors, spec.alignment, shard_count());
}

absl::Status TrainerClient::Register(const ModelSpec& spec,
                                     absl::Span<const float> initial_params) {
  return RegisterOrAttach(spec, initial_params);
}

absl::Status TrainerClient::Attach(const ModelSpec& spec) {
  return RegisterOrAttach(spec, std::nullopt);
}

absl::Status TrainerClient::RegisterOrAttach(
    const ModelSpec& spec, std::optional<absl::Span<const float>> initial_params) {
  if (options_.trainer_rank >= spec.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat(
        "trainer rank ", options_.trainer_rank, " is not below num_trainers ", spec.num_trainers));
  }
  absl::StatusOr<ModelLayout> layout = LayoutFor(spec);
  if (!layout.ok()) return layout.status();
  if (absl::Status s = spec.optimizer.Validate(); !s.ok()) return s;
  if (initial_params && initial_params->size() != layout->total_elements()) {
    return absl::InvalidArgumentError(
        absl::StrCat("initial parameters have ", initial_params->size(),
                     " elements; the layout needs ", layout->total_elements()));
  }
  v1::ModelConfig config;
  config.set_model_id(spec.model_id);
  *config.mutable_layout() = LayoutToProto(*layout);
  config.mutable_layout()->set_alignment(spec.alignment);
  *config.mutable_optimizer() = OptimizerConfigToProto(spec.optimizer);
  if (absl::Status s = spec.lr_schedule.Validate(); !s.ok()) return s;
  *config.mutable_lr_schedule() = LrScheduleToProto(spec.lr_schedule);
  if (spec.loss_scaling) {
    if (absl::Status s = spec.loss_scaler.Validate(); !s.ok()) return s;
  }
  config.mutable_gradient_control()->set_max_grad_norm(spec.max_grad_norm);
  config.mutable_gradient_control()->set_loss_scaling(spec.loss_scaling);
  if (spec.loss_scaling) {
    // The shards keep a replica, so that a trainer that comes back resumes
    // the scaler where the others are.
    v1::LossScalerConfig* scaler = config.mutable_gradient_control()->mutable_loss_scaler();
    scaler->set_initial_scale(spec.loss_scaler.initial_scale);
    scaler->set_min_scale(spec.loss_scaler.min_scale);
    scaler->set_growth_factor(spec.loss_scaler.growth_factor);
    scaler->set_backoff_factor(spec.loss_scaler.backoff_factor);
    scaler->set_growth_interval(spec.loss_scaler.growth_interval);
    scaler->set_hysteresis(spec.loss_scaler.hysteresis);
    scaler->set_max_scale(spec.loss_scaler.max_scale);
  }
  config.set_num_trainers(spec.num_trainers);
  config.set_reduction(spec.reduction == GradientReduction::kSum ? v1::GRADIENT_REDUCTION_SUM
                                                                 : v1::GRADIENT_REDUCTION_MEAN);
  config.set_shard_count(shard_count());

  std::vector<int64_t> versions(shards_.size(), 0);
  // char, not bool: shards write their entries concurrently.
  std::vector<char> created(shards_.size(), 0);
  std::vector<std::optional<LossScaler::State>> scaler_states(shards_.size());
  std::vector<std::string> run_ids(shards_.size());
  const RetryPolicy policy{initial_params ? options_.retry_budget : options_.attach_timeout,
                           options_.initial_backoff, options_.max_backoff};
  // Names this run in the model's checkpoints (used only if the model is new).
  absl::BitGen random;
  const std::string run_id =
      absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16),
                   absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16));
  // Shards at different versions mid-step, or a shard restarted from a
  // checkpoint that the running trainers are catching up: wait for them to
  // agree, up to the retry budget.
  const absl::Time agree_deadline = absl::Now() + policy.budget;
  bool journal_replayed = false;
  absl::Duration agree_backoff = options_.initial_backoff;
  for (;;) {
    absl::Status status = CallEveryShard(
        initial_params ? "RegisterModel" : "RegisterModel (attach)", policy,
        [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
          const FlatRange range = layout->ShardRange(shard.index);
          v1::RegisterModelResponse response;
          std::unique_ptr<grpc::ClientWriter<v1::RegisterModelRequest>> writer =
              shard.stub->RegisterModel(&context, &response);
          v1::RegisterModelRequest request;
          v1::RegisterHeader* header = request.mutable_header();
          *header->mutable_config() = config;
          header->set_shard_index(shard.index);
          header->set_attach_only(!initial_params);
          header->set_run_id(run_id);
          bool open = writer->Write(request);
          if (initial_params) {
            const size_t chunk = options_.chunk_bytes / sizeof(float);
            for (uint64_t off = 0; open && off < range.size(); off += chunk) {
              const uint64_t count = std::min<uint64_t>(chunk, range.size() - off);
              v1::TensorChunk* values = request.mutable_values();
              values->set_offset(off);
              values->set_data(initial_params->data() + range.begin + off, count * sizeof(float));
              open = writer->Write(request);
            }
          }
          // A server that answers early (the model already exists) closes the
          // stream: Finish() then carries its answer.
          if (open) writer->WritesDone();
          absl::Status s = ToAbslStatus(writer->Finish());
          if (!s.ok()) return s;
          if (response.range().begin() != range.begin || response.range().end() != range.end) {
            return absl::InternalError(absl::StrCat(
                "server reports range [", response.range().begin(), ", ", response.range().end(),
                ") but the layout gives [", range.begin, ", ", range.end, ")"));
          }
          versions[shard.index] = response.version();
          created[shard.index] = response.created();
          if (response.has_loss_scaler()) {
            scaler_states[shard.index] = LossScaler::State{
                response.loss_scaler().scale(), response.loss_scaler().growth_tracker(),
                response.loss_scaler().hysteresis_tracker()};
          }
          run_ids[shard.index] = response.run_id();
          return absl::OkStatus();
        },
        [&](const absl::Status& s) {
          return IsRetryable(s) || (!initial_params && absl::IsNotFound(s));
        });
    if (!status.ok()) return status;
    // Shards at different versions (e.g. one restarted empty while the others
    // trained on) must not be trained as one model.
    bool agree = true;
    for (size_t i = 1; i < shards_.size(); ++i) {
      // (A scaler replica one decision ahead: a step was decided meanwhile.)
      agree = agree && versions[i] == versions[0] && scaler_states[i] == scaler_states[0];
    }
    if (agree) break;
    // A shard that had to create the model will not catch up by itself.
    const bool any_created = std::count(created.begin(), created.end(), 1) > 0;
    if (!any_created && !journal_replayed && !options_.journal_path.empty()) {
      // This trainer may have died in the middle of a push: send it again to
      // the shards that missed it.
      if (absl::Status s = ReplayJournal(spec.model_id, *layout, versions); !s.ok()) return s;
      journal_replayed = true;
      continue;
    }
    if (!any_created && absl::Now() + agree_backoff < agree_deadline) {
      absl::SleepFor(agree_backoff);
      agree_backoff = std::min(agree_backoff * 2, options_.max_backoff);
      continue;
    }
    for (size_t i = 1; i < shards_.size(); ++i) {
      if (versions[i] != versions[0]) {
        std::vector<std::string> each;
        for (size_t j = 0; j < shards_.size(); ++j) {
          each.push_back(absl::StrCat("shard ", j, " (", shards_[j]->address, ") at version ",
                                      versions[j], created[j] ? " (just created)" : ""));
        }
        return absl::FailedPreconditionError(
            absl::StrCat("model '", spec.model_id,
                         "': shards disagree on the version: ", absl::StrJoin(each, ", ")));
      }
    }
  }
  for (size_t i = 1; i < shards_.size(); ++i) {
    if (run_ids[i] != run_ids[0]) {
      // Two registrations raced (one interrupted and repeated): their
      // checkpoints would never combine.
      return absl::FailedPreconditionError(absl::StrCat(
          "model '", spec.model_id, "': shard 0 holds it for run '", run_ids[0], "' but shard ", i,
          " for run '", run_ids[i], "' (an interrupted registration?): re-register it"));
    }
  }
  for (auto& shard : shards_) shard->range = layout->ShardRange(shard->index);
  layout_ = std::move(*layout);
  model_id_ = spec.model_id;
  registered_version_ = versions[0];
  max_grad_norm_ = spec.max_grad_norm;
  needs_decision_ = spec.max_grad_norm > 0 || spec.loss_scaling;
  if (spec.loss_scaling) {
    scaler_.emplace(spec.loss_scaler);
    // Where the other trainers' scalers are (after a restart: not initial).
    if (scaler_states[0]) scaler_->set_state(*scaler_states[0]);  // The shards agree (above).
    scaler_step_ = versions[0];
  } else {
    scaler_.reset();
  }
  return absl::OkStatus();
}

absl::StatusOr<StepResult> TrainerClient::Push(int64_t step, absl::Span<const float> flat_grads) {
  if (absl::Status s = CheckBuffer(flat_grads.size(), "gradient buffer"); !s.ok()) return s;
  // Counted before any shard can see the step (see SetHyperparameters).
  last_pushed_step_ = std::max(last_pushed_step_, step);
  // Checked here, whole, before any shard sees the step: a NaN found by one
  // shard only would leave the others holding (or applying) step `step`.
  // (With loss scaling an overflow is expected: every shard skips the step.)
  // 16-bit wire types are rounded once here (as PyTorch's .to() would) and
  // checked after rounding, which also finds the NaNs and infinities of the
  // fp32 input, and finite values that overflow fp16.
  const DType wire_dtype = options_.push_dtype;
  const size_t element = DTypeSize(wire_dtype);
  std::vector<char> narrowed;
  const void* payload = flat_grads.data();
  size_t bad = flat_grads.size();
  if (wire_dtype == DType::kFloat32) {
    if (!scaler_) bad = FindNonFinite(flat_grads.data(), flat_grads.size());
  } else {
    narrowed.resize(flat_grads.size() * element);
    bad = ConvertFromFloatAndFindNonFinite(flat_grads.data(), flat_grads.size(), wire_dtype,
                                           narrowed.data());
    payload = narrowed.data();
  }
  if (!scaler_ && bad != flat_grads.size()) {
    const bool overflow = std::isfinite(flat_grads[bad]);
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of ", layout_->DescribeElement(bad), " for step ", step, " is ", flat_grads[bad],
        overflow ? absl::StrCat(", which overflows ", DTypeName(wire_dtype),
                                wire_dtype == DType::kFloat16
                                    ? "; nothing was pushed (scale the loss down, or push bfloat16)"
                                    : "; nothing was pushed (scale the loss down)")
                 : "; nothing was pushed"));
  }
  std::vector<v1::PushGradientsResponse> responses(shards_.size());
  // gRPC may hold the zero-copy payload slices a little past each call's
  // Finish(); the payload must outlive them.
  PayloadPins pins;
  struct WaitForPins {
    PayloadPins* pins;
    ~WaitForPins() { pins->WaitUntilReleased(); }
  } wait_for_pins{&pins};
  const double loss_scale = scaler_ ? scaler_->scale() : 1.0;
  const int64_t replayed_before = replayed_pushes_.load();
  if (!options_.journal_path.empty()) {
    JournaledPush entry;
    entry.model_id = model_id_;
    entry.trainer_rank = options_.trainer_rank;
    entry.step = step;
    entry.dtype = wire_dtype;
    entry.loss_scale = loss_scale;
    if (absl::Status s =
            WritePushJournal(options_.journal_path, entry, payload, flat_grads.size() * element);
        !s.ok()) {
      return s;
    }
  }
  absl::Status status = CallEveryShard(
      absl::StrCat("PushGradients step ", step), DefaultRetryPolicy(),
      [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
        return PushToShard(shard, context, step, payload, wire_dtype, loss_scale, &pins,
                           &responses[shard.index]);
      },
      IsRetryable,
      // A shard restarted from an older checkpoint gets steps up to `step` - 1 first.
      {step - 1, /*wait_for_last=*/true});
  if (!status.ok()) return status;
  if (options_.replay_steps > 0) Remember(step, payload, flat_grads.size() * element, loss_scale);
  StepResult result;
  result.step = step;
  result.replayed_pushes = static_cast<int>(replayed_pushes_.load() - replayed_before);
  for (size_t i = 0; i < shards_.size(); ++i) {
    const v1::PushGradientsResponse& r = responses[i];
    if (r.outcome() == v1::PushGradientsResponse::OUTCOME_APPLIED ||
        r.outcome() == v1::PushGradientsResponse::OUTCOME_AWAITING_DECISION) {
      result.applied_here = true;  // This push completed the step's gradients.
    }
    if (r.outcome() == v1::PushGradientsResponse::OUTCOME_DUPLICATE ||
        r.outcome() == v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED) {
      ++result.duplicate_pushes;
    }
    result.bytes_pushed += shards_[i]->range.size() * element;
  }
  return result;
}

absl::StatusOr<int64_t> TrainerClient::Pull(int64_t min_version, absl::Span<float> flat_params) {
  return PullInternal(min_version, flat_params, nullptr, nullptr);
}

absl::StatusOr<TrainerClient::Decision> TrainerClient::DecideStep(int64_t step) {
  std::vector<v1::StepStats> stats(shards_.size());
  absl::Status status = CallEveryShard(
      absl::StrCat("GetStepStats step ", step), DefaultRetryPolicy(),
      [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
        v1::GetStepStatsRequest request;
        request.set_model_id(model_id_);
        request.set_step(step);
        request.set_shard_index(shard.index);
        request.set_trainer_rank(options_.trainer_rank);
        request.set_pushed_step(step);
        return ToAbslStatus(shard.stub->GetStepStats(&context, request, &stats[shard.index]));
      },
      IsRetryable, {step, /*wait_for_last=*/false});
  if (!status.ok()) return status;
  // Every trainer computes this from the same numbers, in the same order:
  // they all send the same decision.
  Decision decision;
  double total = 0;
  for (const v1::StepStats& s : stats) {
    total += s.sum_of_squares();
    decision.skip = decision.skip || s.found_inf();
  }
  decision.skip = decision.skip || !std::isfinite(total);
  if (!decision.skip) {
    decision.grad_norm = std::sqrt(total);
    if (max_grad_norm_ > 0) {
      const double coef = max_grad_norm_ / (decision.grad_norm + 1e-6);
      if (coef < 1.0) decision.clip_coef = coef;
    }
  }
  return decision;
}

absl::StatusOr<int64_t> TrainerClient::PullInternal(int64_t min_version,
                                                    absl::Span<float> flat_params,
                                                    const Decision* decision, double* lr) {
  if (absl::Status s = CheckBuffer(flat_params.size(), "parameter buffer"); !s.ok()) return s;
  std::vector<int64_t> versions(shards_.size(), -1);
  std::vector<double> lrs(shards_.size(), 0.0);
  // A shard that lost this trainer's push of the step (it restarted) says so
  // at once instead of waiting for a version that cannot come.
  const int64_t pushed_step = min_version > 0 && last_pushed_step_ == min_version ? min_version : 0;
  absl::Status status =
      CallEveryShard(absl::StrCat("PullParameters version >= ", min_version), DefaultRetryPolicy(),
                     [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
                       return PullFromShard(shard, context, min_version, decision, pushed_step,
                                            flat_params.data() + shard.range.begin,
                                            &versions[shard.index], &lrs[shard.index]);
                     },
                     IsRetryable,
                     // Without a push of its own to check, a pull cannot tell a shard is behind.
                     {pushed_step > 0 ? pushed_step : -1, /*wait_for_last=*/false});
  if (!status.ok()) return status;
  for (size_t i = 1; i < versions.size(); ++i) {
    if (versions[i] != versions[0]) {
      return absl::FailedPreconditionError(
          absl::StrCat("shards disagree on the version: shard 0 is at ", versions[0], ", shard ", i,
                       " at ", versions[i]));
    }
  }
  if (lr != nullptr) *lr = lrs[0];
  return versions[0];
}

absl::Status TrainerClient::PushToShard(Shard& shard, grpc::ClientContext& context, int64_t step,
                                        const void* payload, DType wire_dtype, double loss_scale,
                                        PayloadPins* pins, v1::PushGradientsResponse* response) {
  const size_t element = DTypeSize(wire_dtype);
  std::unique_ptr<grpc::ClientWriter<PushFrame>> writer(
      grpc::internal::ClientWriterFactory<PushFrame>::Create(
          shard.channel.get(), *shard.push_method, &context, response));
  v1::PushGradientsRequest header_message;
  v1::PushHeader* header = header_message.mutable_header();
  header->set_model_id(model_id_);
  header->set_trainer_rank(options_.trainer_rank);
  header->set_step(step);
  header->set_shard_index(shard.index);
  header->set_num_elements(shard.range.size());
  header->set_dtype(DTypeToProto(wire_dtype));
  if (scaler_ || loss_scale != 1.0) header->set_loss_scale(loss_scale);
  PushFrame frame;
  frame.pins = pins;
  frame.element_size = element;
  frame.header = &header_message;
  bool open = writer->Write(frame);
  frame.header = nullptr;
  const size_t chunk = std::max<size_t>(1, options_.chunk_bytes / element);
  for (uint64_t off = 0; open && off < shard.range.size(); off += chunk) {
    frame.offset = off;
    frame.data = static_cast<const char*>(payload) + (shard.range.begin + off) * element;
    frame.count = std::min<uint64_t>(chunk, shard.range.size() - off);
    open = writer->Write(frame);
  }
  if (open) writer->WritesDone();
  return ToAbslStatus(writer->Finish());
}

absl::Status TrainerClient::PushOnce(Shard& shard, int64_t step, const void* payload,
                                     DType wire_dtype, double loss_scale,
                                     v1::PushGradientsResponse* response) {
  PayloadPins pins;
  absl::Status pushed;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    pushed = PushToShard(shard, context, step, payload, wire_dtype, loss_scale, &pins, response);
  }
  // The payload must outlive gRPC's hold on it (see Push).
  pins.WaitUntilReleased();
  return pushed;
}

absl::Status TrainerClient::PullFromShard(Shard& shard, grpc::ClientContext& context,
                                          int64_t min_version, const Decision* decision,
                                          int64_t pushed_step, float* destination,
                                          int64_t* version_out, double* lr_out) {
  v1::PullParametersRequest request;
  request.set_model_id(model_id_);
  request.set_min_version(min_version);
  request.set_shard_index(shard.index);
  request.set_dtype(DTypeToProto(options_.pull_dtype));
  request.set_trainer_rank(options_.trainer_rank);
  request.set_pushed_step(pushed_step);
  if (decision != nullptr) {
    request.mutable_decision()->set_skip(decision->skip);
    request.mutable_decision()->set_clip_coef(decision->clip_coef);
    request.mutable_decision()->set_grad_norm(decision->grad_norm);
  }
  std::unique_ptr<grpc::ClientReader<PullFrame>> reader(
      grpc::internal::ClientReaderFactory<PullFrame>::Create(
          shard.channel.get(), *shard.pull_method, &context, request));
  PullFrame frame;
  frame.destination = destination;
  frame.capacity = shard.range.size();
  frame.dtype = options_.pull_dtype;
  uint64_t received = 0;
  int64_t version = -1;
  absl::Status bad;
  while (reader->Read(&frame)) {
    if (version < 0) {
      version = frame.version;
      *lr_out = frame.lr;
    }
    if (frame.version != version || frame.offset != received) {
      bad = absl::InternalError(absl::StrCat("pull chunk at element ", frame.offset, " of version ",
                                             frame.version, " after ", received,
                                             " elements of version ", version));
      context.TryCancel();
      break;
    }
    received += frame.count;
  }
  if (bad.ok() && !frame.error.empty()) {
    bad = absl::InternalError(frame.error);
    context.TryCancel();
  }
  absl::Status s = ToAbslStatus(reader->Finish());
  if (!bad.ok()) return bad;
  if (!s.ok()) return s;
  if (received != shard.range.size()) {
    return absl::InternalError(
        absl::StrCat("pull ended after ", received, " of ", shard.range.size(), " elements"));
  }
  *version_out = version;
  return absl::OkStatus();
}

absl::Status TrainerClient::ReplayJournal(const std::string& model_id, const ModelLayout& layout,
                                          const std::vector<int64_t>& versions) {
  absl::StatusOr<JournaledPush> entry = ReadPushJournal(options_.journal_path);
  if (absl::IsNotFound(entry.status())) return absl::OkStatus();
  if (!entry.ok()) return entry.status();
  const int64_t lowest = *std::min_element(versions.begin(), versions.end());
  const int64_t highest = *std::max_element(versions.begin(), versions.end());
  // Only the situation the journal is for: shards one step apart, that step
  // being this trainer's last push of this model.
  if (entry->model_id != model_id || entry->trainer_rank != options_.trainer_rank ||
      entry->step != highest || lowest + 1 != highest ||
      entry->payload.size() != layout.total_elements() * DTypeSize(entry->dtype)) {
    return absl::OkStatus();
  }
  model_id_ = model_id;
  for (auto& shard : shards_) {
    if (versions[shard->index] != lowest) continue;
    shard->range = layout.ShardRange(shard->index);
    // The dead process's own stream may hold the trainer's slot for a while
    // (ABORTED until the server notices): retried like any push.
    v1::PushGradientsResponse response;
    const absl::Status pushed = RetryWithBackoff(DefaultRetryPolicy(), [&] {
      return PushOnce(*shard, entry->step, entry->payload.data(), entry->dtype, entry->loss_scale,
                      &response);
    });
    if (!pushed.ok()) return shard->Annotate(pushed, "re-sending the journaled push");
    replayed_pushes_.fetch_add(1);
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> TrainerClient::Checkpoint(const std::string& directory, int64_t step) {
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  if (step < 0) {
    absl::StatusOr<std::vector<std::string>> unused = InspectJson();
    if (!unused.ok()) return unused.status();
    step = std::max<int64_t>(0, latest_inspected_version_);
  }
  std::vector<std::string> manifests(shards_.size());
  absl::Status status = CallEveryShard(
      absl::StrCat("Checkpoint step ", step), DefaultRetryPolicy(),
      [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
        v1::CheckpointRequest request;
        request.set_model_id(model_id_);
        request.set_directory(directory);
        request.set_step(step);
        request.set_shard_index(shard.index);
        v1::CheckpointResponse response;
        absl::Status s = ToAbslStatus(shard.stub->Checkpoint(&context, request, &response));
        manifests[shard.index] = response.manifest();
        return s;
      });
  if (!status.ok()) return status;
  for (const std::string& m : manifests) {
    if (!m.empty()) return m;
  }
  return absl::InternalError("every shard saved its part but none reports the manifest");
}

absl::StatusOr<std::vector<std::string>> TrainerClient::InspectJson() {
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  std::vector<std::string> out(shards_.size());
  std::vector<int64_t> versions(shards_.size(), 0);
  absl::Status status = CallEveryShard(
      "Inspect", DefaultRetryPolicy(),
      [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
        v1::InspectRequest request;
        request.set_model_id(model_id_);
        v1::InspectResponse response;
        absl::Status s = ToAbslStatus(shard.stub->Inspect(&context, request, &response));
        if (!s.ok()) return s;
        versions[shard.index] = response.version();
        google::protobuf::util::JsonPrintOptions options;
        options.preserve_proto_field_names = true;
        if (!google::protobuf::util::MessageToJsonString(response, &out[shard.index], options)
                 .ok()) {
          return absl::InternalError("cannot print the InspectResponse as JSON");
        }
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  latest_inspected_version_ = *std::max_element(versions.begin(), versions.end());
  return out;
}

bool TrainerClient::IsBehind(const absl::Status& status) const {
  return options_.replay_steps > 0 && absl::IsOutOfRange(status);
}

absl::Status TrainerClient::MarkIfBehind(Shard& shard, const absl::Status& status) {
  if (!IsBehind(status)) return status;
  shard.behind = true;
  return status;
}

void TrainerClient::Remember(int64_t step, const void* payload, size_t bytes, double loss_scale) {
  absl::MutexLock lock(&history_mu_);
  while (!history_.empty() && history_.back().step >= step) history_.pop_back();
  PushedStep entry;
  entry.step = step;
  entry.dtype = options_.push_dtype;
  entry.loss_scale = loss_scale;
  entry.payload = std::make_shared<const std::vector<char>>(
      static_cast<const char*>(payload), static_cast<const char*>(payload) + bytes);
  history_.push_back(std::move(entry));
  while (history_.size() > static_cast<size_t>(options_.replay_steps)) history_.pop_front();
}

void TrainerClient::RememberDecision(int64_t step, const Decision& decision) {
  absl::MutexLock lock(&history_mu_);
  for (PushedStep& entry : history_) {
    if (entry.step == step) entry.decision = decision;
  }
}

absl::Status TrainerClient::AwaitAllGradients(Shard& shard, int64_t step) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
  v1::GetStepStatsRequest request;
  request.set_model_id(model_id_);
  request.set_step(step);
  request.set_shard_index(shard.index);
  v1::StepStats stats;
  return ToAbslStatus(shard.stub->GetStepStats(&context, request, &stats));
}

absl::Status TrainerClient::CatchUp(Shard& shard, int64_t last_step, bool wait_for_last) {
  // The shard's version now (GetServerInfo reads no tensor data).
  int64_t version = -1;
  {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    v1::ServerInfo info;
    absl::Status s =
        ToAbslStatus(shard.stub->GetServerInfo(&context, v1::GetServerInfoRequest(), &info));
    if (!s.ok()) return s;
    for (const v1::ModelSummary& m : info.models()) {
      if (m.model_id() == model_id_) version = m.version();
    }
    if (version < 0) {
      return absl::FailedPreconditionError(
          absl::StrCat("the shard came back without model '", model_id_,
                       "' (started without --restore_from?): it cannot rejoin the job"));
    }
  }
  // Hyperparameter changes the shard has not applied yet, as sent to it
  // before (identical repeats are harmless where it still has them).
  std::vector<v1::SetHyperparametersRequest> changes;
  {
    absl::MutexLock lock(&history_mu_);
    for (auto it = changes_.upper_bound(version); it != changes_.end(); ++it) {
      changes.push_back(it->second);
    }
  }
  auto send = [&](const v1::SetHyperparametersRequest& request) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    v1::SetHyperparametersResponse response;
    return ToAbslStatus(shard.stub->SetHyperparameters(&context, request, &response));
  };
  for (const v1::SetHyperparametersRequest& change : changes) {
    absl::Status s = send(change);
    if (absl::IsFailedPrecondition(s) && !change.cancel()) {
      // The shard still holds a change for that step that was cancelled or
      // replaced after its checkpoint: remove it, then schedule this one.
      v1::SetHyperparametersRequest cancel = change;
      cancel.set_cancel(true);
      s = send(cancel);
      if (s.ok()) s = send(change);
    }
    if (!s.ok()) return s;
  }
  std::vector<float> scratch;
  for (int64_t step = version + 1; step <= last_step; ++step) {
    PushedStep entry;
    {
      absl::MutexLock lock(&history_mu_);
      auto it = std::find_if(history_.begin(), history_.end(),
                             [step](const PushedStep& e) { return e.step == step; });
      if (it == history_.end()) {
        return absl::FailedPreconditionError(absl::StrCat(
            "the shard restarted at version ", version, " and needs step ", step,
            " again, which this trainer no longer keeps (replay_steps = ", options_.replay_steps,
            "; keep more steps than the servers' --checkpoint_every)"));
      }
      entry = *it;
    }
    bool already_applied = false;
    {
      v1::PushGradientsResponse response;
      if (absl::Status pushed = PushOnce(shard, step, entry.payload->data(), entry.dtype,
                                         entry.loss_scale, &response);
          !pushed.ok()) {
        return pushed;
      }
      if (response.outcome() != v1::PushGradientsResponse::OUTCOME_DUPLICATE &&
          response.outcome() != v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED) {
        replayed_pushes_.fetch_add(1);
      }
      already_applied = response.outcome() == v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED;
    }
    if (already_applied) continue;
    if (step == last_step && !wait_for_last) {
      // The caller sends this step's decision next: it is accepted only once
      // every trainer has re-pushed the step, so wait for that.
      if (needs_decision_) {
        if (absl::Status s = AwaitAllGradients(shard, step); !s.ok()) return s;
      }
      break;
    }
    // Wait for the step (every trainer re-pushes it) before the next one;
    // with gradient control, send the decision all shards took then.
    if (needs_decision_ && !entry.decision) {
      return absl::InternalError(
          absl::StrCat("the replay history lacks step ", step, "'s decision"));
    }
    if (entry.decision) {
      // The decision applies once every trainer has re-pushed the step.
      if (absl::Status s = AwaitAllGradients(shard, step); !s.ok()) return s;
    }
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + options_.rpc_timeout));
    scratch.resize(shard.range.size());
    int64_t reached = 0;
    double lr = 0;
    const Decision* decision = entry.decision ? &*entry.decision : nullptr;
    if (absl::Status s =
            PullFromShard(shard, context, step, decision, step, scratch.data(), &reached, &lr);
        !s.ok()) {
      return s;
    }
  }
  shard.behind = false;
  return absl::OkStatus();
}

absl::Status TrainerClient::SetHyperparameters(int64_t effective_step,
                                               const OptimizerConfig& optimizer,
                                               const LrSchedule& lr_schedule) {
  if (absl::Status s = optimizer.Validate(); !s.ok()) return s;
  if (absl::Status s = lr_schedule.Validate(); !s.ok()) return s;
  if (effective_step <= std::max(last_pushed_step_, registered_version_)) {
    return absl::FailedPreconditionError(absl::StrCat(
        "step ", effective_step, " may already be applied on some shard (this trainer pushed step ",
        last_pushed_step_, ", the model was at version ", registered_version_,
        "): schedule the change for a later step"));
  }
  v1::SetHyperparametersRequest request;
  request.set_effective_step(effective_step);
  *request.mutable_optimizer() = OptimizerConfigToProto(optimizer);
  *request.mutable_lr_schedule() = LrScheduleToProto(lr_schedule);
  return SendHyperparameters(std::move(request));
}

absl::Status TrainerClient::CancelHyperparameters(int64_t effective_step) {
  v1::SetHyperparametersRequest request;
  request.set_effective_step(effective_step);
  request.set_cancel(true);
  return SendHyperparameters(std::move(request));
}

absl::Status TrainerClient::SendHyperparameters(v1::SetHyperparametersRequest request) {
  if (!layout_) return absl::FailedPreconditionError("call Register or Attach first");
  request.set_model_id(model_id_);
  absl::Status status = CallEveryShard(
      absl::StrCat(request.cancel() ? "cancelling the hyperparameter change at step "
                                    : "SetHyperparameters from step ",
                   request.effective_step()),
      DefaultRetryPolicy(), [&](Shard& shard, grpc::ClientContext& context) -> absl::Status {
        v1::SetHyperparametersResponse response;
        return ToAbslStatus(shard.stub->SetHyperparameters(&context, request, &response));
      });
  if (status.ok() && options_.replay_steps > 0) {
    // A shard restarted from an older checkpoint lost it: CatchUp sends it again.
    // The last word for each step (a cancel too: a restored shard may still
    // hold the change it removes).
    absl::MutexLock lock(&history_mu_);
    changes_[request.effective_step()] = request;
  }
  return status;
}

absl::StatusOr<StepResult> TrainerClient::Step(int64_t step, absl::Span<const float> flat_grads,
                                               absl::Span<float> flat_params) {
  const double loss_scale = this->loss_scale();
  absl::StatusOr<StepResult> result = Push(step, flat_grads);
  if (!result.ok()) return result;
  std::optional<Decision> decision;
  if (needs_decision_) {
    absl::StatusOr<Decision> decided = DecideStep(step);
    if (!decided.ok()) return decided.status();
    decision = *decided;
    // The shards update their scaler replica as the decision reaches them:
    // so does this trainer's scaler, once per step, whether or not the pull
    // below succeeds (a retry of this step must not update it again).
    if (scaler_ && scaler_step_ < step) {
      scaler_->Update(decision->skip);
      scaler_step_ = step;
    }
  }
  double lr = 0;
  absl::StatusOr<int64_t> version =
      PullInternal(step, flat_params, decision ? &*decision : nullptr, &lr);
  if (!version.ok()) return version.status();
  result->lr = lr;
  if (decision && options_.replay_steps > 0) RememberDecision(step, *decision);
  if (decision) {
    result->skipped = decision->skip;
    result->grad_norm = decision->grad_norm;
    result->clip_coef = decision->clip_coef;
    result->loss_scale = loss_scale;
  }
  if (*version != step) {
    // The shards are past this step: this trainer is behind (e.g. restarted
    // with a stale step count) and its gradient was not used.
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", options_.trainer_rank, " pushed step ", step,
                     " but the shards are at version ", *version, ": the trainer is behind"));
  }
  result->version = *version;
  result->bytes_pulled = flat_params.size() * DTypeSize(options_.pull_dtype);
  return result;
}

}  // namespace shardopt
