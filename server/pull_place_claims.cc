#include "server/pull_place_claims.h"

#include <algorithm>
#include <utility>

namespace shardopt {

PullPlaceClaims::Claim PullPlaceClaims::Take(const PullPlace& place) {
  std::shared_ptr<Place> state;
  uint64_t number;
  {
    absl::MutexLock lock(&mu_);
    std::shared_ptr<Place>& entry = places_[place];
    if (entry == nullptr) entry = std::make_shared<Place>();
    ++entry->holders;
    state = entry;
    number = ++taken_;
  }
  {
    // Waits for a piece an older claim is writing. (max: of two claims
    // taken at once, the later number wins whichever gets here first.)
    absl::MutexLock lock(&state->mu);
    state->newest = std::max(state->newest, number);
  }
  return Claim(this, place, std::move(state), number);
}

size_t PullPlaceClaims::places() const {
  absl::MutexLock lock(&mu_);
  return places_.size();
}

void PullPlaceClaims::Release(const PullPlace& place, const std::shared_ptr<Place>& state) {
  absl::MutexLock lock(&mu_);
  if (--state->holders > 0) return;
  auto it = places_.find(place);
  if (it != places_.end() && it->second == state) places_.erase(it);
}

PullPlaceClaims::Claim::Claim(Claim&& other) noexcept
    : claims_(other.claims_),
      place_(other.place_),
      state_(std::move(other.state_)),
      number_(other.number_) {
  other.state_ = nullptr;
}

PullPlaceClaims::Claim::~Claim() {
  if (state_ != nullptr) claims_->Release(place_, state_);
}

namespace {

absl::Status Superseded() {
  return absl::AbortedError(
      "a newer pull into the same place of the trainer's shared segment took it over (this "
      "one was given up on by its trainer); it writes nothing more there");
}

}  // namespace

absl::Status PullPlaceClaims::Claim::Write(const std::function<absl::Status()>& write) {
  absl::MutexLock lock(&state_->mu);
  if (state_->newest != number_) return Superseded();
  return write();
}

absl::Status PullPlaceClaims::Claim::Current() const {
  absl::MutexLock lock(&state_->mu);
  return state_->newest == number_ ? absl::OkStatus() : Superseded();
}

}  // namespace shardopt
