// Test support for safetensors_writer_test and safetensors_reader_test:
// SafetensorsTest (a fresh empty directory per test, so that "no file left
// behind" checks can list it), whole-file reads and writes, and values and
// bit patterns to compare tensors with.
#ifndef SHARDOPT_COMMON_SAFETENSORS_TESTING_H_
#define SHARDOPT_COMMON_SAFETENSORS_TESTING_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "gtest/gtest.h"

namespace shardopt::testing {

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override;
  void TearDown() override;

  // The tests' directories hold plain files only.
  void RemoveDir() const;

  // `name` in the test's directory.
  std::string Path(const std::string& name) const;

  // The names in the test's directory, sorted.
  std::vector<std::string> DirEntries() const;

  std::string dir_;
};

std::string ReadFile(const std::string& path);
void WriteFile(const std::string& path, const std::string& bytes);

// The values' bytes as stored (little-endian fp32).
std::string FloatBytes(const std::vector<float>& values);

// The values' fp32 bit patterns, so that comparisons are bit for bit.
std::vector<uint32_t> Bits(const std::vector<float>& values);

// Every element of tensor `name` as fp32 (a test failure when it is absent
// or unreadable).
std::vector<float> ReadAll(const SafetensorsReader& reader, const std::string& name);

// Values of every class, so that "bit-identical" means something: -0, a
// subnormal, infinities and a NaN payload.
std::vector<float> TestValues(size_t n, uint32_t seed);

}  // namespace shardopt::testing

#endif  // SHARDOPT_COMMON_SAFETENSORS_TESTING_H_
