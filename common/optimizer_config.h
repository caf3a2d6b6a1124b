// OptimizerConfig: the optimizer and hyperparameters of a model, as plain data.
//
// Shared by the client (which fills it and sends it on the wire) and the
// server's kernels (which apply it); neither the kernels nor this header know
// anything of gRPC. Field meanings and defaults follow torch.optim 1.13.
#ifndef SHARDOPT_COMMON_OPTIMIZER_CONFIG_H_
#define SHARDOPT_COMMON_OPTIMIZER_CONFIG_H_

#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace shardopt {

enum class OptimizerKind {
  kSgd,        // torch.optim.SGD
  kAdam,       // torch.optim.Adam (weight decay added to the gradient)
  kAdamW,      // torch.optim.AdamW (decoupled weight decay)
  kAdagrad,    // torch.optim.Adagrad
  kLion,       // Lion (Chen et al. 2023; the reference lion-pytorch update)
  kLamb,       // LAMB (You et al. 2019; apex FusedLAMB's update, DeepSpeed's clamp)
  kAdafactor,  // torch.optim.Adafactor (PyTorch 2.5+)
  kMuon,       // torch.optim.Muon (PyTorch 2.9+), Newton-Schulz in fp32
};

// "sgd", "adam", "adamw", "adagrad", "lion", "lamb", "adafactor", "muon".
const char* OptimizerKindName(OptimizerKind kind);

// The optimizer updates a tensor from values of the whole tensor (norms,
// row and column means, matrix products): LAMB, Adafactor, Muon. The
// elementwise ones run on any partition.
bool NeedsWholeTensors(OptimizerKind kind);
// INVALID_ARGUMENT naming the optimizer and what to set when it needs
// Partition::kWholeTensors and the partition is flat: Adafactor and Muon
// (LAMB gathers its tensor norms over shards on the flat partition, see
// CheckTrustNormsFit in common/step_protocol.h). Trainers and shards both
// check it.
absl::Status CheckOptimizerFitsPartition(OptimizerKind kind, bool whole_tensor_partition);
// INVALID_ARGUMENT naming the tensor when the optimizer cannot update a
// tensor of that shape (Muon: 2-D only, as torch.optim.Muon).
absl::Status CheckOptimizerFitsTensor(OptimizerKind kind, const std::string& name,
                                      const std::vector<int64_t>& shape);

// Muon's learning-rate adjustment per matrix of shape (A, B).
enum class MuonAdjustLr {
  kOriginal,       // lr * sqrt(max(1, A / B)) (Keller Jordan's; torch's default)
  kMatchRmsAdamW,  // lr * 0.2 * sqrt(max(A, B)) (Moonshot's)
};

struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  double lr = 1e-3;
  double weight_decay = 0.0;
  bool maximize = false;

  // SGD.
  double momentum = 0.0;
  double dampening = 0.0;
  bool nesterov = false;

  // Adam, AdamW; Lion (its own defaults 0.9, 0.99: see Lion()).
  double beta1 = 0.9;
  double beta2 = 0.999;
  bool amsgrad = false;

  // Adam, AdamW, Adagrad, LAMB. PyTorch's defaults differ: 1e-8 for
  // Adam(W), 1e-10 for Adagrad; LAMB's is 1e-6; the factories below set the
  // right one.
  double eps = 1e-8;

  // LAMB: the trust ratio ||p|| / ||update|| of each tensor is clamped to
  // [min_trust_ratio, max_trust_ratio] (DeepSpeed's min_coeff, max_coeff;
  // max 0: no clamp, as apex's FusedLAMB); bias_correction as theirs.
  double min_trust_ratio = 0.01;
  double max_trust_ratio = 10.0;
  bool bias_correction = true;

  // Adafactor (torch.optim.Adafactor's beta2_decay, eps=(eps1, eps2), d).
  // eps1 < 0 stands for PyTorch's None: the fp32 machine epsilon.
  double beta2_decay = -0.8;
  double eps1 = -1.0;
  double eps2 = 1e-3;
  double clip_threshold = 1.0;  // d

  // Muon (also momentum, nesterov, eps, weight_decay above; Muon() sets
  // torch.optim.Muon's defaults): the Newton-Schulz coefficients and steps.
  double ns_a = 3.4445;
  double ns_b = -4.7750;
  double ns_c = 2.0315;
  int ns_steps = 5;
  MuonAdjustLr adjust_lr = MuonAdjustLr::kOriginal;

  // Adagrad.
  double lr_decay = 0.0;
  double initial_accumulator_value = 0.0;

  // PyTorch's defaults for each optimizer.
  static OptimizerConfig Sgd(double lr);
  static OptimizerConfig Adam(double lr = 1e-3);
  static OptimizerConfig AdamW(double lr = 1e-3);  // weight_decay 1e-2
  static OptimizerConfig Adagrad(double lr = 1e-2);
  // Lion's published defaults: lr 1e-4, betas (0.9, 0.99), no weight decay.
  static OptimizerConfig Lion(double lr = 1e-4);
  // apex FusedLAMB's defaults: betas (0.9, 0.999), eps 1e-6, weight
  // decay 0.01; DeepSpeed's trust ratio clamp, [0.01, 10].
  static OptimizerConfig Lamb(double lr = 1e-3);
  // torch.optim.Adafactor's defaults: beta2_decay -0.8, eps (None, 1e-3),
  // d 1, no weight decay.
  static OptimizerConfig Adafactor(double lr = 1e-2);
  // torch.optim.Muon's defaults: weight decay 0.1, momentum 0.95, nesterov,
  // eps 1e-7, 5 Newton-Schulz steps, the "original" lr adjustment.
  static OptimizerConfig Muon(double lr = 1e-3);

  // fp32 state slots kept per parameter: SGD 1 with momentum (else 0),
  // Adam/AdamW 2 (3 with amsgrad), Adagrad 1, Lion 1, LAMB 2, Adafactor 2,
  // Muon 1 ("momentum_buffer").
  // The state slots' names in PyTorch's terms, in the order every backend
  // and checkpoint keeps them: "momentum_buffer"; "exp_avg", "exp_avg_sq",
  // "max_exp_avg_sq"; "sum"; Lion's "exp_avg"; LAMB's "exp_avg",
  // "exp_avg_sq"; Adafactor's "row_var", "col_var" (a tensor of shape
  // (..., R, C) keeps its B*R row factors in the first elements of its
  // part of "row_var" and its B*C column factors in the first of "col_var",
  // B the product of the leading dimensions; a tensor of fewer than two
  // dimensions keeps torch's "variance" in "row_var"; the rest is zero).
  // StateSlotsPerElement() of them.
  std::vector<std::string> StateSlotNames() const;
  // Adafactor's slots are packed: a server stores only a tensor's factors
  // (StoredSlotElements) and the rest of its part reads as zero, so its
  // state takes (R + C) / (R * C) of the others' per matrix.
  bool PacksSlot(int slot) const;
  // The elements of slot `slot` that a whole tensor of `shape` (`size`
  // elements) keeps at the start of its part: `size` for unpacked slots;
  // row_var B*R and col_var B*C for two or more dimensions, else `size` and
  // 0.
  uint64_t StoredSlotElements(int slot, const std::vector<int64_t>& shape, uint64_t size) const;
  // Slot `slot` of a whole tensor of `shape` as torch.optim's state_dict
  // holds it: its state key and shape, the stored elements in row-major
  // order (shardoptctl export and import). Unpacked slots: the slot's name
  // and `shape`. Adafactor of two or more dimensions (..., R, C): "row_var"
  // (..., R, 1) and "col_var" (..., 1, C); of fewer: "variance" of `shape`
  // in slot 0 and nothing (nullopt) in slot 1. Its element count is
  // StoredSlotElements' except for a tensor with no elements.
  struct TorchStateTensor {
    std::string key;
    std::vector<int64_t> shape;
  };
  std::optional<TorchStateTensor> TorchStateOf(int slot, const std::vector<int64_t>& shape) const;
  // What a slot holds before the first step: Adagrad's sum starts at
  // initial_accumulator_value, everything else at zero.
  float InitialSlotValue(int slot) const;
  int StateSlotsPerElement() const;

  // OK when `next` can replace this config on live optimizer state: same
  // kind, same amsgrad, and SGD momentum zero in both or in neither (these
  // decide which state slots exist). FAILED_PRECONDITION otherwise.
  absl::Status CheckCanChangeTo(const OptimizerConfig& next) const;

  // The checks torch.optim makes in its constructors (INVALID_ARGUMENT).
  absl::Status Validate() const;

  bool operator==(const OptimizerConfig& other) const;
  bool operator!=(const OptimizerConfig& other) const { return !(*this == other); }

  // Short human-readable form, e.g. "adamw(lr=0.001, betas=(0.9, 0.999), ...)".
  std::string DebugString() const;
};

// The most hyperparameter changes a model may have scheduled and not yet in
// force. Every push carries its trainer's pending changes (see
// PushHeader.hyperparameter_changes), so the trainer keeps within it too:
// a shard refuses a longer list instead of holding what one request names.
inline constexpr size_t kMaxPendingHyperparameterChanges = 1024;

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_OPTIMIZER_CONFIG_H_
