#include "server/optim/packed_slot_extents.h"

#include "absl/base/casts.h"
#include "absl/strings/str_cat.h"

namespace shardopt {

PackedSlotExtents::PackedSlotExtents(const OptimizerConfig& config, int slot,
                                     const std::vector<RangeTensor>& tensors) {
  for (const RangeTensor& t : tensors) {
    const uint64_t length = config.StoredSlotElements(slot, t.shape, t.size);
    stored_at_.push_back(stored_elements_);
    if (length > 0) extents_.push_back(Extent{t.offset, length, stored_elements_});
    stored_elements_ += length;
  }
  std::sort(extents_.begin(), extents_.end(),
            [](const Extent& a, const Extent& b) { return a.offset < b.offset; });
}

absl::Status PackedSlotExtents::CheckUnstoredAreZero(const std::string& slot_name, uint64_t offset,
                                                     uint64_t count, const float* in) const {
  uint64_t unstored = offset;
  absl::Status outside;
  auto check_zero = [&](uint64_t begin, uint64_t stop) {
    for (uint64_t i = begin; i < stop && outside.ok(); ++i) {
      if (absl::bit_cast<uint32_t>(in[i - offset]) != 0) {
        outside = absl::InvalidArgumentError(
            absl::StrCat("optimizer state '", slot_name,
                         "' stores only each tensor's factors, at the start of its part; element ",
                         i, " of the range is ", in[i - offset], ", where it can only be 0"));
      }
    }
  };
  ForEachOverlap(offset, count, [&](uint64_t begin, uint64_t stop, uint64_t) {
    check_zero(unstored, begin);
    unstored = stop;
  });
  check_zero(unstored, offset + count);
  return outside;
}

}  // namespace shardopt
