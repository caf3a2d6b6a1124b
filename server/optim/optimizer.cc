#include "server/optim/optimizer.h"

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/optim/optimizer_internal.h"

namespace shardopt {

absl::StatusOr<std::vector<RangeTensor>> WholeTensorsOfShard(const ModelLayout& layout,
                                                             uint32_t shard_index) {
  const FlatRange range = layout.ShardRange(shard_index);
  std::vector<RangeTensor> tensors;
  for (const TensorPiece& piece : layout.PiecesIn(range)) {
    const TensorPlacement& t = layout.tensors()[piece.tensor_index];
    if (piece.size != t.size) {
      return absl::FailedPreconditionError(absl::StrCat(
          "tensor '", t.spec.name, "' straddles shard ", shard_index, "'s range (partition ",
          PartitionName(layout.partition()), "): this optimizer needs partition whole_tensors"));
    }
    tensors.push_back(RangeTensor{piece.flat_offset - range.begin, t.size, t.spec.shape,
                                  static_cast<uint32_t>(piece.tensor_index), 0, true});
  }
  return tensors;
}

std::vector<RangeTensor> TensorPiecesOfShard(const ModelLayout& layout, uint32_t shard_index) {
  const FlatRange range = layout.ShardRange(shard_index);
  std::vector<RangeTensor> pieces;
  for (const TensorPiece& piece : layout.PiecesIn(range)) {
    const TensorPlacement& t = layout.tensors()[piece.tensor_index];
    pieces.push_back(RangeTensor{piece.flat_offset - range.begin, piece.size, t.spec.shape,
                                 static_cast<uint32_t>(piece.tensor_index), piece.tensor_offset,
                                 piece.size == t.size});
  }
  return pieces;
}

bool Optimizer::needs_trust_norms() const {
  if (!measures_trust()) return false;
  for (const RangeTensor& t : tensors_) {
    if (!t.whole) return true;
  }
  return false;
}

absl::StatusOr<std::unique_ptr<Optimizer>> Optimizer::Create(const OptimizerConfig& config,
                                                             size_t size,
                                                             std::vector<RangeTensor> tensors) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  for (const RangeTensor& t : tensors) {
    if (t.offset > size || t.size > size - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor [", t.offset, ", ", t.offset + t.size,
                                                     ") is outside the range of ", size));
    }
    if (absl::Status s =
            CheckOptimizerFitsTensor(config.kind, absl::StrCat("at ", t.offset), t.shape);
        !s.ok()) {
      return s;
    }
  }
  std::unique_ptr<Optimizer> made = MakeOptimizer(config, size);
  if (made == nullptr) return absl::InvalidArgumentError("unknown optimizer kind");
  for (const RangeTensor& t : tensors) {
    // Only LAMB takes pieces, whose norm blocks count from the tensor's start.
    if (!t.whole && (!made->measures_trust() || t.start % kTrustBlockElements != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(OptimizerKindName(config.kind),
                                                     " cannot update a piece of tensor ", t.index,
                                                     " starting at its element ", t.start));
    }
  }
  made->tensors_ = std::move(tensors);
  return made;
}

void Optimizer::UpdateTensor(int64_t step, float* params, const float* grad, size_t tensor) {
  const RangeTensor& t = tensors_[tensor];
  Update(step, params, grad, t.offset, t.offset + t.size);
}

std::unique_ptr<Optimizer> Optimizer::MakeOptimizer(const OptimizerConfig& config, size_t size) {
  switch (config.kind) {
    case OptimizerKind::kSgd:
      return optim_internal::NewSgd(config, size);
    case OptimizerKind::kAdam:
    case OptimizerKind::kAdamW:
      return optim_internal::NewAdam(config, size);
    case OptimizerKind::kAdagrad:
      return optim_internal::NewAdagrad(config, size);
    case OptimizerKind::kLion:
      return optim_internal::NewLion(config, size);
    case OptimizerKind::kLamb:
      return optim_internal::NewLamb(config, size);
    case OptimizerKind::kAdafactor:
      return optim_internal::NewAdafactor(config, size);
    case OptimizerKind::kMuon:
      return optim_internal::NewMuon(config, size);
  }
  return nullptr;
}

absl::Status Optimizer::SetConfig(const OptimizerConfig& config) {
  if (absl::Status s = config.Validate(); !s.ok()) return s;
  if (absl::Status s = config_.CheckCanChangeTo(config); !s.ok()) return s;
  config_ = config;
  return absl::OkStatus();
}

float* Optimizer::AddSlot(const std::string& name, float initial_value) {
  slot_names_.push_back(name);
  slots_.emplace_back(size_, initial_value);
  return slots_.back().data();
}

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const std::vector<float>& s : slots_) bytes += s.size() * sizeof(float);
  return bytes;
}

}  // namespace shardopt
