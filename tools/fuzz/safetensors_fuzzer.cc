// Fuzzes the safetensors reader (common/safetensors.h) on whole files, as
// `shardoptctl import` reads them: Open validates the header, then every
// tensor it accepted is read (the first elements, the last ones).
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "common/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string path = [] {
    char name[] = "/tmp/shardopt_safetensors_fuzz_XXXXXX";
    const int fd = mkstemp(name);
    close(fd);
    return std::string(name);
  }();
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  }
  absl::StatusOr<std::unique_ptr<shardopt::SafetensorsReader>> reader =
      shardopt::SafetensorsReader::Open(path);
  if (!reader.ok()) return 0;
  std::vector<float> values(16);
  for (const shardopt::SafetensorsTensorInfo& t : (*reader)->tensors()) {
    const uint64_t n = t.num_elements();
    const uint64_t head = std::min<uint64_t>(n, values.size());
    if (!(*reader)->ReadAsFloat(t.name, 0, head, values.data()).ok()) std::abort();
    if (!(*reader)->ReadAsFloat(t.name, n - head, head, values.data()).ok()) std::abort();
    if ((*reader)->ReadAsFloat(t.name, n, 1, values.data()).ok()) std::abort();
  }
  return 0;
}
