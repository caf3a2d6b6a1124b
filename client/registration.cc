#include "client/registration.h"

#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "common/proto_convert.h"
#include "common/step_protocol.h"

namespace shardopt {

absl::StatusOr<v1::ModelConfig> ModelConfigFor(const ModelSpec& spec, const ModelLayout& layout,
                                               uint32_t shard_count) {
  if (absl::Status s = spec.optimizer.Validate(); !s.ok()) return s;
  if (absl::Status s = CheckOptimizerFitsPartition(spec.optimizer.kind,
                                                   layout.partition() == Partition::kWholeTensors);
      !s.ok()) {
    return s;
  }
  for (const TensorSpec& t : spec.tensors) {
    if (absl::Status s = CheckOptimizerFitsTensor(spec.optimizer.kind, t.name, t.shape); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = spec.lr_schedule.Validate(); !s.ok()) return s;
  if (spec.loss_scaling) {
    if (absl::Status s = spec.loss_scaler.Validate(); !s.ok()) return s;
  }
  if (absl::Status s = CheckConsistency(spec.consistency, spec.staleness); !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckTrustNormsFit(spec.optimizer.kind, layout, spec.consistency); !s.ok()) {
    return s;
  }
  v1::ModelConfig config;
  config.set_model_id(spec.model_id);
  *config.mutable_layout() = LayoutToProto(layout);
  config.mutable_layout()->set_alignment(spec.alignment);
  *config.mutable_optimizer() = OptimizerConfigToProto(spec.optimizer);
  *config.mutable_lr_schedule() = LrScheduleToProto(spec.lr_schedule);
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
  config.set_shard_count(shard_count);
  config.set_consistency(ConsistencyToProto(spec.consistency));
  config.set_staleness(spec.staleness);
  return config;
}

std::string NewRunId() {
  absl::BitGen random;
  return absl::StrCat(absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16),
                      absl::Hex(absl::Uniform<uint64_t>(random), absl::kZeroPad16));
}

namespace {

// One shard's registration (attach-only without `initial_params`), its
// range checked against `layout`.
absl::StatusOr<ShardRegistration> RegisterOnShard(ShardConnection& shard,
                                                  grpc::ClientContext& context,
                                                  const v1::ModelConfig& config,
                                                  const ModelLayout& layout,
                                                  const float* initial_params,
                                                  const std::string& run_id, size_t chunk_bytes) {
  const FlatRange range = layout.ShardRange(shard.index());
  v1::RegisterHeader header;
  *header.mutable_config() = config;
  header.set_shard_index(shard.index());
  header.set_attach_only(initial_params == nullptr);
  header.set_run_id(run_id);
  v1::RegisterModelResponse response;
  absl::Status s =
      shard.Register(context, header, initial_params ? initial_params + range.begin : nullptr,
                     initial_params ? range.size() : 0, chunk_bytes, &response);
  if (!s.ok()) return s;
  if (response.range().begin() != range.begin || response.range().end() != range.end) {
    return absl::InternalError(absl::StrCat(
        "server reports range [", response.range().begin(), ", ", response.range().end(),
        ") but the layout gives [", range.begin, ", ", range.end, ")"));
  }
  ShardRegistration r;
  r.version = response.version();
  r.created = response.created();
  if (response.has_loss_scaler()) {
    r.loss_scaler =
        LossScaler::State{response.loss_scaler().scale(), response.loss_scaler().growth_tracker(),
                          response.loss_scaler().hysteresis_tracker()};
  }
  r.run_id = response.run_id();
  return r;
}

}  // namespace

absl::StatusOr<std::vector<ShardRegistration>> RegisterOnEveryShard(
    ShardFanOut& fanout, const ShardFanOut::Call& call, const v1::ModelConfig& config,
    const ModelLayout& layout, const float* initial_params, const std::string& run_id,
    size_t chunk_bytes) {
  std::vector<ShardRegistration> out(fanout.size());
  absl::Status status =
      fanout.Run(call, [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        absl::StatusOr<ShardRegistration> r =
            RegisterOnShard(shard, context, config, layout, initial_params, run_id, chunk_bytes);
        if (!r.ok()) return r.status();
        out[shard.index()] = *std::move(r);
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::optional<std::string>> RunOfHeldModel(ShardFanOut& fanout,
                                                          const ShardFanOut::Call& call,
                                                          const v1::ModelConfig& config,
                                                          const ModelLayout& layout) {
  std::vector<std::string> runs(fanout.size());
  absl::Status status =
      fanout.Run(call, [&](ShardConnection& shard, grpc::ClientContext& context) -> absl::Status {
        absl::StatusOr<ShardRegistration> held =
            RegisterOnShard(shard, context, config, layout, nullptr, "", 0);
        // Not held there, or any other refusal (a different config, another
        // range): the registration's to report. A shard that is down is retried.
        if (!held.ok()) return IsRetryable(held.status()) ? held.status() : absl::OkStatus();
        runs[shard.index()] = held->run_id;
        return absl::OkStatus();
      });
  if (!status.ok()) return status;
  for (const std::string& run : runs) {
    if (!run.empty()) return run;
  }
  return std::nullopt;
}

absl::Status CheckHeldInitialValues(StepCalls& steps, const std::vector<ShardRegistration>& shards,
                                    const ModelLayout& layout, const float* initial_params,
                                    DType pull_dtype, const std::string& model_id) {
  // (Every held shard, not only next to one created now: a shard created by
  // an earlier such registration that failed here holds the model too.)
  std::vector<uint32_t> held;
  for (uint32_t i = 0; i < shards.size(); ++i) {
    if (shards[i].version != 0) return absl::OkStatus();  // Trained: the steps tell.
    if (!shards[i].created) held.push_back(i);
  }
  if (held.empty()) return absl::OkStatus();
  const uint64_t elements = layout.ShardRange(static_cast<uint32_t>(shards.size()) - 1).end;
  std::vector<float> pulled(elements);
  absl::StatusOr<std::vector<PulledVersion>> each = steps.PullEach(pulled.data(), held);
  if (!each.ok()) return each.status();
  std::vector<float> expected;
  std::vector<char> wire;
  for (uint32_t i : held) {
    // Trained between the registration's answer and this pull (another
    // trainer of an asynchronous model pushed): the steps tell, as above.
    if ((*each)[i].version != 0) continue;
    const FlatRange range = layout.ShardRange(i);
    // The initial values as the pull carries them (rounded to a 16-bit type).
    expected.assign(initial_params + range.begin, initial_params + range.end);
    if (pull_dtype != DType::kFloat32) {
      wire.resize(range.size() * DTypeSize(pull_dtype));
      ConvertFromFloat(expected.data(), expected.size(), pull_dtype, wire.data());
      ConvertToFloatAndFindNonFinite(wire.data(), expected.size(), pull_dtype, expected.data());
    }
    for (uint64_t k = 0; k < range.size(); ++k) {
      if (std::memcmp(&expected[k], &pulled[range.begin + k], sizeof(float)) != 0) {
        return absl::FailedPreconditionError(absl::StrCat(
            "model '", model_id, "': shard ", i, " holds it (this run, version 0) with element ",
            range.begin + k, " = ", pulled[range.begin + k], ", and this trainer registers ",
            initial_params[range.begin + k],
            " there: a restarted rank 0 that initialized the model otherwise (seed it), or "
            "remove the model from the servers to start over"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardopt
