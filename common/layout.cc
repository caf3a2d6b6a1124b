#include "common/layout.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <unordered_set>

#include "absl/strings/str_cat.h"
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

absl::StatusOr<ModelLayout> ModelLayout::Create(std::vector<TensorSpec> tensors, uint32_t alignment,
                                                uint32_t shard_count) {
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
  std::unordered_set<std::string> names;
  uint64_t offset = 0;
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
    offset = RoundUp(offset, alignment);
    if (offset + size > kMaxElements) {
      return absl::InvalidArgumentError("model is too large (more than 2^48 elements)");
    }
    layout.used_elements_ += size;
    layout.tensors_.push_back(TensorPlacement{std::move(spec), offset, size});
    offset += size;
  }
  layout.total_elements_ = RoundUp(offset, uint64_t{alignment} * shard_count);
  if (layout.total_elements_ == 0) {
    // An empty model still gives every shard one aligned block, so that
    // ranges are never empty and all shard sizes stay equal.
    layout.total_elements_ = uint64_t{alignment} * shard_count;
  }
  return layout;
}

FlatRange ModelLayout::ShardRange(uint32_t shard_index) const {
  const uint64_t size = shard_size();
  return FlatRange{shard_index * size, (shard_index + 1) * size};
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
  // Tensors are sorted by offset: binary-search the first that ends after begin.
  auto it = std::partition_point(tensors_.begin(), tensors_.end(), [&](const TensorPlacement& t) {
    return t.offset + t.size <= range.begin;
  });
  for (; it != tensors_.end() && it->offset < range.end; ++it) {
    const uint64_t begin = std::max(it->offset, range.begin);
    const uint64_t end = std::min(it->offset + it->size, range.end);
    if (begin >= end) continue;  // Empty tensor.
    pieces.push_back(TensorPiece{static_cast<size_t>(it - tensors_.begin()), begin - it->offset,
                                 begin, end - begin});
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
