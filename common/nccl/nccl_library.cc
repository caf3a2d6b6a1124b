#include "common/nccl/nccl_library.h"

#include <dlfcn.h>

#include <cstdlib>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardopt::nccl {

namespace {
constexpr int kMinimumVersion = 21900;
}  // namespace

absl::StatusOr<const NcclLibrary*> NcclLibrary::Load() {
  static const absl::StatusOr<const NcclLibrary*>* const loaded =
      new absl::StatusOr<const NcclLibrary*>([]() -> absl::StatusOr<const NcclLibrary*> {
        // The operator's choice alone, when there is one.
        std::vector<std::string> names = {"libnccl.so.2", "libnccl.so"};
        if (const char* chosen = std::getenv("SHARDOPT_NCCL_LIBRARY"); chosen && *chosen) {
          names = {chosen};
        }
        std::vector<std::string> failures;
        for (const std::string& name : names) {
          void* handle = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
          if (handle == nullptr) {
            const char* why = dlerror();
            failures.push_back(why ? why : name);
            continue;
          }
          auto* library = new NcclLibrary;
          bool complete = true;
          auto resolve = [&](auto& fn, const char* symbol) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, symbol));
            if (fn == nullptr) {
              complete = false;
              failures.push_back(absl::StrCat(name, " has no ", symbol));
            }
          };
          resolve(library->get_version, "ncclGetVersion");
          resolve(library->get_unique_id, "ncclGetUniqueId");
          resolve(library->comm_init_rank_config, "ncclCommInitRankConfig");
          resolve(library->comm_get_async_error, "ncclCommGetAsyncError");
          resolve(library->comm_finalize, "ncclCommFinalize");
          resolve(library->comm_destroy, "ncclCommDestroy");
          resolve(library->comm_abort, "ncclCommAbort");
          resolve(library->send, "ncclSend");
          resolve(library->recv, "ncclRecv");
          resolve(library->get_error_string, "ncclGetErrorString");
          resolve(library->get_last_error, "ncclGetLastError");
          if (complete && library->get_version(&library->version) != ncclSuccess) {
            complete = false;
            failures.push_back(absl::StrCat(name, ": ncclGetVersion failed"));
          }
          // 2.19 fixed aborts that hung with several threads (NVIDIA/nccl
          // #992); the pairs rely on aborts.
          if (complete && library->version < kMinimumVersion) {
            complete = false;
            failures.push_back(absl::StrCat(name, " is NCCL ", library->version, ", older than ",
                                            kMinimumVersion));
          }
          if (complete) {
            library->path = name;
            return library;
          }
          delete library;
          dlclose(handle);
        }
        return absl::UnimplementedError(
            absl::StrCat("NCCL could not be loaded (", absl::StrJoin(failures, "; "),
                         "): set SHARDOPT_NCCL_LIBRARY or LD_LIBRARY_PATH to a libnccl.so.2"));
      }());
  return *loaded;
}

absl::Status NcclLibrary::Check(ncclResult_t result, const std::string& what,
                                ncclComm_t comm) const {
  if (result == ncclSuccess || result == ncclInProgress) return absl::OkStatus();
  const char* last = get_last_error(comm);
  std::string message = absl::StrCat(what, " failed: ", get_error_string(result));
  if (last != nullptr && *last != '\0') absl::StrAppend(&message, " (", last, ")");
  // A peer that went away (remote or system errors) is the transport's
  // unavailability; anything else is a bug or a misuse.
  if (result == ncclRemoteError || result == ncclSystemError) {
    return absl::UnavailableError(message);
  }
  return absl::InternalError(message);
}

}  // namespace shardopt::nccl
