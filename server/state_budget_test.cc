// StateBudget: a reservation gives back exactly what it took, once, however
// it ends (destroyed, released, moved from or assigned over).
#include "server/state_budget.h"

#include <utility>

#include "absl/strings/match.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(StateBudgetTest, AReservationGivesBackWhatItTookOnce) {
  StateBudget budget(100, 3);
  {
    StateBudget::Reservation a = budget.Reserve("a", 60).value();
    EXPECT_EQ(a.bytes(), 60u);
    EXPECT_EQ(budget.reserved(), 60u);
    const absl::Status full = budget.Reserve("b", 41).status();
    EXPECT_EQ(full.code(), absl::StatusCode::kResourceExhausted);
    EXPECT_TRUE(absl::StrContains(full.message(), "model 'b' needs 41 bytes of state on shard 3; "
                                                  "40 of 100 are free"))
        << full;
    StateBudget::Reservation moved = std::move(a);
    EXPECT_EQ(budget.reserved(), 60u);  // Moved, not doubled.
    moved.Release();
    moved.Release();  // Once only.
    EXPECT_EQ(budget.reserved(), 0u);
    StateBudget::Reservation b = budget.Reserve("b", 30).value();
    b = budget.Reserve("c", 50).value();  // Assigning over gives b's back.
    EXPECT_EQ(budget.reserved(), 50u);
  }
  EXPECT_EQ(budget.reserved(), 0u);  // Destroyed.
  EXPECT_TRUE(budget.Reserve("d", 100).ok());
}

}  // namespace
}  // namespace shardopt
