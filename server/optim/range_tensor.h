// RangeTensor: one tensor inside a shard's range, or (LAMB on the flat
// partition) the piece of one that lies in it; what the whole-tensor
// optimizers and the packed slots are told about the range.
#ifndef SHARDOPT_SERVER_OPTIM_RANGE_TENSOR_H_
#define SHARDOPT_SERVER_OPTIM_RANGE_TENSOR_H_

#include <cstdint>
#include <vector>

namespace shardopt {

struct RangeTensor {
  uint64_t offset = 0;  // Range-local index of its first element.
  uint64_t size = 0;    // Of this piece.
  std::vector<int64_t> shape;
  uint32_t index = 0;  // The tensor's in the layout.
  uint64_t start = 0;  // The piece's first element within the tensor.
  bool whole = true;   // The piece is all of the tensor.
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_RANGE_TENSOR_H_
