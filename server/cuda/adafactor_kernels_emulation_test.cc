// Adafactor's GPU step on the host: AdafactorPlan driving the kernels'
// per-item code (adafactor_kernels_emulated.cc) on packed stores laid out by
// PackedSlotExtents, against CpuBackend, bit for bit: parameters and both
// slots read as a checkpoint reads them. Shapes taller and wider than
// square, rows longer than a piece, a batch of matrices, vectors longer and
// shorter than a piece, a scalar; maximize, weight decay, a binding update
// clip, explicit eps1, gradient multipliers.
#include <cstring>
#include <random>
#include <vector>

#include "common/optimizer_config.h"
#include "gtest/gtest.h"
#include "server/cpu_backend.h"
#include "server/cuda/adafactor_kernels.h"
#include "server/cuda/adafactor_step.h"
#include "server/cuda/cpu_step_testing.h"
#include "server/optim/packed_slot_extents.h"
#include "server/parallel_for.h"

namespace shardopt {
namespace {

using testing::ExpectSameBits;

std::vector<RangeTensor> Tensors() {
  std::vector<RangeTensor> tensors;
  uint64_t offset = 0;
  uint32_t index = 0;
  // With gaps between tensors (padding), tensors of no elements, and one of
  // many rows each longer than a piece.
  for (std::vector<int64_t> shape : std::vector<std::vector<int64_t>>{{37, 11},
                                                                      {5, 3000},
                                                                      {2, 3, 7},
                                                                      {1000},
                                                                      {},
                                                                      {3, 0},
                                                                      {9, 1},
                                                                      {0},
                                                                      {1, 13},
                                                                      {4100},
                                                                      {300, 2100}}) {
    RangeTensor t;
    t.offset = offset;
    t.size = 1;
    for (int64_t d : shape) t.size *= static_cast<uint64_t>(d);
    t.shape = shape;
    t.index = index++;
    tensors.push_back(t);
    offset += t.size + index % 3;
  }
  return tensors;
}

// GpuBackend's Adafactor state and step, on host memory.
struct EmulatedAdafactor {
  EmulatedAdafactor(const OptimizerConfig& c, const std::vector<RangeTensor>& tensors,
                    std::vector<float> initial)
      : rows(c, 0, tensors),
        cols(c, 1, tensors),
        plan(tensors, rows.stored_at(), cols.stored_at()),
        params(std::move(initial)),
        row_store(rows.stored_elements()),
        col_store(cols.stored_elements()),
        device_sums(plan.max_pieces()),
        host_sums(plan.max_pieces()),
        denominators(plan.max_batches()),
        column_partials(plan.max_column_partials()) {}

  void Step(const OptimizerConfig& c, int64_t step, float multiplier, std::vector<float> grad) {
    if (multiplier != 1.0f) {
      ASSERT_TRUE(gpu::ScaleParams(grad.data(), grad.size(), multiplier, nullptr).ok());
    }
    ASSERT_TRUE(plan.Step(c, step, params.data(), grad.data(), row_store.data(), col_store.data(),
                          device_sums.data(), host_sums.data(), denominators.data(),
                          column_partials.data(), nullptr)
                    .ok());
  }

  // A slot as ReadSlot reads it.
  std::vector<float> Slot(int slot) const {
    const PackedSlotExtents& extents = slot == 0 ? rows : cols;
    const std::vector<float>& store = slot == 0 ? row_store : col_store;
    std::vector<float> out(params.size(), 0.0f);
    extents.ForEachOverlap(0, out.size(), [&](uint64_t begin, uint64_t stop, uint64_t stored) {
      std::memcpy(out.data() + begin, store.data() + stored, (stop - begin) * sizeof(float));
    });
    return out;
  }

  PackedSlotExtents rows, cols;
  gpu::AdafactorPlan plan;
  std::vector<float> params, row_store, col_store;
  std::vector<double> device_sums, host_sums;
  std::vector<float> denominators;
  std::vector<double> column_partials;
};

void RunSteps(const OptimizerConfig& config, bool with_multipliers) {
  const std::vector<RangeTensor> tensors = Tensors();
  const uint64_t n = tensors.back().offset + tensors.back().size + 5;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> initial(n);
  for (float& x : initial) x = 0.2f * normal(rng);
  ThreadPool pool(2);
  absl::StatusOr<std::unique_ptr<CpuBackend>> cpu =
      CpuBackend::Create(config, 1, initial, &pool, tensors);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  EmulatedAdafactor gpu(config, tensors, initial);
  for (int64_t step = 1; step <= 10; ++step) {
    std::vector<float> grad(n);
    // Small steps, and jumps (RMS(U) well above 1: the update clip binds).
    const float scale = step % 4 == 0 ? 1e-3f : (step % 4 == 3 ? 30.0f : 0.3f);
    for (float& x : grad) x = scale * normal(rng);
    const float multiplier = with_multipliers && step % 2 == 0 ? 0.375f : 1.0f;
    ASSERT_TRUE(testing::CpuStep(**cpu, config, step, multiplier, grad).ok());
    gpu.Step(config, step, multiplier, grad);
    if (::testing::Test::HasFatalFailure()) return;
    std::vector<float> params(n), row_var(n), col_var(n);
    ASSERT_TRUE((*cpu)->Read(0, n, params.data()).ok());
    ASSERT_TRUE((*cpu)->ReadSlot(0, 0, n, row_var.data()).ok());
    ASSERT_TRUE((*cpu)->ReadSlot(1, 0, n, col_var.data()).ok());
    ExpectSameBits(params, gpu.params, "params", step);
    ExpectSameBits(row_var, gpu.Slot(0), "row_var", step);
    ExpectSameBits(col_var, gpu.Slot(1), "col_var", step);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST(AdafactorKernelsEmulationTest, DefaultsMatchTheCpuBackend) {
  RunSteps(OptimizerConfig::Adafactor(1e-2), false);
}

TEST(AdafactorKernelsEmulationTest, DecayMaximizeClipAndMultipliersMatchTheCpuBackend) {
  OptimizerConfig c = OptimizerConfig::Adafactor(5e-2);
  c.weight_decay = 0.1;
  c.maximize = true;
  c.clip_threshold = 1.0;  // Binds at the steps whose gradient jumps.
  c.eps1 = 1e-20;
  c.beta2_decay = -0.5;
  RunSteps(c, true);
}

TEST(AdafactorPlanTest, PiecesCutRowsAtThePieceLength) {
  RangeTensor wide;
  wide.size = 2 * 5000;
  wide.shape = {2, 5000};
  const gpu::AdafactorPlan plan({wide}, {0}, {0});
  const gpu::AdafactorShape& s = plan.tensors()[0].shape;
  EXPECT_TRUE(s.factored);
  EXPECT_EQ(s.batches, 1u);
  EXPECT_EQ(s.pieces_per_row(), 3u);  // 2048 + 2048 + 904
  EXPECT_EQ(s.pieces(), 6u);
  EXPECT_EQ(plan.max_pieces(), 6u);
  // Its 2 rows make one block of column sums; 130 rows make three.
  EXPECT_EQ(s.row_blocks(), 1u);
  EXPECT_EQ(plan.max_column_partials(), 5000u);
  RangeTensor tall;
  tall.size = 130 * 7;
  tall.shape = {130, 7};
  const gpu::AdafactorPlan tall_plan({tall}, {0}, {0});
  EXPECT_EQ(tall_plan.tensors()[0].shape.row_blocks(), 3u);
  EXPECT_EQ(tall_plan.max_column_partials(), 21u);
}

}  // namespace
}  // namespace shardopt
