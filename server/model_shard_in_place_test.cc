// ModelShard::PushWriter's receipt in place (ReceiveInPlace, WriteReceived:
// a payload socket's fp32 pieces read straight into the trainer's staging):
// the same bits as Write, whole steps and pipelined ranges; the checks Write
// makes (NaN, padding) refuse the push with the state untouched; where it
// cannot apply (16-bit pushes, beyond the range, elements a retried push's
// earlier attempt already had consumed) it declines, and the caller's Write
// path carries those elements. And a pull's send straight from the
// parameters (SendParametersInPlace): their bits, at their version only,
// ABORTED when they moved while the bytes went.
#include <cstring>
#include <memory>
#include <vector>

#include "gtest/gtest.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

using testing::kShard;
using testing::RandomGradient;
using testing::ReadAll;
using testing::TestLayout;

std::unique_ptr<ModelShard> Shard(ThreadPool* pool, uint32_t trainers, uint64_t range_elements) {
  ModelShardOptions options{"m",      TestLayout(), kShard, OptimizerConfig::AdamW(0.01),
                            trainers, true};
  options.pipeline_range_elements = range_elements;
  std::vector<float> init(options.layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.002f * static_cast<float>(i % 89);
  ZeroPadding(options.layout, options.layout.ShardRange(kShard), init.data());
  return ModelShard::Create(std::move(options), std::move(init), pool).value();
}

// How each chunk went.
struct Receipts {
  int in_place = 0;
  int written = 0;
};

// Pushes `grad` (up to `stop_at`) in chunks, each received in place where
// the writer allows it and written otherwise.
absl::Status PushPreferringInPlace(ModelShard::PushWriter& writer, const std::vector<float>& grad,
                                   size_t chunk, Receipts* receipts, uint64_t stop_at = ~0ull) {
  for (uint64_t off = 0; off < grad.size() && off < stop_at; off += chunk) {
    const uint64_t count = std::min<uint64_t>(chunk, grad.size() - off);
    if (float* into = writer.ReceiveInPlace(count)) {
      std::memcpy(into, grad.data() + off, count * sizeof(float));
      if (absl::Status s = writer.WriteReceived(count); !s.ok()) return s;
      ++receipts->in_place;
    } else {
      if (absl::Status s = writer.Write(off, grad.data() + off, count * sizeof(float)); !s.ok()) {
        return s;
      }
      ++receipts->written;
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<PushResult> PushInPlace(ModelShard& shard, uint32_t rank, int64_t step,
                                       const std::vector<float>& grad, Receipts* receipts) {
  absl::StatusOr<ModelShard::PushStart> start = shard.BeginPush(rank, step, grad.size());
  if (!start.ok()) return start.status();
  if (start->immediate) return *start->immediate;
  if (absl::Status s = PushPreferringInPlace(*start->writer, grad, 333, receipts); !s.ok()) {
    return s;
  }
  return start->writer->Commit();
}

void ExpectSameBits(const std::vector<float>& a, const std::vector<float>& b) {
  ASSERT_EQ(a.size(), b.size());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
}

TEST(ModelShardInPlaceTest, GivesWritesBitsWholeAndRangeByRange) {
  for (uint64_t range_elements : {uint64_t{0}, uint64_t{64}}) {
    ThreadPool pool(2);
    std::unique_ptr<ModelShard> written = Shard(&pool, 2, range_elements);
    std::unique_ptr<ModelShard> in_place = Shard(&pool, 2, range_elements);
    Receipts receipts;
    for (int64_t step = 1; step <= 3; ++step) {
      for (uint32_t rank : {0u, 1u}) {
        const std::vector<float> g = RandomGradient(rank, step, written->size());
        ASSERT_TRUE(testing::PushInChunks(*written, rank, step, g, 333).ok());
        absl::StatusOr<PushResult> r = PushInPlace(*in_place, rank, step, g, &receipts);
        ASSERT_TRUE(r.ok()) << r.status();
      }
    }
    EXPECT_EQ(receipts.written, 0);
    EXPECT_GT(receipts.in_place, 0);
    ExpectSameBits(ReadAll(*in_place, 3), ReadAll(*written, 3));
  }
}

TEST(ModelShardInPlaceTest, NanOrPaddingInPlaceIsRefusedAndChangesNothing) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = Shard(&pool, 1, 0);
  const std::vector<float> before = ReadAll(*shard, 0);
  const std::vector<float> g = RandomGradient(0, 1, shard->size());
  Receipts receipts;

  std::vector<float> nan = g;
  nan[500] = std::numeric_limits<float>::quiet_NaN();
  absl::StatusOr<PushResult> refused = PushInPlace(*shard, 0, 1, nan, &receipts);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("is nan; the push is rejected"), std::string::npos)
      << refused.status();

  const FlatRange range = TestLayout().ShardRange(kShard);
  const std::vector<FlatRange> padding = TestLayout().PaddingIn(range);
  ASSERT_FALSE(padding.empty());
  std::vector<float> padded = g;
  padded[padding.front().begin - range.begin] = 0.25f;
  refused = PushInPlace(*shard, 0, 1, padded, &receipts);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(refused.status().message().find("padding element"), std::string::npos)
      << refused.status();

  ExpectSameBits(ReadAll(*shard, 0), before);
  // The clean push of the same step is then applied as Write's would be.
  ASSERT_TRUE(PushInPlace(*shard, 0, 1, g, &receipts).ok());
  std::unique_ptr<ModelShard> reference = Shard(&pool, 1, 0);
  ASSERT_TRUE(testing::PushInChunks(*reference, 0, 1, g, 333).ok());
  ExpectSameBits(ReadAll(*shard, 1), ReadAll(*reference, 1));
}

TEST(ModelShardInPlaceTest, DeclinesSixteenBitPushesAndSpansBeyondTheRange) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = Shard(&pool, 1, 0);
  absl::StatusOr<ModelShard::PushStart> bf16 =
      shard->BeginPush(0, 1, shard->size(), DType::kBFloat16);
  ASSERT_TRUE(bf16.ok() && bf16->writer) << bf16.status();
  EXPECT_EQ(bf16->writer->ReceiveInPlace(16), nullptr);
  EXPECT_EQ(bf16->writer->WriteReceived(16).code(), absl::StatusCode::kFailedPrecondition);
  bf16->writer.reset();

  absl::StatusOr<ModelShard::PushStart> fp32 = shard->BeginPush(0, 1, shard->size());
  ASSERT_TRUE(fp32.ok() && fp32->writer) << fp32.status();
  EXPECT_EQ(fp32->writer->ReceiveInPlace(shard->size() + 1), nullptr);
  EXPECT_NE(fp32->writer->ReceiveInPlace(shard->size()), nullptr);
  EXPECT_EQ(fp32->writer->received(), 0u);
}

// A pipelined step: trainer 1's first attempt delivers a prefix that range
// work consumes at once (trainer 0 pushed everything), then breaks off. Its
// retry must not stage the consumed elements again (Write's rule): the
// writer declines them, Write checks and skips them, and the rest goes in
// place. The step's result is the reference's.
TEST(ModelShardInPlaceTest, ARetryWritesWhatRangeWorkConsumedAndReceivesTheRest) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = Shard(&pool, 2, 64);
  std::unique_ptr<ModelShard> reference = Shard(&pool, 2, 64);
  const std::vector<float> g0 = RandomGradient(0, 1, shard->size());
  const std::vector<float> g1 = RandomGradient(1, 1, shard->size());
  Receipts receipts;
  ASSERT_TRUE(PushInPlace(*shard, 0, 1, g0, &receipts).ok());
  {
    absl::StatusOr<ModelShard::PushStart> first = shard->BeginPush(1, 1, g1.size());
    ASSERT_TRUE(first.ok() && first->writer) << first.status();
    ASSERT_TRUE(PushPreferringInPlace(*first->writer, g1, 333, &receipts, 999).ok());
  }  // Broken off: the writer ends without Commit.
  Receipts retry;
  absl::StatusOr<PushResult> applied = PushInPlace(*shard, 1, 1, g1, &retry);
  ASSERT_TRUE(applied.ok()) << applied.status();
  EXPECT_EQ(applied->outcome, PushOutcome::kApplied);
  EXPECT_GT(retry.written, 0) << "the consumed prefix must go through Write";
  EXPECT_GT(retry.in_place, 0);

  ASSERT_TRUE(testing::PushInChunks(*reference, 0, 1, g0, 333).ok());
  ASSERT_TRUE(testing::PushInChunks(*reference, 1, 1, g1, 333).ok());
  ExpectSameBits(ReadAll(*shard, 1), ReadAll(*reference, 1));
}

TEST(ModelShardInPlaceTest, SendsParametersInPlaceAtTheirVersionOnly) {
  for (uint64_t range_elements : {uint64_t{0}, uint64_t{64}}) {
    ThreadPool pool(1);
    std::unique_ptr<ModelShard> shard = Shard(&pool, 1, range_elements);
    ASSERT_TRUE(testing::PushInChunks(*shard, 0, 1, RandomGradient(0, 1, shard->size()), 333).ok());
    const std::vector<float> at_1 = ReadAll(*shard, 1);
    const uint64_t offset = 100, count = 300;
    std::vector<float> sent;
    const auto record = [&](const float* params) {
      sent.assign(params, params + count);
      return absl::OkStatus();
    };
    const uint64_t bytes_before = shard->Snapshot("", 0, 0, false).value().parameter_bytes_sent;
    absl::StatusOr<bool> done = shard->SendParametersInPlace(1, offset, count, record);
    ASSERT_TRUE(done.ok()) << done.status();
    EXPECT_TRUE(*done);
    // Counted as a read's bytes are (metrics, Inspect).
    EXPECT_EQ(shard->Snapshot("", 0, 0, false).value().parameter_bytes_sent - bytes_before,
              count * sizeof(float));
    ASSERT_EQ(sent.size(), count);
    EXPECT_EQ(std::memcmp(sent.data(), at_1.data() + offset, count * sizeof(float)), 0);

    // Another version: ABORTED, and `send` is not called.
    bool called = false;
    absl::StatusOr<bool> stale = shard->SendParametersInPlace(0, offset, count, [&](const float*) {
      called = true;
      return absl::OkStatus();
    });
    EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted) << stale.status();
    EXPECT_FALSE(called);
    EXPECT_EQ(shard->SendParametersInPlace(1, shard->size(), 1, record).status().code(),
              absl::StatusCode::kOutOfRange);

    // Step 2 applied while the bytes of version 1 go (a caller that is not
    // the trainer): what was sent may be torn, so the send is ABORTED.
    absl::StatusOr<bool> moved = shard->SendParametersInPlace(1, offset, count, [&](const float*) {
      return testing::PushInChunks(*shard, 0, 2, RandomGradient(0, 2, shard->size()), 333).status();
    });
    EXPECT_EQ(moved.status().code(), absl::StatusCode::kAborted) << moved.status();
    EXPECT_NE(moved.status().message().find("during the pull"), std::string::npos);
    EXPECT_NE(std::memcmp(ReadAll(*shard, 2).data(), at_1.data(), at_1.size() * sizeof(float)), 0);
    // The send's own failure is the answer.
    EXPECT_EQ(
        shard
            ->SendParametersInPlace(
                2, offset, count, [](const float*) { return absl::UnavailableError("link broke"); })
            .status()
            .code(),
        absl::StatusCode::kUnavailable);
  }
}

}  // namespace
}  // namespace shardopt
