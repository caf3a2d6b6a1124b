#include "client/partial_change.h"

#include "client/retry.h"

namespace shardopt {

std::optional<std::vector<uint32_t>> ShardsThatTookARecordedChange(
    const std::vector<absl::Status>& answers) {
  std::vector<uint32_t> took;
  for (uint32_t i = 0; i < answers.size(); ++i) {
    const absl::Status& a = answers[i];
    if (a.ok()) {
      took.push_back(i);
    } else if (!(IsRetryable(a) || absl::IsCancelled(a) || absl::IsUnknown(a))) {
      return std::nullopt;  // It answered, and refused.
    }
  }
  if (took.empty()) return std::nullopt;
  return took;
}

}  // namespace shardopt
