#include "server/cuda/cublas.h"

#include <cublas_v2.h>
#include <dlfcn.h>

#include <cstdlib>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace shardopt {
namespace gpu {

struct Cublas::Api {
  decltype(&cublasCreate_v2) create = nullptr;
  decltype(&cublasDestroy_v2) destroy = nullptr;
  decltype(&cublasSetStream_v2) set_stream = nullptr;
  decltype(&cublasSetMathMode) set_math_mode = nullptr;
  decltype(&cublasSgemm_v2) sgemm = nullptr;
};

namespace {

// Loaded once per process (never unloaded: handles may outlive any caller).
absl::StatusOr<const Cublas::Api*> LoadApi() {
  static const absl::StatusOr<const Cublas::Api*>* const loaded =
      new absl::StatusOr<const Cublas::Api*>([]() -> absl::StatusOr<const Cublas::Api*> {
        // The operator's choice alone, when there is one.
        std::vector<std::string> names = {"libcublas.so.13", "libcublas.so"};
        if (const char* chosen = std::getenv("SHARDOPT_CUBLAS_LIBRARY"); chosen && *chosen) {
          names = {chosen};
        }
        std::vector<std::string> failures;
        for (const std::string& name : names) {
          void* library = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
          if (library == nullptr) {
            const char* why = dlerror();
            failures.push_back(why ? why : name);
            continue;
          }
          auto* api = new Cublas::Api;
          bool complete = true;
          auto resolve = [&](auto& fn, const char* symbol) {
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(library, symbol));
            if (fn == nullptr) {
              complete = false;
              failures.push_back(absl::StrCat(name, " has no ", symbol));
            }
          };
          resolve(api->create, "cublasCreate_v2");
          resolve(api->destroy, "cublasDestroy_v2");
          resolve(api->set_stream, "cublasSetStream_v2");
          resolve(api->set_math_mode, "cublasSetMathMode");
          resolve(api->sgemm, "cublasSgemm_v2");
          if (complete) return api;
          delete api;
        }
        return absl::UnimplementedError(
            absl::StrCat("cuBLAS could not be loaded (", absl::StrJoin(failures, "; "),
                         "): set SHARDOPT_CUBLAS_LIBRARY or LD_LIBRARY_PATH to a CUDA 13 "
                         "libcublas"));
      }());
  return *loaded;
}

absl::Status CublasStatus(cublasStatus_t status, const char* what) {
  if (status == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, " failed: cuBLAS status ", static_cast<int>(status)));
}

}  // namespace

absl::Status Cublas::Available() { return LoadApi().status(); }

absl::StatusOr<std::unique_ptr<Cublas>> Cublas::Create(void* stream) {
  absl::StatusOr<const Api*> api = LoadApi();
  if (!api.ok()) return api.status();
  cublasHandle_t handle = nullptr;
  if (absl::Status s = CublasStatus((*api)->create(&handle), "cublasCreate"); !s.ok()) return s;
  std::unique_ptr<Cublas> cublas(new Cublas(*api, handle));
  if (absl::Status s = CublasStatus((*api)->set_stream(handle, static_cast<cudaStream_t>(stream)),
                                    "cublasSetStream");
      !s.ok()) {
    return s;
  }
  if (absl::Status s =
          CublasStatus((*api)->set_math_mode(handle, CUBLAS_DEFAULT_MATH), "cublasSetMathMode");
      !s.ok()) {
    return s;
  }
  return cublas;
}

Cublas::~Cublas() {
  if (handle_ != nullptr) api_->destroy(static_cast<cublasHandle_t>(handle_));
}

absl::Status Cublas::Sgemm(bool transpose_a, bool transpose_b, size_t m, size_t n, size_t k,
                           float alpha, const float* a, size_t lda, const float* b, size_t ldb,
                           float beta, float* c, size_t ldc) {
  // Row-major C = op(A) op(B) is column-major C^T = op(B)^T op(A)^T, and a
  // row-major matrix read column-major is its transpose: swap the operands.
  const cublasOperation_t op_a = transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_b = transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  return CublasStatus(
      api_->sgemm(static_cast<cublasHandle_t>(handle_), op_b, op_a, static_cast<int>(n),
                  static_cast<int>(m), static_cast<int>(k), &alpha, b, static_cast<int>(ldb), a,
                  static_cast<int>(lda), &beta, c, static_cast<int>(ldc)),
      "cublasSgemm");
}

}  // namespace gpu
}  // namespace shardopt
