// Adafactor's step on the GPU backend, driven from the host: for each
// tensor of the range, the passes of server/cuda/adafactor_kernels.h in the
// CPU kernel's order, with the per-piece sums of squares brought to the
// host and added there in order, and the scalars of
// server/optim/adafactor_rules.h. Bit-identical to the CPU kernel: it runs
// the same arithmetic in the same order (tested with the emulated kernels
// against CpuBackend, adafactor_kernels_emulation_test). Host code; the
// buffers are device memory (host memory with the emulated kernels).
#ifndef SHARDOPT_SERVER_CUDA_ADAFACTOR_STEP_H_
#define SHARDOPT_SERVER_CUDA_ADAFACTOR_STEP_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/optimizer_config.h"
#include "server/cuda/adafactor_kernels.h"
#include "server/optim/range_tensor.h"

namespace shardopt {
namespace gpu {

// One tensor as the passes see it, with where its factors (or variance)
// are stored in the packed slots (server/optim/packed_slot_extents.h).
struct AdafactorTensor {
  uint64_t offset = 0;  // Range-local.
  AdafactorShape shape{};
  uint64_t row_at = 0;  // In the row_var (variance) store.
  uint64_t col_at = 0;  // In the col_var store.
};

class AdafactorPlan {
 public:
  // `row_at` / `col_at`: PackedSlotExtents' stored_at() of slots 0 and 1.
  AdafactorPlan(const std::vector<RangeTensor>& tensors, const std::vector<uint64_t>& row_at,
                const std::vector<uint64_t>& col_at);

  const std::vector<AdafactorTensor>& tensors() const { return tensors_; }
  // Scratch sizes: sums (device and host, doubles), denominators (floats).
  size_t max_pieces() const { return max_pieces_; }
  size_t max_batches() const { return max_batches_; }
  size_t max_column_partials() const { return max_column_partials_; }

  // Step `step` on every tensor. `grad`: the reduced gradient (times its
  // multiplier); `row_store` / `col_store`: the packed slots' stored
  // elements; `device_sums` (max_pieces doubles), `host_sums` (the same, host
  // memory), `denominators` (max_batches floats), `column_partials`
  // (max_column_partials doubles): scratch. Waits for the
  // stream at each tensor's two sums.
  absl::Status Step(const OptimizerConfig& config, int64_t step, float* params, const float* grad,
                    float* row_store, float* col_store, double* device_sums, double* host_sums,
                    float* denominators, double* column_partials, void* stream) const;

 private:
  std::vector<AdafactorTensor> tensors_;
  size_t max_pieces_ = 0;
  size_t max_batches_ = 0;
  size_t max_column_partials_ = 0;
};

}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_ADAFACTOR_STEP_H_
