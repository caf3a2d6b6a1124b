// Launch helpers shared by the .cu files of the simple passes
// (gradient_control.cu, muon_kernels.cu): a grid-stride launch size and
// the launch's error as a Status. Host code; included by .cu files only.
#ifndef SHARDOPT_SERVER_CUDA_LAUNCH_UTIL_H_
#define SHARDOPT_SERVER_CUDA_LAUNCH_UTIL_H_

#include <cuda_runtime.h>

#include <cstddef>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace shardopt {
namespace gpu {
namespace launch {

inline constexpr int kThreads = 256;

inline absl::Status Check(cudaError_t error, const char* what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(error), " (", cudaGetErrorString(error), ")"));
}

// Blocks of kThreads for `work` elements of a grid-stride loop (capped).
inline int Blocks(size_t work) {
  const size_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<int>(blocks < 65535 * 32 ? (blocks == 0 ? 1 : blocks) : 65535 * 32);
}

}  // namespace launch
}  // namespace gpu
}  // namespace shardopt

#endif  // SHARDOPT_SERVER_CUDA_LAUNCH_UTIL_H_
