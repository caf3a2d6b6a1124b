#include "server/cuda/gpu_backend.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "server/cuda/fused_optimizers.h"
#include "server/cuda/gradient_control.h"

namespace shardopt {

absl::StatusOr<std::unique_ptr<GpuBackend>> GpuBackend::Create(int device_index,
                                                               const OptimizerConfig& optimizer,
                                                               uint32_t num_trainers,
                                                               const std::vector<float>& initial,
                                                               std::vector<RangeTensor> tensors) {
  if (num_trainers == 0) return absl::InvalidArgumentError("num_trainers must be at least 1");
  if (absl::Status s = optimizer.Validate(); !s.ok()) return s;
  // What this backend cannot update is UNIMPLEMENTED (the server then uses
  // its CPU backend), refused before any device memory is taken.
  const bool muon = optimizer.kind == OptimizerKind::kMuon;
  const bool lamb = optimizer.kind == OptimizerKind::kLamb;
  const bool adafactor = optimizer.kind == OptimizerKind::kAdafactor;
  if (num_trainers > static_cast<uint32_t>(gpu::kMaxGradientBuffers)) {
    return absl::UnimplementedError(absl::StrCat("the GPU backend reduces at most ",
                                                 gpu::kMaxGradientBuffers, " trainers, not ",
                                                 num_trainers));
  }
  if (muon) {
    if (absl::Status s = gpu::Cublas::Available(); !s.ok()) return s;
  }
  const size_t n = initial.size();
  std::vector<GpuMatrix> matrices;
  std::vector<gpu::LambPiece> lamb_pieces;
  if (absl::Status s = CheckRangeTensors(optimizer.kind, n, tensors); !s.ok()) return s;
  if (absl::Status s = CheckTrustTensorOrder(optimizer.kind, tensors); !s.ok()) return s;
  for (const RangeTensor& t : tensors) {
    if (muon) {
      matrices.push_back(GpuMatrix{t.offset, static_cast<uint64_t>(t.shape[0]),
                                   static_cast<uint64_t>(t.shape[1])});
    }
    if (lamb) lamb_pieces.push_back(gpu::LambPiece{t.offset, t.size, t.index, t.whole});
  }
  if (absl::Status s = gpu::SetCurrentDevice(device_index); !s.ok()) return s;
  std::unique_ptr<GpuBackend> backend(new GpuBackend(device_index, optimizer, n, num_trainers));
  backend->matrices_ = std::move(matrices);
  auto allocate = [](size_t bytes, gpu::DeviceBuffer* out) -> absl::Status {
    absl::StatusOr<gpu::DeviceBuffer> buffer = gpu::DeviceBuffer::Allocate(bytes);
    if (!buffer.ok()) return buffer.status();
    *out = std::move(*buffer);
    return absl::OkStatus();
  };
  if (absl::Status s = allocate(n * sizeof(float), &backend->params_); !s.ok()) return s;
  if (adafactor) {
    if (absl::Status s = backend->AllocateAdafactorState(tensors); !s.ok()) return s;
  } else {
    for (int i = 0; i < optimizer.StateSlotsPerElement(); ++i) {
      if (absl::Status s = allocate(n * sizeof(float), &backend->slots_[i]); !s.ok()) return s;
    }
  }
  if (absl::Status s =
          allocate(num_trainers * GpuBackend::StagingStride(n) * sizeof(float), &backend->staging_);
      !s.ok()) {
    return s;
  }
  const size_t norm_blocks = (n + kNormBlockElements - 1) / kNormBlockElements;
  if (absl::Status s = allocate(norm_blocks * sizeof(double), &backend->block_sums_); !s.ok()) {
    return s;
  }
  for (gpu::Stream* stream : {&backend->apply_stream_, &backend->read_stream_}) {
    absl::StatusOr<gpu::Stream> created = gpu::Stream::Create();
    if (!created.ok()) return created.status();
    *stream = std::move(*created);
  }
  for (Lane& lane : backend->lanes_) {
    absl::StatusOr<gpu::Stream> created = gpu::Stream::Create();
    if (!created.ok()) return created.status();
    lane.stream = std::move(*created);
  }
  if (muon) {
    absl::StatusOr<std::unique_ptr<gpu::Cublas>> cublas =
        gpu::Cublas::Create(backend->apply_stream_.get());
    if (!cublas.ok()) return cublas.status();
    backend->cublas_ = *std::move(cublas);
    if (absl::Status s = backend->AllocateMuonScratch(); !s.ok()) return s;
  }
  if (lamb) {
    backend->lamb_ = std::make_unique<gpu::LambPlan>(std::move(lamb_pieces));
    if (absl::Status s = backend->AllocateLambState(); !s.ok()) return s;
  }
  if (absl::Status s = backend->params_.Upload(initial.data(), n * sizeof(float)); !s.ok()) {
    return s;
  }
  std::array<float*, 3> slots = {backend->slots_[0].as<float>(), backend->slots_[1].as<float>(),
                                 backend->slots_[2].as<float>()};
  // (Adafactor's packed slots were zeroed with their allocation.)
  if (!adafactor) {
    if (absl::Status s =
            gpu::InitializeOptimizerState(optimizer, n, slots, backend->apply_stream_.get());
        !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = backend->apply_stream_.Synchronize(); !s.ok()) return s;
  return backend;
}

GpuBackend::~GpuBackend() {
  // Frees happen on the backend's GPU, after the copies still queued (an
  // aborted push may have left some): errors here have no one to go to.
  if (!gpu::SetCurrentDevice(device_index_).ok()) return;
  for (Lane& lane : lanes_) lane.stream.Synchronize().IgnoreError();
  apply_stream_.Synchronize().IgnoreError();
}

std::string GpuBackend::device() const { return absl::StrCat("cuda:", device_index_); }

absl::StatusOr<size_t> GpuBackend::Stage(uint32_t rank, uint64_t offset, const void* data,
                                         DType dtype, size_t count) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  Lane& lane = lanes_[rank];
  const char* source = static_cast<const char*>(data);
  // Everything is staged even past a NaN/inf: with loss scaling the step is
  // skipped, not refused (ModelShard decides).
  size_t first_bad = count;
  for (size_t done = 0; done < count;) {
    const size_t piece = std::min(count - done, kPinnedElements);
    gpu::PinnedBuffer& pinned = lane.pinned[lane.next];
    if (pinned.data() == nullptr) {
      absl::StatusOr<gpu::PinnedBuffer> allocated =
          gpu::PinnedBuffer::Allocate(kPinnedElements * sizeof(float));
      if (!allocated.ok()) return allocated.status();
      pinned = std::move(*allocated);
    }
    if (lane.in_flight[lane.next]) {
      // Its copy was queued two pieces ago; the previous piece's copy keeps
      // the DMA engine busy while this thread waits and then fills it.
      if (absl::Status s = lane.stream.Synchronize(); !s.ok()) return s;
      lane.in_flight = {false, false};
    }
    float* host = pinned.as<float>();
    const size_t bad =
        ConvertToFloatAndFindNonFinite(source + done * DTypeSize(dtype), piece, dtype, host);
    if (bad != piece && first_bad == count) first_bad = done + bad;
    if (absl::Status s = gpu::CopyToDevice(staging(rank) + offset + done, host,
                                           piece * sizeof(float), lane.stream.get());
        !s.ok()) {
      return s;
    }
    lane.in_flight[lane.next] = true;
    lane.next ^= 1;
    done += piece;
  }
  return first_bad;
}

absl::Status GpuBackend::FinishStaging(uint32_t rank) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  Lane& lane = lanes_[rank];
  absl::Status s = lane.stream.Synchronize();
  lane.in_flight = {false, false};
  return s;
}

absl::Status GpuBackend::WaitForStagedCopies() {
  // (Stage of later elements may be queueing more copies meanwhile: they
  // are waited for too, which costs at most two pinned pieces.)
  for (const Lane& lane : lanes_) {
    if (absl::Status s = lane.stream.Synchronize(); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status GpuBackend::RunFusedStep(int64_t step, const OptimizerConfig& config,
                                      const float* const* gradients, int count, bool mean,
                                      uint64_t begin, uint64_t end) {
  std::vector<const float*> offset_gradients(gradients, gradients + count);
  for (const float*& g : offset_gradients) g += begin;
  gpu::FusedStepBuffers buffers;
  buffers.gradients = offset_gradients.data();
  buffers.num_gradients = count;
  buffers.reduction = mean ? gpu::GradientReduction::kMean : gpu::GradientReduction::kSum;
  buffers.params = params_.as<float>() + begin;
  for (size_t i = 0; i < slots_.size(); ++i) {
    buffers.slots[i] = slots_[i].as<float>() == nullptr ? nullptr : slots_[i].as<float>() + begin;
  }
  // Held through the launch: the first bf16 read converts all parameters,
  // and must see each range either before its update (which then writes
  // the copy too) or after it, not in the middle.
  absl::MutexLock bf16_lock(&bf16_mu_);
  if (bf16_ready_.load()) buffers.params_bf16 = params_bf16_.as<uint16_t>() + begin;
  if (absl::Status s =
          gpu::FusedOptimizerStep(config, step, end - begin, buffers, apply_stream_.get());
      !s.ok()) {
    return s;
  }
  return apply_stream_.Synchronize();
}

absl::Status GpuBackend::Apply(int64_t step, bool mean, const OptimizerConfig& config) {
  if (supports_ranges()) return ApplyRange(step, mean, config, 0, size_);
  if (absl::Status s = optimizer_.CheckCanChangeTo(config); !s.ok()) return s;
  if (adafactor_ != nullptr) {
    if (absl::Status s = Reduce(mean); !s.ok()) return s;
    return DrainOnError(AdafactorStep(step, config));
  }
  if (lamb_ != nullptr) {
    if (absl::Status s = CheckLambOwnNormsSuffice(); !s.ok()) return s;
    if (absl::Status s = Reduce(mean); !s.ok()) return s;
    return LambStep(step, config, 1.0f);
  }
  if (absl::Status s = Reduce(mean); !s.ok()) return s;
  return DrainOnError(MuonStep(config));
}

absl::Status GpuBackend::ApplyRange(int64_t step, bool mean, const OptimizerConfig& config,
                                    uint64_t begin, uint64_t end) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRangeElements(begin, end, size_); !s.ok()) return s;
  if (absl::Status s = RefuseRangesOfWholeTensors(); !s.ok()) return s;
  if (absl::Status s = optimizer_.CheckCanChangeTo(config); !s.ok()) return s;
  if (absl::Status s = WaitForStagedCopies(); !s.ok()) return s;
  std::vector<const float*> gradients(lanes_.size());
  for (uint32_t r = 0; r < lanes_.size(); ++r) gradients[r] = staging(r);
  return DrainOnError(RunFusedStep(step, config, gradients.data(),
                                   static_cast<int>(gradients.size()), mean, begin, end));
}

absl::Status GpuBackend::Reduce(bool mean) { return ReduceRange(mean, 0, size_); }

absl::Status GpuBackend::ReduceRange(bool mean, uint64_t begin, uint64_t end) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRangeElements(begin, end, size_); !s.ok()) return s;
  if (absl::Status s = WaitForStagedCopies(); !s.ok()) return s;
  if (absl::Status s =
          gpu::ReduceInPlace(staging_.as<float>() + begin, end - begin, staging_stride_,
                             static_cast<int>(lanes_.size()), mean, apply_stream_.get());
      !s.ok()) {
    return s;
  }
  return apply_stream_.Synchronize();
}

absl::Status GpuBackend::BlockSumsToHost(const float* x, size_t n, float scale, size_t first_block,
                                         double* block_sums) {
  const size_t blocks = (n + kNormBlockElements - 1) / kNormBlockElements;
  if (blocks == 0) return absl::OkStatus();
  double* device_sums = block_sums_.as<double>() + first_block;
  if (absl::Status s = gpu::BlockSumsOfSquares(x, n, scale, kNormBlockElements, device_sums,
                                               apply_stream_.get());
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          gpu::CopyToHost(block_sums, device_sums, blocks * sizeof(double), apply_stream_.get());
      !s.ok()) {
    return s;
  }
  return apply_stream_.Synchronize();
}

absl::Status GpuBackend::SumOfSquaresBlocks(float scale, uint64_t begin, uint64_t end,
                                            double* block_sums) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRangeElements(begin, end, size_); !s.ok()) return s;
  if (begin % kNormBlockElements != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a sum of squares must start on a block of ",
                                                   kNormBlockElements, " elements, not at ",
                                                   begin));
  }
  return BlockSumsToHost(staging(0) + begin, end - begin, scale, begin / kNormBlockElements,
                         block_sums);
}

absl::StatusOr<double> GpuBackend::SumOfSquares(float scale) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  std::vector<double> host((size_ + kNormBlockElements - 1) / kNormBlockElements);
  if (absl::Status s = BlockSumsToHost(staging(0), size_, scale, 0, host.data()); !s.ok()) {
    return s;
  }
  double total = 0;  // In block order, as CpuBackend adds them.
  for (double b : host) total += b;
  return total;
}

absl::Status GpuBackend::Update(int64_t step, const OptimizerConfig& config, float multiplier) {
  if (supports_ranges()) return UpdateRange(step, config, multiplier, 0, size_);
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = optimizer_.CheckCanChangeTo(config); !s.ok()) return s;
  if (lamb_ != nullptr) return LambStep(step, config, multiplier);
  if (multiplier != 1.0f) {
    if (absl::Status s = gpu::ScaleInPlace(staging(0), size_, multiplier, apply_stream_.get());
        !s.ok()) {
      return s;
    }
  }
  return DrainOnError(adafactor_ != nullptr ? AdafactorStep(step, config) : MuonStep(config));
}

absl::Status GpuBackend::UpdateRange(int64_t step, const OptimizerConfig& config, float multiplier,
                                     uint64_t begin, uint64_t end) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRangeElements(begin, end, size_); !s.ok()) return s;
  if (absl::Status s = RefuseRangesOfWholeTensors(); !s.ok()) return s;
  if (absl::Status s = optimizer_.CheckCanChangeTo(config); !s.ok()) return s;
  if (multiplier != 1.0f) {
    if (absl::Status s =
            gpu::ScaleInPlace(staging(0) + begin, end - begin, multiplier, apply_stream_.get());
        !s.ok()) {
      return s;
    }
  }
  const float* gradient = staging(0);  // Already reduced (ReduceRange).
  return DrainOnError(RunFusedStep(step, config, &gradient, 1, /*mean=*/false, begin, end));
}

absl::Status GpuBackend::DrainOnError(absl::Status status) {
  // Nothing queued may still write the state once the caller lets readers
  // of the range in again (the shard stops after a failed step).
  if (!status.ok()) apply_stream_.Synchronize().IgnoreError();
  return status;
}

absl::StatusOr<std::unique_ptr<GpuBackend::ReadLane>> GpuBackend::TakeReadLane() {
  {
    absl::MutexLock lock(&read_lanes_mu_);
    if (!idle_read_lanes_.empty()) {
      std::unique_ptr<ReadLane> lane = std::move(idle_read_lanes_.back());
      idle_read_lanes_.pop_back();
      return lane;
    }
    if (read_lanes_made_ >= kMaxReadLanes) return std::unique_ptr<ReadLane>();
    ++read_lanes_made_;
  }
  auto forget = [this] {
    absl::MutexLock lock(&read_lanes_mu_);
    --read_lanes_made_;
  };
  auto lane = std::make_unique<ReadLane>();
  for (int i = 0; i < 2; ++i) {
    absl::StatusOr<gpu::Stream> stream = gpu::Stream::Create();
    absl::StatusOr<gpu::PinnedBuffer> pinned = gpu::PinnedBuffer::Allocate(kReadPieceBytes);
    if (!stream.ok() || !pinned.ok()) {
      forget();
      return stream.ok() ? pinned.status() : stream.status();
    }
    lane->streams[i] = std::move(*stream);
    lane->pinned[i] = std::move(*pinned);
  }
  return lane;
}

void GpuBackend::ReturnReadLane(std::unique_ptr<ReadLane> lane) {
  absl::MutexLock lock(&read_lanes_mu_);
  idle_read_lanes_.push_back(std::move(lane));
}

absl::Status GpuBackend::ReadThroughPinned(const void* device_src, size_t bytes, void* host_dst) {
  if (bytes == 0) return absl::OkStatus();
  absl::StatusOr<std::unique_ptr<ReadLane>> lane = TakeReadLane();
  if (!lane.ok() || *lane == nullptr) {
    // Every lane busy, or no pinned memory: straight into the caller's
    // memory (CUDA stages pageable copies itself, more slowly).
    if (absl::Status s = gpu::CopyToHost(host_dst, device_src, bytes, read_stream_.get());
        !s.ok()) {
      return s;
    }
    return read_stream_.Synchronize();
  }
  ReadLane& l = **lane;
  const size_t piece_bytes = kReadPieceBytes;
  const char* src = static_cast<const char*>(device_src);
  char* dst = static_cast<char*>(host_dst);
  // Piece k goes through pinned[k % 2] on streams[k % 2]: while the device
  // copies piece k, this thread copies piece k - 1 out of its pinned buffer.
  int pending = -1;
  size_t pending_offset = 0, pending_bytes = 0;
  absl::Status status;
  auto drain = [&]() -> absl::Status {
    if (pending < 0) return absl::OkStatus();
    if (absl::Status s = l.streams[pending].Synchronize(); !s.ok()) return s;
    std::memcpy(dst + pending_offset, l.pinned[pending].data(), pending_bytes);
    pending = -1;
    return absl::OkStatus();
  };
  for (size_t done = 0, k = 0; done < bytes && status.ok(); ++k) {
    const int b = static_cast<int>(k % 2);
    const size_t n = std::min(piece_bytes, bytes - done);
    status = gpu::CopyToHost(l.pinned[b].data(), src + done, n, l.streams[b].get());
    if (status.ok()) status = drain();
    pending = b;
    pending_offset = done;
    pending_bytes = n;
    done += n;
  }
  if (status.ok()) {
    status = drain();
  } else {
    // Nothing may still be copying into the buffers when the lane goes back.
    for (gpu::Stream& stream : l.streams) stream.Synchronize().IgnoreError();
  }
  ReturnReadLane(std::move(*lane));
  return status;
}

absl::Status GpuBackend::Read(uint64_t offset, uint64_t count, float* out) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRange("elements", offset, count); !s.ok()) return s;
  return ReadThroughPinned(params_.as<float>() + offset, count * sizeof(float), out);
}

absl::StatusOr<bool> GpuBackend::ReadBFloat16(uint64_t offset, uint64_t count, void* out) {
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (absl::Status s = CheckRange("elements", offset, count); !s.ok()) return s;
  if (!bf16_ready_.load()) {
    absl::MutexLock lock(&bf16_mu_);
    if (bf16_unavailable_) return false;
    if (!bf16_ready_.load()) {
      absl::StatusOr<gpu::DeviceBuffer> buffer =
          gpu::DeviceBuffer::Allocate(std::max<size_t>(size_, 1) * sizeof(uint16_t));
      if (absl::IsResourceExhausted(buffer.status())) {
        // No room for the copy (and none is tried again): the caller
        // converts fp32 reads instead.
        bf16_unavailable_ = true;
        return false;
      }
      if (!buffer.ok()) return buffer.status();
      if (absl::Status s = gpu::ConvertToBf16(params_.as<float>(), buffer->as<uint16_t>(), size_,
                                              read_stream_.get());
          !s.ok()) {
        return s;
      }
      if (absl::Status s = read_stream_.Synchronize(); !s.ok()) return s;
      params_bf16_ = std::move(*buffer);
      bf16_ready_.store(true);
    }
  }
  if (absl::Status s =
          ReadThroughPinned(params_bf16_.as<uint16_t>() + offset, count * sizeof(uint16_t), out);
      !s.ok()) {
    return s;
  }
  return true;
}

absl::Status GpuBackend::CheckSlot(int slot, uint64_t offset, uint64_t count) const {
  if (slot < 0 || slot >= optimizer_.StateSlotsPerElement()) {
    return absl::OutOfRangeError(absl::StrCat("the optimizer has no state slot ", slot));
  }
  return CheckRange("slot elements", offset, count);
}

absl::Status GpuBackend::CheckRange(const char* what, uint64_t offset, uint64_t count) const {
  return CheckElementsInRange(what, offset, count, size_);
}

absl::Status GpuBackend::ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) {
  if (absl::Status s = CheckSlot(slot, offset, count); !s.ok()) return s;
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (adafactor_ != nullptr) return ReadPackedSlot(slot, offset, count, out);
  if (absl::Status s = gpu::CopyToHost(out, slots_[slot].as<float>() + offset,
                                       count * sizeof(float), read_stream_.get());
      !s.ok()) {
    return s;
  }
  return read_stream_.Synchronize();
}

absl::Status GpuBackend::WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) {
  if (absl::Status s = CheckSlot(slot, offset, count); !s.ok()) return s;
  if (absl::Status s = gpu::SetCurrentDevice(device_index_); !s.ok()) return s;
  if (adafactor_ != nullptr) return WritePackedSlot(slot, offset, count, in);
  if (absl::Status s = gpu::CopyToDevice(slots_[slot].as<float>() + offset, in,
                                         count * sizeof(float), apply_stream_.get());
      !s.ok()) {
    return s;
  }
  return apply_stream_.Synchronize();
}

}  // namespace shardopt
