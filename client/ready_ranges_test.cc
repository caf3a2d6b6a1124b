// ReadyRanges: intervals merge in any order; waits end when covered, at
// AllowCommit, or with false at Fail; a sent chunk changed afterwards (one
// element, one bit, a scaled copy) is found, an unchanged one is not.
// DigestBytes: any one changed word or a changed length changes it.
#include "client/ready_ranges.h"

#include <cmath>
#include <cstring>
#include <thread>
#include <vector>

#include "client/chunk_digest.h"

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

TEST(ReadyRangesTest, RangesMergeInAnyOrderAndWaitsEndWhenCovered) {
  ReadyRanges ready;
  ready.MarkReady(100, 200);
  ready.MarkReady(0, 50);
  std::thread waiter([&] { EXPECT_TRUE(ready.WaitReady(10, 150)); });
  ready.MarkReady(40, 100);  // Bridges the two: [0, 200).
  waiter.join();
  EXPECT_TRUE(ready.WaitReady(0, 200));
  EXPECT_TRUE(ready.WaitReady(5, 5));
  ready.MarkReady(300, 250);  // Empty: ignored.
  ready.MarkReady(200, 201);  // Adjacent: merged.
  EXPECT_TRUE(ready.WaitReady(199, 201));
}

TEST(ReadyRangesTest, FailEndsEveryWaitAndCommitWaitsForAllowCommit) {
  ReadyRanges ready;
  ready.MarkReady(0, 10);
  absl::Notification started;
  std::thread commit([&] {
    started.Notify();
    EXPECT_TRUE(ready.WaitCommit());
  });
  started.WaitForNotification();
  ready.AllowCommit();
  commit.join();
  std::thread gap([&] { EXPECT_FALSE(ready.WaitReady(0, 20)); });
  ready.Fail();
  gap.join();
  EXPECT_TRUE(ready.failed());
  EXPECT_FALSE(ready.WaitCommit());
}

TEST(ReadyRangesTest, FindsTheFirstSentChunkThatChangedAfterItWasSent) {
  std::vector<float> grads(1003);
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = std::sin(static_cast<float>(i));
  ReadyRanges ready;
  // Two shards' chunks, out of order, one sent twice (a retried attempt).
  ready.RecordSent(500, 1003, &grads[500]);
  ready.RecordSent(0, 250, &grads[0]);
  ready.RecordSent(250, 500, &grads[250]);
  ready.RecordSent(0, 250, &grads[0]);
  EXPECT_FALSE(ready.FirstChangedChunk(grads.data()).has_value());

  std::vector<float> flipped = grads;
  uint32_t bits;
  std::memcpy(&bits, &flipped[1002], 4);
  bits ^= 1;  // The lowest bit of the last (odd-placed) element.
  std::memcpy(&flipped[1002], &bits, 4);
  auto changed = ready.FirstChangedChunk(flipped.data());
  ASSERT_TRUE(changed.has_value());
  EXPECT_EQ(changed->first, 500u);
  EXPECT_EQ(changed->second, 1003u);

  std::vector<float> clipped = grads;
  for (float& g : clipped) g *= 0.5f;  // What clip_grad_norm_ does.
  EXPECT_TRUE(ready.FirstChangedChunk(clipped.data()).has_value());

  std::vector<float> one = grads;
  one[300] = -one[300];
  changed = ready.FirstChangedChunk(one.data());
  ASSERT_TRUE(changed.has_value());
  EXPECT_EQ(changed->first, 250u);
}

TEST(ChunkDigestTest, EveryOneWordChangeAndTheLengthChangeIt) {
  std::vector<uint64_t> words(37);
  for (size_t i = 0; i < words.size(); ++i) words[i] = i * 0x9e3779b97f4a7c15ULL;
  const size_t bytes = words.size() * 8 - 3;  // Not a multiple of 8.
  const uint64_t base = DigestBytes(words.data(), bytes);
  for (size_t i = 0; i < words.size(); ++i) {
    std::vector<uint64_t> changed = words;
    changed[i] ^= 1ULL << (i % 40);  // (Within the last word's 5 bytes, too.)
    EXPECT_NE(DigestBytes(changed.data(), bytes), base) << "word " << i;
  }
  EXPECT_NE(DigestBytes(words.data(), bytes - 1), base);
  // Sign flips of floats in two words of one lane (words i and i + 4), and
  // of every pair of elements among the first 64: their top bits must not
  // cancel.
  std::vector<float> floats(64);
  for (size_t i = 0; i < floats.size(); ++i) floats[i] = 0.5f + static_cast<float>(i);
  const uint64_t float_base = DigestBytes(floats.data(), floats.size() * 4);
  for (size_t a = 0; a < floats.size(); ++a) {
    for (size_t b = a + 1; b < floats.size(); ++b) {
      std::vector<float> flipped = floats;
      flipped[a] = -flipped[a];
      flipped[b] = -flipped[b];
      EXPECT_NE(DigestBytes(flipped.data(), flipped.size() * 4), float_base)
          << "elements " << a << " and " << b;
    }
  }
  std::vector<uint64_t> zeros(8, 0);
  EXPECT_NE(DigestBytes(zeros.data(), 32), DigestBytes(zeros.data(), 64));
}

}  // namespace
}  // namespace shardopt
