// Optimizer: the optimizer slots of one contiguous range of fp32 parameters,
// and the update that torch.optim 1.13 would apply to them.
//
// Contract:
// - Create() allocates the slots (momentum buffer, exp_avg/exp_avg_sq/
//   max_exp_avg_sq, or Adagrad's sum) for `size` elements, initialised as
//   PyTorch does (zeros; Adagrad: initial_accumulator_value).
// - Update(step, params, grad, begin, end) applies step `step` (>= 1, the
//   1-based count of updates, as PyTorch's state['step']) to elements
//   [begin, end) of `params` (indexed like the slots) with gradient `grad`
//   (same indexing). Step-dependent scalars (bias corrections, lr decay) are
//   computed in double precision as PyTorch computes them on the host;
//   per-element arithmetic is fp32 in PyTorch's operation order.
//   PyTorch's operation order is that of its CPU kernels without FMA (as
//   with ATEN_CPU_CAPABILITY=default); PyTorch's AVX2 kernels fuse some
//   multiply-adds, so they can differ from these by an fp32 rounding.
//   PyTorch keeps the step count in a float32, which stops growing at 2^24;
//   the step-dependent scalars use min(step, 2^24) accordingly.
//   `params` and `grad` must not overlap each other or the slots. The result
//   is bit-identical however [0, size()) is split into ranges.
// - Update is safe to call concurrently from several threads on disjoint
//   [begin, end) ranges with the same step. It knows nothing of threads,
//   networks or trainers: the caller splits the range and reduces gradients.
// - The caller must apply steps 1, 2, 3, ... in order over the whole range.
// - Whole-tensor optimizers (needs_whole_tensors(): LAMB, Adafactor, Muon)
//   update one tensor at a time from values of the whole tensor (norms, row
//   and column means). They get the range's tensors at Create(); UpdateTensor
//   updates one (concurrent calls on different tensors are safe), and
//   Update(begin, end) every tensor that begins in [begin, end), each of
//   which must end by `end`. Padding between them is left alone.
// - LAMB (measures_trust()) also runs a step in two calls, so that a tensor
//   split over shards gets the norms of all of it: MeasureTrust adds a
//   piece's squares to a TrustPartial and changes nothing; UpdateWithTrust
//   updates the piece given the whole tensor's norms. Both work on any
//   block-aligned part of a piece, concurrently on disjoint parts, and give
//   the same bits as UpdateTensor on a whole tensor (which is the two calls
//   with the tensor's own norms). LAMB with pieces that are not whole
//   (needs_trust_norms(); the flat partition) has no UpdateTensor/Update.
#ifndef SHARDOPT_SERVER_OPTIM_OPTIMIZER_H_
#define SHARDOPT_SERVER_OPTIM_OPTIMIZER_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "common/step_protocol.h"
#include "server/optim/packed_slot_extents.h"
#include "server/optim/range_tensor.h"

namespace shardopt {

// The tensors of shard `shard_index`'s range, each whole; FAILED_PRECONDITION
// naming the tensor when one straddles the range (a flat partition).
absl::StatusOr<std::vector<RangeTensor>> WholeTensorsOfShard(const ModelLayout& layout,
                                                             uint32_t shard_index);
// Every tensor piece of the range, whole or not, in flat order.
std::vector<RangeTensor> TensorPiecesOfShard(const ModelLayout& layout, uint32_t shard_index);

class Optimizer {
 public:
  // INVALID_ARGUMENT when config.Validate() fails, or when `tensors` (the
  // range's tensors, needed by whole-tensor optimizers) leave [0, size).
  static absl::StatusOr<std::unique_ptr<Optimizer>> Create(const OptimizerConfig& config,
                                                           size_t size,
                                                           std::vector<RangeTensor> tensors = {});

  virtual ~Optimizer() = default;

  virtual void Update(int64_t step, float* params, const float* grad, size_t begin, size_t end) = 0;

  virtual bool needs_whole_tensors() const { return false; }
  // Step `step` on tensors()[tensor] alone (whole-tensor optimizers; the
  // others update its elements).
  virtual void UpdateTensor(int64_t step, float* params, const float* grad, size_t tensor);
  const std::vector<RangeTensor>& tensors() const { return tensors_; }

  // LAMB's two-call step (see the header comment). [begin, end) lies in
  // tensors()[piece], begin a multiple of kTrustBlockElements from the
  // tensor's start. MeasureTrust is for gradient grad * multiplier;
  // UpdateWithTrust reads a gradient already multiplied.
  virtual bool measures_trust() const { return false; }
  // Some piece is not a whole tensor: steps need norms from other shards.
  bool needs_trust_norms() const;
  virtual void MeasureTrust(int64_t step, const float* params, const float* grad, float multiplier,
                            size_t piece, uint64_t begin, uint64_t end,
                            TrustPartial* partial) const {}
  virtual void UpdateWithTrust(int64_t step, float* params, const float* grad, size_t piece,
                               uint64_t begin, uint64_t end, const TensorNorms& norms) {}

  const OptimizerConfig& config() const { return config_; }
  // Replaces the hyperparameters for the following updates (not during one):
  // INVALID_ARGUMENT when invalid, FAILED_PRECONDITION when
  // config().CheckCanChangeTo(config) refuses.
  absl::Status SetConfig(const OptimizerConfig& config);
  size_t size() const { return size_; }

  // Names of the state slots in PyTorch's terms ("momentum_buffer", "exp_avg",
  // "exp_avg_sq", "max_exp_avg_sq", "sum"). Each reads as `size()` floats
  // indexed like the parameters, which is how checkpoints hold it; a packed
  // slot (Adafactor's factors) stores only the first elements of each
  // tensor's part (StoredSlotElements) and reads as zero elsewhere.
  const std::vector<std::string>& slot_names() const { return slot_names_; }
  // Elements [offset, offset + count) of slot `slot` (inside [0, size()),
  // which the caller checks) into `out`.
  void ReadSlot(size_t slot, uint64_t offset, uint64_t count, float* out) const;
  // The reverse; INVALID_ARGUMENT, changing nothing, when `in` has a value
  // other than zero where a packed slot stores nothing.
  absl::Status WriteSlot(size_t slot, uint64_t offset, uint64_t count, const float* in);
  // All `size()` elements of slot `slot` (tests and tools).
  std::vector<float> SlotValues(size_t slot) const;
  // The bytes the slots hold (what packing saves is not counted).
  size_t state_bytes() const;
  // The same before creating one, for a budget: what Create(config, size,
  // tensors).state_bytes() will be (tensors as Create takes them).
  static uint64_t PlannedStateBytes(const OptimizerConfig& config, size_t size,
                                    const std::vector<RangeTensor>& tensors);
  // The working memory one step takes besides the state (Muon's
  // Newton-Schulz buffers for the largest of `tensors`: muon_workspace.h),
  // for the same budget; 0 for the elementwise optimizers.
  static uint64_t PlannedWorkspaceBytes(const OptimizerConfig& config,
                                        const std::vector<RangeTensor>& tensors);

 protected:
  Optimizer(const OptimizerConfig& config, size_t size) : config_(config), size_(size) {}
  // Adds a slot of `size()` elements, each `initial_value`; returns its data.
  float* AddSlot(const std::string& name, float initial_value);
  // Adds a packed slot (zeros) storing OptimizerConfig::StoredSlotElements
  // of each of tensors() at the start of the tensor's part; returns where
  // each tensor's stored elements are, in tensors() order.
  std::vector<float*> AddPackedSlot(const std::string& name);
  // Called by Create() once tensors() is set: packed slots are added here.
  virtual void AddTensorSlots() {}

 private:
  struct Slot {
    std::vector<float> values;
    bool packed = false;
    PackedSlotExtents extents;  // Packed only.
  };
  // The family's factory; nullptr for an unknown kind.
  static std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& config, size_t size);

  OptimizerConfig config_;
  size_t size_;
  std::vector<RangeTensor> tensors_;
  std::vector<std::string> slot_names_;
  std::vector<Slot> slots_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_OPTIMIZER_H_
