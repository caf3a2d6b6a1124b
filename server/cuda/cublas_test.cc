// Cublas's loader where the library cannot be had: a clear UNIMPLEMENTED
// naming what was tried (the server then runs Muon on the CPU). Runs
// everywhere: it needs neither cuBLAS nor a GPU.
#include "server/cuda/cublas.h"

#include <cstdlib>

#include "gtest/gtest.h"

namespace shardopt::gpu {
namespace {

TEST(CublasTest, AMissingLibraryIsUnimplementedAndSaysWhich) {
  // Before the first Create: the process loads (or fails to load) once.
  ASSERT_EQ(setenv("SHARDOPT_CUBLAS_LIBRARY", "/nonexistent/libcublas.so.13", 1), 0);
  absl::StatusOr<std::unique_ptr<Cublas>> cublas = Cublas::Create(nullptr);
  ASSERT_FALSE(cublas.ok());
  EXPECT_EQ(cublas.status().code(), absl::StatusCode::kUnimplemented) << cublas.status();
  EXPECT_NE(cublas.status().message().find("/nonexistent/libcublas.so.13"), std::string::npos)
      << cublas.status();
  EXPECT_NE(cublas.status().message().find("SHARDOPT_CUBLAS_LIBRARY"), std::string::npos)
      << cublas.status();
  // Again, and without making a handle: the same answer.
  EXPECT_EQ(Cublas::Create(nullptr).status(), cublas.status());
  EXPECT_EQ(Cublas::Available(), cublas.status());
}

}  // namespace
}  // namespace shardopt::gpu
