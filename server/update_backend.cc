// UpdateBackend's defaults for backends whose staging lies in host memory.
#include "server/update_backend.h"

#include <cstring>

#include "common/finite.h"

namespace shardopt {

absl::StatusOr<UpdateBackend::StagedScan> UpdateBackend::ScanStaged(
    uint32_t rank, uint64_t offset, uint64_t count, absl::Span<const FlatRange> must_be_zero) {
  const float* staged = HostStaging(rank, offset, count);
  if (staged == nullptr) {
    return absl::OutOfRangeError(absl::StrCat("staged elements [", offset, ", ", offset + count,
                                              ") of trainer ", rank, " are not in host memory"));
  }
  StagedScan scan;
  scan.first_non_finite = FindNonFinite(staged, count);
  for (const FlatRange& span : must_be_zero) {
    if (span.begin < offset || span.end > offset + count) {
      return absl::OutOfRangeError(absl::StrCat("padding [", span.begin, ", ", span.end,
                                                ") lies outside the scanned elements"));
    }
    for (uint64_t i = span.begin; i < span.end && !scan.first_nonzero; ++i) {
      uint32_t bits;
      std::memcpy(&bits, staged + (i - offset), 4);
      if ((bits & 0x7fffffffu) != 0) scan.first_nonzero = i;
    }
    if (scan.first_nonzero) break;
  }
  return scan;
}

absl::Status UpdateBackend::ReadStaged(uint32_t rank, uint64_t offset, uint64_t count, float* out) {
  const float* staged = HostStaging(rank, offset, count);
  if (staged == nullptr) {
    return absl::OutOfRangeError(absl::StrCat("staged elements [", offset, ", ", offset + count,
                                              ") of trainer ", rank, " are not in host memory"));
  }
  std::memcpy(out, staged, count * sizeof(float));
  return absl::OkStatus();
}

}  // namespace shardopt
