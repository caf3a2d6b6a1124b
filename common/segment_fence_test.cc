#include "common/segment_fence.h"

#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <thread>

#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/shared_memory.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(SegmentFenceTest, RefusesBadTicketsAndPlaces) {
  EXPECT_EQ(SegmentFence::CheckTicket(0).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SegmentFence::CheckTicket(SegmentFence::kBusy).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(SegmentFence::CheckTicket(SegmentFence::kRevoked).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(SegmentFence::CheckTicket(SegmentFence::kRevoked - 1).ok());
  EXPECT_TRUE(SegmentFence::CheckPlace(4088, 4096, 0, 4088).ok());
  EXPECT_NE(SegmentFence::CheckPlace(4092, 4096, 0, 4).message().find("aligned"),
            std::string::npos);
  EXPECT_NE(SegmentFence::CheckPlace(4096, 4096, 0, 4).message().find("overruns"),
            std::string::npos);
  EXPECT_NE(SegmentFence::CheckPlace(~uint64_t{7}, 4096, 0, 4).message().find("overruns"),
            std::string::npos);
  // Inside the payload, at either edge.
  EXPECT_NE(SegmentFence::CheckPlace(0, 4096, 0, 1).message().find("lies in the payload"),
            std::string::npos);
  EXPECT_NE(SegmentFence::CheckPlace(1024, 4096, 1031, 8).message().find("lies in the payload"),
            std::string::npos);
  EXPECT_TRUE(SegmentFence::CheckPlace(1024, 4096, 1032, 8).ok());
  EXPECT_TRUE(SegmentFence::CheckPlace(1024, 4096, 0, 1024).ok());
}

TEST(SegmentFenceTest, AnAttemptTouchesMemoryOnlyWhileItsTicketIsOpen) {
  alignas(8) char word[8] = {};
  SegmentFence fence(word);
  int touched = 0;
  const auto touch = [&touched] {
    ++touched;
    return absl::OkStatus();
  };
  // Closed: nothing.
  EXPECT_EQ(fence.Access(1, touch).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(fence.TryOpen(1));
  EXPECT_TRUE(fence.Open(1));
  EXPECT_TRUE(fence.Access(1, touch).ok());
  EXPECT_TRUE(fence.Access(1, touch).ok());
  EXPECT_EQ(touched, 2);
  // The touch's own failure comes back as it is.
  EXPECT_EQ(fence.Access(1, [] { return absl::DataLossError("x"); }).code(),
            absl::StatusCode::kDataLoss);
  // One attempt at a time: a word not closed is not opened again.
  EXPECT_FALSE(fence.TryOpen(2));
  EXPECT_TRUE(fence.Open(1));
  // Closed, then opened by the retry: the attempt closed stays shut out.
  EXPECT_TRUE(fence.Revoke(1, absl::ZeroDuration()).ok());
  EXPECT_FALSE(fence.Open(1));
  EXPECT_EQ(fence.Access(1, touch).code(), absl::StatusCode::kAborted);
  ASSERT_TRUE(fence.TryOpen(2));
  EXPECT_EQ(fence.Access(1, touch).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(fence.Access(2, touch).ok());
  // Revoking an attempt the word moved on from is at once, and changes
  // nothing.
  EXPECT_TRUE(fence.Revoke(1, absl::ZeroDuration()).ok());
  EXPECT_TRUE(fence.Open(2));
  EXPECT_TRUE(fence.Revoke(2, absl::ZeroDuration()).ok());
  EXPECT_FALSE(fence.Open(2));
  EXPECT_EQ(fence.Access(2, touch).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(touched, 3);
}

TEST(SegmentFenceTest, RevokeWaitsOutAPieceInProgress) {
  alignas(8) char word[8] = {};
  SegmentFence fence(word);
  ASSERT_TRUE(fence.TryOpen(7));
  absl::Notification entered;
  std::atomic<bool> piece_done{false};
  std::thread shard([&] {
    EXPECT_TRUE(fence
                    .Access(7,
                            [&] {
                              entered.Notify();
                              absl::SleepFor(absl::Milliseconds(300));
                              piece_done = true;
                              return absl::OkStatus();
                            })
                    .ok());
  });
  entered.WaitForNotification();
  EXPECT_TRUE(fence.Open(7));  // (Busy, and still its.)
  // While the piece runs, a new attempt cannot open the word either.
  EXPECT_FALSE(fence.TryOpen(8));
  EXPECT_TRUE(fence.Revoke(7, absl::Seconds(30)).ok());
  EXPECT_TRUE(piece_done);
  shard.join();
  EXPECT_EQ(fence.Access(7, [] { return absl::OkStatus(); }).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(fence.TryOpen(8));
}

// A shard that goes on piece after piece (a pull streaming its ranges, a
// push reading its payload) lets go of the word for a moment between two:
// the close does not have to catch that moment, the piece in progress is
// made the last.
TEST(SegmentFenceTest, RevokeEndsACallThatTouchesPieceAfterPiece) {
  alignas(8) char word[8] = {};
  SegmentFence fence(word);
  ASSERT_TRUE(fence.TryOpen(9));
  std::atomic<int> pieces{0};
  std::atomic<bool> after_revoke{false};
  std::thread shard([&] {
    // Until shut out; bounded for a broken fence.
    for (int i = 0; i < 2000; ++i) {
      const absl::Status s = fence.Access(9, [&] {
        ++pieces;
        absl::SleepFor(absl::Milliseconds(5));
        return absl::OkStatus();
      });
      if (absl::IsAborted(s)) return;
      EXPECT_FALSE(after_revoke) << "a piece began after the close returned";
    }
  });
  while (pieces < 3) absl::SleepFor(absl::Milliseconds(1));
  // (Far below the 2000 pieces' 10 s: a close that must catch the shard
  // between two pieces would hardly ever succeed.)
  const absl::Status closed = fence.Revoke(9, absl::Seconds(2));
  after_revoke = true;
  shard.join();
  EXPECT_TRUE(closed.ok()) << closed;
  EXPECT_LT(pieces, 1000);
  EXPECT_TRUE(fence.TryOpen(10));
}

TEST(SegmentFenceTest, APieceThatNeverEndsTimesOutButStaysTheLast) {
  alignas(8) char word[8] = {};
  SegmentFence fence(word);
  ASSERT_TRUE(fence.TryOpen(3));
  // A piece in progress that outlasts the close's wait.
  absl::Notification entered, finish;
  std::thread shard([&] {
    EXPECT_TRUE(fence
                    .Access(3,
                            [&] {
                              entered.Notify();
                              finish.WaitForNotification();
                              return absl::OkStatus();
                            })
                    .ok());
  });
  entered.WaitForNotification();
  absl::Status timed_out = fence.Revoke(3, absl::Milliseconds(50), [] { return false; });
  EXPECT_EQ(timed_out.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(timed_out.message().find("that piece is its last"), std::string::npos);
  EXPECT_FALSE(fence.TryOpen(4));
  finish.Notify();
  shard.join();
  // The piece ended: the shard closed the word, and the call is shut out.
  EXPECT_EQ(fence.Access(3, [] { return absl::OkStatus(); }).code(),
            absl::StatusCode::kAborted);
  EXPECT_TRUE(fence.TryOpen(4));
  EXPECT_TRUE(fence.Revoke(4, absl::ZeroDuration()).ok());
}

TEST(SegmentFenceTest, AWordAShardDiedInIsClosedByTheTrainer) {
  alignas(8) char word[8] = {};
  SegmentFence fence(word);
  ASSERT_TRUE(fence.TryOpen(3));
  // What a shard killed in the middle of a piece leaves.
  const uint64_t busy = uint64_t{3} | SegmentFence::kBusy;
  std::memcpy(word, &busy, 8);
  EXPECT_EQ(fence.Revoke(3, absl::Milliseconds(20), [] { return false; }).code(),
            absl::StatusCode::kDeadlineExceeded);
  EXPECT_FALSE(fence.TryOpen(4));
  EXPECT_FALSE(fence.ClearAbandoned(2));  // (Not that attempt's.)
  EXPECT_TRUE(fence.Revoke(3, absl::Seconds(30), [] { return true; }).ok());
  EXPECT_TRUE(fence.TryOpen(4));
  // The same later, after the close gave up (the transport's way).
  std::memcpy(word, &busy, 8);
  EXPECT_FALSE(fence.Revoke(3, absl::Milliseconds(20)).ok());
  EXPECT_TRUE(fence.ClearAbandoned(3));
  EXPECT_TRUE(fence.TryOpen(4));
}

// The real arrangement: the shard is another process writing the trainer's
// segment piece by piece (a pull); once Revoke returns, no byte changes.
TEST(SegmentFenceTest, AnotherProcessWritesNothingOnceRevoked) {
  constexpr size_t kPayload = 1 << 20;
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(kPayload + 64);
  ASSERT_TRUE(segment.ok()) << segment.status();
  char* payload = segment->data();
  SegmentFence fence(segment->data() + kPayload);
  ASSERT_TRUE(fence.TryOpen(11));
  const pid_t child = fork();
  ASSERT_GE(child, 0);
  if (child == 0) {
    // Writes ever new values until shut out; its exit code says how it ended.
    for (int piece = 1;; ++piece) {
      const absl::Status s = SegmentFence(segment->data() + kPayload).Access(11, [&] {
        std::memset(payload, piece & 0x7f, kPayload);
        return absl::OkStatus();
      });
      if (absl::IsAborted(s)) _exit(piece > 1 ? 0 : 2);
      if (!s.ok()) _exit(3);
    }
  }
  // Until it has written some pieces.
  const absl::Time until = absl::Now() + absl::Seconds(30);
  while (payload[0] == 0 && absl::Now() < until) absl::SleepFor(absl::Milliseconds(1));
  absl::SleepFor(absl::Milliseconds(20));
  ASSERT_TRUE(fence.Revoke(11, absl::Seconds(30)).ok());
  std::string after(payload, kPayload);
  // Every byte one piece's: no piece was cut short by the revoke.
  EXPECT_EQ(after.find_first_not_of(after[0]), std::string::npos);
  int status = 0;
  ASSERT_EQ(waitpid(child, &status, 0), child);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(std::string(payload, kPayload), after);
}

}  // namespace
}  // namespace shardopt
