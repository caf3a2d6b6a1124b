// ModelShard's reads of its state: pulls, inspection, checkpoints (and the
// holds that keep their step boundary), restores.
#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "common/finite.h"
#include "server/model_shard.h"

namespace shardopt {
namespace {

// A pull's parameters [offset, offset + count) that are at `now` (-1: some
// of their ranges at the next version already) instead of `version`.
absl::Status MovedDuringPull(uint64_t offset, uint64_t count, int64_t version, int64_t now) {
  return absl::AbortedError(
      absl::StrCat("parameters [", offset, ", ", offset + count, ") moved from version ", version,
                   " to ", now < 0 ? std::string("the next, range by range,") : absl::StrCat(now),
                   " during the pull; retry"));
}

// OUT_OF_RANGE unless a read of [offset, offset + count) lies within a
// slice of `size` elements.
absl::Status CheckReadInRange(uint64_t offset, uint64_t count, uint64_t size) {
  if (offset <= size && count <= size - offset) return absl::OkStatus();
  return absl::OutOfRangeError(
      absl::StrCat("read [", offset, ", ", offset + count, ") is outside the range"));
}

// Parameters read at a time for inspection statistics.
constexpr uint64_t kStatsBlockElements = 1 << 16;
// Parameters converted at a time for 16-bit pulls.
constexpr uint64_t kConvertBlockElements = 1 << 16;

// A parameter that a 16-bit pull cannot carry: a master weight beyond the
// type's range, or one that is itself not finite.
absl::Status PullOverflowError(const std::string& element, float value, DType dtype) {
  if (!std::isfinite(value)) {
    return absl::FailedPreconditionError(absl::StrCat("parameter ", element, " is ", value,
                                                      ": the master weights are no longer finite"));
  }
  return absl::FailedPreconditionError(
      absl::StrCat("parameter ", element, " is ", value, ", which overflows ", DTypeName(dtype),
                   dtype == DType::kFloat16 ? "; pull float32 or bfloat16" : "; pull float32"));
}

}  // namespace

StepHold& StepHold::operator=(StepHold&& other) noexcept {
  if (this != &other) {
    Release();
    shard_ = other.shard_;
    step_ = other.step_;
    other.shard_ = nullptr;
  }
  return *this;
}

void StepHold::Release() {
  if (shard_ == nullptr) return;
  absl::MutexLock lock(&shard_->mu_);
  if (shard_->async_) {
    shard_->async_->ReleaseHold(step_);
  } else {
    shard_->state_.ReleaseHold(step_);
  }
  shard_ = nullptr;
}

ModelShard::StepHold ModelShard::HoldStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (async_) {
    async_->AddHold(step);
  } else {
    state_.AddHold(step);
  }
  return StepHold(this, step);
}

absl::StatusOr<ShardProgress> ModelShard::AwaitStepBoundary(
    int64_t step, absl::Time deadline, const std::function<bool()>& cancelled) {
  if (state_.failed()) return state_.failure();
  // (A step that is only being reduced, waiting for its decision, has not
  // touched the parameters: its version can still be saved.)
  const int64_t version = state_.version();
  if (version > step || (version == step && state_.updating())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "shard ", options_.shard_index, " of model '", options_.model_id, "' is at version ",
        version, state_.updating() ? " (applying the next step)" : "", ", past step ", step,
        ": checkpoint a later step"));
  }
  absl::Status waited =
      AwaitState([&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_.version() >= step; },
                 deadline, cancelled);
  if (waited.ok() && state_.version() != step) {
    waited = state_.failed() ? state_.failure()
                             : absl::UnavailableError("the shard server is shutting down");
  }
  if (!waited.ok()) {
    if (absl::IsDeadlineExceeded(waited)) {
      return WaitExpired(absl::StrCat("version ", step, " (to checkpoint)"), step);
    }
    return waited;
  }
  return state_.Progress();
}

absl::Status ModelShard::CheckpointAt(
    int64_t step, absl::Time deadline, const std::function<bool()>& cancelled,
    const std::function<absl::Status(const ShardProgress&, const ShardStateReadFn&)>& write,
    StepHold held) {
  if (!held.held() || held.step() != step) held = HoldStep(step);
  ShardProgress progress;
  {
    absl::MutexLock lock(&mu_);
    if (step < 0) {
      return absl::InvalidArgumentError(absl::StrCat("step ", step, " is negative"));
    }
    absl::StatusOr<ShardProgress> reached = async_ ? AwaitAsyncCut(step, deadline, cancelled)
                                                   : AwaitStepBoundary(step, deadline, cancelled);
    if (!reached.ok()) return reached.status();
    progress = *std::move(reached);
  }
  absl::Status written;
  {
    absl::ReaderMutexLock lock(&params_mu_);
    const RangeLocks ranges(*this, 0, range_count_, /*exclusive=*/false);
    const ShardStateReadFn read = [this](int slot, uint64_t offset, uint64_t count,
                                         float* out) -> absl::Status {
      if (slot < 0) {
        if (offset > range_.size() || count > range_.size() - offset) {
          return absl::OutOfRangeError("read outside the range");
        }
        return backend_->Read(offset, count, out);
      }
      return backend_->ReadSlot(slot, offset, count, out);
    };
    written = write(progress, read);
  }
  return written;
}

absl::Status ModelShard::CheckRestoreLocked(const ShardProgress& progress) const {
  if (absl::Status s = state_.CheckRestore(progress); !s.ok()) return s;
  if (async_) {
    if (async_->version() != 0) {
      return absl::FailedPreconditionError("a shard that has taken pushes cannot be restored");
    }
    // (Every push applied is an update or a skip: a shard restored so
    // counts version - skipped updates.)
    if (progress.optimizer_steps + progress.skipped_steps != progress.version) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the saved asynchronous progress has ", progress.optimizer_steps, " updates and ",
          progress.skipped_steps, " skipped pushes at version ", progress.version,
          ": they must add up to it"));
    }
    return async_->CheckRestore(AsyncProgress{progress.trainer_steps, progress.version});
  }
  if (!progress.trainer_steps.empty()) {
    return absl::InvalidArgumentError(
        "the saved state is of an asynchronous model (it has trainer steps); this one is "
        "synchronous");
  }
  return absl::OkStatus();
}

absl::Status ModelShard::Restore(const ShardProgress& progress, const ShardStateReadFn& read_slot) {
  {
    absl::MutexLock lock(&mu_);
    if (absl::Status s = CheckRestoreLocked(progress); !s.ok()) return s;
  }
  // Validated where it came in (ProgressFromProto, from the checkpoint).
  assert(progress.current.optimizer.Validate().ok());
  if (absl::Status s = options_.optimizer.CheckCanChangeTo(progress.current.optimizer); !s.ok()) {
    return s;
  }
  // Through a bounded buffer: a range can be gigabytes.
  constexpr uint64_t kBlock = uint64_t{1} << 20;
  std::vector<float> block;
  const int slots = options_.optimizer.StateSlotsPerElement();
  {
    // (A shard is restored before it serves; held all the same, as the
    // lock's contract says.)
    absl::WriterMutexLock slots_lock(&params_mu_);
    for (int slot = 0; slot < slots; ++slot) {
      for (uint64_t done = 0; done < range_.size(); done += kBlock) {
        const uint64_t n = std::min<uint64_t>(kBlock, range_.size() - done);
        block.resize(n);
        if (absl::Status s = read_slot(slot, done, n, block.data()); !s.ok()) return s;
        if (size_t bad = FindNonFinite(block.data(), n); bad != n) {
          return absl::DataLossError(absl::StrCat("saved optimizer state ",
                                                  options_.optimizer.StateSlotNames()[slot], " of ",
                                                  DescribeElement(done + bad), " is ", block[bad]));
        }
        if (absl::Status s = backend_->WriteSlot(slot, done, n, block.data()); !s.ok()) {
          // What the saved state holds contradicts the optimizer's own (a
          // packed slot's unstored element that is not zero).
          if (s.code() != absl::StatusCode::kInvalidArgument) return s;
          return absl::DataLossError(absl::StrCat("saved optimizer state of elements [", done, ", ",
                                                  done + n, ") of the range: ", s.message()));
        }
      }
    }
  }
  absl::MutexLock lock(&mu_);
  // (Checked again: a concurrent restore may have won.)
  if (absl::Status s = CheckRestoreLocked(progress); !s.ok()) return s;
  state_.Restore(progress);
  if (async_) {
    RestoreAsyncProgress(progress);  // (Checked above, under the same lock.)
  }
  absl::MutexLock params_lock(&params_mu_);
  std::fill(range_versions_.begin(), range_versions_.end(), progress.version);
  return absl::OkStatus();
}

absl::Status ModelShard::ReadParameters(int64_t version, uint64_t offset, uint64_t count,
                                        float* out) {
  return ReadParameters(version, offset, count, DType::kFloat32, out);
}

absl::Status ModelShard::ReadParameters(int64_t version, uint64_t offset, uint64_t count,
                                        DType dtype, void* out) {
  return ReadParametersInto(version, offset, count, dtype, out, /*own_memory=*/false);
}

absl::Status ModelShard::ReadParametersInOwnMemory(int64_t version, uint64_t offset, uint64_t count,
                                                   float* own_out) {
  return ReadParametersInto(version, offset, count, DType::kFloat32, own_out,
                            /*own_memory=*/true);
}

absl::StatusOr<bool> ModelShard::SendParametersInPlace(
    int64_t version, uint64_t offset, uint64_t count,
    const std::function<absl::Status(const float* params)>& send) {
  if (asynchronous()) return false;
  if (absl::Status s = CheckReadInRange(offset, count, range_.size()); !s.ok()) return s;
  // (Not a structured binding: C++17 lambdas cannot capture one.)
  const std::pair<size_t, size_t> covering =
      RangesCovering(offset, count, range_elements_, range_count_);
  const size_t first = covering.first;
  const size_t last = covering.second;
  // At `version` under the ranges' locks now, and again after the send: a
  // change in between bumps the ranges' versions.
  const auto check = [&]() -> absl::StatusOr<const float*> {
    absl::ReaderMutexLock lock(&params_mu_);
    const RangeLocks ranges(*this, first, std::max(last, first + 1), /*exclusive=*/false);
    if (const int64_t now = ParamsVersion(offset, count); now != version) {
      return MovedDuringPull(offset, count, version, now);
    }
    return backend_->HostParameters(offset, count);
  };
  absl::StatusOr<const float*> params = check();
  if (!params.ok()) return params.status();
  if (*params == nullptr) return false;
  if (absl::Status s = send(*params); !s.ok()) return s;
  if (absl::StatusOr<const float*> after = check(); !after.ok()) return after.status();
  NotePulled(version, offset, count, count * sizeof(float));
  return true;
}

absl::Status ModelShard::ReadParametersInto(int64_t version, uint64_t offset, uint64_t count,
                                            DType dtype, void* out, bool own_memory) {
  if (own_memory && dtype != DType::kFloat32) {
    return absl::InvalidArgumentError("parameters in the backend's memory are fp32 only");
  }
  if (absl::Status s = CheckReadInRange(offset, count, range_.size()); !s.ok()) return s;
  absl::ReaderMutexLock lock(&params_mu_);
  const auto [first, last] = RangesCovering(offset, count, range_elements_, range_count_);
  // (An empty read still looks at its range's version.)
  const RangeLocks ranges(*this, first, std::max(last, first + 1), /*exclusive=*/false);
  if (const int64_t now = ParamsVersion(offset, count); now != version) {
    return MovedDuringPull(offset, count, version, now);
  }
  absl::StatusOr<bool> native_bf16 = false;
  if (dtype == DType::kBFloat16) native_bf16 = backend_->ReadBFloat16(offset, count, out);
  if (!native_bf16.ok()) return native_bf16.status();
  if (dtype == DType::kFloat32) {
    float* const floats = static_cast<float*>(out);
    if (absl::Status s = own_memory ? backend_->ReadOwn(offset, count, floats)
                                    : backend_->Read(offset, count, floats);
        !s.ok()) {
      return s;
    }
  } else if (*native_bf16) {
    // The backend's own bf16 copy: checked as the conversion below checks.
    if (size_t bad = FindNonFiniteOfType(out, count, dtype); bad != count) {
      float value = 0;
      if (absl::Status s = backend_->Read(offset + bad, 1, &value); !s.ok()) return s;
      return PullOverflowError(DescribeElement(offset + bad), value, dtype);
    }
  } else {
    // Through a bounded fp32 buffer per thread, block by block.
    thread_local std::vector<float> wide(kConvertBlockElements);
    char* narrow = static_cast<char*>(out);
    for (uint64_t done = 0; done < count; done += kConvertBlockElements) {
      const uint64_t n = std::min<uint64_t>(kConvertBlockElements, count - done);
      if (absl::Status s = backend_->Read(offset + done, n, wide.data()); !s.ok()) return s;
      char* block = narrow + done * DTypeSize(dtype);
      // fp16 tops out at 65504: a larger master weight would arrive as inf.
      if (size_t bad = ConvertFromFloatAndFindNonFinite(wide.data(), n, dtype, block); bad != n) {
        return PullOverflowError(DescribeElement(offset + done + bad), wide[bad], dtype);
      }
    }
  }
  NotePulled(version, offset, count, count * DTypeSize(dtype));
  return absl::OkStatus();
}

void ModelShard::NotePulled(int64_t version, uint64_t offset, uint64_t count, uint64_t bytes) {
  parameter_bytes_sent_.fetch_add(bytes, std::memory_order_relaxed);
  if (timeline_) {
    const auto [first, last] = RangesCovering(offset, count, range_elements_, range_count_);
    timeline_->Pulled(version, first, last, absl::Now());
  }
}

absl::StatusOr<ShardSnapshot> ModelShard::Snapshot(const std::string& tensor_name,
                                                   uint64_t slice_offset, uint32_t slice_length,
                                                   bool with_tensor_stats) {
  if (slice_offset >= range_.size() && slice_length > 0) {
    return absl::OutOfRangeError(absl::StrCat(
        "slice offset ", slice_offset, " is past the range of ", range_.size(), " elements"));
  }
  std::optional<size_t> only;
  if (!tensor_name.empty()) {
    absl::StatusOr<size_t> index = options_.layout.Find(tensor_name);
    if (!index.ok()) return index.status();
    only = *index;
  }
  ShardSnapshot snap;
  {
    absl::MutexLock lock(&mu_);
    snap.version = state_.version();
    snap.trainers_pushed = state_.TrainersPushed();
    snap.partly_run = state_.PartlyRun();
    snap.current = state_.schedule().current();
    snap.next = state_.schedule().InForceAt(state_.version() + 1);
    snap.last_lr = state_.last_lr();
    snap.last_step = state_.last_step();
    snap.optimizer_steps = state_.optimizer_steps();
    snap.skipped_steps = state_.skipped_steps();
    snap.scheduled_changes = state_.schedule().ScheduledSteps();
    snap.trainers = state_.trainers();
    if (async_) {
      snap.version = async_->version();
      snap.optimizer_steps = snap.version - async_skipped_;
      snap.skipped_steps = async_skipped_;
      snap.last_lr = last_async_lr_;
      snap.trainer_steps = async_->applied();
      snap.max_staleness = async_->max_staleness();
      snap.applied_order.assign(async_->recent_order().begin(), async_->recent_order().end());
      for (uint32_t t = 0; t < snap.trainers.size(); ++t) {
        snap.trainers[t] = TrainerActivity{async_->pushed(t), async_push_times_[t]};
      }
    }
  }
  snap.parameter_bytes = backend_->parameter_bytes();
  snap.optimizer_state_bytes = backend_->optimizer_state_bytes();
  snap.staging_bytes = backend_->staging_bytes();
  snap.gradient_bytes_received = gradient_bytes_received_.load(std::memory_order_relaxed);
  snap.parameter_bytes_sent = parameter_bytes_sent_.load(std::memory_order_relaxed);
  if (!with_tensor_stats && slice_length == 0) return snap;

  // Statistics and values must describe one version: read that version under
  // the same lock as the values (an update may have finished since above).
  // (During a pipelined step whose push stalled, the ranges already updated
  // hold the next version's values: the oldest version is reported.)
  absl::ReaderMutexLock lock(&params_mu_);
  const RangeLocks ranges(*this, 0, range_count_, /*exclusive=*/false);
  snap.version = *std::min_element(range_versions_.begin(), range_versions_.end());
  std::vector<float> block;
  for (const TensorPiece& piece : options_.layout.PiecesIn(range_)) {
    if (!with_tensor_stats) break;
    if (only && piece.tensor_index != *only) continue;
    TensorPieceStats stats;
    stats.piece = piece;
    double sum = 0, sum_sq = 0;
    double lo = std::numeric_limits<double>::infinity();
    double hi = -lo;
    // In blocks: the backend may hold the parameters in device memory.
    for (uint64_t done = 0; done < piece.size;) {
      const uint64_t n = std::min<uint64_t>(piece.size - done, kStatsBlockElements);
      block.resize(n);
      absl::Status read = backend_->Read(piece.flat_offset - range_.begin + done, n, block.data());
      if (!read.ok()) return read;
      for (float f : block) {
        const double x = f;
        sum += x;
        sum_sq += x * x;
        lo = std::min(lo, x);
        hi = std::max(hi, x);
      }
      done += n;
    }
    stats.l2_norm = std::sqrt(sum_sq);
    stats.min = lo;
    stats.max = hi;
    stats.mean = sum / static_cast<double>(piece.size);
    snap.tensors.push_back(stats);
  }
  if (with_tensor_stats && only && snap.tensors.empty()) {
    return absl::NotFoundError(
        absl::StrCat("tensor '", tensor_name, "' has no elements on shard ", options_.shard_index));
  }
  if (slice_length > 0) {
    const uint64_t end = std::min<uint64_t>(range_.size(), slice_offset + slice_length);
    snap.values.resize(end - slice_offset);
    absl::Status read = backend_->Read(slice_offset, end - slice_offset, snap.values.data());
    if (!read.ok()) return read;
  }
  return snap;
}

}  // namespace shardopt
