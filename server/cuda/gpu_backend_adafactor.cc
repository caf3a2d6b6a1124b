// GpuBackend's Adafactor (server/optim/adafactor.cc's formulas; see
// gpu_backend.h): the packed factors in slots_[0] and slots_[1], the step
// through AdafactorPlan, and the packed slots read and written as slots of
// the range's size (PackedSlotExtents' rules, as the CPU optimizer's).
#include <algorithm>
#include <utility>
#include <vector>

#include "server/cuda/gpu_backend.h"

namespace shardopt {

absl::Status GpuBackend::AllocateAdafactorState(const std::vector<RangeTensor>& tensors) {
  for (int slot = 0; slot < 2; ++slot) {
    packed_[slot] = PackedSlotExtents(optimizer_, slot, tensors);
    // (A store of no elements is an empty buffer no tensor reads.)
    const size_t bytes = packed_[slot].stored_elements() * sizeof(float);
    absl::StatusOr<gpu::DeviceBuffer> made = gpu::DeviceBuffer::Allocate(bytes);
    if (!made.ok()) return made.status();
    slots_[slot] = *std::move(made);
    if (absl::Status s = slots_[slot].Fill(0, bytes); !s.ok()) return s;
  }
  adafactor_ =
      std::make_unique<gpu::AdafactorPlan>(tensors, packed_[0].stored_at(), packed_[1].stored_at());
  const size_t pieces = std::max<size_t>(1, adafactor_->max_pieces());
  const size_t batches = std::max<size_t>(1, adafactor_->max_batches());
  absl::StatusOr<gpu::DeviceBuffer> sums = gpu::DeviceBuffer::Allocate(pieces * sizeof(double));
  if (!sums.ok()) return sums.status();
  adafactor_sums_ = *std::move(sums);
  absl::StatusOr<gpu::DeviceBuffer> denominators =
      gpu::DeviceBuffer::Allocate(batches * sizeof(float));
  if (!denominators.ok()) return denominators.status();
  adafactor_denominators_ = *std::move(denominators);
  // (At most an eighth of a byte per element of the largest matrix.)
  absl::StatusOr<gpu::DeviceBuffer> partials = gpu::DeviceBuffer::Allocate(
      std::max<size_t>(1, adafactor_->max_column_partials()) * sizeof(double));
  if (!partials.ok()) return partials.status();
  adafactor_column_partials_ = *std::move(partials);
  absl::StatusOr<gpu::PinnedBuffer> host = gpu::PinnedBuffer::Allocate(pieces * sizeof(double));
  if (!host.ok()) return host.status();
  adafactor_host_sums_ = *std::move(host);
  return absl::OkStatus();
}

absl::Status GpuBackend::AdafactorStep(int64_t step, const OptimizerConfig& config) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s =
          adafactor_->Step(config, step, params_.as<float>(), staging(0), slots_[0].as<float>(),
                           slots_[1].as<float>(), adafactor_sums_.as<double>(),
                           adafactor_host_sums_.as<double>(), adafactor_denominators_.as<float>(),
                           adafactor_column_partials_.as<double>(), apply_stream_.get());
      !s.ok()) {
    return s;
  }
  return RefreshBf16CopyAndWait();
}

absl::Status GpuBackend::ReadPackedSlot(int slot, uint64_t offset, uint64_t count, float* out) {
  std::fill(out, out + count, 0.0f);
  absl::Status status;
  packed_[slot].ForEachOverlap(offset, count, [&](uint64_t begin, uint64_t stop, uint64_t stored) {
    if (status.ok()) {
      status = gpu::CopyToHost(out + (begin - offset), slots_[slot].as<float>() + stored,
                               (stop - begin) * sizeof(float), read_stream_.get());
    }
  });
  if (!status.ok()) return status;
  return read_stream_.Synchronize();
}

absl::Status GpuBackend::WritePackedSlot(int slot, uint64_t offset, uint64_t count,
                                         const float* in) {
  const std::string name = optimizer_.StateSlotNames()[slot];
  if (absl::Status s = packed_[slot].CheckUnstoredAreZero(name, offset, count, in); !s.ok()) {
    return s;
  }
  absl::Status status;
  packed_[slot].ForEachOverlap(offset, count, [&](uint64_t begin, uint64_t stop, uint64_t stored) {
    if (status.ok()) {
      status = gpu::CopyToDevice(slots_[slot].as<float>() + stored, in + (begin - offset),
                                 (stop - begin) * sizeof(float), apply_stream_.get());
    }
  });
  if (!status.ok()) return status;
  return apply_stream_.Synchronize();
}

}  // namespace shardopt
