// NcclLibrary: the NCCL functions shardopt's GPU data plane calls, from a
// libnccl loaded at first use with dlopen, so that servers, trainers, their
// tests and container images run without NCCL unless a pair of GPU peers
// asks for it (as server/cuda/cublas.h does for cuBLAS).
//
// Contract: Load() resolves every function once per process (never
// unloaded: communicators may outlive any caller). The library:
// $SHARDOPT_NCCL_LIBRARY alone if set, else libnccl.so.2, then libnccl.so,
// on the loader's path. UNIMPLEMENTED naming each library tried and why
// when none loads, one lacks a function, or it is older than NCCL 2.19
// (whose aborts could hang). The types are nccl.h's: a build
// needs NCCL's header, a run only the library.
#ifndef SHARDOPT_COMMON_NCCL_NCCL_LIBRARY_H_
#define SHARDOPT_COMMON_NCCL_NCCL_LIBRARY_H_

#include <nccl.h>

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace shardopt::nccl {

struct NcclLibrary {
  decltype(&ncclGetVersion) get_version = nullptr;
  decltype(&ncclGetUniqueId) get_unique_id = nullptr;
  decltype(&ncclCommInitRankConfig) comm_init_rank_config = nullptr;
  decltype(&ncclCommGetAsyncError) comm_get_async_error = nullptr;
  decltype(&ncclCommFinalize) comm_finalize = nullptr;
  decltype(&ncclCommDestroy) comm_destroy = nullptr;
  decltype(&ncclCommAbort) comm_abort = nullptr;
  decltype(&ncclSend) send = nullptr;
  decltype(&ncclRecv) recv = nullptr;
  decltype(&ncclGetErrorString) get_error_string = nullptr;
  decltype(&ncclGetLastError) get_last_error = nullptr;
  std::string path;  // The library that was loaded.
  int version = 0;   // ncclGetVersion's: 22801 for 2.28.1.

  static absl::StatusOr<const NcclLibrary*> Load();
  // "<what> failed: <NCCL's error string> (<its last error>)", or OK for
  // ncclSuccess. ncclInProgress is not an error: callers poll for it.
  absl::Status Check(ncclResult_t result, const std::string& what, ncclComm_t comm) const;
};

}  // namespace shardopt::nccl

#endif  // SHARDOPT_COMMON_NCCL_NCCL_LIBRARY_H_
