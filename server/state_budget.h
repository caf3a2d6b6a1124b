// StateBudget: how many bytes of model state (parameters, optimizer slots,
// per-trainer staging) one server may hold (--max_state_mib). A
// registration, restore or rollback reserves its model's bytes before
// allocating anything; the Reservation goes with the model and gives the
// bytes back when destroyed, so no path can forget to, or give back a
// different amount. Thread-safe.
#ifndef SHARDOPT_SERVER_STATE_BUDGET_H_
#define SHARDOPT_SERVER_STATE_BUDGET_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace shardopt {

class StateBudget {
 public:
  StateBudget(uint64_t limit_bytes, uint32_t shard_index)
      : limit_(limit_bytes), shard_index_(shard_index) {}

  // Bytes taken from the budget until destroyed (or Release()). Movable.
  class Reservation {
   public:
    Reservation() = default;
    Reservation(Reservation&& other) noexcept { *this = std::move(other); }
    Reservation& operator=(Reservation&& other) noexcept;
    ~Reservation() { Release(); }
    uint64_t bytes() const { return bytes_; }
    void Release();

   private:
    friend class StateBudget;
    Reservation(StateBudget* budget, uint64_t bytes) : budget_(budget), bytes_(bytes) {}
    StateBudget* budget_ = nullptr;
    uint64_t bytes_ = 0;
  };

  // RESOURCE_EXHAUSTED (naming the model, what it needs and what is free)
  // when `bytes` do not fit.
  absl::StatusOr<Reservation> Reserve(const std::string& model_id, uint64_t bytes);

  uint64_t reserved() const;

 private:
  const uint64_t limit_;
  const uint32_t shard_index_;
  mutable absl::Mutex mu_;
  uint64_t reserved_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_STATE_BUDGET_H_
