// GpuBackend's LAMB (server/optim/lamb.cc's formulas; see gpu_backend.h):
// the trust blocks on the device, the measure pass with its block sums
// brought to the host, and the apply pass with each piece's step size.
#include <algorithm>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/cuda/gpu_backend.h"
#include "server/cuda/lamb_kernels.h"

namespace shardopt {

absl::Status GpuBackend::AllocateLambState() {
  const std::vector<gpu::TrustBlock>& blocks = lamb_->blocks();
  // (At least one element each: no zero-byte device allocations.)
  const size_t block_count = std::max<size_t>(1, blocks.size());
  const size_t piece_count = std::max<size_t>(1, lamb_->piece_count());
  for (auto [buffer, bytes] : {std::pair{&lamb_blocks_, block_count * sizeof(gpu::TrustBlock)},
                               std::pair{&lamb_weight_sums_, block_count * sizeof(double)},
                               std::pair{&lamb_update_sums_, block_count * sizeof(double)},
                               std::pair{&lamb_step_sizes_, piece_count * sizeof(float)}}) {
    absl::StatusOr<gpu::DeviceBuffer> made = gpu::DeviceBuffer::Allocate(bytes);
    if (!made.ok()) return made.status();
    *buffer = *std::move(made);
  }
  absl::StatusOr<gpu::PinnedBuffer> pinned =
      gpu::PinnedBuffer::Allocate(2 * block_count * sizeof(double));
  if (!pinned.ok()) return pinned.status();
  lamb_host_sums_ = *std::move(pinned);
  if (blocks.empty()) return absl::OkStatus();
  return lamb_blocks_.Upload(blocks.data(), blocks.size() * sizeof(gpu::TrustBlock));
}

absl::Status GpuBackend::CheckLambOwnNormsSuffice() const {
  if (!lamb_->needs_every_shards_norms()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      "lamb on the flat partition updates with tensor norms from every shard (the step's "
      "decision), not from this shard's pieces alone");
}

absl::StatusOr<std::vector<TrustPartial>> GpuBackend::LambMeasureToHost(
    int64_t step, const OptimizerConfig& config, float multiplier) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  const size_t blocks = lamb_->blocks().size();
  void* const stream = apply_stream_.get();
  gpu::LambMeasureArgs args{lamb_blocks_.as<gpu::TrustBlock>(),
                            blocks,
                            params_.as<float>(),
                            staging(0),
                            slots_[0].as<float>(),
                            slots_[1].as<float>(),
                            gpu::LambPlan::Scalars(config, step, multiplier),
                            lamb_weight_sums_.as<double>(),
                            lamb_update_sums_.as<double>()};
  double* const weight = lamb_host_sums_.as<double>();
  double* const update = weight + blocks;
  absl::Status s = gpu::LambMeasure(args, stream);
  if (s.ok() && blocks > 0) {
    s = gpu::CopyToHost(weight, args.weight_squares, blocks * sizeof(double), stream);
  }
  if (s.ok() && blocks > 0) {
    s = gpu::CopyToHost(update, args.update_squares, blocks * sizeof(double), stream);
  }
  if (s.ok()) s = apply_stream_.Synchronize();
  if (!s.ok()) return DrainOnError(s);
  // (One thread: ExactSum::Add per block, about as many adds as the CPU
  // backend spreads over its pool.)
  return lamb_->Partials(weight, update);
}

absl::Status GpuBackend::LambApplyWithNorms(int64_t step, const OptimizerConfig& config,
                                            float multiplier, absl::Span<const TensorNorms> norms) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  absl::StatusOr<std::vector<float>> step_sizes = lamb_->StepSizes(config, norms);
  if (!step_sizes.ok()) return step_sizes.status();
  void* const stream = apply_stream_.get();
  if (!step_sizes->empty()) {
    // (Synchronous upload: the host vector dies with this call.)
    if (absl::Status s =
            lamb_step_sizes_.Upload(step_sizes->data(), step_sizes->size() * sizeof(float));
        !s.ok()) {
      return s;
    }
  }
  gpu::LambApplyArgs args{lamb_blocks_.as<gpu::TrustBlock>(),
                          lamb_->blocks().size(),
                          params_.as<float>(),
                          staging(0),
                          slots_[0].as<float>(),
                          slots_[1].as<float>(),
                          gpu::LambPlan::Scalars(config, step, multiplier),
                          lamb_step_sizes_.as<float>()};
  if (absl::Status s = gpu::LambApply(args, stream); !s.ok()) return DrainOnError(s);
  return DrainOnError(RefreshBf16CopyAndWait());
}

absl::Status GpuBackend::LambStep(int64_t step, const OptimizerConfig& config, float multiplier) {
  if (absl::Status s = CheckLambOwnNormsSuffice(); !s.ok()) return s;
  absl::StatusOr<std::vector<TrustPartial>> partials = LambMeasureToHost(step, config, multiplier);
  if (!partials.ok()) return partials.status();
  const std::vector<TensorNorms> norms = gpu::LambPlan::OwnNorms(*partials);
  return LambApplyWithNorms(step, config, multiplier, norms);
}

absl::StatusOr<std::vector<TrustPartial>> GpuBackend::MeasureTrust(int64_t step,
                                                                   const OptimizerConfig& config,
                                                                   float multiplier) {
  if (lamb_ == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(OptimizerKindName(optimizer_.kind), " has no trust ratio"));
  }
  if (absl::Status s = optimizer_.CheckCanChangeTo(config); !s.ok()) return s;
  return LambMeasureToHost(step, config, multiplier);
}

absl::Status GpuBackend::UpdateWithTrust(int64_t step, const OptimizerConfig& config,
                                         float multiplier, absl::Span<const TensorNorms> norms) {
  if (lamb_ == nullptr) {
    return absl::UnimplementedError(
        absl::StrCat(OptimizerKindName(optimizer_.kind), " has no trust ratio"));
  }
  if (absl::Status s = optimizer_.CheckCanChangeTo(config); !s.ok()) return s;
  return LambApplyWithNorms(step, config, multiplier, norms);
}

}  // namespace shardopt
