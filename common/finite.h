// Scans of fp32 payloads for values that must never reach an optimizer.
#ifndef SHARDOPT_COMMON_FINITE_H_
#define SHARDOPT_COMMON_FINITE_H_

#include <cstddef>

namespace shardopt {

// Index of the first NaN or infinity in data[0, n), or n when all are finite.
// Branch-free per block so that the common all-finite case vectorises.
size_t FindNonFinite(const float* data, size_t n);

// FindNonFinite's answer, with the first half scanned on a thread of its own
// when n is at least kParallelScanElements. For a check that every byte
// waits for (a trainer's whole gradient before its push), which would
// otherwise leave the other core idle: 64 MiB in 1.1-1.2 ms instead of
// 1.75 ms on this project's 2-core machine.
inline constexpr size_t kParallelScanElements = size_t{1} << 21;  // 8 MiB.
size_t FindNonFiniteOnTwoThreads(const float* data, size_t n);

// Copies all n floats from `src` (any alignment, e.g. a received payload) to
// `dst` and returns the index of the first NaN or infinity, or n. One pass
// over the data instead of a copy and a scan.
size_t CopyAndFindNonFinite(float* dst, const void* src, size_t n);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_FINITE_H_
