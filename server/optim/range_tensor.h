// RangeTensor: one tensor inside a shard's range, or (LAMB on the flat
// partition) the piece of one that lies in it; what the whole-tensor
// optimizers and the packed slots are told about the range.
#ifndef SHARDOPT_SERVER_OPTIM_RANGE_TENSOR_H_
#define SHARDOPT_SERVER_OPTIM_RANGE_TENSOR_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "common/optimizer_config.h"

namespace shardopt {

struct RangeTensor {
  uint64_t offset = 0;  // Range-local index of its first element.
  uint64_t size = 0;    // Of this piece.
  std::vector<int64_t> shape;
  uint32_t index = 0;  // The tensor's in the layout.
  uint64_t start = 0;  // The piece's first element within the tensor.
  bool whole = true;   // The piece is all of the tensor.
};

// OK when `kind` can update `tensors` in a range of `size` elements; else
// INVALID_ARGUMENT naming the tensor: one outside the range, one the
// optimizer does not fit (CheckOptimizerFitsTensor), a piece of a tensor
// for any optimizer but LAMB, or a LAMB piece that does not start on a norm
// block of its tensor (its blocks count from the tensor's start). One rule
// for the CPU optimizer and the GPU backend.
absl::Status CheckRangeTensors(OptimizerKind kind, uint64_t size,
                               const std::vector<RangeTensor>& tensors);

// For LAMB in a backend, which looks the step's norms up by layout tensor:
// INVALID_ARGUMENT unless `tensors` name distinct layout tensors in order.
// OK for the other optimizers.
absl::Status CheckTrustTensorOrder(OptimizerKind kind, const std::vector<RangeTensor>& tensors);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_OPTIM_RANGE_TENSOR_H_
