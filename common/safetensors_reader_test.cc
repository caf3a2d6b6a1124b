// SafetensorsReader: slices and bad ranges, files truncated before or after
// opening, every malformed header the format rules out (bad JSON, bad
// entries, duplicate keys, overlaps, holes, size mismatches, other dtypes),
// BF16 and F16 widened exactly, and a file written by the reference
// implementation. Writing: safetensors_writer_test.cc.
#include <sys/types.h>
#include <unistd.h>

#include <cstdint>
#include <limits>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/float_bits.h"
#include "common/safetensors.h"
#include "common/safetensors_testing.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardopt::testing {
namespace {

using ::testing::HasSubstr;

// `v` as 8 little-endian bytes: the size field that starts a file.
std::string U64Le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

// A file as the spec lays it out: size, header (padded with spaces to 8 bytes
// when `pad`), data.
std::string MakeFile(std::string header, const std::string& data, bool pad = true) {
  if (pad) header.append((8 - header.size() % 8) % 8, ' ');
  return U64Le(header.size()) + header + data;
}

// 16-bit patterns (BF16, F16) as little-endian bytes.
std::string U16Bytes(const std::vector<uint16_t>& values) {
  std::string s;
  for (uint16_t v : values) {
    s.push_back(static_cast<char>(v & 0xff));
    s.push_back(static_cast<char>(v >> 8));
  }
  return s;
}

// Writes `bytes` to `path` and opens it.
absl::StatusOr<std::unique_ptr<SafetensorsReader>> OpenBytes(const std::string& path,
                                                             const std::string& bytes) {
  WriteFile(path, bytes);
  return SafetensorsReader::Open(path);
}

TEST_F(SafetensorsTest, ReadsSlicesAndRefusesBadRanges) {
  const std::string path = Path("slice.safetensors");
  std::vector<float> a = TestValues(10, 1), b = TestValues(20, 2);
  auto writer = SafetensorsWriter::Create(path, {{"a", {10}}, {"b", {4, 5}}}, {});
  ASSERT_TRUE(writer.ok()) << writer.status();
  ASSERT_TRUE((*writer)->Append(a.data(), a.size()).ok());
  ASSERT_TRUE((*writer)->Append(b.data(), b.size()).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();

  std::vector<float> out(7);
  ASSERT_TRUE((*reader)->ReadAsFloat("b", 3, 7, out.data()).ok());
  EXPECT_EQ(Bits(out), Bits(std::vector<float>(b.begin() + 3, b.begin() + 10)));
  ASSERT_TRUE((*reader)->ReadAsFloat("b", 19, 1, out.data()).ok());
  EXPECT_EQ(FloatToBits(out[0]), FloatToBits(b[19]));
  EXPECT_TRUE((*reader)->ReadAsFloat("b", 20, 0, out.data()).ok());

  EXPECT_EQ((*reader)->ReadAsFloat("b", 15, 6, out.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadAsFloat("b", 21, 0, out.data()).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadAsFloat("b", 1, std::numeric_limits<uint64_t>::max(), out.data()).code(),
            absl::StatusCode::kOutOfRange);
  EXPECT_EQ((*reader)->ReadAsFloat("c", 0, 1, out.data()).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ((*reader)->Find("c").status().code(), absl::StatusCode::kNotFound);
}

// A reader opened on a file that is then cut short reports DATA_LOSS on the
// read rather than returning garbage.
TEST_F(SafetensorsTest, FileTruncatedAfterOpen) {
  const std::string path = Path("shrink.safetensors");
  std::vector<float> a = TestValues(100, 1);
  auto writer = SafetensorsWriter::Create(path, {{"a", {100}}}, {});
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append(a.data(), a.size()).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  auto reader = SafetensorsReader::Open(path);
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ(truncate(path.c_str(), static_cast<off_t>(ReadFile(path).size() - 40)), 0);
  std::vector<float> out(100);
  const absl::Status s = (*reader)->ReadAsFloat("a", 0, 100, out.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_TRUE((*reader)->ReadAsFloat("a", 0, 50, out.data()).ok());
}

TEST_F(SafetensorsTest, RefusesTruncatedFile) {
  const std::string path = Path("cut.safetensors");
  auto writer = SafetensorsWriter::Create(path, {{"first", {4}}, {"last", {4}}}, {});
  ASSERT_TRUE(writer.ok());
  const std::vector<float> data = TestValues(8, 3);
  ASSERT_TRUE((*writer)->Append(data.data(), data.size()).ok());
  ASSERT_TRUE((*writer)->Finish().ok());
  const std::string bytes = ReadFile(path);

  auto reader = OpenBytes(path, bytes.substr(0, bytes.size() - 3));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("'last'"));

  reader = OpenBytes(path, bytes.substr(0, bytes.size() - 20));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("'first'"));

  // Cut inside the header, and inside the size field.
  reader = OpenBytes(path, bytes.substr(0, 20));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  reader = OpenBytes(path, bytes.substr(0, 5));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  reader = OpenBytes(path, "");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
}

TEST_F(SafetensorsTest, RefusesHeaderSizeLargerThanFile) {
  const std::string path = Path("big_n.safetensors");
  auto reader = OpenBytes(path, U64Le(1000) + "{}      ");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kDataLoss) << reader.status();
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("1000"));
  // Beyond the format's 100 MB limit: refused before anything is read.
  reader = OpenBytes(path, U64Le(100'000'001) + "{}      ");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  reader = OpenBytes(path, U64Le(std::numeric_limits<uint64_t>::max()) + "{}      ");
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
}

TEST_F(SafetensorsTest, RefusesBadJson) {
  const std::string path = Path("bad_json.safetensors");
  for (const std::string& header : {
           std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]})"),  // No '}'.
           std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}}x)"),
           std::string("{\"a\xff\":{}}"),  // Not UTF-8.
           std::string(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})") + '\0',
       }) {
    auto reader = OpenBytes(path, MakeFile(header, FloatBytes({1.0f})));
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr("JSON")) << reader.status();
  }
  // Not a JSON object, or no JSON at all.
  for (const std::string& header :
       {std::string("[1, 2]"), std::string("\"x\""), std::string(""), std::string("   ")}) {
    auto reader = OpenBytes(path, MakeFile(header, "", /*pad=*/false));
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  }
  // Whitespace around the object is fine (the reference accepts both).
  auto reader = OpenBytes(path, MakeFile(" \n{}\t\r\n", "", /*pad=*/false));
  EXPECT_TRUE(reader.ok()) << reader.status();
}

TEST_F(SafetensorsTest, RefusesMalformedEntries) {
  const std::string path = Path("entries.safetensors");
  const std::string data = FloatBytes({1.0f, 2.0f});
  for (const char* header : {
           R"({"a":[1]})",                                                 // Not an object.
           R"({"a":{"shape":[2],"data_offsets":[0,8]}})",                  // No dtype.
           R"({"a":{"dtype":3,"shape":[2],"data_offsets":[0,8]}})",        // dtype not string.
           R"({"a":{"dtype":"F32","data_offsets":[0,8]}})",                // No shape.
           R"({"a":{"dtype":"F32","shape":[-2],"data_offsets":[0,8]}})",   // Negative dim.
           R"({"a":{"dtype":"F32","shape":[2.0],"data_offsets":[0,8]}})",  // Float dim.
           R"({"a":{"dtype":"F32","shape":[2]}})",                         // No offsets.
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0]}})",      // One offset.
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8,8]}})",  // Three.
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8.0]}})",  // Float.
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[-8,0]}})",   // Negative.
           R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[8,0]}})",    // end < begin.
           R"({"__metadata__":{"k":1},"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           R"({"__metadata__":[],"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
           // Overflowing element count.
           R"({"a":{"dtype":"F32","shape":[4294967296,4294967296],"data_offsets":[0,8]}})",
           R"({"a":{"dtype":"F32","shape":[9223372036854775808],"data_offsets":[0,8]}})",
       }) {
    auto reader = OpenBytes(path, MakeFile(header, data));
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument)
        << header << " -> " << reader.status();
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  }
  // Fields beyond the three are ignored (as the reference does), and a null
  // __metadata__ is no metadata.
  auto reader = OpenBytes(
      path,
      MakeFile(
          R"({"__metadata__":null,"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8],"x":1}})",
          data));
  EXPECT_TRUE(reader.ok()) << reader.status();
}

TEST_F(SafetensorsTest, RefusesDuplicateKeys) {
  const std::string path = Path("dup.safetensors");
  const std::string data = FloatBytes({1.0f, 2.0f});
  auto reader = OpenBytes(path, MakeFile(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                                         R"("a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                                         data));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("'a'"));
  reader = OpenBytes(
      path,
      MakeFile(R"({"a":{"dtype":"F32","dtype":"F16","shape":[2],"data_offsets":[0,8]}})", data));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
  reader = OpenBytes(path, MakeFile(R"({"__metadata__":{"k":"1","k":"2"},)"
                                    R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                                    data));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument) << reader.status();
}

TEST_F(SafetensorsTest, RefusesOverlapsHolesAndSizeMismatch) {
  const std::string path = Path("layout.safetensors");
  const std::string data16 = FloatBytes({1, 2, 3, 4});
  struct Case {
    const char* header;
    const char* expected;
  };
  for (const Case& c : std::vector<Case>{
           {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
            "overlaps"},
           // Same range twice.
           {R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
            R"("c":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            "overlaps"},
           // A hole between two tensors.
           {R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
            R"("b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
            "belong to no tensor"},
           // A hole at the start.
           {R"({"b":{"dtype":"F32","shape":[3],"data_offsets":[4,16]}})", "belong to no tensor"},
           // Bytes after the last tensor.
           {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,12]}})", "after the last"},
           // Shape says 12 bytes, offsets say 16.
           {R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,16]}})", "12 bytes"},
           // F16 of 8 elements is 16 bytes, not 32.
           {R"({"a":{"dtype":"F16","shape":[8],"data_offsets":[0,32]}})", "16 bytes"},
       }) {
    auto reader = OpenBytes(path, MakeFile(c.header, data16));
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kInvalidArgument)
        << c.header << " -> " << reader.status();
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(c.expected)) << c.header;
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  }
  // Entries out of offset order are fine: the spec orders by offset, not by
  // the header's key order.
  auto reader =
      OpenBytes(path, MakeFile(R"({"b":{"dtype":"F32","shape":[2],"data_offsets":[8,16]},)"
                               R"("a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})",
                               data16));
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->tensors()[0].name, "a");
  EXPECT_EQ(Bits(ReadAll(**reader, "b")), Bits({3, 4}));
  // An unpadded header is valid too (older writers did not pad).
  reader = OpenBytes(path, MakeFile(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})",
                                    data16, /*pad=*/false));
  ASSERT_TRUE(reader.ok()) << reader.status();
}

TEST_F(SafetensorsTest, RefusesOtherDtypes) {
  const std::string path = Path("dtype.safetensors");
  for (const char* dtype : {"I64", "F64", "U8", "BOOL", "F8_E4M3", "Q7", "f32"}) {
    const std::string header =
        absl::StrCat(R"({"ok":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"odd":{"dtype":")",
                     dtype, R"(","shape":[1],"data_offsets":[4,12]}})");
    auto reader = OpenBytes(path, MakeFile(header, std::string(12, '\0')));
    EXPECT_EQ(reader.status().code(), absl::StatusCode::kUnimplemented) << reader.status();
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr("'odd'"));
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(absl::StrCat("\"", dtype, "\"")));
    EXPECT_THAT(std::string(reader.status().message()), HasSubstr(path));
  }
}

TEST_F(SafetensorsTest, OpenMissingFile) {
  auto reader = SafetensorsReader::Open(Path("absent.safetensors"));
  EXPECT_EQ(reader.status().code(), absl::StatusCode::kNotFound) << reader.status();
  EXPECT_THAT(std::string(reader.status().message()), HasSubstr("absent.safetensors"));
}

TEST_F(SafetensorsTest, ReadsBFloat16AndFloat16Exactly) {
  // fp16 bit patterns and their exact fp32 values: +-0, 1, -2, the largest
  // finite (65504), the smallest and largest subnormals, the smallest normal,
  // +-inf, NaN, and 0x3555 (0.333251953125).
  const std::vector<uint16_t> half = {0x0000, 0x8000, 0x3c00, 0xc000, 0x7bff, 0x0001,
                                      0x03ff, 0x0400, 0x7c00, 0xfc00, 0x7e00, 0x3555};
  const std::vector<uint32_t> half_as_float = {0x00000000, 0x80000000, 0x3f800000, 0xc0000000,
                                               0x477fe000, 0x33800000, 0x387fc000, 0x38800000,
                                               0x7f800000, 0xff800000, 0x7fc00000, 0x3eaaa000};
  // More than one read chunk (65536 elements) of bf16: every 16-bit pattern,
  // then some; bf16 widens to its bits << 16.
  std::vector<uint16_t> bf16(70001);
  for (size_t i = 0; i < bf16.size(); ++i) bf16[i] = static_cast<uint16_t>(i * 40503u);
  const std::string header = absl::StrCat(
      R"({"h":{"dtype":"F16","shape":[3,4],"data_offsets":[0,24]},)",
      R"("s":{"dtype":"BF16","shape":[],"data_offsets":[24,26]},)",
      R"("b":{"dtype":"BF16","shape":[70001],"data_offsets":[26,)", 26 + 2 * bf16.size(), "]}}");
  const std::string path = Path("half.safetensors");
  auto reader =
      OpenBytes(path, MakeFile(header, U16Bytes(half) + U16Bytes({0xc0a0}) + U16Bytes(bf16)));
  ASSERT_TRUE(reader.ok()) << reader.status();
  ASSERT_EQ((*reader)->tensors().size(), 3u);
  EXPECT_EQ((*reader)->tensors()[0].dtype, DType::kFloat16);
  EXPECT_EQ((*reader)->tensors()[1].dtype, DType::kBFloat16);
  EXPECT_EQ((*reader)->tensors()[1].shape, std::vector<int64_t>{});

  EXPECT_EQ(Bits(ReadAll(**reader, "h")), half_as_float);
  EXPECT_EQ(Bits(ReadAll(**reader, "s")), std::vector<uint32_t>{0xc0a00000u});  // -5
  const std::vector<float> b = ReadAll(**reader, "b");
  ASSERT_EQ(b.size(), bf16.size());
  for (size_t i = 0; i < b.size(); ++i) {
    ASSERT_EQ(FloatToBits(b[i]), static_cast<uint32_t>(bf16[i]) << 16) << i;
  }
  // A slice at an odd offset crossing the chunk boundary.
  std::vector<float> slice(1001);
  ASSERT_TRUE((*reader)->ReadAsFloat("b", 65001, slice.size(), slice.data()).ok());
  for (size_t i = 0; i < slice.size(); ++i) {
    ASSERT_EQ(FloatToBits(slice[i]), static_cast<uint32_t>(bf16[65001 + i]) << 16) << i;
  }
  std::vector<float> h(3);
  ASSERT_TRUE((*reader)->ReadAsFloat("h", 5, 3, h.data()).ok());
  EXPECT_EQ(Bits(h), std::vector<uint32_t>(half_as_float.begin() + 5, half_as_float.begin() + 8));
}

// A file written by the reference implementation (safetensors 0.8.0 under
// PyTorch 1.13), byte for byte:
//   from safetensors.torch import save_file
//   save_file({"w": torch.tensor([[1.0, -2.5, 3.0e-40], [float("inf"), -0.0, 0.1]]),
//              "h": torch.tensor([1.0, -65504.0, 2.0**-24, 0.1], dtype=torch.float16),
//              "b": torch.tensor([1.0, -3.0e38, 0.1], dtype=torch.bfloat16),
//              "s": torch.tensor(7.0, dtype=torch.bfloat16)},
//             "torch_saved.safetensors", metadata={"format": "pt", "source": "save_file"})
// The expected values are torch's own `.float().view(torch.int32)`.
TEST_F(SafetensorsTest, ReadsFileWrittenByReferenceImplementation) {
  const std::string header = R"({"__metadata__":{"source":"save_file","format":"pt"},)"
                             R"("w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},)"
                             R"("b":{"dtype":"BF16","shape":[3],"data_offsets":[24,30]},)"
                             R"("s":{"dtype":"BF16","shape":[],"data_offsets":[30,32]},)"
                             R"("h":{"dtype":"F16","shape":[4],"data_offsets":[32,40]}}     )";
  ASSERT_EQ(header.size(), 280u);
  const std::string data = absl::HexStringToBytes(
      "0000803f000020c0474403000000807f00000080cdcccc3d803f62ffcd3de040003cfffb0100662e");
  const std::string path = Path("torch_saved.safetensors");
  auto reader = OpenBytes(path, U64Le(280) + header + data);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->metadata(),
            (std::map<std::string, std::string>{{"format", "pt"}, {"source", "save_file"}}));
  std::vector<std::string> names;
  for (const auto& t : (*reader)->tensors()) names.push_back(t.name);
  EXPECT_EQ(names, (std::vector<std::string>{"w", "b", "s", "h"}));
  EXPECT_EQ((*(*reader)->Find("w"))->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(Bits(ReadAll(**reader, "w")),
            (std::vector<uint32_t>{0x3f800000, 0xc0200000, 0x00034447, 0x7f800000, 0x80000000,
                                   0x3dcccccd}));
  EXPECT_EQ(Bits(ReadAll(**reader, "h")),
            (std::vector<uint32_t>{0x3f800000, 0xc77fe000, 0x33800000, 0x3dccc000}));
  EXPECT_EQ(Bits(ReadAll(**reader, "b")),
            (std::vector<uint32_t>{0x3f800000, 0xff620000, 0x3dcd0000}));
  EXPECT_EQ(Bits(ReadAll(**reader, "s")), std::vector<uint32_t>{0x40e00000});
}

}  // namespace
}  // namespace shardopt::testing
