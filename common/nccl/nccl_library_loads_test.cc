// The real libnccl (CUDA's, named by SHARDOPT_NCCL_LIBRARY in the BUILD):
// every function resolves, the version is known, and a unique id can be
// made, which needs no GPU (NCCL's bootstrap only opens a socket). So the
// loader is checked here, where no pair can run.
#include <cstdlib>

#include "common/nccl/nccl_library.h"
#include "common/nccl/nccl_pair.h"
#include "gtest/gtest.h"

namespace shardopt::nccl {
namespace {

TEST(NcclLibraryLoadsTest, EveryFunctionResolvesAndAnIdCanBeMade) {
  absl::StatusOr<const NcclLibrary*> library = NcclLibrary::Load();
  ASSERT_TRUE(library.ok()) << library.status();
  const char* chosen = std::getenv("SHARDOPT_NCCL_LIBRARY");
  ASSERT_NE(chosen, nullptr) << "the BUILD sets SHARDOPT_NCCL_LIBRARY";
  EXPECT_EQ((*library)->path, chosen);
  EXPECT_GE((*library)->version, 21900);
  absl::StatusOr<std::string> a = NcclPair::NewUniqueId();
  ASSERT_TRUE(a.ok()) << a.status();
  absl::StatusOr<std::string> b = NcclPair::NewUniqueId();
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_EQ(a->size(), kUniqueIdBytes);
  EXPECT_NE(*a, *b);
  printf("NCCL %d from %s\n", (*library)->version, (*library)->path.c_str());
}

}  // namespace
}  // namespace shardopt::nccl
