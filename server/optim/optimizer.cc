#include "server/optim/optimizer.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include "absl/base/casts.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/optim/muon_workspace.h"
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
  if (absl::Status s = CheckRangeTensors(config.kind, size, tensors); !s.ok()) return s;
  std::unique_ptr<Optimizer> made = MakeOptimizer(config, size);
  if (made == nullptr) return absl::InvalidArgumentError("unknown optimizer kind");
  made->tensors_ = std::move(tensors);
  made->AddTensorSlots();
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
  slots_.push_back(Slot{std::vector<float>(size_, initial_value), false, {}});
  return slots_.back().values.data();
}

std::vector<float*> Optimizer::AddPackedSlot(const std::string& name) {
  const int index = static_cast<int>(slots_.size());
  // PlannedStateBytes budgets exactly the slots that PacksSlot names.
  assert(config_.PacksSlot(index));
  Slot slot;
  slot.packed = true;
  slot.extents = PackedSlotExtents(config_, index, tensors_);
  slot.values.assign(slot.extents.stored_elements(), 0.0f);
  slot_names_.push_back(name);
  slots_.push_back(std::move(slot));
  std::vector<float*> where;
  for (uint64_t at : slots_.back().extents.stored_at()) {
    where.push_back(slots_.back().values.data() + at);
  }
  return where;
}

void Optimizer::ReadSlot(size_t slot, uint64_t offset, uint64_t count, float* out) const {
  const Slot& s = slots_[slot];
  if (!s.packed) {
    std::copy_n(s.values.data() + offset, count, out);
    return;
  }
  std::fill(out, out + count, 0.0f);
  s.extents.ForEachOverlap(offset, count, [&](uint64_t begin, uint64_t stop, uint64_t stored) {
    std::copy_n(s.values.data() + stored, stop - begin, out + (begin - offset));
  });
}

absl::Status Optimizer::WriteSlot(size_t slot, uint64_t offset, uint64_t count, const float* in) {
  Slot& s = slots_[slot];
  if (!s.packed) {
    std::copy_n(in, count, s.values.data() + offset);
    return absl::OkStatus();
  }
  // Everything outside the stored elements must be zero, as it reads back.
  if (absl::Status refused = s.extents.CheckUnstoredAreZero(slot_names_[slot], offset, count, in);
      !refused.ok()) {
    return refused;
  }
  s.extents.ForEachOverlap(offset, count, [&](uint64_t begin, uint64_t stop, uint64_t stored) {
    std::copy_n(in + (begin - offset), stop - begin, s.values.data() + stored);
  });
  return absl::OkStatus();
}

std::vector<float> Optimizer::SlotValues(size_t slot) const {
  std::vector<float> values(size_);
  ReadSlot(slot, 0, size_, values.data());
  return values;
}

size_t Optimizer::state_bytes() const {
  size_t bytes = 0;
  for (const Slot& s : slots_) bytes += s.values.size() * sizeof(float);
  return bytes;
}

uint64_t Optimizer::PlannedStateBytes(const OptimizerConfig& config, size_t size,
                                      const std::vector<RangeTensor>& tensors) {
  uint64_t elements = 0;
  for (int slot = 0; slot < config.StateSlotsPerElement(); ++slot) {
    if (!config.PacksSlot(slot)) {
      elements += size;
      continue;
    }
    for (const RangeTensor& t : tensors)
      elements += config.StoredSlotElements(slot, t.shape, t.size);
  }
  return elements * sizeof(float);
}

uint64_t Optimizer::PlannedWorkspaceBytes(const OptimizerConfig& config,
                                          const std::vector<RangeTensor>& tensors) {
  if (config.kind != OptimizerKind::kMuon) return 0;
  MuonWorkspace workspace;
  for (const RangeTensor& t : tensors) {
    if (t.shape.size() != 2) continue;  // (Refused at registration.)
    workspace.Add(static_cast<uint64_t>(t.shape[0]), static_cast<uint64_t>(t.shape[1]));
  }
  return workspace.bytes();
}

}  // namespace shardopt
