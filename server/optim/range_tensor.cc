#include "server/optim/range_tensor.h"

#include "absl/strings/str_cat.h"
#include "common/step_protocol.h"

namespace shardopt {

absl::Status CheckRangeTensors(OptimizerKind kind, uint64_t size,
                               const std::vector<RangeTensor>& tensors) {
  const bool lamb = kind == OptimizerKind::kLamb;
  for (const RangeTensor& t : tensors) {
    if (t.offset > size || t.size > size - t.offset) {
      return absl::InvalidArgumentError(absl::StrCat("tensor [", t.offset, ", ", t.offset + t.size,
                                                     ") is outside the range of ", size));
    }
    if (absl::Status s = CheckOptimizerFitsTensor(kind, absl::StrCat("at ", t.offset), t.shape);
        !s.ok()) {
      return s;
    }
    if (!t.whole && (!lamb || t.start % kTrustBlockElements != 0)) {
      return absl::InvalidArgumentError(absl::StrCat(OptimizerKindName(kind),
                                                     " cannot update a piece of tensor ", t.index,
                                                     " starting at its element ", t.start));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckTrustTensorOrder(OptimizerKind kind, const std::vector<RangeTensor>& tensors) {
  if (kind != OptimizerKind::kLamb) return absl::OkStatus();
  for (size_t i = 1; i < tensors.size(); ++i) {
    if (tensors[i].index <= tensors[i - 1].index) {
      return absl::InvalidArgumentError(
          absl::StrCat("lamb's tensor pieces must name distinct layout tensors in order: piece ", i,
                       " names tensor ", tensors[i].index, " after ", tensors[i - 1].index));
    }
  }
  return absl::OkStatus();
}

}  // namespace shardopt
