// SafetensorsWriter: files that round-trip through the reader bit for bit,
// the exact bytes of small files (ours and the reference implementation's
// own serialization tests), refused declarations and appends, and the
// atomic replace (no temp file left, an older file kept until Finish).
// Reading hand-made and damaged files: safetensors_reader_test.cc.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "common/safetensors.h"
#include "common/safetensors_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardopt::testing {
namespace {

using ::testing::HasSubstr;

TEST_F(SafetensorsTest, RoundTripWithOddSizesScalarAndEmpty) {
  const std::string path = Path("model.safetensors");
  const std::vector<SafetensorsWriter::TensorSpec> specs = {
      {"layer.0.weight", {3, 5}}, {"scalar", {}},      {"empty", {0}},
      {"layer.0.bias", {7}},      {"empty2d", {4, 0}}, {"big", {1031}}};
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"step", "12"}};
  std::vector<std::vector<float>> values;
  std::vector<float> all;
  for (size_t i = 0; i < specs.size(); ++i) {
    int64_t n = 1;
    for (int64_t d : specs[i].shape) n *= d;
    values.push_back(TestValues(static_cast<size_t>(n), static_cast<uint32_t>(i)));
    all.insert(all.end(), values.back().begin(), values.back().end());
  }
  auto writer = SafetensorsWriter::Create(path, specs, metadata);
  ASSERT_TRUE(writer.ok()) << writer.status();
  EXPECT_EQ((*writer)->total_elements(), all.size());
  // Chunks that split and span tensors.
  for (size_t done = 0; done < all.size();) {
    const size_t n = std::min<size_t>(13, all.size() - done);
    ASSERT_TRUE((*writer)->Append(all.data() + done, n).ok());
    done += n;
  }
  ASSERT_TRUE((*writer)->Append(nullptr, 0).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"model.safetensors"});  // No temp file.

  const std::string bytes = ReadFile(path);
  ASSERT_GE(bytes.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(bytes[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(bytes.size(), 8 + n + 4 * all.size());

  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata(), metadata);
  const auto& tensors = (*reader)->tensors();
  ASSERT_EQ(tensors.size(), specs.size());
  // Offset order; the two empty tensors sit at the offset where they were
  // declared, so it is also declaration order here except for ties.
  uint64_t offset = 0;
  for (const SafetensorsTensorInfo& t : tensors) {
    EXPECT_EQ(t.data_begin, offset) << t.name;
    offset = t.data_end;
  }
  for (size_t i = 0; i < specs.size(); ++i) {
    auto info = (*reader)->Find(specs[i].name);
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ((*info)->shape, specs[i].shape);
    EXPECT_EQ((*info)->dtype, DType::kFloat32);
    EXPECT_EQ((*info)->num_elements(), values[i].size());
    EXPECT_EQ(Bits(ReadAll(**reader, specs[i].name)), Bits(values[i])) << specs[i].name;
  }
}

TEST_F(SafetensorsTest, ExactBytesOfTinyFileWithMetadata) {
  const std::string path = Path("tiny.safetensors");
  auto writer = SafetensorsWriter::Create(path, {{"w", {2}}, {"s", {}}}, {{"k", "v"}});
  ASSERT_TRUE(writer.ok()) << writer.status();
  const float data[] = {1.0f, -2.0f, 0.5f};
  ASSERT_TRUE((*writer)->Append(data, 3).ok());
  ASSERT_TRUE((*writer)->Finish().ok());

  // 132 bytes of compact JSON, __metadata__ first, tensors in declaration
  // order, then 4 spaces so that the data starts at 8 + 136 = 144.
  const std::string header =
      R"({"__metadata__":{"k":"v"},"w":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
      R"("s":{"dtype":"F32","shape":[],"data_offsets":[8,12]}})";
  ASSERT_EQ(header.size(), 132u);
  const std::string expected = std::string("\x88\0\0\0\0\0\0\0", 8) + header + "    " +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f", 12);
  EXPECT_EQ(ReadFile(path), expected);
}

// The byte sequences of the reference implementation's own serialization
// tests (safetensors/src/tensor.rs: test_serialization, test_empty).
TEST_F(SafetensorsTest, ExactBytesMatchReferenceSerialization) {
  {
    const std::string path = Path("attn.safetensors");
    auto writer = SafetensorsWriter::Create(path, {{"attn.0", {1, 2, 3}}}, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    const float data[] = {0, 1, 2, 3, 4, 5};
    ASSERT_TRUE((*writer)->Append(data, 6).ok());
    ASSERT_TRUE((*writer)->Finish().ok());
    // 64 bytes of JSON: already aligned, no padding.
    const std::string expected =
        std::string("\x40\0\0\0\0\0\0\0", 8) +
        R"({"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}})" +
        FloatBytes({0, 1, 2, 3, 4, 5});
    EXPECT_EQ(ReadFile(path), expected);
  }
  {
    const std::string path = Path("empty.safetensors");
    auto writer = SafetensorsWriter::Create(path, {}, {});
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Finish().ok());
    EXPECT_EQ(ReadFile(path), std::string("\x08\0\0\0\0\0\0\0{}      ", 16));
    auto reader = SafetensorsReader::Open(path);
    ASSERT_TRUE(reader.ok()) << reader.status();
    EXPECT_TRUE((*reader)->tensors().empty());
    EXPECT_TRUE((*reader)->metadata().empty());
  }
  {
    const std::string path = Path("empty_meta.safetensors");
    auto writer = SafetensorsWriter::Create(path, {}, {{"framework", "pt"}});
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Finish().ok());
    EXPECT_EQ(ReadFile(path), std::string("\x28\0\0\0\0\0\0\0", 8) +
                                  R"({"__metadata__":{"framework":"pt"}})" + "     ");
  }
}

TEST_F(SafetensorsTest, WriterRefusesBadDeclarations) {
  const std::string path = Path("bad.safetensors");
  struct Case {
    std::vector<SafetensorsWriter::TensorSpec> specs;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {{{"a", {2}}, {"b", {3}}, {"a", {1}}}, "'a' is declared twice"},
           {{{"a", {2}}, {"", {3}}}, "empty name"},
           {{{"__metadata__", {2}}}, "reserved"},
           {{{"a", {2, -1}}}, "negative"},
           {{{"a", {1LL << 32, 1LL << 31}}}, "overflow"},
           {{{"a\xc3", {1}}}, "UTF-8"},
       }) {
    auto writer = SafetensorsWriter::Create(path, c.specs, {});
    EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument) << writer.status();
    EXPECT_THAT(std::string(writer.status().message()), HasSubstr(c.expected));
    EXPECT_THAT(std::string(writer.status().message()), HasSubstr(path));
  }
  auto writer = SafetensorsWriter::Create(path, {{"a", {1}}}, {{"k", "\xff"}});
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kInvalidArgument) << writer.status();
  EXPECT_TRUE(DirEntries().empty());
  writer = SafetensorsWriter::Create(Path("no/such/dir/x.safetensors"), {{"a", {1}}}, {});
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kNotFound) << writer.status();
}

TEST_F(SafetensorsTest, AppendBeyondDeclaredSizeIsRefused) {
  const std::string path = Path("over.safetensors");
  auto writer = SafetensorsWriter::Create(path, {{"a", {3}}, {"b", {2}}}, {});
  ASSERT_TRUE(writer.ok());
  const std::vector<float> data = TestValues(6, 0);
  ASSERT_TRUE((*writer)->Append(data.data(), 4).ok());
  const absl::Status s = (*writer)->Append(data.data(), 2);
  EXPECT_EQ(s.code(), absl::StatusCode::kOutOfRange) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("only 1 of 5"));
  // The writer is spent; nothing is left anywhere.
  EXPECT_EQ((*writer)->Append(data.data(), 1).code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DirEntries().empty());
}

TEST_F(SafetensorsTest, FinishWithMissingDataLeavesNoFile) {
  const std::string path = Path("short.safetensors");
  // An older file at the path survives a failed write.
  WriteFile(path, "previous");
  auto writer = SafetensorsWriter::Create(path, {{"a", {3}}, {"b", {4}}, {"c", {1}}}, {});
  ASSERT_TRUE(writer.ok());
  const std::vector<float> data = TestValues(5, 0);
  ASSERT_TRUE((*writer)->Append(data.data(), 5).ok());
  EXPECT_EQ(DirEntries().size(), 2u);  // The temp file, beside the old one.
  const absl::Status s = (*writer)->Finish();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("'b' has 2 of 4"));
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"short.safetensors"});
  EXPECT_EQ(ReadFile(path), "previous");

  std::remove(path.c_str());
  writer = SafetensorsWriter::Create(path, {{"a", {3}}}, {});
  ASSERT_TRUE(writer.ok());
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_TRUE(DirEntries().empty());
}

TEST_F(SafetensorsTest, AbandonedWriterRemovesTempFileAndFinishReplacesAtomically) {
  const std::string path = Path("atomic.safetensors");
  WriteFile(path, "previous");
  {
    auto writer = SafetensorsWriter::Create(path, {{"a", {2}}}, {});
    ASSERT_TRUE(writer.ok());
    const float v[] = {1, 2};
    ASSERT_TRUE((*writer)->Append(v, 1).ok());
  }
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"atomic.safetensors"});
  EXPECT_EQ(ReadFile(path), "previous");

  auto writer = SafetensorsWriter::Create(path, {{"a", {2}}}, {});
  ASSERT_TRUE(writer.ok());
  const float v[] = {1, 2};
  ASSERT_TRUE((*writer)->Append(v, 2).ok());
  EXPECT_EQ(ReadFile(path), "previous");  // Untouched until Finish.
  ASSERT_TRUE((*writer)->Finish().ok());
  EXPECT_EQ((*writer)->Finish().code(), absl::StatusCode::kFailedPrecondition);
  writer->reset();
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ(Bits(ReadAll(**reader, "a")), Bits({1, 2}));
  EXPECT_EQ(DirEntries(), std::vector<std::string>{"atomic.safetensors"});
}

}  // namespace
}  // namespace shardopt::testing
