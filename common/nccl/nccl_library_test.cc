// NcclLibrary's loader where the library cannot be had: a clear
// UNIMPLEMENTED naming what was tried (the pair's transfers then go over
// gRPC). Runs everywhere: it needs neither NCCL nor a GPU.
#include "common/nccl/nccl_library.h"

#include <cstdlib>

#include "common/nccl/nccl_pair.h"
#include "gtest/gtest.h"

namespace shardopt::nccl {
namespace {

TEST(NcclLibraryTest, AMissingLibraryIsUnimplementedAndSaysWhich) {
  // Before the first load: the process loads (or fails to) once.
  ASSERT_EQ(setenv("SHARDOPT_NCCL_LIBRARY", "/nonexistent/libnccl.so.2", 1), 0);
  absl::StatusOr<const NcclLibrary*> library = NcclLibrary::Load();
  ASSERT_FALSE(library.ok());
  EXPECT_EQ(library.status().code(), absl::StatusCode::kUnimplemented) << library.status();
  EXPECT_NE(library.status().message().find("/nonexistent/libnccl.so.2"), std::string::npos)
      << library.status();
  EXPECT_NE(library.status().message().find("SHARDOPT_NCCL_LIBRARY"), std::string::npos);
  EXPECT_EQ(NcclPair::Available(), library.status());
  EXPECT_EQ(NcclPair::NewUniqueId().status(), library.status());
}

}  // namespace
}  // namespace shardopt::nccl
