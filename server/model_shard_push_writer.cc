// ModelShard::PushWriter: one push's chunks checked (order, size, padding,
// NaN/inf) and staged, received in place, and committed. The step protocol
// it reports to is in model_shard.cc.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "server/model_shard.h"

namespace shardopt {

ModelShard::PushWriter::~PushWriter() {
  if (!finished_) shard_->AbortPush(rank_, step_);
}

absl::Status ModelShard::PushWriter::CheckChunk(uint64_t offset, uint64_t count) const {
  if (skip_) {
    return absl::InvalidArgumentError(absl::StrCat("trainer ", rank_, " skips step ", step_,
                                                   ": a skipped step carries no gradient"));
  }
  if (offset != received_) {
    return absl::InvalidArgumentError(
        absl::StrCat("chunk starts at element ", offset, " but ", received_,
                     " were received: chunks must arrive in order, without gaps or overlaps"));
  }
  if (count > shard_->range_.size() - received_) {
    return absl::InvalidArgumentError(absl::StrCat("chunk [", offset, ", ", offset + count,
                                                   ") overruns the shard range of ",
                                                   shard_->range_.size(), " elements"));
  }
  return absl::OkStatus();
}

std::vector<FlatRange> ModelShard::PushWriter::PaddingSpans(uint64_t offset, uint64_t count) const {
  const uint64_t range_begin = shard_->range_.begin;
  std::vector<FlatRange> padding = shard_->options_.layout.PaddingIn(
      FlatRange{range_begin + offset, range_begin + offset + count});
  for (FlatRange& gap : padding) gap = FlatRange{gap.begin - range_begin, gap.end - range_begin};
  return padding;
}

absl::StatusOr<std::optional<uint64_t>> ModelShard::PushWriter::FindStagedPadding(
    uint64_t offset, uint64_t count) const {
  const uint64_t range_begin = shard_->range_.begin;
  UpdateBackend& backend = *shard_->backend_;
  if (const float* staged = backend.HostStaging(rank_, offset, count)) {
    return FindNonZeroPadding(shard_->options_.layout,
                              FlatRange{range_begin + offset, range_begin + offset + count}, staged,
                              DType::kFloat32);
  }
  // (Staging elsewhere, a GPU's: scanned there, over the span the padding covers.)
  const std::vector<FlatRange> padding = PaddingSpans(offset, count);
  if (padding.empty()) return std::nullopt;
  absl::StatusOr<UpdateBackend::StagedScan> scan = backend.ScanStaged(
      rank_, padding.front().begin, padding.back().end - padding.front().begin, padding);
  if (!scan.ok()) return scan.status();
  if (!scan->first_nonzero) return std::nullopt;
  return range_begin + *scan->first_nonzero;
}

absl::Status ModelShard::PushWriter::PaddingRefused(uint64_t flat_index, float value) const {
  return absl::InvalidArgumentError(absl::StrCat(
      "gradient of ", shard_->options_.layout.DescribeElement(flat_index), " from trainer ", rank_,
      " for step ", step_, " is ", value, ": padding gets zero gradients; the push is rejected"));
}

absl::Status ModelShard::PushWriter::Admit(uint64_t offset, uint64_t count, uint64_t skip,
                                           uint64_t bad,
                                           const std::function<float(uint64_t)>& value_of) {
  std::optional<uint64_t> first_inf;
  // (Asynchronous pushes are unscaled by their trainer, which skips an
  // overflowing step itself: never inf here.)
  if (bad != count && shard_->options_.loss_scaling && !shard_->asynchronous()) {
    // Overflow under loss scaling: legitimate, staged, and the step will
    // be skipped on every shard.
    found_inf_ = true;
    first_inf = offset + bad;
  } else if (bad != count) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient of ", shard_->DescribeElement(offset + bad), " from trainer ", rank_,
                     " for step ", step_, " is ", value_of(bad), "; the push is rejected"));
  }
  received_ += count;
  shard_->gradient_bytes_received_.fetch_add(count * DTypeSize(dtype_), std::memory_order_relaxed);
  if (first_inf && !first_inf_) first_inf_ = first_inf;
  if (skip < count && !defer_) shard_->RecordDelivered(rank_, step_, received_, first_inf);
  return absl::OkStatus();
}

absl::Status ModelShard::PushWriter::Write(uint64_t offset, const void* data, size_t bytes,
                                           Source source) {
  const size_t element = DTypeSize(dtype_);
  if (!skip_ && bytes % element != 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "chunk of ", bytes, " bytes is not a whole number of ", DTypeName(dtype_), " elements"));
  }
  const uint64_t count = bytes / element;
  if (absl::Status s = CheckChunk(offset, count); !s.ok()) return s;
  // Padding receives zero gradients (a trainer that writes there writes out
  // of its tensors). Bytes of the shard's own are refused before staging.
  const uint64_t flat_begin = shard_->range_.begin + offset;
  if (source == Source::kShardOwned) {
    if (std::optional<uint64_t> padding = FindNonZeroPadding(
            shard_->options_.layout, FlatRange{flat_begin, flat_begin + count}, data, dtype_)) {
      float value;
      ConvertToFloatAndFindNonFinite(
          static_cast<const char*>(data) + (*padding - flat_begin) * DTypeSize(dtype_), 1, dtype_,
          &value);
      return PaddingRefused(*padding, value);
    }
  }
  // Elements consumed by ranges already applied are not staged again.
  const uint64_t skip = std::min<uint64_t>(count, consumed_ > offset ? consumed_ - offset : 0);
  uint64_t bad = count;
  if (skip < count) {
    absl::StatusOr<size_t> staged_bad = shard_->backend_->Stage(
        rank_, offset + skip, static_cast<const char*>(data) + skip * element, dtype_,
        count - skip);
    if (!staged_bad.ok()) return staged_bad.status();
    bad = skip + *staged_bad;
    if (source == Source::kTrainerWritable) {
      absl::StatusOr<std::optional<uint64_t>> padding =
          FindStagedPadding(offset + skip, count - skip);
      if (!padding.ok()) return padding.status();
      if (*padding) {
        float value = 0;
        shard_->backend_->ReadStaged(rank_, **padding - shard_->range_.begin, 1, &value)
            .IgnoreError();  // (For the message.)
        return PaddingRefused(**padding, value);
      }
    }
  }
  return Admit(offset, count, skip, bad, [&](uint64_t i) {
    float value;
    ConvertToFloatAndFindNonFinite(static_cast<const char*>(data) + i * element, 1, dtype_, &value);
    return value;
  });
}

bool ModelShard::PushWriter::CanReceiveInPlace(uint64_t count) const {
  return !skip_ && dtype_ == DType::kFloat32 && consumed_ <= received_ &&
         count <= shard_->range_.size() - received_;
}

float* ModelShard::PushWriter::ReceiveInPlace(uint64_t count) {
  if (!CanReceiveInPlace(count)) return nullptr;
  return shard_->backend_->HostStaging(rank_, received_, count);
}

void* ModelShard::PushWriter::ReceiveInOwnMemory(uint64_t count, PairMemory memory) {
  if (!CanReceiveInPlace(count) || shard_->backend_->own_memory() != memory) return nullptr;
  return shard_->backend_->OwnStaging(rank_, received_, count);
}

absl::Status ModelShard::PushWriter::WriteReceived(uint64_t count) {
  const uint64_t offset = received_;
  UpdateBackend& backend = *shard_->backend_;
  if (!CanReceiveInPlace(count) || backend.OwnStaging(rank_, offset, count) == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("elements [", offset, ", ", offset + count, ") of trainer ", rank_,
                     "'s push cannot have been received in place"));
  }
  // Checked where they landed (the backend's memory, maybe a GPU's): the
  // padding among them, then NaN/inf, as Write checks a chunk.
  const uint64_t range_begin = shard_->range_.begin;
  absl::StatusOr<UpdateBackend::StagedScan> scan =
      backend.ScanStaged(rank_, offset, count, PaddingSpans(offset, count));
  if (!scan.ok()) return scan.status();
  const auto value_at = [&](uint64_t range_index) {
    float value = 0;
    backend.ReadStaged(rank_, range_index, 1, &value).IgnoreError();  // (For the message.)
    return value;
  };
  if (scan->first_nonzero) {
    return PaddingRefused(range_begin + *scan->first_nonzero, value_at(*scan->first_nonzero));
  }
  return Admit(offset, count, /*skip=*/0, scan->first_non_finite,
               [&](uint64_t i) { return value_at(offset + i); });
}

absl::StatusOr<PushResult> ModelShard::PushWriter::Commit(absl::Time deadline,
                                                          const std::function<bool()>& cancelled) {
  if (skip_) {
    finished_ = true;
    return shard_->CommitAsyncPush(rank_, step_, /*skip=*/true, loss_scale_, deadline, cancelled);
  }
  if (received_ != shard_->range_.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("push ended after ", received_, " of ", shard_->range_.size(), " elements"));
  }
  if (absl::Status s = shard_->backend_->FinishStaging(rank_); !s.ok()) return s;
  if (shard_->asynchronous()) {
    finished_ = true;  // (A push the commit withdraws leaves its slot empty itself.)
    return shard_->CommitAsyncPush(rank_, step_, /*skip=*/false, loss_scale_, deadline, cancelled);
  }
  if (defer_ && consumed_ < received_) {
    shard_->RecordDelivered(rank_, step_, received_, first_inf_);
  }
  finished_ = true;
  return shard_->CommitPush(rank_, step_, found_inf_, loss_scale_);
}

}  // namespace shardopt
