#include "client/push_payload.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/dtype_convert.h"
#include "common/finite.h"

namespace shardopt {

absl::Status PreparePushPayload(const ModelLayout& layout, int64_t step,
                                absl::Span<const float> flat_grads, DType wire_dtype,
                                bool loss_scaling, std::vector<char>* narrowed,
                                const void** payload, bool* overflowed) {
  // 16-bit wire types are rounded once here (as PyTorch's .to() would) and
  // checked after rounding, which also finds the NaNs and infinities of the
  // fp32 input, and finite values that overflow fp16.
  *payload = flat_grads.data();
  size_t bad = flat_grads.size();
  if (wire_dtype == DType::kFloat32) {
    if (!loss_scaling) bad = FindNonFiniteOnTwoThreads(flat_grads.data(), flat_grads.size());
  } else {
    narrowed->resize(flat_grads.size() * DTypeSize(wire_dtype));
    bad = ConvertFromFloatAndFindNonFinite(flat_grads.data(), flat_grads.size(), wire_dtype,
                                           narrowed->data());
    *payload = narrowed->data();
    if (overflowed != nullptr) *overflowed = bad != flat_grads.size();
  }
  if (!loss_scaling && bad != flat_grads.size()) {
    const bool overflow = std::isfinite(flat_grads[bad]);
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient of ", layout.DescribeElement(bad), " for step ", step, " is ", flat_grads[bad],
        overflow ? absl::StrCat(", which overflows ", DTypeName(wire_dtype),
                                wire_dtype == DType::kFloat16
                                    ? "; nothing was pushed (scale the loss down, or push bfloat16)"
                                    : "; nothing was pushed (scale the loss down)")
                 : "; nothing was pushed"));
  }
  if (auto pad =
          FindNonZeroPadding(layout, {0, flat_grads.size()}, flat_grads.data(), DType::kFloat32)) {
    return absl::InvalidArgumentError(
        absl::StrCat("gradient of ", layout.DescribeElement(*pad), " for step ", step, " is ",
                     flat_grads[*pad], ": padding gets zero gradients; nothing was pushed"));
  }
  return absl::OkStatus();
}

}  // namespace shardopt
