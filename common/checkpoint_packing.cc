#include "common/checkpoint_packing.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace shardopt {

uint32_t CheckpointFormatVersionFor(const OptimizerConfig& optimizer) {
  for (int slot = 0; slot < optimizer.StateSlotsPerElement(); ++slot) {
    if (optimizer.PacksSlot(slot)) return 2;
  }
  return 1;
}

absl::StatusOr<PackedSection> PackedSection::Create(const ModelLayout& layout, FlatRange range,
                                                    const OptimizerConfig& optimizer, int slot) {
  if (!optimizer.PacksSlot(slot)) {
    return absl::InvalidArgumentError(
        absl::StrCat("slot ", slot, " of ", OptimizerKindName(optimizer.kind), " is not packed"));
  }
  PackedSection section;
  for (const TensorPiece& piece : layout.PiecesIn(range)) {
    const TensorPlacement& t = layout.tensors()[piece.tensor_index];
    if (piece.tensor_offset != 0 || piece.size != t.size) {
      return absl::InvalidArgumentError(absl::StrCat(
          "tensor '", t.spec.name, "' straddles the range [", range.begin, ", ", range.end,
          "): a packed optimizer slot needs whole tensors (partition whole_tensors)"));
    }
    const uint64_t stored = optimizer.StoredSlotElements(slot, t.spec.shape, t.size);
    if (stored == 0) continue;
    section.runs_.push_back(Run{piece.flat_offset, stored, section.num_elements_});
    section.num_elements_ += stored;
  }
  return section;
}

std::vector<PackedSection::Run> PackedSection::RunsIn(uint64_t begin, uint64_t end) const {
  std::vector<Run> runs;
  // The first run that ends after `begin`.
  auto it = std::upper_bound(runs_.begin(), runs_.end(), begin, [](uint64_t at, const Run& run) {
    return at < run.flat_begin + run.count;
  });
  for (; it != runs_.end() && it->flat_begin < end; ++it) {
    const uint64_t lo = std::max(begin, it->flat_begin);
    const uint64_t hi = std::min(end, it->flat_begin + it->count);
    runs.push_back(Run{lo, hi - lo, it->packed_begin + (lo - it->flat_begin)});
  }
  return runs;
}

}  // namespace shardopt
