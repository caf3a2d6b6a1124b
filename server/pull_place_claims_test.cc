#include "server/pull_place_claims.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

// A write that records that it ran.
absl::Status Mark(int* writes) {
  ++*writes;
  return absl::OkStatus();
}

TEST(PullPlaceClaimsTest, TheNewestClaimOwnsThePlace) {
  PullPlaceClaims claims;
  const PullPlace place{{1, 7}, 0};
  int writes = 0;
  PullPlaceClaims::Claim abandoned = claims.Take(place);
  EXPECT_TRUE(abandoned.Write([&] { return Mark(&writes); }).ok());
  PullPlaceClaims::Claim retry = claims.Take(place);
  // Another offset, or the same offset of another segment, is another place.
  PullPlaceClaims::Claim elsewhere = claims.Take(PullPlace{{1, 7}, 32});
  PullPlaceClaims::Claim other_segment = claims.Take(PullPlace{{1, 8}, 0});
  EXPECT_EQ(claims.places(), 3u);

  EXPECT_TRUE(absl::IsAborted(abandoned.Current()));
  EXPECT_TRUE(retry.Current().ok());
  EXPECT_TRUE(other_segment.Current().ok());
  absl::Status late = abandoned.Write([&] { return Mark(&writes); });
  EXPECT_TRUE(absl::IsAborted(late)) << late;
  EXPECT_NE(late.message().find("newer pull"), std::string::npos) << late;
  EXPECT_EQ(writes, 1) << "the superseded claim wrote";
  EXPECT_TRUE(retry.Write([&] { return Mark(&writes); }).ok());
  EXPECT_TRUE(elsewhere.Write([&] { return Mark(&writes); }).ok());
  EXPECT_EQ(writes, 3);
  // What the write says is the claim's answer.
  EXPECT_TRUE(absl::IsDataLoss(retry.Write([] { return absl::DataLossError("x"); })));
}

TEST(PullPlaceClaimsTest, PlacesAreForgottenWithTheirLastClaim) {
  PullPlaceClaims claims;
  const PullPlace place{{1, 7}, 0};
  {
    PullPlaceClaims::Claim first = claims.Take(place);
    {
      PullPlaceClaims::Claim second = claims.Take(place);
      PullPlaceClaims::Claim moved(std::move(second));
      EXPECT_EQ(claims.places(), 1u);
    }
    EXPECT_EQ(claims.places(), 1u) << "forgotten while an older claim still holds it";
    EXPECT_TRUE(absl::IsAborted(first.Write([] { return absl::OkStatus(); })));
  }
  EXPECT_EQ(claims.places(), 0u);
  // A fresh claim after them all owns the place again.
  PullPlaceClaims::Claim again = claims.Take(place);
  EXPECT_TRUE(again.Write([] { return absl::OkStatus(); }).ok());
}

// A piece the older claim is writing when a newer one is taken is finished
// before Take returns: the newer pull's pieces always land after it.
TEST(PullPlaceClaimsTest, TakeWaitsForAPieceBeingWritten) {
  PullPlaceClaims claims;
  const PullPlace place{{1, 7}, 0};
  PullPlaceClaims::Claim older = claims.Take(place);
  absl::Notification writing;
  std::atomic<bool> written{false};
  std::thread writer([&] {
    EXPECT_TRUE(older
                    .Write([&] {
                      writing.Notify();
                      absl::SleepFor(absl::Milliseconds(200));
                      written = true;
                      return absl::OkStatus();
                    })
                    .ok());
  });
  writing.WaitForNotification();
  PullPlaceClaims::Claim newer = claims.Take(place);
  EXPECT_TRUE(written) << "Take returned while the older claim's piece was half written";
  writer.join();
  EXPECT_TRUE(absl::IsAborted(older.Write([] { return absl::OkStatus(); })));
}

}  // namespace
}  // namespace shardopt
