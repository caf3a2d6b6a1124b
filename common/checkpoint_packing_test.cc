// Packed optimizer slots in checkpoints (format 2): Adafactor's parts store
// only each tensor's factors, the writer asks for nothing else, the reader
// gives them back at their places with zeros elsewhere for any shard count,
// and a manifest that disagrees with the packing is refused. Models
// without packed slots still write format 1.
#include "common/checkpoint_packing.h"

#include <google/protobuf/util/json_util.h>
#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/checkpoint_files.h"
#include "common/checkpoint_testing.h"
#include "common/proto_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

using checkpoint_testing::Progress;
using checkpoint_testing::TempDir;
using checkpoint_testing::WriteCheckpoint;
using ::testing::HasSubstr;

// Odd shapes: a matrix taller than wide, a 3-D tensor, a vector, a scalar,
// an empty matrix.
const std::vector<TensorSpec> kTensors = {{"w", {37, 11}}, {"cube", {2, 3, 7}}, {"b", {11}},
                                          {"s", {}},       {"none", {0, 4}},    {"e", {5, 13}}};

v1::ModelConfig AdafactorConfig(uint32_t shards) {
  const ModelLayout layout =
      ModelLayout::Create(kTensors, 16, shards, Partition::kWholeTensors).value();
  v1::ModelConfig config;
  config.set_model_id("factored");
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Adafactor());
  config.set_num_trainers(1);
  config.set_shard_count(shards);
  return config;
}

// What the server holds: section s's value at flat element i when element i
// is stored (tensor-local k < StoredSlotElements), zero otherwise.
float Held(const ModelLayout& layout, int section, uint64_t i) {
  const OptimizerConfig adafactor = OptimizerConfig::Adafactor();
  for (const TensorPlacement& t : layout.tensors()) {
    if (i < t.offset || i >= t.offset + t.size) continue;
    const uint64_t k = i - t.offset;
    const uint64_t stored =
        section == 0 ? t.size : adafactor.StoredSlotElements(section - 1, t.spec.shape, t.size);
    return k < stored ? static_cast<float>(section * 100000) + 0.25f * static_cast<float>(i) + 1
                      : 0.0f;
  }
  return 0.0f;  // Padding.
}

std::string WriteAdafactorCheckpoint(const std::string& name, uint32_t shards,
                                     uint64_t* asked_for_slots) {
  const std::string dir = TempDir(name);
  const v1::ModelConfig config = AdafactorConfig(shards);
  const ModelLayout layout = LayoutFromProto(config.layout(), shards).value();
  for (uint32_t shard = 0; shard < shards; ++shard) {
    const FlatRange range = layout.ShardRange(shard);
    absl::StatusOr<CheckpointPartWritten> w =
        WriteCheckpointPart(dir, config, shard, Progress(7),
                            [&](int section, uint64_t offset, uint64_t count, float* out) {
                              for (uint64_t k = 0; k < count; ++k) {
                                const float v = Held(layout, section, range.begin + offset + k);
                                // The writer asks a packed slot only for what it stores.
                                if (section > 0 && v == 0.0f) {
                                  return absl::InternalError(absl::StrCat(
                                      "asked for unstored element ", range.begin + offset + k,
                                      " of section ", section));
                                }
                                out[k] = v;
                              }
                              if (section > 0) *asked_for_slots += count;
                              return absl::OkStatus();
                            });
    EXPECT_TRUE(w.ok()) << w.status();
  }
  return dir;
}

TEST(CheckpointPackingTest, AdafactorPartsStoreOnlyTheFactors) {
  uint64_t asked = 0;
  const std::string dir = WriteAdafactorCheckpoint("packed", 2, &asked);
  // Factors: w 37 + 11, cube 2*3 + 2*7, b 11 (variance), s 1, none 0, e 5 + 13.
  const uint64_t factors = 37 + 11 + 6 + 14 + 11 + 1 + 5 + 13;
  EXPECT_EQ(asked, factors);
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
  EXPECT_EQ(reader->manifest().format_version(), 2u);
  uint64_t stored = 0, file_bytes = 0, range_elements = 0;
  for (const v1::CheckpointPart& part : reader->manifest().parts()) {
    ASSERT_EQ(part.sections_size(), 3);
    EXPECT_EQ(part.sections(0).num_elements(), part.range().end() - part.range().begin());
    stored += part.sections(1).num_elements() + part.sections(2).num_elements();
    file_bytes += part.file_bytes();
    range_elements += part.range().end() - part.range().begin();
  }
  EXPECT_EQ(stored, factors);
  // Header, the parameters and the factors: nothing else on disk.
  EXPECT_EQ(file_bytes, 2 * kCheckpointHeaderBytes + 4 * (range_elements + factors));
  ASSERT_TRUE(reader->VerifyEveryBlock().ok());

  // Every element where it was, for the saved layout and for others.
  const ModelLayout saved = reader->layout();
  for (int section = 0; section < 3; ++section) {
    std::vector<float> all(saved.total_elements());
    ASSERT_TRUE(reader->Read(section, 0, all.size(), all.data()).ok());
    for (uint64_t i = 0; i < all.size(); ++i) {
      ASSERT_EQ(all[i], Held(saved, section, i)) << "section " << section << " element " << i;
    }
    // Windows that start and end inside tensors.
    std::vector<float> window(29);
    ASSERT_TRUE(reader->Read(section, 30, window.size(), window.data()).ok());
    for (uint64_t k = 0; k < window.size(); ++k) {
      ASSERT_EQ(window[k], Held(saved, section, 30 + k)) << section << " " << k;
    }
    for (uint32_t shards : {1u, 3u, 5u}) {
      const ModelLayout target =
          ModelLayout::Create(kTensors, 16, shards, Partition::kWholeTensors).value();
      std::vector<float> values(target.total_elements());
      ASSERT_TRUE(reader->ReadFor(target, section, 0, values.size(), values.data()).ok());
      for (const TensorPlacement& t : target.tensors()) {
        const TensorPlacement& u = saved.tensors()[saved.Find(t.spec.name).value()];
        for (uint64_t k = 0; k < t.size; ++k) {
          ASSERT_EQ(values[t.offset + k], Held(saved, section, u.offset + k))
              << t.spec.name << " " << k << " on " << shards << " shards";
        }
      }
    }
  }
}

TEST(CheckpointPackingTest, OtherModelsStillWriteFormatOne) {
  const std::string dir = WriteCheckpoint("unpacked", 3);
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
  EXPECT_EQ(reader->manifest().format_version(), 1u);
  for (const v1::CheckpointPart& part : reader->manifest().parts()) {
    for (const v1::CheckpointSection& section : part.sections()) {
      EXPECT_EQ(section.num_elements(), part.range().end() - part.range().begin());
    }
  }
}

// A manifest edited so that it disagrees with the packing: refused as
// damage, naming the section.
TEST(CheckpointPackingTest, ManifestsThatDisagreeWithThePackingAreRefused) {
  uint64_t asked = 0;
  const std::string dir = WriteAdafactorCheckpoint("packed_bad", 2, &asked);
  const std::string path = dir + "/manifest.json";
  std::stringstream text;
  text << std::ifstream(path).rdbuf();
  v1::CheckpointManifest original;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &original).ok());
  auto open_with = [&](const std::function<void(v1::CheckpointManifest&)>& edit) {
    v1::CheckpointManifest m = original;
    edit(m);
    std::string json;
    EXPECT_TRUE(google::protobuf::util::MessageToJsonString(m, &json).ok());
    std::ofstream(path, std::ios::trunc) << json;
    return CheckpointReader::Open(dir).status();
  };
  absl::Status s = open_with([](v1::CheckpointManifest& m) {
    v1::CheckpointSection* rows = m.mutable_parts(0)->mutable_sections(1);
    rows->set_num_elements(rows->num_elements() + 1);
  });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("section 1 ('row_var') of part 0"));
  // Format 1 sizes every section by the range: these packed ones no longer
  // match (the header says 2 as well).
  s = open_with([](v1::CheckpointManifest& m) { m.set_format_version(1); });
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_THAT(std::string(s.message()), HasSubstr("('row_var') of part 0 does not match"));
  // A newer format than this build reads.
  s = open_with([](v1::CheckpointManifest& m) { m.set_format_version(3); });
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  // The original opens again.
  EXPECT_TRUE(open_with([](v1::CheckpointManifest&) {}).ok());
}

// Shards of two builds (a rolling upgrade): a part record of format 1 next
// to one of format 2 is never committed into a manifest Open would refuse.
TEST(CheckpointPackingTest, PartsOfDifferentFormatsAreNotCommitted) {
  const std::string dir = TempDir("mixed_formats");
  const v1::ModelConfig config = AdafactorConfig(2);
  const ModelLayout layout = LayoutFromProto(config.layout(), 2).value();
  auto write = [&](uint32_t shard) {
    const FlatRange range = layout.ShardRange(shard);
    return WriteCheckpointPart(dir, config, shard, Progress(7),
                               [&](int section, uint64_t offset, uint64_t count, float* out) {
                                 for (uint64_t k = 0; k < count; ++k) {
                                   out[k] = Held(layout, section, range.begin + offset + k);
                                 }
                                 return absl::OkStatus();
                               });
  };
  ASSERT_TRUE(write(0).ok());
  // Shard 0's record as an older build would have written it.
  const std::string record = dir + "/" + CheckpointPartRecordName(0, 2);
  std::stringstream text;
  text << std::ifstream(record).rdbuf();
  v1::CheckpointManifest part;
  ASSERT_TRUE(google::protobuf::util::JsonStringToMessage(text.str(), &part).ok());
  part.set_format_version(1);
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(part, &json).ok());
  std::ofstream(record, std::ios::trunc) << json;
  absl::StatusOr<CheckpointPartWritten> second = write(1);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition) << second.status();
  EXPECT_THAT(std::string(second.status().message()), HasSubstr("shard 1 wrote format 2"));
  EXPECT_EQ(CheckpointReader::Open(dir).status().code(), absl::StatusCode::kNotFound);
}

// A format 1 Adafactor checkpoint, as builds before format 2 wrote it:
// every section range-sized, the factors at the start of each tensor's
// part and zeros elsewhere. The old writer is gone, so one is made here by
// rewriting a format 2 checkpoint's files and manifest the old way (header
// version 1, full-size sections, their block CRCs): it reads back the same
// values, for its own layout and for another shard count.
TEST(CheckpointPackingTest, FormatOneAdafactorCheckpointsStillRead) {
  uint64_t asked = 0;
  const std::string dir = WriteAdafactorCheckpoint("format1", 2, &asked);
  std::unique_ptr<CheckpointReader> packed = CheckpointReader::Open(dir).value();
  const ModelLayout saved = packed->layout();
  std::vector<std::vector<float>> all(3, std::vector<float>(saved.total_elements()));
  for (int section = 0; section < 3; ++section) {
    ASSERT_TRUE(packed->Read(section, 0, all[section].size(), all[section].data()).ok());
  }
  v1::CheckpointManifest m = packed->manifest();
  packed.reset();
  m.set_format_version(1);
  for (int p = 0; p < m.parts_size(); ++p) {
    v1::CheckpointPart* part = m.mutable_parts(p);
    const std::string path = dir + "/" + part->file();
    std::string data(kCheckpointHeaderBytes, '\0');
    std::ifstream(path, std::ios::binary).read(data.data(), kCheckpointHeaderBytes);
    const uint32_t version = 1;
    std::memcpy(&data[8], &version, sizeof(version));  // (Magic, then the version.)
    const uint64_t begin = part->range().begin();
    const uint64_t size = part->range().end() - begin;
    for (int section = 0; section < 3; ++section) {
      v1::CheckpointSection* out = part->mutable_sections(section);
      out->set_file_offset(data.size());
      out->set_num_elements(size);
      out->clear_block_crc32();
      const char* bytes = reinterpret_cast<const char*>(all[section].data() + begin);
      for (uint64_t at = 0; at < size * 4; at += part->block_bytes()) {
        const uint64_t n = std::min<uint64_t>(part->block_bytes(), size * 4 - at);
        out->add_block_crc32(static_cast<uint32_t>(
            crc32(0L, reinterpret_cast<const Bytef*>(bytes + at), static_cast<uInt>(n))));
      }
      data.append(bytes, size * 4);
    }
    part->set_file_bytes(data.size());
    std::ofstream(path, std::ios::binary | std::ios::trunc) << data;
  }
  std::string json;
  ASSERT_TRUE(google::protobuf::util::MessageToJsonString(m, &json).ok());
  std::ofstream(dir + "/manifest.json", std::ios::trunc) << json;

  absl::StatusOr<std::unique_ptr<CheckpointReader>> old = CheckpointReader::Open(dir);
  ASSERT_TRUE(old.ok()) << old.status();
  EXPECT_EQ((*old)->manifest().format_version(), 1u);
  ASSERT_TRUE((*old)->VerifyEveryBlock().ok());
  const ModelLayout three = ModelLayout::Create(kTensors, 16, 3, Partition::kWholeTensors).value();
  for (int section = 0; section < 3; ++section) {
    std::vector<float> values(saved.total_elements());
    ASSERT_TRUE((*old)->Read(section, 0, values.size(), values.data()).ok());
    EXPECT_EQ(values, all[section]) << "section " << section;
    std::vector<float> resharded(three.total_elements());
    ASSERT_TRUE((*old)->ReadFor(three, section, 0, resharded.size(), resharded.data()).ok());
    for (const TensorPlacement& t : three.tensors()) {
      const TensorPlacement& u = saved.tensors()[saved.Find(t.spec.name).value()];
      for (uint64_t k = 0; k < t.size; ++k) {
        ASSERT_EQ(resharded[t.offset + k], all[section][u.offset + k]) << t.spec.name << " " << k;
      }
    }
  }
}

// The runs themselves: clipped to the window asked for, in order.
TEST(CheckpointPackingTest, RunsAreClippedToTheWindow) {
  const ModelLayout layout = ModelLayout::Create(kTensors, 16, 1, Partition::kWholeTensors).value();
  const OptimizerConfig adafactor = OptimizerConfig::Adafactor();
  PackedSection rows = PackedSection::Create(layout, layout.ShardRange(0), adafactor, 0).value();
  const TensorPlacement& w = layout.tensors()[0];
  std::vector<PackedSection::Run> runs = rows.RunsIn(w.offset + 5, w.offset + 20);
  ASSERT_EQ(runs.size(), 1u);
  EXPECT_EQ(runs[0].flat_begin, w.offset + 5);
  EXPECT_EQ(runs[0].count, 15u);
  EXPECT_EQ(runs[0].packed_begin, 5u);  // w is first: its row factors start the section.
  // From inside w's factors to inside cube's: w's last 32, then all 6 of cube's.
  const TensorPlacement& cube = layout.tensors()[1];
  runs = rows.RunsIn(w.offset + 5, cube.offset + 10);
  ASSERT_EQ(runs.size(), 2u);
  EXPECT_EQ(runs[0].count, 32u);
  EXPECT_EQ(runs[1].flat_begin, cube.offset);
  EXPECT_EQ(runs[1].count, 6u);
  EXPECT_EQ(runs[1].packed_begin, 37u);
  EXPECT_EQ(rows.RunsIn(w.offset + 37, w.offset + 100).size(), 0u);
  EXPECT_EQ(rows.RunsIn(0, layout.total_elements()).size(), 5u);  // All but "none".
  EXPECT_FALSE(
      PackedSection::Create(layout, layout.ShardRange(0), OptimizerConfig::AdamW(), 0).ok());
  const ModelLayout flat = ModelLayout::Create(kTensors, 16, 2).value();
  absl::StatusOr<PackedSection> straddling =
      PackedSection::Create(flat, flat.ShardRange(0), adafactor, 0);
  EXPECT_EQ(straddling.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(straddling.status().message()), HasSubstr("whole tensors"));
}

}  // namespace
}  // namespace shardopt
