// CudaStatus: CUDA runtime error codes as absl::Status, for code that talks to
// the CUDA runtime (server/cuda/*.cc, *.cu). Public headers of this package
// (device.h, fused_optimizers.h) do not include this one: they use no CUDA
// types.
#ifndef SHARDOPT_SERVER_CUDA_CUDA_STATUS_H_
#define SHARDOPT_SERVER_CUDA_CUDA_STATUS_H_

#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace shardopt {
namespace gpu {

// OK for cudaSuccess; otherwise a status whose message names `what`, the
// error's name and CUDA's description, e.g.
//   "cudaMalloc(1073741824 bytes): cudaErrorMemoryAllocation (out of memory)".
// Codes: RESOURCE_EXHAUSTED for out-of-memory, UNAVAILABLE when there is no
// usable driver or device, INVALID_ARGUMENT for bad values or launch
// configurations, INTERNAL for everything else (kernel faults included:
// those are sticky, and the process must stop using that device).
inline absl::Status CudaStatus(cudaError_t err, absl::string_view what) {
  if (err == cudaSuccess) return absl::OkStatus();
  const std::string message =
      absl::StrCat(what, ": ", cudaGetErrorName(err), " (", cudaGetErrorString(err), ")");
  switch (err) {
    case cudaErrorMemoryAllocation:
      return absl::ResourceExhaustedError(message);
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
    case cudaErrorDevicesUnavailable:
    case cudaErrorInvalidDevice:
    case cudaErrorSystemDriverMismatch:
    case cudaErrorCompatNotSupportedOnDevice:
    case cudaErrorNoKernelImageForDevice:
    case cudaErrorUnsupportedPtxVersion:
      return absl::UnavailableError(message);
    case cudaErrorInvalidValue:
    case cudaErrorInvalidConfiguration:
    case cudaErrorInvalidDevicePointer:
    case cudaErrorInvalidResourceHandle:
      return absl::InvalidArgumentError(message);
    default:
      return absl::InternalError(message);
  }
}

}  // namespace gpu
}  // namespace shardopt

// Evaluates a CUDA runtime call; on failure returns its CudaStatus, naming
// the call's source text.
#define SHARDOPT_CUDA_RETURN_IF_ERROR(call)                          \
  do {                                                               \
    const cudaError_t shardopt_cuda_err_ = (call);                   \
    if (shardopt_cuda_err_ != cudaSuccess) {                         \
      return ::shardopt::gpu::CudaStatus(shardopt_cuda_err_, #call); \
    }                                                                \
  } while (0)

#endif  // SHARDOPT_SERVER_CUDA_CUDA_STATUS_H_
