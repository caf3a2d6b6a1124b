// Test helper: trust partials of given sums (see common/step_protocol.h).
#ifndef SHARDOPT_COMMON_STEP_PROTOCOL_TESTING_H_
#define SHARDOPT_COMMON_STEP_PROTOCOL_TESTING_H_

#include <cstdint>

#include "common/step_protocol.h"

namespace shardopt::testing {

inline TrustPartial Partial(uint32_t tensor, bool whole, double weight, double update) {
  TrustPartial p;
  p.tensor_index = tensor;
  p.whole_tensor = whole;
  p.weight_squares.Add(weight);
  p.update_squares.Add(update);
  return p;
}

}  // namespace shardopt::testing

#endif  // SHARDOPT_COMMON_STEP_PROTOCOL_TESTING_H_
