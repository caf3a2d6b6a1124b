// GpuBackend through ModelShard against CpuBackend, bit for bit: the same
// pushes (odd sizes, several trainers, chunks larger than a pinned buffer,
// arbitrary arrival order) must give the same parameters. Skips, with the
// reason, where no usable GPU exists.
#include "server/cuda/gpu_backend.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <limits>
#include <thread>
#include <vector>

#include "common/dtype_convert.h"
#include "gtest/gtest.h"
#include "server/cuda/device.h"
#include "server/cuda/gpu_backend_test_fixture.h"
#include "server/device_support.h"
#include "server/model_shard.h"
#include "server/model_shard_testing.h"

namespace shardopt {
namespace {

using testing::PushInChunks;
using testing::RandomGradient;
using testing::ZeroPadding;

TEST_F(GpuBackendTest, MatchesTheCpuBackendBitForBit) {
  std::vector<OptimizerConfig> configs = {OptimizerConfig::Sgd(0.05), OptimizerConfig::Adam(1e-2),
                                          OptimizerConfig::AdamW(1e-2),
                                          OptimizerConfig::Adagrad(0.1)};
  configs[0].momentum = 0.9;
  configs[0].nesterov = true;
  configs[2].amsgrad = true;
  configs[3].lr_decay = 1e-3;
  // 3 shards; the middle one holds (1<<21) + 77 elements: pushes cross the
  // 1M-element pinned buffers.
  const ModelLayout layout = ModelLayout::Create({{"w", {3 * ((1 << 21) + 77)}}}, 1, 3).value();
  for (const OptimizerConfig& config : configs) {
    ModelShardOptions options{"m", layout, 1, config, 3, true};
    std::vector<float> init(layout.ShardSize(0));
    for (size_t i = 0; i < init.size(); ++i) init[i] = std::sin(0.001f * static_cast<float>(i));
    std::unique_ptr<ModelShard> cpu = MakeShard(options, init, false);
    std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
    EXPECT_EQ(gpu->device(), "cuda:" + std::to_string(gpu_index_));
    for (int64_t step = 1; step <= 12; ++step) {
      // Ranks arrive in another order on each side, with other chunk sizes.
      for (uint32_t rank : {2u, 0u, 1u}) {
        ASSERT_TRUE(
            PushInChunks(*cpu, rank, step, RandomGradient(rank, step, cpu->size()), 333333).ok());
      }
      for (uint32_t rank : {0u, 1u, 2u}) {
        absl::StatusOr<PushResult> r =
            PushInChunks(*gpu, rank, step, RandomGradient(rank, step, gpu->size()), (1 << 20) + 5);
        ASSERT_TRUE(r.ok()) << r.status();
      }
    }
    std::vector<float> a(cpu->size()), b(gpu->size(), std::nanf(""));
    ASSERT_TRUE(cpu->ReadParameters(12, 0, a.size(), a.data()).ok());
    ASSERT_TRUE(gpu->ReadParameters(12, 0, b.size(), b.data()).ok());
    size_t mismatches = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0 && mismatches++ < 5) {
        ADD_FAILURE() << config.DebugString() << " element " << i << ": cpu " << a[i] << " gpu "
                      << b[i];
      }
    }
    EXPECT_EQ(mismatches, 0u) << config.DebugString();
  }
}

TEST_F(GpuBackendTest, NonFiniteChunkIsRejectedAndTheRetryCounts) {
  const ModelLayout layout = ModelLayout::Create({{"w", {5000}}}, 1, 1).value();
  ModelShardOptions options{"m", layout, 0, OptimizerConfig::Sgd(1.0), 1, true};
  std::vector<float> init(layout.ShardSize(0), 1.0f);
  std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
  std::vector<float> g(gpu->size(), 0.5f);
  g[4321] = std::numeric_limits<float>::infinity();
  absl::StatusOr<PushResult> r = PushInChunks(*gpu, 0, 1, g, 1000);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(r.status().message().find("tensor 'w'[4321]"), std::string::npos) << r.status();
  g[4321] = 0.5f;
  r = PushInChunks(*gpu, 0, 1, g, 1000);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->outcome, PushOutcome::kApplied);
  std::vector<float> out(gpu->size());
  ASSERT_TRUE(gpu->ReadParameters(1, 0, out.size(), out.data()).ok());
  for (float v : out) ASSERT_EQ(v, 0.5f);
}

// Per-step hyperparameters (a schedule, a live change) and 16-bit staging go
// through the GPU backend exactly as through the CPU backend.
TEST_F(GpuBackendTest, ScheduleChangesAndSixteenBitPushesMatchTheCpu) {
  const ModelLayout layout = ModelLayout::Create({{"w", {10001}}}, 1, 1).value();
  ModelShardOptions options{"m", layout, 0, OptimizerConfig::AdamW(0.01), 2, true};
  options.lr_schedule.kind = LrSchedule::Kind::kWarmupCosine;
  options.lr_schedule.warmup_steps = 2;
  options.lr_schedule.total_steps = 10;
  std::vector<float> init(layout.ShardSize(0));
  for (size_t i = 0; i < init.size(); ++i) init[i] = std::cos(0.01f * static_cast<float>(i));
  std::unique_ptr<ModelShard> cpu = MakeShard(options, init, false);
  std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
  OptimizerConfig changed = OptimizerConfig::AdamW(0.003);
  changed.weight_decay = 0.2;
  for (ModelShard* shard : {cpu.get(), gpu.get()}) {
    ASSERT_TRUE(shard->SetHyperparameters(4, {changed, LrSchedule()}).ok());
  }
  for (int64_t step = 1; step <= 8; ++step) {
    for (uint32_t rank = 0; rank < 2; ++rank) {
      const DType dtype = rank == 0 ? DType::kBFloat16 : DType::kFloat16;
      const std::vector<float> g = RandomGradient(rank, step, layout.ShardSize(0));
      std::vector<uint16_t> wire(g.size());
      ConvertFromFloat(g.data(), g.size(), dtype, wire.data());
      for (ModelShard* shard : {cpu.get(), gpu.get()}) {
        auto start = shard->BeginPush(rank, step, wire.size(), dtype);
        ASSERT_TRUE(start.ok() && start->writer != nullptr) << start.status();
        for (size_t off = 0; off < wire.size(); off += 3001) {
          const size_t n = std::min<size_t>(3001, wire.size() - off);
          ASSERT_TRUE(start->writer->Write(off, wire.data() + off, n * 2).ok());
        }
        ASSERT_TRUE(start->writer->Commit().ok());
      }
    }
    // bf16 pulls: the GPU backend's own bf16 copy (made by the first such
    // pull at step 3, then written by every fused step) against the CPU
    // backend's host conversion, through the pinned read path.
    if (step >= 3) ExpectSameParameters(*cpu, *gpu, step, DType::kBFloat16);
  }
  ExpectSameParameters(*cpu, *gpu, 8);
  EXPECT_DOUBLE_EQ(gpu->Snapshot("", 0, 0, false).value().last_lr, 0.003);
}

// Gradient control on the GPU: the same stats (bit for bit, so every shard
// and backend reaches the same decision), the same skips, the same clipped
// updates as the CPU backend.
TEST_F(GpuBackendTest, GradientControlMatchesTheCpu) {
  const ModelLayout layout = ModelLayout::Create({{"w", {200003}}}, 1, 1).value();
  ModelShardOptions options{"m", layout, 0, OptimizerConfig::AdamW(0.01), 3, true};
  options.max_grad_norm = 0.5;
  options.loss_scaling = true;
  std::vector<float> init(layout.ShardSize(0), 0.25f);
  std::unique_ptr<ModelShard> cpu = MakeShard(options, init, false);
  std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
  const double scale = 4096;
  for (int64_t step = 1; step <= 6; ++step) {
    StepStats stats[2];
    int k = 0;
    for (ModelShard* shard : {cpu.get(), gpu.get()}) {
      for (uint32_t rank = 0; rank < 3; ++rank) {
        std::vector<float> g = RandomGradient(rank, step, layout.ShardSize(0));
        for (float& v : g) v *= static_cast<float>(scale);
        if (step == 4 && rank == 2) g[12345] = std::numeric_limits<float>::infinity();
        auto start = shard->BeginPush(rank, step, g.size(), DType::kFloat32, scale);
        ASSERT_TRUE(start.ok() && start->writer != nullptr) << start.status();
        ASSERT_TRUE(start->writer->Write(0, g.data(), g.size() * sizeof(float)).ok());
        ASSERT_TRUE(start->writer->Commit().ok());
      }
      stats[k++] = shard->WaitForStepStats(step, absl::Now() + absl::Seconds(30), nullptr).value();
    }
    EXPECT_EQ(stats[0].found_inf, stats[1].found_inf) << step;
    if (!stats[0].found_inf) {
      EXPECT_EQ(stats[0].sum_of_squares, stats[1].sum_of_squares) << step;  // Bit for bit.
    }
    const double norm = std::sqrt(stats[0].sum_of_squares);
    const StepDecision decision{
        stats[0].found_inf, stats[0].found_inf ? 1.0 : std::min(1.0, 0.5 / (norm + 1e-6)), norm};
    ASSERT_TRUE(cpu->Decide(step, decision).ok());
    ASSERT_TRUE(gpu->Decide(step, decision).ok());
  }
  ExpectSameParameters(*cpu, *gpu, 6);
  EXPECT_EQ(gpu->Snapshot("", 0, 0, false).value().skipped_steps, 1);
}

// The backend's bf16 copy used directly: made once by the first bf16 reads
// (8 threads racing to make it), exact against the host conversion of Read()
// at odd offsets and over several read pieces into misaligned memory, and
// kept up to date by the fused kernel through Apply and through Update (the
// gradient-control path), for each optimizer family.
TEST_F(GpuBackendTest, Bf16CopyIsExactAndKeptUpToDate) {
  const size_t n = (size_t{1} << 21) + 77;  // Many read pieces.
  std::vector<float> init(n);
  for (size_t i = 0; i < n; ++i) init[i] = 3.0f * std::cos(0.37f * static_cast<float>(i));
  auto check = [&](GpuBackend& backend, const char* when) {
    for (const auto& [offset, count] :
         std::vector<std::pair<size_t, size_t>>{{0, n}, {1, n - 1}, {3, 600001}, {n - 1, 1}}) {
      std::vector<float> wide(count);
      ASSERT_TRUE(backend.Read(offset, count, wide.data()).ok());
      std::vector<char> got(2 * count + 1);
      absl::StatusOr<bool> native = backend.ReadBFloat16(offset, count, got.data() + 1);
      ASSERT_TRUE(native.ok()) << native.status();
      ASSERT_TRUE(*native) << "the GPU backend keeps a bf16 copy";
      size_t mismatches = 0;
      for (size_t i = 0; i < count; ++i) {
        uint16_t bits;
        std::memcpy(&bits, got.data() + 1 + 2 * i, 2);
        if (bits != FloatToBFloat16Bits(wide[i]) && mismatches++ < 3) {
          ADD_FAILURE() << when << ": element " << offset + i << " " << wide[i] << " -> " << bits;
        }
      }
      EXPECT_EQ(mismatches, 0u) << when << " offset " << offset;
    }
  };
  for (const OptimizerConfig& config :
       {OptimizerConfig::Sgd(0.1), OptimizerConfig::AdamW(0.01), OptimizerConfig::Adagrad(0.1)}) {
    std::unique_ptr<GpuBackend> backend = GpuBackend::Create(gpu_index_, config, 1, init).value();
    std::vector<std::vector<uint16_t>> first(8, std::vector<uint16_t>(n));
    std::vector<std::thread> readers;
    std::atomic<int> native{0};
    for (int t = 0; t < 8; ++t) {
      readers.emplace_back([&, t] {
        absl::StatusOr<bool> r = backend->ReadBFloat16(0, n, first[t].data());
        if (r.ok() && *r) native.fetch_add(1);
      });
    }
    for (std::thread& t : readers) t.join();
    EXPECT_EQ(native.load(), 8);
    for (int t = 1; t < 8; ++t) EXPECT_EQ(first[t], first[0]) << "reader " << t;
    check(*backend, "initial");
    const std::vector<float> g1 = testing::RandomGradient(0, 1, n);
    ASSERT_TRUE(backend->Stage(0, 0, g1.data(), DType::kFloat32, n).ok());
    ASSERT_TRUE(backend->FinishStaging(0).ok());
    ASSERT_TRUE(backend->Apply(1, true, config).ok());
    check(*backend, "after Apply");
    const std::vector<float> g2 = testing::RandomGradient(0, 2, n);
    ASSERT_TRUE(backend->Stage(0, 0, g2.data(), DType::kFloat32, n).ok());
    ASSERT_TRUE(backend->FinishStaging(0).ok());
    ASSERT_TRUE(backend->Reduce(true).ok());
    ASSERT_TRUE(backend->Update(2, config, 0.5f).ok());
    check(*backend, "after Update");
    EXPECT_EQ(backend->parameter_bytes(), n * 6);  // fp32 masters + the bf16 copy.
  }
}

// Pipelined steps on the GPU (supports_ranges): trainers' chunks cut
// across ranges, each range reduced and updated once all its gradients
// are in, while a reader pulls the step range by range in bf16 (the
// first bf16 read makes the copy while later ranges are still being
// updated). Parameters and pulled bf16 equal a CPU shard running whole
// steps, with and without gradient control.
TEST_F(GpuBackendTest, PipelinedRangesMatchTheCpuWholeStep) {
  const ModelLayout layout = ModelLayout::Create({{"w", {301, 900}}, {"b", {33}}}, 16, 1).value();
  constexpr uint64_t kRange = uint64_t{1} << 16;
  struct Job {
    uint32_t trainers;
    OptimizerConfig optimizer;
    double max_grad_norm;
    bool loss_scaling;
  };
  const std::vector<Job> jobs = {{2, OptimizerConfig::Adam(0.01), 0, false},
                                 {3, OptimizerConfig::AdamW(0.02), 50, false},
                                 {2, OptimizerConfig::Adam(0.01), 1000, true}};
  for (const Job& job : jobs) {
    SCOPED_TRACE(job.optimizer.DebugString() + (job.max_grad_norm > 0 ? " clipped" : ""));
    ModelShardOptions options{"m", layout, 0, job.optimizer, job.trainers, true};
    options.max_grad_norm = job.max_grad_norm;
    options.loss_scaling = job.loss_scaling;
    std::vector<float> init(layout.ShardSize(0));
    for (size_t i = 0; i < init.size(); ++i) init[i] = 0.001f * static_cast<float>(i % 101);
    ZeroPadding(layout, 0, &init);
    std::unique_ptr<ModelShard> cpu = MakeShard(options, init, false);
    options.pipeline_range_elements = kRange;
    std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
    const size_t n = cpu->size();
    const double scale = job.loss_scaling ? 1024.0 : 1.0;
    for (int64_t step = 1; step <= 4; ++step) {
      std::vector<std::vector<float>> grads;
      for (uint32_t r = 0; r < job.trainers; ++r) {
        grads.push_back(RandomGradient(r, step, n));
        for (float& g : grads.back()) g *= static_cast<float>(scale);
        ZeroPadding(layout, 0, &grads.back());
      }
      // The reader: range by range as each reaches the step, in bf16.
      std::vector<uint16_t> pulled(n);
      std::thread reader;
      if (step >= 2) {
        reader = std::thread([&] {
          for (uint64_t at = 0; at < n; at += kRange) {
            const uint64_t count = std::min<uint64_t>(kRange, n - at);
            const absl::Status waited =
                gpu->WaitForRanges(step, at, count, absl::Now() + absl::Seconds(30), nullptr);
            ASSERT_TRUE(waited.ok()) << waited;
            const absl::Status read =
                gpu->ReadParameters(step, at, count, DType::kBFloat16, pulled.data() + at);
            ASSERT_TRUE(read.ok()) << read;
          }
        });
      }
      // (A failed assertion leaves this lambda only: the reader is joined.)
      auto run_step = [&](ModelShard* shard) {
        std::vector<std::unique_ptr<ModelShard::PushWriter>> writers;
        for (uint32_t r = 0; r < job.trainers; ++r) {
          auto start = shard->BeginPush(r, step, n, DType::kFloat32, scale);
          ASSERT_TRUE(start.ok() && start->writer != nullptr) << start.status();
          writers.push_back(std::move(start->writer));
        }
        const size_t chunk = shard == cpu.get() ? 100000 : 40000 + 7 * step;
        for (size_t off = 0; off < n; off += chunk) {
          for (uint32_t i = 0; i < job.trainers; ++i) {
            const uint32_t r = step % 2 ? job.trainers - 1 - i : i;
            const size_t end = std::min(n, off + chunk);
            ASSERT_TRUE(
                writers[r]->Write(off, grads[r].data() + off, (end - off) * sizeof(float)).ok());
          }
        }
        for (auto& w : writers) ASSERT_TRUE(w->Commit().ok());
        if (shard->options().needs_decision()) {
          absl::StatusOr<StepStats> stats =
              shard->WaitForStepStats(step, absl::Now() + absl::Seconds(30), nullptr);
          ASSERT_TRUE(stats.ok()) << stats.status();
          ASSERT_TRUE(shard->Decide(step, DecideStep({*stats}, job.max_grad_norm), false).ok());
        }
        ASSERT_TRUE(shard->WaitForVersion(step, absl::Now() + absl::Seconds(30), nullptr).ok());
      };
      run_step(cpu.get());
      run_step(gpu.get());
      if (reader.joinable()) reader.join();
      if (HasFatalFailure()) return;
      ExpectSameParameters(*cpu, *gpu, step);
      if (step >= 2) {
        std::vector<uint16_t> want(n);
        ASSERT_TRUE(cpu->ReadParameters(step, 0, n, DType::kBFloat16, want.data()).ok());
        EXPECT_EQ(pulled, want) << "bf16 pulled range by range at step " << step;
      }
    }
  }
}

// Muon on the GPU (cuBLAS for the Newton-Schulz products) against the CPU
// backend (OpenBLAS): the momentum buffer, elementwise, bit for bit; the
// parameters within fp32 rounding of the products' summation order; with
// Nesterov or not, both lr adjustments, weight decay, and clipping (the
// Update path). Matrices taller, wider and square, one of a single row.
TEST_F(GpuBackendTest, MuonMatchesTheCpuWithinRounding) {
  // (Checked first: MakeShard would abort the binary on the error.)
  const absl::Status cublas = gpu::Cublas::Available();
  ASSERT_TRUE(cublas.ok()) << cublas
                           << " (the bundle's run.sh looks in /usr/local/cuda/lib64 "
                              "and in the python3's nvidia packages)";
  const ModelLayout layout =
      ModelLayout::Create({{"a", {37, 11}}, {"b", {5, 53}}, {"c", {64, 64}}, {"d", {1, 9}}}, 16, 1,
                          Partition::kWholeTensors)
          .value();
  OptimizerConfig plain = OptimizerConfig::Muon(0.02);
  plain.nesterov = false;
  plain.weight_decay = 0.1;
  plain.adjust_lr = MuonAdjustLr::kMatchRmsAdamW;
  struct Job {
    OptimizerConfig optimizer;
    double max_grad_norm;
  };
  for (const Job& job : {Job{OptimizerConfig::Muon(0.02), 0}, Job{plain, 0},
                         Job{OptimizerConfig::Muon(0.02), 5.0}}) {
    SCOPED_TRACE(job.optimizer.DebugString() + (job.max_grad_norm > 0 ? " clipped" : ""));
    ModelShardOptions options{"m", layout, 0, job.optimizer, 2, true};
    options.max_grad_norm = job.max_grad_norm;
    std::vector<float> init(layout.ShardSize(0));
    for (size_t i = 0; i < init.size(); ++i)
      init[i] = 0.05f * std::sin(0.7f * static_cast<float>(i));
    ZeroPadding(layout, 0, &init);
    std::unique_ptr<ModelShard> cpu = MakeShard(options, init, false);
    std::unique_ptr<ModelShard> gpu = MakeShard(options, init, true);
    ASSERT_EQ(gpu->device(), "cuda:" + std::to_string(gpu_index_))
        << "Muon must run on the GPU backend here (is cuBLAS loadable?)";
    constexpr int64_t kSteps = 8;
    for (int64_t step = 1; step <= kSteps; ++step) {
      for (ModelShard* shard : {cpu.get(), gpu.get()}) {
        for (uint32_t rank = 0; rank < 2; ++rank) {
          std::vector<float> g = RandomGradient(rank, step, shard->size());
          ZeroPadding(layout, 0, &g);
          ASSERT_TRUE(PushInChunks(*shard, rank, step, g, 1000).ok());
        }
        if (shard->options().needs_decision()) {
          absl::StatusOr<StepStats> stats =
              shard->WaitForStepStats(step, absl::Now() + absl::Seconds(30), nullptr);
          ASSERT_TRUE(stats.ok()) << stats.status();
          ASSERT_TRUE(shard->Decide(step, DecideStep({*stats}, job.max_grad_norm)).ok());
        }
      }
    }
    std::vector<float> a(cpu->size()), b(gpu->size());
    ASSERT_TRUE(cpu->ReadParameters(kSteps, 0, a.size(), a.data()).ok());
    ASSERT_TRUE(gpu->ReadParameters(kSteps, 0, b.size(), b.data()).ok());
    double worst = 0, moved = 0;
    for (size_t i = 0; i < a.size(); ++i) {
      worst =
          std::max(worst, std::fabs(double{a[i]} - b[i]) / std::max(std::fabs(double{a[i]}), 1.0));
      moved = std::max(moved, std::fabs(double{b[i]} - init[i]));
    }
    std::printf("muon gpu vs cpu: max relative difference %.3g after %lld steps\n", worst,
                static_cast<long long>(kSteps));
    EXPECT_LE(worst, 1e-4);
    EXPECT_GT(moved, 1e-3);
    ExpectSameSlots(*cpu, *gpu, kSteps, {0});  // momentum_buffer
  }
}

TEST(GpuDeviceSelectionTest, ReportsWhyThereIsNoGpu) {
  absl::StatusOr<gpu::GpuInfo> gpu = gpu::SelectDevice("auto");
  if (gpu.ok()) {
    EXPECT_GE(gpu->index, 0) << gpu->DebugString();  // Found: nothing to report.
    return;
  }
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kUnavailable) << gpu.status();
  EXPECT_FALSE(gpu.status().message().empty());
}

}  // namespace
}  // namespace shardopt
