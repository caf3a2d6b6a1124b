// ModelShard without gRPC: arrival order, concurrency, torn-pull detection,
// reads, inspection and backend failures (the step controls are in
// model_shard_control_test.cc).
#include "server/model_shard.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/dtype_convert.h"
#include "gtest/gtest.h"
#include "server/forwarding_backend_testing.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

using testing::kShard;
using testing::kShards;
using testing::MakeShard;
using testing::PushAll;
using testing::RandomGradient;
using testing::ReadAll;
using testing::TestLayout;

TEST(ModelShardTest, ResultDoesNotDependOnArrivalOrder) {
  ThreadPool pool(2);
  std::vector<std::vector<float>> results;
  std::vector<uint32_t> order = {0, 1, 2};
  do {
    std::unique_ptr<ModelShard> shard = MakeShard(&pool, 3);
    for (int64_t step = 1; step <= 5; ++step) {
      for (uint32_t rank : order) {
        absl::StatusOr<PushResult> r = PushAll(*shard, rank, step);
        ASSERT_TRUE(r.ok()) << r.status();
        EXPECT_EQ(r->outcome,
                  rank == order.back() ? PushOutcome::kApplied : PushOutcome::kAccepted);
      }
    }
    results.push_back(ReadAll(*shard, 5));
  } while (std::next_permutation(order.begin(), order.end()));
  for (const auto& r : results) {
    ASSERT_EQ(std::memcmp(r.data(), results[0].data(), r.size() * sizeof(float)), 0);
  }
}

TEST(ModelShardTest, ThreadCountDoesNotChangeTheResult) {
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3, 8}) {
    ThreadPool pool(threads);
    std::unique_ptr<ModelShard> shard = MakeShard(&pool, 2);
    for (int64_t step = 1; step <= 4; ++step) {
      ASSERT_TRUE(PushAll(*shard, 1, step).ok());
      ASSERT_TRUE(PushAll(*shard, 0, step).ok());
    }
    results.push_back(ReadAll(*shard, 4));
  }
  for (const auto& r : results) {
    ASSERT_EQ(std::memcmp(r.data(), results[0].data(), r.size() * sizeof(float)), 0);
  }
}

TEST(ModelShardTest, ConcurrentTrainersStepInLockstep) {
  ThreadPool pool(2);
  constexpr uint32_t kTrainers = 4;
  constexpr int64_t kSteps = 60;
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, kTrainers);
  std::vector<std::thread> trainers;
  std::vector<std::string> errors(kTrainers);
  std::vector<std::vector<float>> finals(kTrainers);
  for (uint32_t rank = 0; rank < kTrainers; ++rank) {
    trainers.emplace_back([&, rank] {
      for (int64_t step = 1; step <= kSteps; ++step) {
        absl::StatusOr<PushResult> r = PushAll(*shard, rank, step, 100 + rank);
        if (!r.ok()) {
          errors[rank] = r.status().ToString();
          return;
        }
        absl::StatusOr<int64_t> v =
            shard->WaitForVersion(step, absl::Now() + absl::Seconds(30), [] { return false; });
        if (!v.ok() || *v != step) {
          errors[rank] = "wait failed at step " + std::to_string(step);
          return;
        }
        std::vector<float> out(shard->size());
        // Nobody can push step + 1 before this trainer does: the read is stable.
        absl::Status s = shard->ReadParameters(step, 0, out.size(), out.data());
        if (!s.ok()) {
          errors[rank] = s.ToString();
          return;
        }
        if (step == kSteps) finals[rank] = out;
      }
    });
  }
  for (std::thread& t : trainers) t.join();
  for (const std::string& e : errors) EXPECT_EQ(e, "");
  EXPECT_EQ(shard->version(), kSteps);

  // Sequential replay of the same pushes gives the same bits.
  std::unique_ptr<ModelShard> serial = MakeShard(&pool, kTrainers);
  for (int64_t step = 1; step <= kSteps; ++step) {
    for (uint32_t rank = 0; rank < kTrainers; ++rank)
      ASSERT_TRUE(PushAll(*serial, rank, step).ok());
  }
  const std::vector<float> expected = ReadAll(*serial, kSteps);
  for (const auto& f : finals) {
    ASSERT_EQ(f.size(), expected.size());
    EXPECT_EQ(std::memcmp(f.data(), expected.data(), f.size() * sizeof(float)), 0);
  }
}

TEST(ModelShardTest, ReadsRacingUpdatesAreWholeVersionsOrAborted) {
  ThreadPool pool(2);
  constexpr int64_t kSteps = 150;
  // Every version's parameters, from a sequential run.
  std::vector<std::vector<float>> expected;
  {
    std::unique_ptr<ModelShard> serial = MakeShard(&pool, 1);
    expected.push_back(ReadAll(*serial, 0));
    for (int64_t step = 1; step <= kSteps; ++step) {
      ASSERT_TRUE(PushAll(*serial, 0, step).ok());
      expected.push_back(ReadAll(*serial, step));
    }
  }
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  std::atomic<bool> done{false};
  // The version the reader last finished a read attempt at. Every tenth step the writer waits
  // for one attempt at the version it just made, so some reads meet a quiet shard however the
  // two threads are scheduled (on a loaded machine every racing read can land inside an
  // update); the other steps follow each other at once and the reads race them.
  std::atomic<int64_t> attempted_version{-1};
  std::thread writer([&] {
    // (Also when an assertion ends the thread early: the reader stops.)
    absl::Cleanup stop_reader = [&] { done = true; };
    for (int64_t step = 1; step <= kSteps; ++step) {
      ASSERT_TRUE(PushAll(*shard, 0, step).ok());
      if (step % 10 != 0) continue;
      const absl::Time give_up = absl::Now() + absl::Seconds(10);
      while (attempted_version.load() < step) {
        ASSERT_LT(absl::Now(), give_up) << "reader made no attempt at version " << step;
        std::this_thread::yield();
      }
    }
  });
  int whole = 0, aborted = 0;
  std::vector<float> out(shard->size());
  while (!done.load()) {
    const int64_t v = shard->version();
    absl::Status s = shard->ReadParameters(v, 0, out.size(), out.data());
    if (s.ok()) {
      ++whole;
      ASSERT_EQ(std::memcmp(out.data(), expected[v].data(), out.size() * sizeof(float)), 0)
          << "torn read at version " << v;
    } else {
      ASSERT_EQ(s.code(), absl::StatusCode::kAborted) << s;
      ++aborted;
    }
    attempted_version = v;
  }
  writer.join();
  EXPECT_GE(whole, kSteps / 10);
  std::printf("reads: %d whole, %d aborted\n", whole, aborted);
}

TEST(ModelShardTest, ReadOfAnOldVersionIsAborted) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  std::vector<float> out(10);
  ASSERT_TRUE(shard->ReadParameters(0, 0, 10, out.data()).ok());
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  EXPECT_EQ(shard->ReadParameters(0, 0, 10, out.data()).code(), absl::StatusCode::kAborted);
  EXPECT_TRUE(shard->ReadParameters(1, 0, 10, out.data()).ok());
  EXPECT_EQ(shard->ReadParameters(1, shard->size() - 5, 10, out.data()).code(),
            absl::StatusCode::kOutOfRange);
}

TEST(ModelShardTest, ConcurrentPushOfTheSameRankIsAbortedUntilTheFirstEnds) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 2);
  absl::StatusOr<ModelShard::PushStart> first = shard->BeginPush(0, 1, shard->size());
  ASSERT_TRUE(first.ok());
  ASSERT_TRUE(first->writer != nullptr);
  EXPECT_EQ(shard->BeginPush(0, 1, shard->size()).status().code(), absl::StatusCode::kAborted);
  first->writer.reset();  // The first stream broke off.
  absl::StatusOr<PushResult> retry = PushAll(*shard, 0, 1);
  ASSERT_TRUE(retry.ok());
  EXPECT_EQ(retry->outcome, PushOutcome::kAccepted);
}

TEST(ModelShardTest, WaitHonoursDeadlineCancellationAndShutdown) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  EXPECT_EQ(
      shard->WaitForVersion(1, absl::Now() + absl::Milliseconds(100), nullptr).status().code(),
      absl::StatusCode::kDeadlineExceeded);
  EXPECT_EQ(shard->WaitForVersion(1, absl::Now() + absl::Seconds(30), [] { return true; })
                .status()
                .code(),
            absl::StatusCode::kCancelled);
  std::thread stopper([&] {
    absl::SleepFor(absl::Milliseconds(100));
    shard->Shutdown();
  });
  EXPECT_EQ(shard->WaitForVersion(1, absl::Now() + absl::Seconds(30), nullptr).status().code(),
            absl::StatusCode::kUnavailable);
  stopper.join();
}

TEST(ModelShardTest, SumReductionAndSnapshot) {
  ThreadPool pool(1);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(1.0), 2, false};
  std::vector<float> init(options.layout.ShardSize(0), 1.0f);
  testing::ZeroPadding(options.layout, kShard, &init);
  std::unique_ptr<ModelShard> shard = ModelShard::Create(options, init, &pool).value();
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  ShardSnapshot pending = shard->Snapshot("", 0, 4, true).value();
  EXPECT_EQ(pending.trainers_pushed, std::vector<uint32_t>{0});
  EXPECT_EQ(pending.values, std::vector<float>(4, 1.0f));
  ASSERT_TRUE(PushAll(*shard, 1, 1).ok());
  const std::vector<float> g0 = RandomGradient(0, 1, shard->size()),
                           g1 = RandomGradient(1, 1, shard->size());
  const std::vector<float> out = ReadAll(*shard, 1);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], init[i] + (-1.0f) * (g0[i] + g1[i])) << i;
  }
  ShardSnapshot snap = shard->Snapshot("b", 0, 2, true).value();
  ASSERT_EQ(snap.tensors.size(), 1u);
  EXPECT_EQ(snap.tensors[0].piece.size, 77u);
  EXPECT_EQ(snap.gradient_bytes_received, 2 * shard->size() * sizeof(float));
  EXPECT_EQ(shard->Snapshot("nope", 0, 1, true).status().code(), absl::StatusCode::kNotFound);
}

// A backend whose update fails (e.g. a GPU error): the shard stops for good
// with INTERNAL instead of serving parameters of unknown state.
class FailingBackend final : public UpdateBackend {
 public:
  explicit FailingBackend(size_t size) : size_(size) {}
  std::string device() const override { return "failing"; }
  absl::StatusOr<size_t> Stage(uint32_t, uint64_t, const void*, DType, size_t count) override {
    return count;
  }
  absl::Status FinishStaging(uint32_t) override { return absl::OkStatus(); }
  absl::Status Apply(int64_t, bool, const OptimizerConfig&) override {
    return absl::DataLossError("device lost");
  }
  absl::Status Reduce(bool) override { return absl::DataLossError("device lost"); }
  absl::StatusOr<double> SumOfSquares(float) override { return absl::DataLossError("lost"); }
  absl::Status Update(int64_t, const OptimizerConfig&, float) override {
    return absl::DataLossError("device lost");
  }
  absl::Status Read(uint64_t, uint64_t count, float* out) override {
    std::fill(out, out + count, 0.0f);
    return absl::OkStatus();
  }
  absl::Status ReadSlot(int, uint64_t, uint64_t, float*) override {
    return absl::OutOfRangeError("no slots");
  }
  absl::Status WriteSlot(int, uint64_t, uint64_t, const float*) override {
    return absl::OutOfRangeError("no slots");
  }
  uint64_t parameter_bytes() const override { return size_ * 4; }
  uint64_t optimizer_state_bytes() const override { return 0; }
  uint64_t staging_bytes() const override { return 0; }

 private:
  size_t size_;
};

// A CPU backend that also keeps its own bf16 copy, as the GPU backend does
// (there the fused kernel writes it): ModelShard must use it for bf16 pulls,
// give the same bits as its own conversion, and refuse non-finite values.
class Bf16CopyBackend final : public testing::ForwardingBackend {
 public:
  explicit Bf16CopyBackend(std::unique_ptr<UpdateBackend> cpu)
      : ForwardingBackend(std::move(cpu)) {}
  std::string device() const override { return "cpu+bf16"; }
  absl::StatusOr<bool> ReadBFloat16(uint64_t offset, uint64_t count, void* out) override {
    ++bf16_reads;
    std::vector<float> wide(count);
    if (absl::Status s = inner().Read(offset, count, wide.data()); !s.ok()) return s;
    for (uint64_t i = 0; i < count; ++i) {
      const uint16_t bits = FloatToBFloat16Bits(wide[i]);
      std::memcpy(static_cast<char*>(out) + 2 * i, &bits, 2);
    }
    return true;
  }

  std::atomic<int> bf16_reads{0};
};

TEST(ModelShardTest, BFloat16PullsUseTheBackendsOwnCopy) {
  ThreadPool pool(2);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(2.0), 1, true};
  std::vector<float> init(options.layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
  testing::ZeroPadding(options.layout, kShard, &init);
  Bf16CopyBackend* backend = nullptr;
  const ModelShard::BackendFactory cpu_factory = ModelShard::CpuBackendFactory(&pool);
  std::unique_ptr<ModelShard> shard =
      ModelShard::Create(
          options, init,
          [&](const ModelShardOptions& o,
              std::vector<float> v) -> absl::StatusOr<std::unique_ptr<UpdateBackend>> {
            absl::StatusOr<std::unique_ptr<UpdateBackend>> cpu = cpu_factory(o, std::move(v));
            if (!cpu.ok()) return cpu.status();
            auto wrapped = std::make_unique<Bf16CopyBackend>(std::move(*cpu));
            backend = wrapped.get();
            return std::unique_ptr<UpdateBackend>(std::move(wrapped));
          })
          .value();
  std::unique_ptr<ModelShard> reference =
      ModelShard::Create(options, init, &pool).value();  // Converts on the host.
  for (ModelShard* s : {shard.get(), reference.get()}) ASSERT_TRUE(PushAll(*s, 0, 1).ok());
  std::vector<uint16_t> got(shard->size()), want(shard->size());
  ASSERT_TRUE(shard->ReadParameters(1, 0, got.size(), DType::kBFloat16, got.data()).ok());
  ASSERT_TRUE(reference->ReadParameters(1, 0, want.size(), DType::kBFloat16, want.data()).ok());
  EXPECT_EQ(backend->bf16_reads.load(), 1);
  EXPECT_EQ(std::memcmp(got.data(), want.data(), got.size() * 2), 0);
  // fp16 and fp32 pulls do not ask for it.
  std::vector<uint16_t> half(shard->size());
  ASSERT_TRUE(shard->ReadParameters(1, 0, half.size(), DType::kFloat16, half.data()).ok());
  EXPECT_EQ(backend->bf16_reads.load(), 1);

  // A parameter driven to infinity (a finite gradient, a huge step) is
  // refused as the host conversion refuses it, naming the element.
  std::vector<float> huge(shard->size(), 0.0f);
  huge[5] = -3e38f;
  absl::StatusOr<ModelShard::PushStart> start = shard->BeginPush(0, 2, huge.size());
  ASSERT_TRUE(start.ok() && start->writer) << start.status();
  ASSERT_TRUE(start->writer->Write(0, huge.data(), huge.size() * sizeof(float)).ok());
  ASSERT_TRUE(start->writer->Commit().ok());
  const absl::Status refused =
      shard->ReadParameters(2, 0, got.size(), DType::kBFloat16, got.data());
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_NE(refused.message().find("is inf: the master weights are no longer finite"),
            std::string::npos)
      << refused;
  EXPECT_EQ(backend->bf16_reads.load(), 2);
}

TEST(ModelShardTest, BackendFailureStopsTheShard) {
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(0.1), 1, true};
  std::vector<float> init(options.layout.ShardSize(0), 0.0f);
  std::unique_ptr<ModelShard> shard =
      ModelShard::Create(
          options, init,
          [](const ModelShardOptions& o,
             std::vector<float> v) -> absl::StatusOr<std::unique_ptr<UpdateBackend>> {
            return std::unique_ptr<UpdateBackend>(new FailingBackend(v.size()));
          })
          .value();
  EXPECT_EQ(shard->device(), "failing");
  absl::StatusOr<PushResult> r = PushAll(*shard, 0, 1);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInternal);
  EXPECT_NE(r.status().message().find("device lost"), std::string::npos) << r.status();
  EXPECT_EQ(shard->version(), 0);
  EXPECT_EQ(PushAll(*shard, 0, 1).status().code(), absl::StatusCode::kInternal);
  EXPECT_EQ(shard->WaitForVersion(1, absl::Now() + absl::Seconds(5), nullptr).status().code(),
            absl::StatusCode::kInternal);
}

// Padding holds zeros and gets zero gradients: a push that puts anything
// else there is refused, naming the element, and nothing is staged (the
// clean retry of the same step is then applied as usual). (Initial values
// are checked where a registration comes in: bad_model_setup_test.)
TEST(ModelShardTest, NonZeroPaddingIsRefused) {
  ThreadPool pool(1);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(1.0), 1, false};
  const FlatRange range = options.layout.ShardRange(kShard);
  const std::vector<FlatRange> padding = options.layout.PaddingIn(range);
  ASSERT_FALSE(padding.empty());
  const uint64_t pad = padding.front().begin - range.begin;  // Within the range.

  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1, OptimizerConfig::Sgd(1.0));
  const std::vector<float> before = ReadAll(*shard, 0);
  std::vector<float> g = RandomGradient(0, 1, shard->size());
  g[pad] = 0.5f;
  absl::StatusOr<PushResult> pushed = testing::PushInChunks(*shard, 0, 1, g, 333);
  EXPECT_EQ(pushed.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(pushed.status().message().find("padding element"), std::string::npos)
      << pushed.status();
  // -0 is zero.
  g[pad] = -0.0f;
  pushed = testing::PushInChunks(*shard, 0, 1, g, 333);
  ASSERT_TRUE(pushed.ok()) << pushed.status();
  const std::vector<float> after = ReadAll(*shard, 1);
  for (size_t i = 0; i < after.size(); ++i) ASSERT_EQ(after[i], before[i] - g[i]) << i;
  EXPECT_EQ(after[pad], 0.0f);
}

}  // namespace
}  // namespace shardopt
