// PackedSlotExtents: where a packed optimizer slot (OptimizerConfig::
// PacksSlot, Adafactor's factors) keeps each tensor's stored elements, and
// the rules of reading and writing it as a slot of the range's size: a
// tensor's OptimizerConfig::StoredSlotElements sit at the start of its part
// of the slot and everything else reads as +0.0 and may only be written as
// +0.0. One definition for the CPU optimizer (server/optim/optimizer.cc)
// and the GPU backend, which keep the stored elements in their own memory.
#ifndef SHARDOPT_SERVER_OPTIM_PACKED_SLOT_EXTENTS_H_
#define SHARDOPT_SERVER_OPTIM_PACKED_SLOT_EXTENTS_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/optimizer_config.h"
#include "server/optim/range_tensor.h"

namespace shardopt {

class PackedSlotExtents {
 public:
  PackedSlotExtents() = default;
  PackedSlotExtents(const OptimizerConfig& config, int slot,
                    const std::vector<RangeTensor>& tensors);

  uint64_t stored_elements() const { return stored_elements_; }
  // Where each tensor's stored elements begin, in `tensors` order.
  const std::vector<uint64_t>& stored_at() const { return stored_at_; }

  // fn(begin, stop, stored) for each part [begin, stop) of range elements
  // [offset, offset + count) that the slot stores, at stored element
  // `stored`, in order.
  template <typename Fn>
  void ForEachOverlap(uint64_t offset, uint64_t count, Fn&& fn) const {
    const uint64_t end = offset + count;
    auto it = std::partition_point(extents_.begin(), extents_.end(), [offset](const Extent& e) {
      return e.offset + e.length <= offset;
    });
    for (; it != extents_.end() && it->offset < end; ++it) {
      const uint64_t begin = std::max(offset, it->offset);
      const uint64_t stop = std::min(end, it->offset + it->length);
      fn(begin, stop, it->stored_at + (begin - it->offset));
    }
  }

  // OK when every value in `in` (range elements [offset, offset + count))
  // that the slot does not store is +0.0 (-0.0 too is refused: it would read
  // back as +0.0); else INVALID_ARGUMENT naming `slot_name` and the element.
  absl::Status CheckUnstoredAreZero(const std::string& slot_name, uint64_t offset, uint64_t count,
                                    const float* in) const;

 private:
  // Range elements [offset, offset + length) are stored elements
  // [stored_at, stored_at + length).
  struct Extent {
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t stored_at = 0;
  };
  std::vector<Extent> extents_;  // By offset, disjoint.
  std::vector<uint64_t> stored_at_;
  uint64_t stored_elements_ = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_PACKED_SLOT_EXTENTS_H_
