// ModelShard's waits of pulls: the version a pull returns, and the ranges of
// it reaching that version (synchronous; the asynchronous modes pin theirs,
// model_shard_async.cc).
#include <cassert>

#include "absl/strings/str_cat.h"
#include "server/model_shard.h"

namespace shardopt {

absl::Status ModelShard::AwaitPullable(const std::function<bool()>& reached, int64_t version,
                                       absl::Time deadline, const std::function<bool()>& cancelled,
                                       const std::optional<PushedBy>& pushed) {
  if (pushed) {
    if (absl::Status s = CheckRank(pushed->rank); !s.ok()) return s;
  }
  const auto lost = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return pushed && !state_.CheckHoldsPush(pushed->rank, pushed->step).ok();
  };
  const absl::Status waited = AwaitState(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return reached() || lost(); }, deadline, cancelled);
  if (state_.failed()) return state_.failure();
  if (shutdown_) return absl::UnavailableError("the shard server is shutting down");
  if (reached()) return absl::OkStatus();
  if (lost()) return state_.CheckHoldsPush(pushed->rank, pushed->step);
  if (absl::IsDeadlineExceeded(waited)) {
    return WaitExpired(absl::StrCat("version ", version), version);
  }
  return waited;
}

absl::StatusOr<int64_t> ModelShard::WaitForVersion(int64_t min_version, absl::Time deadline,
                                                   const std::function<bool()>& cancelled,
                                                   std::optional<PushedBy> pushed) {
  if (asynchronous()) {
    // (Released at once: the caller reads nothing under it.)
    return AsyncPullTarget(min_version, deadline, cancelled, pushed, nullptr);
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AwaitPullable(
          [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_.version() >= min_version; },
          min_version, deadline, cancelled, pushed);
      !s.ok()) {
    return s;
  }
  return state_.version();
}

absl::StatusOr<int64_t> ModelShard::PullTarget(int64_t min_version, absl::Time deadline,
                                               const std::function<bool()>& cancelled,
                                               std::optional<PushedBy> pushed, ReadPin* pin) {
  if (asynchronous()) {
    assert(pin != nullptr);
    return AsyncPullTarget(min_version, deadline, cancelled, pushed, pin);
  }
  absl::MutexLock lock(&mu_);
  if (absl::Status s = AwaitPullable(
          [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return state_.version() + 1 >= min_version; },
          min_version, deadline, cancelled, pushed);
      !s.ok()) {
    return s;
  }
  // A range already at the next version has lost the current one.
  const int64_t newest = state_.RangeVersion(0);
  if (min_version < newest && state_.PartlyRun() &&
      !(pushed && pushed->step == state_.version() + 1)) {
    // A trainer that lost its push of the step (restarted without a
    // journal) would wait for itself: say so at once.
    return absl::FailedPreconditionError(absl::StrCat(
        "version ", min_version, " cannot be pulled: ", state_.DescribePartlyRun(),
        "; without it, restart every shard from a checkpoint (--restore_from) or roll the "
        "job back"));
  }
  return std::max(min_version, newest);
}

absl::Status ModelShard::WaitForRanges(int64_t version, uint64_t offset, uint64_t count,
                                       absl::Time deadline, const std::function<bool()>& cancelled,
                                       std::optional<PushedBy> pushed) {
  absl::MutexLock lock(&mu_);
  if (async_) {
    // (Pinned by PullTarget: the version cannot move.)
    if (async_->version() >= version) return absl::OkStatus();
    return absl::AbortedError(absl::StrCat("version ", version, " is not applied here"));
  }
  const std::pair<size_t, size_t> ranges = state_.RangesCovering(offset, count);
  return AwaitPullable(
      [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
        for (size_t i = ranges.first; i < ranges.second; ++i) {
          if (state_.RangeVersion(i) < version) return false;
        }
        return true;
      },
      version, deadline, cancelled, pushed);
}

int64_t ModelShard::ParamsVersion(uint64_t offset, uint64_t count) const {
  const auto [first, last] = RangesCovering(offset, count, range_elements_, range_count_);
  const int64_t version = range_versions_[first];
  for (size_t i = first; i < last; ++i) {
    if (range_versions_[i] != version) return -1;
  }
  return version;
}

}  // namespace shardopt
