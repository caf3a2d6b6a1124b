// The gradient of a step as it goes on the wire, checked whole before any
// shard sees it: a NaN, or a non-zero padding element, found by one shard
// only would leave the others holding (or applying) the step.
#ifndef SHARDOPT_CLIENT_PUSH_PAYLOAD_H_
#define SHARDOPT_CLIENT_PUSH_PAYLOAD_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/dtype.h"
#include "common/layout.h"

namespace shardopt {

// Rounds `flat_grads` to `wire_dtype` into `narrowed` (unless fp32) and
// points `payload` at what is to be sent. INVALID_ARGUMENT naming the element
// for a NaN/inf (unless `loss_scaling`, where an overflow is expected and
// every shard skips the step), a finite value that overflows a 16-bit type,
// or padding that is not zero; nothing is sent then. With `loss_scaling`
// and a 16-bit wire type, `overflowed` (when given) says whether some
// element is not finite after rounding.
absl::Status PreparePushPayload(const ModelLayout& layout, int64_t step,
                                absl::Span<const float> flat_grads, DType wire_dtype,
                                bool loss_scaling, std::vector<char>* narrowed,
                                const void** payload, bool* overflowed = nullptr);

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_PUSH_PAYLOAD_H_
