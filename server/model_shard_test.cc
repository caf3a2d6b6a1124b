// ModelShard without gRPC: arrival order, concurrency, torn-pull detection.
#include "server/model_shard.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "common/dtype_convert.h"
#include "gtest/gtest.h"
#include "server/model_shard_testing.h"
#include "server/optim/optimizer.h"

namespace shardopt {
namespace {

constexpr uint32_t kShards = 2;
constexpr uint32_t kShard = 1;

ModelLayout TestLayout() {
  return ModelLayout::Create({{"a", {1000, 3}}, {"b", {77}}}, 16, kShards).value();
}

std::unique_ptr<ModelShard> MakeShard(ThreadPool* pool, uint32_t trainers,
                                      OptimizerConfig optimizer = OptimizerConfig::AdamW(0.01)) {
  ModelShardOptions options{"m", TestLayout(), kShard, optimizer, trainers, true};
  std::vector<float> init(options.layout.shard_size());
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * static_cast<float>(i % 97);
  return ModelShard::Create(std::move(options), std::move(init), pool).value();
}

using testing::RandomGradient;

std::vector<float> Grad(uint32_t rank, int64_t step, size_t n) {
  return RandomGradient(rank, step, n);
}

absl::StatusOr<PushResult> PushAll(ModelShard& shard, uint32_t rank, int64_t step,
                                   size_t chunk = 333) {
  return testing::PushInChunks(shard, rank, step, Grad(rank, step, shard.size()), chunk);
}

std::vector<float> ReadAll(ModelShard& shard, int64_t version) {
  std::vector<float> out(shard.size());
  EXPECT_TRUE(shard.ReadParameters(version, 0, out.size(), out.data()).ok());
  return out;
}

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
  std::thread writer([&] {
    for (int64_t step = 1; step <= kSteps; ++step) ASSERT_TRUE(PushAll(*shard, 0, step).ok());
    done = true;
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
  }
  writer.join();
  EXPECT_GT(whole, 0);
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
  std::vector<float> init(options.layout.shard_size(), 1.0f);
  std::unique_ptr<ModelShard> shard = ModelShard::Create(options, init, &pool).value();
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  ShardSnapshot pending = shard->Snapshot("", 0, 4, true).value();
  EXPECT_EQ(pending.trainers_pushed, std::vector<uint32_t>{0});
  EXPECT_EQ(pending.values, std::vector<float>(4, 1.0f));
  ASSERT_TRUE(PushAll(*shard, 1, 1).ok());
  const std::vector<float> g0 = Grad(0, 1, shard->size()), g1 = Grad(1, 1, shard->size());
  const std::vector<float> out = ReadAll(*shard, 1);
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_EQ(out[i], 1.0f + (-1.0f) * (g0[i] + g1[i])) << i;
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
class Bf16CopyBackend final : public UpdateBackend {
 public:
  explicit Bf16CopyBackend(std::unique_ptr<UpdateBackend> cpu) : cpu_(std::move(cpu)) {}
  std::string device() const override { return "cpu+bf16"; }
  absl::StatusOr<size_t> Stage(uint32_t rank, uint64_t offset, const void* data, DType dtype,
                               size_t count) override {
    return cpu_->Stage(rank, offset, data, dtype, count);
  }
  absl::Status FinishStaging(uint32_t rank) override { return cpu_->FinishStaging(rank); }
  absl::Status Apply(int64_t step, bool mean, const OptimizerConfig& config) override {
    return cpu_->Apply(step, mean, config);
  }
  absl::Status Reduce(bool mean) override { return cpu_->Reduce(mean); }
  absl::StatusOr<double> SumOfSquares(float scale) override { return cpu_->SumOfSquares(scale); }
  absl::Status Update(int64_t step, const OptimizerConfig& config, float multiplier) override {
    return cpu_->Update(step, config, multiplier);
  }
  absl::Status Read(uint64_t offset, uint64_t count, float* out) override {
    return cpu_->Read(offset, count, out);
  }
  absl::StatusOr<bool> ReadBFloat16(uint64_t offset, uint64_t count, void* out) override {
    ++bf16_reads;
    std::vector<float> wide(count);
    if (absl::Status s = cpu_->Read(offset, count, wide.data()); !s.ok()) return s;
    for (uint64_t i = 0; i < count; ++i) {
      const uint16_t bits = FloatToBFloat16Bits(wide[i]);
      std::memcpy(static_cast<char*>(out) + 2 * i, &bits, 2);
    }
    return true;
  }
  absl::Status ReadSlot(int slot, uint64_t offset, uint64_t count, float* out) override {
    return cpu_->ReadSlot(slot, offset, count, out);
  }
  absl::Status WriteSlot(int slot, uint64_t offset, uint64_t count, const float* in) override {
    return cpu_->WriteSlot(slot, offset, count, in);
  }
  uint64_t parameter_bytes() const override { return cpu_->parameter_bytes(); }
  uint64_t optimizer_state_bytes() const override { return cpu_->optimizer_state_bytes(); }
  uint64_t staging_bytes() const override { return cpu_->staging_bytes(); }

  std::atomic<int> bf16_reads{0};

 private:
  std::unique_ptr<UpdateBackend> cpu_;
};

TEST(ModelShardTest, BFloat16PullsUseTheBackendsOwnCopy) {
  ThreadPool pool(2);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Sgd(2.0), 1, true};
  std::vector<float> init(options.layout.shard_size());
  for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * static_cast<float>(i % 97) - 0.03f;
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
  ModelShard::PushStart start = shard->BeginPush(0, 2, huge.size()).value();
  ASSERT_TRUE(start.writer->Write(0, huge.data(), huge.size() * sizeof(float)).ok());
  ASSERT_TRUE(start.writer->Commit().ok());
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
  std::vector<float> init(options.layout.shard_size(), 0.0f);
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

TEST(ModelShardTest, HyperparameterChangeTakesEffectAtItsStepAndRepeatsAreHarmless) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1, OptimizerConfig::Sgd(0.1));
  const Hyperparameters next{OptimizerConfig::Sgd(0.5), LrSchedule()};
  Hyperparameters other = next;
  other.optimizer.lr = 0.7;
  ASSERT_TRUE(shard->SetHyperparameters(2, next).ok());
  EXPECT_TRUE(shard->SetHyperparameters(2, next).ok());  // Repeat.
  EXPECT_EQ(shard->SetHyperparameters(2, other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->SetHyperparameters(3, {OptimizerConfig::Adam(0.1), LrSchedule()}).code(),
            absl::StatusCode::kFailedPrecondition);  // Another optimizer kind.

  std::vector<float> expected = ReadAll(*shard, 0);
  for (int64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(PushAll(*shard, 0, step).ok());
    const std::vector<float> g = Grad(0, step, shard->size());
    const float lr = step == 1 ? 0.1f : 0.5f;
    for (size_t i = 0; i < expected.size(); ++i) expected[i] = expected[i] + (-lr) * g[i];
  }
  EXPECT_EQ(ReadAll(*shard, 2), expected);
  ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_DOUBLE_EQ(snap.last_lr, 0.5);
  EXPECT_TRUE(snap.scheduled_changes.empty());

  // After the change took effect: an identical repeat (a retry after a lost
  // reply) is still OK, anything else is refused.
  EXPECT_TRUE(shard->SetHyperparameters(2, next).ok());
  EXPECT_EQ(shard->SetHyperparameters(2, other).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->SetHyperparameters(1, next).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->CancelHyperparameters(2).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->SetHyperparameters(5, other).ok());
  ASSERT_TRUE(shard->CancelHyperparameters(5).ok());
  EXPECT_TRUE(shard->CancelHyperparameters(6).ok());  // Nothing there: still OK.
  EXPECT_TRUE(shard->Snapshot("", 0, 0, false).value().scheduled_changes.empty());
}

// A change for a step one shard has applied and another has not: the first
// refuses, the second accepts, and cancelling on the second makes them agree
// again (why TrainerClient only schedules steps its trainer has not pushed).
TEST(ModelShardTest, PartlyAcceptedChangeCanBeCancelled) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> a = MakeShard(&pool, 2, OptimizerConfig::Sgd(0.1));
  std::unique_ptr<ModelShard> b = MakeShard(&pool, 2, OptimizerConfig::Sgd(0.1));
  ASSERT_TRUE(PushAll(*a, 0, 1).ok());
  ASSERT_TRUE(PushAll(*a, 1, 1).ok());  // Step 1 applied on a...
  ASSERT_TRUE(PushAll(*b, 0, 1).ok());  // ...still waiting for rank 1 on b.
  const Hyperparameters next{OptimizerConfig::Sgd(0.5), LrSchedule()};
  EXPECT_EQ(a->SetHyperparameters(1, next).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(b->SetHyperparameters(1, next).ok());
  ASSERT_TRUE(b->CancelHyperparameters(1).ok());
  ASSERT_TRUE(PushAll(*b, 1, 1).ok());
  EXPECT_DOUBLE_EQ(a->Snapshot("", 0, 0, false).value().last_lr, 0.1);
  EXPECT_DOUBLE_EQ(b->Snapshot("", 0, 0, false).value().last_lr, 0.1);
}

// Gradient control: the last push reduces and reports; nothing changes until
// the decision; a skip leaves everything (also the optimizer's step count)
// as it was; clipping and unscaling multiply the reduced gradient.
TEST(ModelShardTest, StepsWithGradientControlWaitForTheirDecision) {
  ThreadPool pool(2);
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::Adam(0.01), 2, true};
  options.max_grad_norm = 1.0;
  options.loss_scaling = true;
  std::vector<float> init(options.layout.shard_size(), 0.5f);
  std::unique_ptr<ModelShard> shard = ModelShard::Create(options, init, &pool).value();
  const size_t n = shard->size();
  auto push = [&](uint32_t rank, int64_t step, std::vector<float> g, double scale) {
    auto start = shard->BeginPush(rank, step, n, DType::kFloat32, scale);
    if (!start.ok()) return start.status();
    if (absl::Status s = start->writer->Write(0, g.data(), n * sizeof(float)); !s.ok()) return s;
    return start->writer->Commit().status();
  };
  const double scale = 1024.0;
  std::vector<float> g0 = RandomGradient(0, 1, n), g1 = RandomGradient(1, 1, n);
  for (float& v : g0) v *= static_cast<float>(scale);
  for (float& v : g1) v *= static_cast<float>(scale);
  // Step 1: rank 1's gradient overflowed: accepted, and the step must be skipped.
  std::vector<float> bad = g1;
  bad[17] = std::numeric_limits<float>::infinity();
  ASSERT_TRUE(push(0, 1, g0, scale).ok());
  EXPECT_EQ(push(1, 1, bad, 2048.0).code(), absl::StatusCode::kFailedPrecondition);  // Scale.
  EXPECT_EQ(shard->BeginPush(1, 1, n, DType::kFloat32, 2048.0).status().code(),
            absl::StatusCode::kFailedPrecondition);  // Refused before streaming.
  ASSERT_TRUE(push(1, 1, bad, scale).ok());
  StepStats stats = shard->WaitForStepStats(1, absl::Now() + absl::Seconds(5), nullptr).value();
  EXPECT_TRUE(stats.found_inf);
  EXPECT_EQ(shard->version(), 0);
  EXPECT_EQ(shard->Decide(1, {false, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(shard->Decide(1, {true, 1.0, 0}).ok());
  EXPECT_TRUE(shard->Decide(1, {true, 1.0, 0}).ok());  // Repeat.
  // A skip is a skip, whatever else the request says.
  EXPECT_TRUE(shard->Decide(1, {true, 0.5, 0}).ok());
  EXPECT_EQ(shard->Decide(1, {false, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->version(), 1);
  EXPECT_EQ(ReadAll(*shard, 1), init);  // Skipped: nothing moved.

  // Step 2: finite; the norm comes out of the stats; clip by half.
  g0 = RandomGradient(0, 2, n);
  g1 = RandomGradient(1, 2, n);
  std::vector<float> s0 = g0, s1 = g1;
  for (float& v : s0) v *= static_cast<float>(scale);
  for (float& v : s1) v *= static_cast<float>(scale);
  EXPECT_EQ(push(0, 2, s0, 1000.0).code(), absl::StatusCode::kInvalidArgument);  // Not 2^k.
  ASSERT_TRUE(push(0, 2, s0, scale).ok());
  EXPECT_EQ(shard->Decide(2, {false, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  ASSERT_TRUE(push(1, 2, s1, scale).ok());
  // While step 2 waits for its decision, a change for it is refused (some
  // shards may have decided it already).
  EXPECT_EQ(shard->SetHyperparameters(2, {OptimizerConfig::Adam(0.5), LrSchedule()}).code(),
            absl::StatusCode::kFailedPrecondition);
  stats = shard->WaitForStepStats(2, absl::Now() + absl::Seconds(5), nullptr).value();
  EXPECT_FALSE(stats.found_inf);
  double expected_sum = 0;
  std::vector<float> reduced(n);
  for (size_t i = 0; i < n; ++i) {
    reduced[i] = (s0[i] + s1[i]) / 2.0f;
    const double u = static_cast<double>(reduced[i] * static_cast<float>(1.0 / scale));
    expected_sum += u * u;
  }
  EXPECT_NEAR(stats.sum_of_squares, expected_sum, 1e-9 * expected_sum);
  EXPECT_EQ(shard->version(), 1);
  const double norm = std::sqrt(stats.sum_of_squares);
  const double coef = std::min(1.0, 1.0 / (norm + 1e-6));
  ASSERT_LT(coef, 1.0);
  // A coefficient that does not follow from the norm is refused.
  EXPECT_EQ(shard->Decide(2, {false, coef / 2, norm}).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(shard->Decide(2, {false, coef, norm}).ok());
  // Adam's FIRST update (the skipped step did not count), on g * coef / scale.
  std::vector<float> expected = init, g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = reduced[i] * (static_cast<float>(coef) * static_cast<float>(1.0 / scale));
  }
  auto adam = Optimizer::Create(OptimizerConfig::Adam(0.01), n).value();
  adam->Update(1, expected.data(), g.data(), 0, n);
  EXPECT_EQ(ReadAll(*shard, 2), expected);
  const ShardSnapshot snap = shard->Snapshot("", 0, 0, false).value();
  EXPECT_EQ(snap.optimizer_steps, 1);
  EXPECT_EQ(snap.skipped_steps, 1);
  EXPECT_EQ(snap.last_step.step, 2);
  EXPECT_DOUBLE_EQ(snap.last_step.decision.clip_coef, coef);
  // The stats of the last decided step are still there for late askers.
  EXPECT_TRUE(shard->WaitForStepStats(2, absl::Now() + absl::Seconds(1), nullptr).ok());
}

TEST(ModelShardTest, DecisionsAreRefusedWithoutGradientControl) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  EXPECT_EQ(shard->Decide(1, {true, 1.0, 0}).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->WaitForStepStats(1, absl::Now(), nullptr).status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(shard->BeginPush(0, 1, shard->size(), DType::kFloat32, 2.0).status().code(),
            absl::StatusCode::kInvalidArgument);  // No loss scaling registered.
}

TEST(ModelShardTest, CreateRejectsBadInput) {
  ThreadPool pool(1);
  const ModelLayout layout = TestLayout();
  std::vector<float> init(layout.shard_size(), 0.0f);
  EXPECT_EQ(ModelShard::Create({"m", layout, kShard, OptimizerConfig::Adam(), 0, true}, init, &pool)
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(
      ModelShard::Create({"m", layout, kShards, OptimizerConfig::Adam(), 1, true}, init, &pool)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
  std::vector<float> short_init(layout.shard_size() - 1);
  EXPECT_EQ(
      ModelShard::Create({"m", layout, kShard, OptimizerConfig::Adam(), 1, true}, short_init, &pool)
          .status()
          .code(),
      absl::StatusCode::kInvalidArgument);
}

// A checkpoint of step 2 asked for at version 0 sees exactly version 2:
// step 3 waits until the write is done, then applies.
TEST(ModelShardTest, CheckpointHoldsTheStepBoundary) {
  ThreadPool pool(1);
  std::unique_ptr<ModelShard> shard = MakeShard(&pool, 1);
  std::vector<float> saved_params(shard->size());
  std::vector<std::vector<float>> saved_slots(2, std::vector<float>(shard->size()));
  ShardProgress saved;
  absl::Notification writing, release;
  std::thread checkpoint([&] {
    const absl::Status s = shard->CheckpointAt(
        2, absl::Now() + absl::Seconds(30), nullptr,
        [&](const ShardProgress& progress, const ShardStateReadFn& read) {
          saved = progress;
          EXPECT_TRUE(read(-1, 0, shard->size(), saved_params.data()).ok());
          for (int slot = 0; slot < 2; ++slot) {
            EXPECT_TRUE(read(slot, 0, shard->size(), saved_slots[slot].data()).ok());
          }
          writing.Notify();
          release.WaitForNotification();
          return absl::OkStatus();
        });
    EXPECT_TRUE(s.ok()) << s;
  });
  ASSERT_TRUE(PushAll(*shard, 0, 1).ok());
  ASSERT_TRUE(PushAll(*shard, 0, 2).ok());
  writing.WaitForNotification();
  EXPECT_EQ(saved.version, 2);
  EXPECT_EQ(saved.optimizer_steps, 2);
  // Step 3 is pushed but not applied while the checkpoint is being written.
  std::thread step3([&] { EXPECT_TRUE(PushAll(*shard, 0, 3).ok()); });
  absl::SleepFor(absl::Milliseconds(100));
  EXPECT_EQ(shard->version(), 2);
  release.Notify();
  step3.join();
  checkpoint.join();
  EXPECT_EQ(shard->version(), 3);
  // A step already passed cannot be checkpointed any more.
  EXPECT_EQ(shard
                ->CheckpointAt(
                    2, absl::Now() + absl::Seconds(1), nullptr,
                    [](const ShardProgress&, const ShardStateReadFn&) { return absl::OkStatus(); })
                .code(),
            absl::StatusCode::kFailedPrecondition);

  // A shard restored from what was saved continues exactly like the original.
  ModelShardOptions options{"m", TestLayout(), kShard, OptimizerConfig::AdamW(0.01), 1, true};
  std::unique_ptr<ModelShard> restored = ModelShard::Create(options, saved_params, &pool).value();
  const absl::Status s =
      restored->Restore(saved, [&](int slot, uint64_t offset, uint64_t count, float* out) {
        std::copy_n(saved_slots[slot].data() + offset, count, out);
        return absl::OkStatus();
      });
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(restored->version(), 2);
  ASSERT_TRUE(PushAll(*restored, 0, 3).ok());
  std::vector<float> a(shard->size()), b(shard->size());
  ASSERT_TRUE(shard->ReadParameters(3, 0, a.size(), a.data()).ok());
  ASSERT_TRUE(restored->ReadParameters(3, 0, b.size(), b.data()).ok());
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0);
  // Pushes at or below the restored version are acknowledged, not applied.
  absl::StatusOr<PushResult> old = PushAll(*restored, 0, 3);
  ASSERT_TRUE(old.ok());
  EXPECT_EQ(old->outcome, PushOutcome::kAlreadyApplied);
  // Restoring a shard that has taken pushes is refused.
  EXPECT_EQ(restored->Restore(saved, nullptr).code(), absl::StatusCode::kFailedPrecondition);
}

}  // namespace
}  // namespace shardopt
