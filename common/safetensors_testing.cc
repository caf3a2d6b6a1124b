// SafetensorsTest's directory and the shared helpers of the safetensors
// tests (safetensors_testing.h).
#include "common/safetensors_testing.h"

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "common/float_bits.h"

namespace shardopt::testing {

void SafetensorsTest::SetUp() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  dir_ = absl::StrCat(::testing::TempDir(), "/safetensors_test_", getpid(), "_", info->name());
  RemoveDir();
  ASSERT_EQ(mkdir(dir_.c_str(), 0755), 0) << dir_;
}

void SafetensorsTest::TearDown() { RemoveDir(); }

void SafetensorsTest::RemoveDir() const {
  for (const std::string& name : DirEntries()) std::remove(Path(name).c_str());
  rmdir(dir_.c_str());
}

std::string SafetensorsTest::Path(const std::string& name) const {
  return absl::StrCat(dir_, "/", name);
}

std::vector<std::string> SafetensorsTest::DirEntries() const {
  std::vector<std::string> names;
  DIR* d = opendir(dir_.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  std::sort(names.begin(), names.end());
  return names;
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

void WriteFile(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

std::string FloatBytes(const std::vector<float>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * 4);
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(FloatToBits(v));
  return bits;
}

std::vector<float> ReadAll(const SafetensorsReader& reader, const std::string& name) {
  const auto info = reader.Find(name);
  EXPECT_TRUE(info.ok()) << info.status();
  if (!info.ok()) return {};
  std::vector<float> out((*info)->num_elements());
  const absl::Status s = reader.ReadAsFloat(name, 0, out.size(), out.data());
  EXPECT_TRUE(s.ok()) << s;
  return out;
}

std::vector<float> TestValues(size_t n, uint32_t seed) {
  std::vector<float> v(n);
  const float specials[] = {-0.0f,
                            BitsToFloat(0x00000001u),
                            std::numeric_limits<float>::infinity(),
                            -std::numeric_limits<float>::infinity(),
                            BitsToFloat(0x7fc12345u),
                            std::numeric_limits<float>::max()};
  for (size_t i = 0; i < n; ++i) {
    v[i] = i % 7 == 3 ? specials[(i / 7 + seed) % 6] : static_cast<float>(seed * 1000 + i) * 0.37f;
  }
  return v;
}

}  // namespace shardopt::testing
