#include "server/state_budget.h"

#include "absl/strings/str_cat.h"

namespace shardopt {

StateBudget::Reservation& StateBudget::Reservation::operator=(Reservation&& other) noexcept {
  if (this != &other) {
    Release();
    budget_ = other.budget_;
    bytes_ = other.bytes_;
    other.budget_ = nullptr;
    other.bytes_ = 0;
  }
  return *this;
}

void StateBudget::Reservation::Release() {
  if (budget_ == nullptr) return;
  absl::MutexLock lock(&budget_->mu_);
  budget_->reserved_ -= bytes_;
  budget_ = nullptr;
  bytes_ = 0;
}

absl::StatusOr<StateBudget::Reservation> StateBudget::Reserve(const std::string& model_id,
                                                              uint64_t bytes) {
  absl::MutexLock lock(&mu_);
  if (bytes > limit_ - reserved_) {
    return absl::ResourceExhaustedError(
        absl::StrCat("model '", model_id, "' needs ", bytes, " bytes of state on shard ",
                     shard_index_, "; ", limit_ - reserved_, " of ", limit_,
                     " are free (--max_state_mib)"));
  }
  reserved_ += bytes;
  return Reservation(this, bytes);
}

uint64_t StateBudget::reserved() const {
  absl::MutexLock lock(&mu_);
  return reserved_;
}

}  // namespace shardopt
