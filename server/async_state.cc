#include "server/async_state.h"

#include <algorithm>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardopt {

AsyncState::AsyncState(AsyncOptions options)
    : options_(options),
      applied_(options.num_trainers, 0),
      slots_(options.num_trainers, Slot::kEmpty),
      last_staleness_(options.num_trainers, 0) {}

int64_t AsyncState::version() const {
  return std::accumulate(applied_.begin(), applied_.end(), int64_t{0});
}

int64_t AsyncState::pushed(uint32_t rank) const {
  // A queued or applying push is this trainer's next step.
  const bool waiting = slots_[rank] == Slot::kQueued || slots_[rank] == Slot::kApplying;
  return applied_[rank] + (waiting ? 1 : 0);
}

absl::StatusOr<AsyncAdmission> AsyncState::BeginPush(uint32_t rank, int64_t step) {
  if (failed()) {
    return absl::FailedPreconditionError(
        absl::StrCat("the shard failed applying a push: ", failure_.message()));
  }
  if (rank >= options_.num_trainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer rank ", rank, " of ", options_.num_trainers, " trainers"));
  }
  if (step < 1)
    return absl::InvalidArgumentError(absl::StrCat("step ", step, " (steps start at 1)"));
  if (step <= applied_[rank]) return AsyncAdmission::kAlreadyApplied;
  if (step > applied_[rank] + 1) {
    return absl::OutOfRangeError(absl::StrCat(
        "trainer ", rank, " pushed its step ", step, " but this shard applied its steps up to ",
        applied_[rank], ": push steps ", applied_[rank] + 1, "..", step - 1, " first"));
  }
  if (slots_[rank] != Slot::kEmpty) {
    return absl::AbortedError(absl::StrCat("trainer ", rank, "'s push of step ", step,
                                           slots_[rank] == Slot::kReceiving
                                               ? " is still being received"
                                               : " is in and waits to be applied"));
  }
  slots_[rank] = Slot::kReceiving;
  return AsyncAdmission::kAccepted;
}

void AsyncState::AbortPush(uint32_t rank, int64_t step) {
  if (rank < slots_.size() && step == applied_[rank] + 1 && slots_[rank] == Slot::kReceiving) {
    slots_[rank] = Slot::kEmpty;
  }
}

bool AsyncState::WithdrawQueued(uint32_t rank, int64_t step) {
  const auto it = std::find_if(queue_.begin(), queue_.end(),
                               [&](const Queued& q) { return q.rank == rank && q.step == step; });
  if (it == queue_.end()) return false;
  queue_.erase(it);
  slots_[rank] = Slot::kEmpty;
  return true;
}

absl::Status AsyncState::CommitPush(uint32_t rank, int64_t step) {
  if (rank >= slots_.size() || step != applied_[rank] + 1 || slots_[rank] != Slot::kReceiving) {
    return absl::FailedPreconditionError(
        absl::StrCat("trainer ", rank, "'s push of step ", step, " is not being received"));
  }
  slots_[rank] = Slot::kQueued;
  queue_.push_back(Queued{rank, step, commits_++});
  return absl::OkStatus();
}

bool AsyncState::Eligible(uint32_t rank, int64_t step) const {
  if (!holds_.empty() && step > *holds_.begin()) return false;
  return Laggards(rank, step).empty();
}

std::vector<std::pair<uint32_t, int64_t>> AsyncState::Laggards(uint32_t rank, int64_t step) const {
  std::vector<std::pair<uint32_t, int64_t>> laggards;
  if (options_.staleness <= 0) return laggards;
  for (uint32_t t = 0; t < options_.num_trainers; ++t) {
    // Applied steps only: a queued push may still be withdrawn (its call
    // gave up), and the bound must hold for what is applied. (The slowest
    // trainer's next step is always eligible: no deadlock.)
    if (t != rank && applied_[t] < step - options_.staleness) laggards.emplace_back(t, applied_[t]);
  }
  return laggards;
}

std::string AsyncState::DescribeWait(uint32_t rank, int64_t step) const {
  std::vector<std::string> reasons;
  const std::vector<std::pair<uint32_t, int64_t>> laggards = Laggards(rank, step);
  if (!laggards.empty()) {
    reasons.push_back(absl::StrCat(
        "staleness ", options_.staleness, ": waits for trainer(s) ",
        absl::StrJoin(laggards, ", ",
                      [](std::string* out, const std::pair<uint32_t, int64_t>& l) {
                        absl::StrAppend(out, l.first, " (applied step ", l.second, ")");
                      }),
        " to push step ", step - options_.staleness));
  }
  if (!holds_.empty() && step > *holds_.begin()) {
    const int64_t cut = *holds_.begin();
    std::vector<std::string> behind;  // (None: the cut is being saved.)
    for (uint32_t t = 0; t < options_.num_trainers; ++t) {
      if (applied_[t] < cut) behind.push_back(absl::StrCat(t, " (applied step ", applied_[t], ")"));
    }
    reasons.push_back(absl::StrCat(
        "the checkpoint of step ", cut, " holds every trainer there until it is saved",
        behind.empty() ? ""
                       : absl::StrCat(": it waits for trainer(s) ", absl::StrJoin(behind, ", "),
                                      " to push up to step ", cut)));
  }
  if (reasons.empty()) return "";
  return absl::StrCat("trainer ", rank, "'s step ", step, ": ", absl::StrJoin(reasons, "; "));
}

bool AsyncState::CanClaimCommittedBefore(uint64_t commit) const {
  if (applying_ || failed()) return false;
  return std::any_of(queue_.begin(), queue_.end(),
                     [&](const Queued& q) { return q.seq < commit && Eligible(q.rank, q.step); });
}

std::optional<AsyncState::Claim> AsyncState::ClaimApply() {
  if (applying_ || failed()) return std::nullopt;
  for (auto it = queue_.begin(); it != queue_.end(); ++it) {
    const uint32_t rank = it->rank;
    const int64_t step = it->step;
    if (!Eligible(rank, step)) continue;
    // How far ahead of the slowest trainer's applied step, counting this
    // push as done: 0 when every trainer is level.
    int64_t slowest = step;
    for (uint32_t t = 0; t < options_.num_trainers; ++t) {
      if (t != rank) slowest = std::min(slowest, applied_[t]);
    }
    queue_.erase(it);
    slots_[rank] = Slot::kApplying;
    applying_ = true;
    return Claim{rank, step, version() + 1, step - slowest};
  }
  return std::nullopt;
}

void AsyncState::FinishApply(const Claim& claim) {
  applied_[claim.rank] = claim.step;
  slots_[claim.rank] = Slot::kEmpty;
  applying_ = false;
  max_staleness_ = std::max(max_staleness_, claim.staleness);
  last_staleness_[claim.rank] = claim.staleness;
  recent_order_.emplace_back(claim.rank, claim.step);
  if (recent_order_.size() > kRecentOrder) recent_order_.pop_front();
}

void AsyncState::FailApply(const Claim& claim, absl::Status failure) {
  slots_[claim.rank] = Slot::kEmpty;
  applying_ = false;
  failure_ = std::move(failure);
}

void AsyncState::ReleaseHold(int64_t step) {
  const auto it = holds_.find(step);
  if (it != holds_.end()) holds_.erase(it);
}

bool AsyncState::UniformCutReachable(int64_t step) const {
  for (uint32_t t = 0; t < options_.num_trainers; ++t) {
    if (applied_[t] + (slots_[t] == Slot::kApplying ? 1 : 0) > step) return false;
  }
  return true;
}

bool AsyncState::UniformCutReached(int64_t step) const {
  return !applying_ &&
         std::all_of(applied_.begin(), applied_.end(), [step](int64_t s) { return s == step; });
}

int64_t AsyncState::slowest_applied() const {
  return *std::min_element(applied_.begin(), applied_.end());
}

absl::Status AsyncState::CheckRestore(const AsyncProgress& progress) const {
  if (progress.applied.size() != options_.num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat("a record of ", progress.applied.size(),
                                                   " trainers for a model of ",
                                                   options_.num_trainers));
  }
  if (std::any_of(progress.applied.begin(), progress.applied.end(),
                  [](int64_t s) { return s < 0; }) ||
      std::accumulate(progress.applied.begin(), progress.applied.end(), int64_t{0}) !=
          progress.version) {
    return absl::InvalidArgumentError(absl::StrCat(
        "version ", progress.version, " is not the sum of the trainers' applied steps [",
        absl::StrJoin(progress.applied, ", "), "]"));
  }
  if (applying_ || !queue_.empty() ||
      std::any_of(slots_.begin(), slots_.end(), [](Slot s) { return s != Slot::kEmpty; })) {
    return absl::FailedPreconditionError("pushes are open, waiting or being applied");
  }
  return absl::OkStatus();
}

void AsyncState::Restore(const AsyncProgress& progress) {
  applied_ = progress.applied;  // (CheckRestore: its version is their sum.)
  recent_order_.clear();
  max_staleness_ = 0;
  std::fill(last_staleness_.begin(), last_staleness_.end(), 0);
}

}  // namespace shardopt
