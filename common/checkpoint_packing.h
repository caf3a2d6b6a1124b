// PackedSection: where a packed optimizer slot (OptimizerConfig::PacksSlot:
// Adafactor's factors) keeps its values in one shard's checkpoint section
// (format 2, docs/checkpoints.md). Each whole tensor of the shard's range,
// in flat order, contributes its OptimizerConfig::StoredSlotElements first
// elements, one run after another; every other element of the range (the
// rest of each tensor, the padding) is not stored and reads as zero, as the
// server's packed slot holds it. The writer and the reader of
// common/checkpoint_files.h both map positions through this class, so the
// two cannot disagree. Immutable; pure arithmetic on the layout.
#ifndef SHARDOPT_COMMON_CHECKPOINT_PACKING_H_
#define SHARDOPT_COMMON_CHECKPOINT_PACKING_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/layout.h"
#include "common/optimizer_config.h"

namespace shardopt {

// The checkpoint format version for `optimizer`: 2 when it has a packed
// slot (readers before format 2 refuse those by version, not as damage), 1
// otherwise (readable by every build).
uint32_t CheckpointFormatVersionFor(const OptimizerConfig& optimizer);

class PackedSection {
 public:
  // A stored run: `count` elements of the flat buffer from `flat_begin`,
  // kept at element `packed_begin` of the section.
  struct Run {
    uint64_t flat_begin = 0;
    uint64_t count = 0;
    uint64_t packed_begin = 0;
  };

  // Slot `slot` of `optimizer` over `range` of `layout`. INVALID_ARGUMENT
  // when the slot is not packed or a tensor straddles the range's ends (a
  // packed slot needs whole tensors).
  static absl::StatusOr<PackedSection> Create(const ModelLayout& layout, FlatRange range,
                                              const OptimizerConfig& optimizer, int slot);

  // Elements the section stores.
  uint64_t num_elements() const { return num_elements_; }
  // The stored runs overlapping flat [begin, end), clipped to it, in order.
  std::vector<Run> RunsIn(uint64_t begin, uint64_t end) const;

 private:
  std::vector<Run> runs_;  // One per tensor that stores anything, by flat_begin.
  uint64_t num_elements_ = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_CHECKPOINT_PACKING_H_
