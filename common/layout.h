// ModelLayout: where every tensor of a model lives in one flat buffer, and
// which contiguous range of that buffer each of S optimizer shards owns.
//
// Two partitions:
// - kFlat (Megatron/ZeRO-1 style, the default). Tensors are placed in
//   declaration order, each starting at a multiple of `alignment` elements;
//   the buffer is padded to a multiple of shard_count * alignment, so it
//   splits into shard_count ranges of exactly equal size. Shard i owns
//   [i * total / S, (i + 1) * total / S). A tensor may straddle shards.
// - kWholeTensors: every tensor lies on exactly one shard (what LAMB,
//   Adafactor and Muon need). Tensors are assigned largest first (ties in
//   declaration order) to the shard with the fewest elements so far (ties to
//   the lowest index), counting each tensor's aligned size; each shard's
//   tensors are then placed in declaration order, shard 0's first, each
//   shard's range padded to a multiple of `alignment` and at least one
//   aligned block. Bound: the largest shard holds at most
//   ceil(A / S) + L + alignment elements, A the sum and L the largest of the
//   tensors' aligned sizes (each tensor goes to a shard holding at most the
//   mean); a tensor larger than all others together is allowed, and then
//   its shard is simply that large (LargestTensorOutweighsRest() says so).
// Gaps and the tail are padding: zeros that receive zero gradients.
//
// The same code computes the layout on trainers and servers, so both agree on
// every offset. A ModelLayout is immutable and cheap to copy.
#ifndef SHARDOPT_COMMON_LAYOUT_H_
#define SHARDOPT_COMMON_LAYOUT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/dtype.h"

namespace shardopt {

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;  // Empty: a scalar.
  DType dtype = DType::kFloat32;

  // Product of the dimensions (1 for a scalar).
  uint64_t num_elements() const;
};

// A tensor and its place in the flat buffer.
struct TensorPlacement {
  TensorSpec spec;
  uint64_t offset = 0;  // First element in the flat buffer.
  uint64_t size = 0;    // Number of elements.
};

// A half-open range [begin, end) of flat-buffer elements.
struct FlatRange {
  uint64_t begin = 0;
  uint64_t end = 0;
  uint64_t size() const { return end - begin; }
};

// The part of one tensor that lies inside a given flat range.
struct TensorPiece {
  size_t tensor_index = 0;
  uint64_t tensor_offset = 0;  // First element of the tensor in the piece.
  uint64_t flat_offset = 0;    // Where that element lies in the flat buffer.
  uint64_t size = 0;
};

enum class Partition {
  kFlat,          // Even split; tensors may straddle shards.
  kWholeTensors,  // Every tensor on one shard, shards balanced greedily.
};

// "flat", "whole_tensors".
const char* PartitionName(Partition partition);
// INVALID_ARGUMENT naming the choices for anything else.
absl::StatusOr<Partition> PartitionFromName(absl::string_view name);

class ModelLayout {
 public:
  static constexpr uint32_t kDefaultAlignment = 64;

  // INVALID_ARGUMENT for an empty or duplicate name, a negative dimension, a
  // size that overflows, alignment not a power of two (0 selects the default),
  // or shard_count == 0.
  static absl::StatusOr<ModelLayout> Create(std::vector<TensorSpec> tensors, uint32_t alignment,
                                            uint32_t shard_count,
                                            Partition partition = Partition::kFlat);

  // In declaration order (with whole tensors, offsets are not ascending).
  const std::vector<TensorPlacement>& tensors() const { return tensors_; }
  uint32_t alignment() const { return alignment_; }
  uint32_t shard_count() const { return shard_count_; }
  Partition partition() const { return partition_; }

  // Elements in the padded flat buffer (flat: a multiple of shard_count *
  // alignment; whole tensors: of alignment).
  uint64_t total_elements() const { return total_elements_; }
  // Elements actually used by tensors (no padding).
  uint64_t used_elements() const { return used_elements_; }
  // Elements of shard `shard_index`'s range (with kFlat all equal).
  uint64_t ShardSize(uint32_t shard_index) const { return ShardRange(shard_index).size(); }
  // The largest shard's elements over the mean (1 for kFlat).
  double Imbalance() const;
  // Whole tensors: one tensor has more elements than all others together
  // (its shard is then as large as it, whatever the shard count).
  bool LargestTensorOutweighsRest() const;
  // Whole tensors where LargestTensorOutweighsRest(): what a user should be
  // told ("tensor 'w' (N elements) outweighs all others together (M): ...");
  // empty otherwise.
  std::string DescribeImbalance() const;

  // The range shard `shard_index` (< shard_count) owns.
  FlatRange ShardRange(uint32_t shard_index) const;
  // The shard whose range holds tensor `tensor_index` (kWholeTensors; with
  // kFlat the shard of its first element).
  uint32_t ShardOfTensor(size_t tensor_index) const;
  // Same tensors (names, shapes, dtypes, order) and alignment: a buffer of
  // one reads as the other's by tensor (offsets may differ).
  bool SameTensors(const ModelLayout& other) const;

  // Index of the tensor called `name`, or NOT_FOUND.
  absl::StatusOr<size_t> Find(absl::string_view name) const;

  // Names flat-buffer element `flat_index` for messages: "tensor 'w'[12]"
  // (row-major index within the tensor) or "padding element 1000".
  std::string DescribeElement(uint64_t flat_index) const;

  // The pieces of tensors inside `range`, in flat order (padding omitted).
  std::vector<TensorPiece> PiecesIn(FlatRange range) const;
  // The padding inside `range`: the gaps between its tensor pieces and the
  // tail, in flat order.
  std::vector<FlatRange> PaddingIn(FlatRange range) const;

 private:
  ModelLayout() = default;

  std::vector<TensorPlacement> tensors_;
  // Indices into tensors_ by ascending offset (PiecesIn searches it).
  std::vector<uint32_t> by_offset_;
  // shard i owns [shard_begin_[i], shard_begin_[i + 1]).
  std::vector<uint64_t> shard_begin_;
  // kWholeTensors: each tensor's shard (an empty one may sit at the next
  // shard's first offset).
  std::vector<uint32_t> shard_of_;
  uint32_t alignment_ = kDefaultAlignment;
  uint32_t shard_count_ = 1;
  Partition partition_ = Partition::kFlat;
  uint64_t total_elements_ = 0;
  uint64_t used_elements_ = 0;
};

// Padding holds zeros and gets zero gradients: the flat index of the first
// padding element among `values` (range.size() elements of `dtype` for flat
// elements [range.begin, range.end)) that is not +0 or -0, or nullopt.
// Trainers check what they send and shards what they receive with it.
std::optional<uint64_t> FindNonZeroPadding(const ModelLayout& layout, FlatRange range,
                                           const void* values, DType dtype);

// Zeros the padding elements of `values` (range.size() elements, for flat
// elements [range.begin, range.end)): what a buffer filled element by
// element needs before it is pushed or registered.
template <typename Element>
void ZeroPadding(const ModelLayout& layout, FlatRange range, Element* values) {
  for (const FlatRange& gap : layout.PaddingIn(range)) {
    for (uint64_t i = gap.begin; i < gap.end; ++i) values[i - range.begin] = Element{0};
  }
}

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_LAYOUT_H_
