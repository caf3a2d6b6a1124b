// A trainer that gives up on a step whose payloads go through shared memory
// (Ctrl-C: TrainerClient::Interrupt) has its memory to itself again when
// Step returns: every fence word of its segment is closed
// (common/segment_fence.h), so the shards write nothing into its shared
// parameters when another trainer completes the step right after. Before,
// a shard that had not yet seen the cancellation wrote the step's values
// there: shardopt.torch took that for the user changing the weights. The
// retry then completes the step as usual.
#include <cstring>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "client/shared_memory_route.h"
#include "client/trainer_client.h"
#include "common/segment_fence.h"
#include "gtest/gtest.h"
#include "tests/support/synthetic.h"
#include "tests/support/two_shard_cluster.h"

namespace shardopt::testing {
namespace {

class SharedMemoryFenceTest : public TwoShardClusterTest {};

uint64_t FenceWord(const TrainerSegment& segment, uint32_t shard, TrainerSegment::FenceUse use) {
  const int64_t offset = segment.FenceOffset(shard, use);
  EXPECT_GE(offset, 0);
  uint64_t word = 0;
  std::memcpy(&word, segment.segment().data() + offset, sizeof(word));
  return word;
}

TEST_F(SharedMemoryFenceTest, AnInterruptedStepLeavesTheSegmentToItsTrainer) {
  const ModelSpec spec = SyntheticModelSpec("fence", OptimizerConfig::Sgd(0.5), 2);
  auto rank0 = Connect(0), rank1 = Connect(1);
  const std::vector<float> initial = SyntheticInitialParams(rank0->LayoutFor(spec).value(), 3);
  ASSERT_TRUE(rank0->Register(spec, initial).ok());
  ASSERT_TRUE(rank1->Attach(spec).ok());
  ASSERT_NE(rank0->shared_segment(), nullptr) << "no shared memory on this host";
  const TrainerSegment& segment = *rank0->shared_segment();
  // The parameters live in the segment, pulled into in place (as
  // shardopt.torch's are).
  const absl::Span<float> params = rank0->shared_parameters();
  std::copy(initial.begin(), initial.end(), params.begin());
  std::vector<float> grad0(initial.size()), grad1(initial.size()), params1 = initial;
  SyntheticGradient(rank0->layout(), initial, 0, 1, 3, absl::MakeSpan(grad0));
  SyntheticGradient(rank1->layout(), initial, 1, 1, 3, absl::MakeSpan(grad1));

  // Rank 0's step pushes, then its pull waits on the shards for rank 1.
  absl::StatusOr<StepResult> interrupted = absl::UnknownError("not run");
  std::thread stepping([&] { interrupted = rank0->Step(1, grad0, params); });
  // Its push reached both shards (through the segment); then a moment for
  // the pull to start waiting.
  const absl::Time give_up = absl::Now() + absl::Seconds(30);
  while (rank0->shared_memory_transfers() < 2 && absl::Now() < give_up) {
    absl::SleepFor(absl::Milliseconds(5));
  }
  const bool pushed = rank0->shared_memory_transfers() >= 2;
  absl::SleepFor(absl::Milliseconds(100));
  rank0->Interrupt();
  stepping.join();
  ASSERT_TRUE(pushed) << "rank 0's push did not go through the segment to both shards";
  EXPECT_EQ(interrupted.status().code(), absl::StatusCode::kCancelled) << interrupted.status();
  for (uint32_t shard = 0; shard < 2; ++shard) {
    EXPECT_EQ(FenceWord(segment, shard, TrainerSegment::FenceUse::kPush), 0u) << shard;
    EXPECT_EQ(FenceWord(segment, shard, TrainerSegment::FenceUse::kPull), 0u)
        << "shard " << shard << " may still write the pull rank 0 gave up on";
  }
  const std::vector<float> left(params.begin(), params.end());

  // Rank 1 completes step 1 at once: the pull rank 0 gave up on, still
  // waiting on the shards, writes none of it.
  absl::StatusOr<StepResult> completed = rank1->Step(1, grad1, absl::MakeSpan(params1));
  ASSERT_TRUE(completed.ok()) << completed.status();
  EXPECT_EQ(completed->version, 1);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_EQ(std::memcmp(params.data(), left.data(), left.size() * sizeof(float)), 0)
      << "a shard wrote into rank 0's parameters after its step returned";

  // The retry completes the step: the same parameters as rank 1's.
  rank0->ClearInterrupt();
  absl::StatusOr<StepResult> retried = rank0->Step(1, grad0, params);
  ASSERT_TRUE(retried.ok()) << retried.status();
  EXPECT_EQ(retried->version, 1);
  EXPECT_EQ(std::memcmp(params.data(), params1.data(), params1.size() * sizeof(float)), 0);
  EXPECT_GT(rank0->shared_memory_transfers(), 0) << "the payloads did not go through the segment";
}

}  // namespace
}  // namespace shardopt::testing
