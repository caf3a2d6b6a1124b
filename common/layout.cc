#include "common/layout.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/names.h"

namespace shardopt {
namespace {

// Keeps every offset far from uint64 overflow, and every byte count of a
// shard range representable.
constexpr uint64_t kMaxElements = uint64_t{1} << 48;

uint64_t RoundUp(uint64_t value, uint64_t multiple) {
  return (value + multiple - 1) / multiple * multiple;
}

}  // namespace

uint64_t TensorSpec::num_elements() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

const char* PartitionName(Partition partition) {
  return partition == Partition::kWholeTensors ? "whole_tensors" : "flat";
}

absl::StatusOr<Partition> PartitionFromName(absl::string_view name) {
  if (name == "flat") return Partition::kFlat;
  if (name == "whole_tensors") return Partition::kWholeTensors;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown partition '", name, "' (flat or whole_tensors)"));
}

absl::StatusOr<ModelLayout> ModelLayout::Create(std::vector<TensorSpec> tensors, uint32_t alignment,
                                                uint32_t shard_count, Partition partition) {
  if (alignment == 0) alignment = kDefaultAlignment;
  if ((alignment & (alignment - 1)) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("alignment ", alignment, " is not a power of two"));
  }
  if (shard_count == 0) {
    return absl::InvalidArgumentError("shard_count must be at least 1");
  }
  ModelLayout layout;
  layout.alignment_ = alignment;
  layout.shard_count_ = shard_count;
  layout.partition_ = partition;
  std::unordered_set<std::string> names;
  std::vector<uint64_t> sizes;
  uint64_t aligned_sum = 0;
  for (TensorSpec& spec : tensors) {
    if (absl::Status s = CheckTensorName(spec.name); !s.ok()) return s;
    if (!names.insert(spec.name).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor name ", Quoted(spec.name), " appears twice"));
    }
    uint64_t size = 1;
    for (int64_t d : spec.shape) {
      if (d < 0) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quoted(spec.name), " has negative dimension ", d));
      }
      if (d != 0 && size > kMaxElements / static_cast<uint64_t>(d)) {
        return absl::InvalidArgumentError(
            absl::StrCat("tensor ", Quoted(spec.name), " is too large"));
      }
      size *= static_cast<uint64_t>(d);
    }
    aligned_sum += RoundUp(size, alignment);
    if (aligned_sum > kMaxElements) {
      return absl::InvalidArgumentError("model is too large (more than 2^48 elements)");
    }
    sizes.push_back(size);
    layout.used_elements_ += size;
    layout.tensors_.push_back(TensorPlacement{std::move(spec), 0, size});
  }
  const size_t n = layout.tensors_.size();
  // The shard of each tensor: all on shard 0 for kFlat (cut evenly below).
  std::vector<uint32_t> shard_of(n, 0);
  if (partition == Partition::kWholeTensors) {
    std::vector<uint32_t> largest_first(n);
    for (size_t i = 0; i < n; ++i) largest_first[i] = static_cast<uint32_t>(i);
    std::stable_sort(largest_first.begin(), largest_first.end(),
                     [&](uint32_t a, uint32_t b) { return sizes[a] > sizes[b]; });
    std::vector<uint64_t> load(shard_count, 0);
    for (uint32_t t : largest_first) {
      const uint32_t s =
          static_cast<uint32_t>(std::min_element(load.begin(), load.end()) - load.begin());
      shard_of[t] = s;
      load[s] += RoundUp(sizes[t], alignment);
    }
  }
  uint64_t offset = 0;
  const uint32_t placed_shards = partition == Partition::kWholeTensors ? shard_count : 1;
  for (uint32_t s = 0; s < placed_shards; ++s) {
    const uint64_t begin = offset;
    layout.shard_begin_.push_back(begin);
    for (size_t i = 0; i < n; ++i) {
      if (shard_of[i] != s) continue;
      offset = RoundUp(offset, alignment);
      layout.tensors_[i].offset = offset;
      offset += sizes[i];
    }
    // Never an empty range: a shard without tensors holds one aligned block.
    offset = std::max(RoundUp(offset, alignment), begin + alignment);
  }
  if (partition == Partition::kWholeTensors) {
    layout.shard_begin_.push_back(offset);
    layout.total_elements_ = offset;
  } else {
    layout.total_elements_ = RoundUp(offset, uint64_t{alignment} * shard_count);
    const uint64_t each = layout.total_elements_ / shard_count;
    layout.shard_begin_.clear();
    for (uint32_t s = 0; s <= shard_count; ++s) layout.shard_begin_.push_back(s * each);
  }
  layout.by_offset_.resize(n);
  for (size_t i = 0; i < n; ++i) layout.by_offset_[i] = static_cast<uint32_t>(i);
  // By offset, then end: an empty tensor at the end of one shard has the
  // offset of the next shard's first tensor, and must come before it for
  // PiecesIn's binary search (ends must not decrease).
  std::stable_sort(layout.by_offset_.begin(), layout.by_offset_.end(), [&](uint32_t a, uint32_t b) {
    const TensorPlacement& x = layout.tensors_[a];
    const TensorPlacement& y = layout.tensors_[b];
    return x.offset != y.offset ? x.offset < y.offset : x.size < y.size;
  });
  layout.shard_of_ = std::move(shard_of);
  return layout;
}

FlatRange ModelLayout::ShardRange(uint32_t shard_index) const {
  return FlatRange{shard_begin_[shard_index], shard_begin_[shard_index + 1]};
}

double ModelLayout::Imbalance() const {
  uint64_t largest = 0;
  for (uint32_t s = 0; s < shard_count_; ++s) largest = std::max(largest, ShardSize(s));
  return static_cast<double>(largest) * shard_count_ / static_cast<double>(total_elements_);
}

bool ModelLayout::LargestTensorOutweighsRest() const {
  uint64_t largest = 0;
  for (const TensorPlacement& t : tensors_) largest = std::max(largest, t.size);
  return tensors_.size() > 1 && largest > used_elements_ - largest;
}

std::string ModelLayout::DescribeImbalance() const {
  if (partition_ != Partition::kWholeTensors || !LargestTensorOutweighsRest()) return "";
  size_t largest = 0;
  for (size_t t = 1; t < tensors_.size(); ++t) {
    if (tensors_[t].size > tensors_[largest].size) largest = t;
  }
  const TensorPlacement& t = tensors_[largest];
  return absl::StrFormat(
      "tensor '%s' (%d elements) outweighs all others together (%d): shard %d holds it, the "
      "largest shard %.2fx the mean (the flat partition splits it evenly, for the optimizers "
      "that allow it)",
      t.spec.name, t.size, used_elements_ - t.size, ShardOfTensor(largest), Imbalance());
}

uint32_t ModelLayout::ShardOfTensor(size_t tensor_index) const {
  if (partition_ == Partition::kWholeTensors) return shard_of_[tensor_index];
  const uint64_t at = tensors_[tensor_index].offset;
  // The last shard whose range begins at or before `at`.
  auto it = std::upper_bound(shard_begin_.begin(), shard_begin_.end() - 1, at);
  return static_cast<uint32_t>(it - shard_begin_.begin()) - 1;
}

bool ModelLayout::SameTensors(const ModelLayout& other) const {
  if (alignment_ != other.alignment_ || tensors_.size() != other.tensors_.size()) return false;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const TensorSpec& a = tensors_[i].spec;
    const TensorSpec& b = other.tensors_[i].spec;
    if (a.name != b.name || a.shape != b.shape || a.dtype != b.dtype) return false;
  }
  return true;
}

absl::StatusOr<size_t> ModelLayout::Find(absl::string_view name) const {
  for (size_t i = 0; i < tensors_.size(); ++i) {
    if (tensors_[i].spec.name == name) return i;
  }
  return absl::NotFoundError(absl::StrCat("no tensor named ", Quoted(name)));
}

std::string ModelLayout::DescribeElement(uint64_t flat_index) const {
  for (const TensorPiece& p : PiecesIn(FlatRange{flat_index, flat_index + 1})) {
    return absl::StrCat("tensor '", tensors_[p.tensor_index].spec.name, "'[", p.tensor_offset, "]");
  }
  return absl::StrCat("padding element ", flat_index);
}

std::vector<TensorPiece> ModelLayout::PiecesIn(FlatRange range) const {
  std::vector<TensorPiece> pieces;
  // by_offset_ is sorted by offset: binary-search the first that ends after begin.
  auto it = std::partition_point(by_offset_.begin(), by_offset_.end(), [&](uint32_t i) {
    return tensors_[i].offset + tensors_[i].size <= range.begin;
  });
  for (; it != by_offset_.end() && tensors_[*it].offset < range.end; ++it) {
    const TensorPlacement& t = tensors_[*it];
    const uint64_t begin = std::max(t.offset, range.begin);
    const uint64_t end = std::min(t.offset + t.size, range.end);
    if (begin >= end) continue;  // Empty tensor.
    pieces.push_back(TensorPiece{*it, begin - t.offset, begin, end - begin});
  }
  return pieces;
}

std::vector<FlatRange> ModelLayout::PaddingIn(FlatRange range) const {
  std::vector<FlatRange> padding;
  uint64_t at = range.begin;
  for (const TensorPiece& p : PiecesIn(range)) {
    if (p.flat_offset > at) padding.push_back(FlatRange{at, p.flat_offset});
    at = p.flat_offset + p.size;
  }
  if (at < range.end) padding.push_back(FlatRange{at, range.end});
  return padding;
}

std::optional<uint64_t> FindNonZeroPadding(const ModelLayout& layout, FlatRange range,
                                           const void* values, DType dtype) {
  const size_t element = DTypeSize(dtype);
  const char* bytes = static_cast<const char*>(values);
  for (const FlatRange& gap : layout.PaddingIn(range)) {
    for (uint64_t i = gap.begin; i < gap.end; ++i) {
      const char* at = bytes + (i - range.begin) * element;
      bool zero;
      if (element == 4) {
        uint32_t bits;
        std::memcpy(&bits, at, 4);
        zero = (bits & 0x7fffffffu) == 0;
      } else {
        uint16_t bits;
        std::memcpy(&bits, at, 2);
        zero = (bits & 0x7fffu) == 0;
      }
      if (!zero) return i;
    }
  }
  return std::nullopt;
}

}  // namespace shardopt
