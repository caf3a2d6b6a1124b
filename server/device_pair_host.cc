#include "server/device_pair_host.h"

#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/logging.h"
#include "common/names.h"
#include "common/shared_memory.h"

namespace shardopt {

struct DevicePairHost::Entry {
  enum class State { kJoining, kIdle, kBusy, kGone };
  State state = State::kJoining;
  std::string name;
  std::string peer;
  std::unique_ptr<DevicePair> pair;
  absl::Time last_used = absl::Now();
};

DevicePairHost::~DevicePairHost() {
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> dropped;
  {
    absl::MutexLock lock(&mu_);
    const auto none_joining = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return joining_ == 0; };
    mu_.Await(absl::Condition(&none_joining));
    dropped.swap(pairs_);
  }
  // (Outside the lock: tearing NCCL communicators down takes a while.)
  dropped.clear();
}

size_t DevicePairHost::pairs() const {
  absl::MutexLock lock(&mu_);
  size_t open = 0;
  for (const auto& [name, entry] : pairs_) open += entry->state != Entry::State::kJoining;
  return open;
}

size_t DevicePairHost::busy() const {
  absl::MutexLock lock(&mu_);
  size_t busy = 0;
  for (const auto& [name, entry] : pairs_) busy += entry->state == Entry::State::kBusy;
  return busy;
}

absl::StatusOr<DevicePairHost::Opened> DevicePairHost::Open(std::string peer) {
  absl::StatusOr<std::string> id = kind_.NewId();
  if (!id.ok()) return id.status();
  auto entry = std::make_shared<Entry>();
  entry->name = RandomHexToken(16);
  entry->peer = std::move(peer);
  std::shared_ptr<Entry> evicted;  // Destroyed after the lock is released.
  {
    absl::MutexLock lock(&mu_);
    if (joining_ >= kMaxJoining) {
      return absl::ResourceExhaustedError(
          absl::StrCat(joining_, " device pairs are joining this shard; try again later"));
    }
    if (pairs_.size() >= kMaxPairs) {
      std::shared_ptr<Entry> oldest;
      for (const auto& [name, e] : pairs_) {
        if (e->state == Entry::State::kIdle && (!oldest || e->last_used < oldest->last_used)) {
          oldest = e;
        }
      }
      if (!oldest) {
        return absl::ResourceExhaustedError(
            absl::StrCat("this shard holds ", pairs_.size(), " device pairs, none idle"));
      }
      oldest->state = Entry::State::kGone;
      pairs_.erase(oldest->name);
      evicted = std::move(oldest);
    }
    pairs_[entry->name] = entry;
    ++joining_;
  }
  std::thread([this, entry, id = *id] { Join(entry, id); }).detach();
  return Opened{entry->name, *std::move(id)};
}

void DevicePairHost::Join(std::shared_ptr<Entry> entry, std::string id) {
  absl::StatusOr<std::unique_ptr<DevicePair>> pair =
      kind_.Connect(id, /*rank=*/0, device_, absl::Now() + join_timeout_, entry->peer);
  if (!pair.ok()) {
    LogWarning("device pair with %s (%s) did not join: %s", entry->peer, kind_.name(),
               pair.status().ToString());
  }
  absl::MutexLock lock(&mu_);
  --joining_;
  if (pair.ok() && entry->state == Entry::State::kJoining) {
    entry->pair = *std::move(pair);
    entry->state = Entry::State::kIdle;
    entry->last_used = absl::Now();
  } else if (entry->state == Entry::State::kJoining) {
    entry->state = Entry::State::kGone;
    pairs_.erase(entry->name);
  }
}

absl::StatusOr<DevicePairHost::Lease> DevicePairHost::Acquire(absl::string_view pair,
                                                              absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto it = pairs_.find(pair);
  if (it == pairs_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("device pair ", Quoted(pair), " ", kDevicePairNotOpen));
  }
  std::shared_ptr<Entry> entry = it->second;
  // A pair still joining, or whose last transfer's call has not let go of
  // it yet (the trainer moves on once the bytes are through), comes soon.
  const auto ready = [&entry]() {
    return entry->state != Entry::State::kJoining && entry->state != Entry::State::kBusy;
  };
  mu_.AwaitWithDeadline(absl::Condition(&ready), std::min(deadline, absl::Now() + join_timeout_));
  if (!ready()) {
    return absl::UnavailableError(absl::StrCat(
        "device pair with ", entry->peer, " is still ",
        entry->state == Entry::State::kJoining ? "joining" : "busy with another transfer"));
  }
  if (entry->state != Entry::State::kIdle) {
    return absl::FailedPreconditionError(
        absl::StrCat("device pair ", Quoted(pair), " ", kDevicePairNotOpen));
  }
  entry->state = Entry::State::kBusy;
  return Lease(this, std::move(entry));
}

void DevicePairHost::Release(const std::shared_ptr<Entry>& entry, bool finished) {
  std::unique_ptr<DevicePair> dropped;
  {
    absl::MutexLock lock(&mu_);
    entry->last_used = absl::Now();
    if (finished && entry->state == Entry::State::kBusy && entry->pair->broken().ok()) {
      entry->state = Entry::State::kIdle;
      return;
    }
    if (entry->state != Entry::State::kGone) pairs_.erase(entry->name);
    entry->state = Entry::State::kGone;
    dropped = std::move(entry->pair);
  }
  // (Outside the lock: tearing an NCCL communicator down takes a while.)
  dropped.reset();
}

DevicePairHost::Lease::~Lease() {
  if (entry_ != nullptr) host_->Release(entry_, /*finished=*/!dirty_ && !abandoned_);
}

DevicePair& DevicePairHost::Lease::pair() const { return *entry_->pair; }

}  // namespace shardopt
