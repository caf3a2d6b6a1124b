// Fuzzes the checkpoint reader (common/checkpoint_files.h) on a manifest and
// a part file, as a shard restoring from a damaged or hostile directory
// reads them: Open (manifest, part headers, sizes), then every block's
// checksum, then reads of each section. Input: a 32-bit manifest length,
// the manifest, then the data file of shard 0 of 1.
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/checkpoint_files.h"
#include "common/file.h"
#include "tools/fuzz/fuzz_input.h"

namespace {

void Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string dir = [] {
    char name[] = "/tmp/shardopt_checkpoint_fuzz_XXXXXX";
    return std::string(mkdtemp(name));
  }();
  shardopt::fuzz::FuzzInput input(data, size);
  const std::string manifest = input.Bytes(input.U32());
  Write(shardopt::JoinPath(dir, shardopt::kCheckpointManifestFile), manifest);
  Write(shardopt::JoinPath(dir, shardopt::CheckpointDataFileName(0, 1)), input.Rest());
  absl::StatusOr<std::unique_ptr<shardopt::CheckpointReader>> reader =
      shardopt::CheckpointReader::Open(dir);
  if (!reader.ok()) return 0;
  const bool verified = (*reader)->VerifyEveryBlock().ok();
  const uint64_t total = (*reader)->layout().total_elements();
  std::vector<float> values(std::min<uint64_t>(total, 64));
  for (size_t section = 0; section < (*reader)->section_names().size(); ++section) {
    const absl::Status read =
        (*reader)->Read(static_cast<int>(section), 0, values.size(), values.data());
    // Whatever verified whole reads.
    if (verified && !read.ok()) std::abort();
  }
  return 0;
}
