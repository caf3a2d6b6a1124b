// Checkpoint files: parts committed by a manifest, read back for other shard
// counts, and every damaged or torn checkpoint refused with the file named.
#include "common/checkpoint_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/checkpoint_testing.h"
#include "common/proto_convert.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

constexpr int64_t kNoLimit = std::numeric_limits<int64_t>::max();

using checkpoint_testing::Config;
using checkpoint_testing::FlipByte;
using checkpoint_testing::Progress;
using checkpoint_testing::TempDir;
using checkpoint_testing::Value;
using checkpoint_testing::WriteCheckpoint;
using checkpoint_testing::WritePart;

using ::testing::HasSubstr;

// Shard `shard`'s part of `config` (values Value()) with `progress`.
absl::StatusOr<CheckpointPartWritten> WritePartWith(const std::string& dir,
                                                    const v1::ModelConfig& config, uint32_t shard,
                                                    const v1::CheckpointProgress& progress) {
  const FlatRange range =
      LayoutFromProto(config.layout(), config.shard_count()).value().ShardRange(shard);
  return WriteCheckpointPart(dir, config, shard, progress,
                             [&](int section, uint64_t offset, uint64_t count, float* out) {
                               for (uint64_t k = 0; k < count; ++k) {
                                 out[k] = Value(section, range.begin + offset + k);
                               }
                               return absl::OkStatus();
                             });
}

// The step directory's entry in its parent is synced before the manifest
// that commits it, also when another shard made the directory (and may have
// died before syncing the parent).
TEST(CheckpointFilesTest, TheDirectorysEntryIsSyncedBeforeTheManifest) {
  class RecordingEnv : public FileEnvWrapper {
   public:
    RecordingEnv() : FileEnvWrapper(FileEnv::Default()) {}
    absl::Status SyncDirectory(const std::string& dir) override {
      events.push_back("sync " + dir);
      return FileEnvWrapper::SyncDirectory(dir);
    }
    absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(
        const std::string& path) override {
      events.push_back("write " + BaseName(path));
      return FileEnvWrapper::NewAtomicFile(path);
    }
    std::vector<std::string> events;
  };
  const std::string root = TempDir("entry_synced");
  const std::string dir = root + "/step-00000007";
  ASSERT_TRUE(FileEnv::Default()->CreateDirs(dir).ok());  // By a shard that died then.
  const v1::ModelConfig config = Config(2);
  ASSERT_TRUE(WritePart(dir, config, 0).ok());
  RecordingEnv env;
  const FlatRange range = LayoutFromProto(config.layout(), 2).value().ShardRange(1);
  absl::StatusOr<CheckpointPartWritten> last = WriteCheckpointPart(
      dir, config, 1, Progress(7),
      [&](int section, uint64_t offset, uint64_t count, float* out) {
        for (uint64_t k = 0; k < count; ++k) out[k] = Value(section, range.begin + offset + k);
        return absl::OkStatus();
      },
      &env);
  ASSERT_TRUE(last.ok()) << last.status();
  ASSERT_TRUE(last->committed);
  const auto manifest = std::find(env.events.begin(), env.events.end(),
                                  std::string("write ") + kCheckpointManifestFile);
  ASSERT_NE(manifest, env.events.end()) << absl::StrJoin(env.events, "; ");
  EXPECT_NE(std::find(env.events.begin(), manifest, "sync " + root), manifest)
      << absl::StrJoin(env.events, "; ");
}

TEST(CheckpointFilesTest, TheLastPartCommitsTheManifest) {
  const std::string dir = TempDir("commit");
  const v1::ModelConfig config = Config(3);
  for (uint32_t i = 0; i < 3; ++i) {
    absl::StatusOr<CheckpointPartWritten> w = WritePart(dir, config, i);
    ASSERT_TRUE(w.ok()) << w.status();
    EXPECT_GT(w->bytes, kCheckpointHeaderBytes);
    EXPECT_EQ(w->committed, i == 2);
    if (i < 2) {
      // Torn: not every shard has written its part.
      absl::StatusOr<std::unique_ptr<CheckpointReader>> torn = CheckpointReader::Open(dir);
      EXPECT_EQ(torn.status().code(), absl::StatusCode::kNotFound);
      EXPECT_THAT(std::string(torn.status().message()), HasSubstr("manifest.json"));
    }
  }
  absl::StatusOr<std::unique_ptr<CheckpointReader>> reader = CheckpointReader::Open(dir);
  ASSERT_TRUE(reader.ok()) << reader.status();
  EXPECT_EQ((*reader)->step(), 7);
  EXPECT_EQ((*reader)->section_names(),
            (std::vector<std::string>{"params", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"}));
  EXPECT_EQ((*reader)->manifest().parts(1).progress().optimizer_steps(), 7);
  // No temporary file is left behind.
  EXPECT_EQ(std::system(absl::StrCat("ls -a ", dir, " | grep -q tmp").c_str()) == 0, false);

  // The same checkpoint again writes nothing; another step is refused.
  absl::StatusOr<CheckpointPartWritten> again = WritePart(dir, config, 0);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->bytes, 0u);
  EXPECT_FALSE(again->manifest.empty());
  absl::StatusOr<CheckpointPartWritten> other = WritePart(dir, config, 0, 8);
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("step 7"));
}

// Leftover parts of another training run of the same model and step are
// never combined with this run's, and its committed checkpoint is kept.
TEST(CheckpointFilesTest, PartsOfAnotherRunAreNeverCombined) {
  const std::string dir = TempDir("runs");
  const v1::ModelConfig config = Config(3);
  ASSERT_TRUE(WritePart(dir, config, 0, 7, "old-run").ok());
  ASSERT_TRUE(WritePart(dir, config, 1, 7, "old-run").ok());
  // Written, not committed, and the reason is said.
  absl::StatusOr<CheckpointPartWritten> w = WritePart(dir, config, 2, 7, "new-run");
  EXPECT_EQ(w.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(w.status().message()), HasSubstr("old-run"));
  EXPECT_EQ(CheckpointReader::Open(dir).status().code(), absl::StatusCode::kNotFound);
  // The new run's shards rewrite their parts: then it commits.
  EXPECT_EQ(WritePart(dir, config, 0, 7, "new-run").status().code(),
            absl::StatusCode::kFailedPrecondition);  // Shard 1's part is still old.
  w = WritePart(dir, config, 1, 7, "new-run");
  ASSERT_TRUE(w.ok()) << w.status();
  EXPECT_TRUE(w->committed);
  EXPECT_EQ(CheckpointReader::Open(dir).value()->manifest().parts(2).progress().run_id(),
            "new-run");
  absl::StatusOr<CheckpointPartWritten> other = WritePart(dir, config, 0, 7, "third-run");
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(other.status().message()), HasSubstr("another training run"));
}

TEST(CheckpointFilesTest, ReadsAnyRangeForAnyShardCount) {
  const std::string dir = WriteCheckpoint("reshard");
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
  const uint64_t saved = reader->layout().total_elements();
  for (uint32_t shards : {1u, 2u, 3u, 4u, 5u, 7u}) {
    const ModelLayout layout = LayoutFromProto(Config(shards).layout(), shards).value();
    for (uint32_t s = 0; s < shards; ++s) {
      const FlatRange range = layout.ShardRange(s);
      for (int section = 0; section < 4; ++section) {
        std::vector<float> got(range.size(), -1.0f);
        ASSERT_TRUE(reader->Read(section, range.begin, range.size(), got.data()).ok());
        for (uint64_t k = 0; k < range.size(); ++k) {
          const uint64_t i = range.begin + k;
          // Past the saved buffer: padding, at the section's initial value.
          const float want = i < saved ? Value(section, i) : 0.0f;
          ASSERT_EQ(got[k], want) << shards << " shards, section " << section << ", element " << i;
        }
      }
    }
  }
}

// Every tensor element of `target` read through ReadFor must be the saved
// layout's value of the same tensor element. (Padding in the saved files
// holds Value()s here, not zeros: the flat-to-flat read copies them.)
void ExpectReadsByTensor(const CheckpointReader& reader, const ModelLayout& target) {
  const ModelLayout& saved = reader.layout();
  for (uint32_t s = 0; s < target.shard_count(); ++s) {
    const FlatRange range = target.ShardRange(s);
    for (int section = 0; section < 4; ++section) {
      std::vector<float> got(range.size(), -1.0f);
      ASSERT_TRUE(reader.ReadFor(target, section, range.begin, range.size(), got.data()).ok());
      for (const TensorPiece& p : target.PiecesIn(range)) {
        for (uint64_t k = 0; k < p.size; ++k) {
          ASSERT_EQ(got[p.flat_offset - range.begin + k],
                    Value(section, saved.tensors()[p.tensor_index].offset + p.tensor_offset + k))
              << PartitionName(target.partition()) << " x" << target.shard_count() << " shard " << s
              << " section " << section << " tensor " << p.tensor_index;
        }
      }
    }
  }
}

TEST(CheckpointFilesTest, ReadsByTensorIntoEitherPartitionAndAnyShardCount) {
  // Saved flat by 3 shards, read as whole tensors by 1, 2, 3, 5 and flat by 4.
  std::unique_ptr<CheckpointReader> flat =
      CheckpointReader::Open(WriteCheckpoint("flat-to-whole")).value();
  for (uint32_t shards : {1u, 2u, 3u, 5u}) {
    v1::Layout proto = Config(shards).layout();
    proto.set_partition(v1::PARTITION_WHOLE_TENSORS);
    ExpectReadsByTensor(*flat, LayoutFromProto(proto, shards).value());
  }
  ExpectReadsByTensor(*flat, LayoutFromProto(Config(4).layout(), 4).value());

  // Saved as whole tensors by 2 shards, read flat by 5 and whole by 3.
  const std::string dir = TempDir("whole-to-flat");
  v1::ModelConfig config = Config(2);
  config.mutable_layout()->set_partition(v1::PARTITION_WHOLE_TENSORS);
  for (uint32_t i = 0; i < 2; ++i) ASSERT_TRUE(WritePart(dir, config, i).ok());
  std::unique_ptr<CheckpointReader> whole = CheckpointReader::Open(dir).value();
  EXPECT_EQ(whole->layout().partition(), Partition::kWholeTensors);
  ExpectReadsByTensor(*whole, LayoutFromProto(Config(5).layout(), 5).value());
  v1::Layout proto = Config(3).layout();
  proto.set_partition(v1::PARTITION_WHOLE_TENSORS);
  ExpectReadsByTensor(*whole, LayoutFromProto(proto, 3).value());

  // Other tensors: refused.
  const ModelLayout other = LayoutFromProto(Config(2, /*extra=*/1).layout(), 2).value();
  std::vector<float> out(other.ShardSize(0));
  EXPECT_EQ(whole->ReadFor(other, 0, 0, out.size(), out.data()).code(),
            absl::StatusCode::kFailedPrecondition);
}

// Many small tensors share blocks: a read by tensor opens each part's file
// once per call, however many pieces it reads from it.
TEST(CheckpointFilesTest, ReadingByTensorOpensEachPartOncePerCall) {
  class CountingEnv : public FileEnvWrapper {
   public:
    CountingEnv() : FileEnvWrapper(FileEnv::Default()) {}
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
        const std::string& path) override {
      ++opens;
      return FileEnvWrapper::NewRandomAccessFile(path);
    }
    int opens = 0;
  };
  std::vector<TensorSpec> tensors;
  for (int i = 0; i < 60; ++i) tensors.push_back({"t" + std::to_string(i), {3}, DType::kFloat32});
  const std::string dir = TempDir("many-small");
  v1::ModelConfig config = Config(2);
  *config.mutable_layout() = LayoutToProto(ModelLayout::Create(tensors, 4, 2).value());
  for (uint32_t i = 0; i < 2; ++i) ASSERT_TRUE(WritePart(dir, config, i).ok());
  CountingEnv env;
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir, &env).value();
  v1::Layout whole = config.layout();
  whole.set_partition(v1::PARTITION_WHOLE_TENSORS);
  const ModelLayout target = LayoutFromProto(whole, 3).value();
  ExpectReadsByTensor(*reader, target);
  for (uint32_t s = 0; s < 3; ++s) {
    const FlatRange range = target.ShardRange(s);
    std::vector<float> out(range.size());
    env.opens = 0;
    ASSERT_TRUE(reader->ReadFor(target, 1, range.begin, range.size(), out.data()).ok());
    EXPECT_LE(env.opens, 2) << "shard " << s << " of " << target.PiecesIn(range).size()
                            << " pieces";
  }
}

TEST(CheckpointFilesTest, LargeSectionsAreReadBlockByBlock) {
  // More than one checksummed block per section, read in odd pieces.
  const std::string dir = TempDir("blocks");
  const ModelLayout layout = ModelLayout::Create({{"big", {600001}}}, 16, 2).value();
  v1::ModelConfig config = Config(2);
  *config.mutable_layout() = LayoutToProto(layout);
  *config.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::Sgd(0.1));
  for (uint32_t i = 0; i < 2; ++i) {
    const FlatRange range = layout.ShardRange(i);
    ASSERT_TRUE(WriteCheckpointPart(dir, config, i, Progress(3),
                                    [&](int section, uint64_t offset, uint64_t count, float* out) {
                                      for (uint64_t k = 0; k < count; ++k) {
                                        out[k] = Value(section, range.begin + offset + k);
                                      }
                                      return absl::OkStatus();
                                    })
                    .ok());
  }
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
  EXPECT_EQ(reader->manifest().parts(0).sections(0).block_crc32_size(), 2);
  for (uint64_t begin : {0ul, 262143ul, 262144ul, 300015ul, 562159ul, 599999ul}) {
    std::vector<float> got(7);
    ASSERT_TRUE(reader->Read(0, begin, 2, got.data()).ok());
    EXPECT_EQ(got[0], Value(0, begin));
    EXPECT_EQ(got[1], Value(0, begin + 1));
  }
}

TEST(CheckpointFilesTest, TruncatedDataFileIsRefused) {
  const std::string dir = WriteCheckpoint("truncated");
  const std::string file = dir + "/" + CheckpointDataFileName(1, 3);
  ASSERT_EQ(::truncate(file.c_str(), 200), 0);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(file));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("truncated"));
}

TEST(CheckpointFilesTest, FlippedByteFailsItsChecksum) {
  const std::string dir = WriteCheckpoint("flipped");
  const std::string file = dir + "/" + CheckpointDataFileName(2, 3);
  FlipByte(file, kCheckpointHeaderBytes + 40);  // In section "params".
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
  const FlatRange range = reader->layout().ShardRange(2);
  std::vector<float> got(range.size());
  const absl::Status s = reader->Read(0, range.begin, range.size(), got.data());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(s.message()), HasSubstr(file));
  EXPECT_THAT(std::string(s.message()), HasSubstr("checksum"));
  // Other shards' ranges still read.
  const FlatRange first = reader->layout().ShardRange(0);
  got.resize(first.size());
  EXPECT_TRUE(reader->Read(0, first.begin, first.size(), got.data()).ok());

  // A damaged header is caught when the checkpoint is opened.
  FlipByte(file, 3);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("header"));
}

TEST(CheckpointFilesTest, MissingPiecesAreRefused) {
  {
    const std::string dir = WriteCheckpoint("no_manifest");
    ASSERT_EQ(std::remove((dir + "/manifest.json").c_str()), 0);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(dir));
  }
  {
    const std::string dir = WriteCheckpoint("no_data");
    const std::string file = dir + "/" + CheckpointDataFileName(0, 3);
    ASSERT_EQ(std::remove(file.c_str()), 0);
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(file));
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("missing"));
  }
  {
    // A part that cannot be opened for another reason (permissions, I/O) is
    // not damage: the error comes back as it is, and nothing sets it aside.
    class FailingOpens : public FileEnvWrapper {
     public:
      FailingOpens() : FileEnvWrapper(FileEnv::Default()) {}
      absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
          const std::string& path) override {
        if (absl::EndsWith(path, ".bin")) return absl::PermissionDeniedError(path + ": denied");
        return FileEnvWrapper::NewRandomAccessFile(path);
      }
    } env;
    const std::string dir = WriteCheckpoint("unreadable_part");
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir, &env);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kPermissionDenied) << r.status();
  }
  {
    const std::string dir = WriteCheckpoint("garbage_manifest");
    std::ofstream(dir + "/manifest.json") << "{\"step\": [not json";
    absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr("manifest.json"));
  }
}

TEST(CheckpointFilesTest, ManifestOfAnotherLayoutIsRefused) {
  const std::string dir = WriteCheckpoint("layout_a");
  // The same model with one tensor larger, saved elsewhere.
  const std::string other = TempDir("layout_b");
  const v1::ModelConfig bigger = Config(3, /*extra=*/40);
  for (uint32_t i = 0; i < 3; ++i) ASSERT_TRUE(WritePart(other, bigger, i).ok());
  ASSERT_EQ(std::system(absl::StrCat("cp ", other, "/manifest.json ", dir, "/").c_str()), 0);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> r = CheckpointReader::Open(dir);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(dir));
}

// Full verification reaches every block: the last byte of the last
// section of any part is checked too.
TEST(CheckpointFilesTest, VerifyingEveryBlockFindsTheLastByteOfEveryPart) {
  const std::string dir = WriteCheckpoint("verify_all", 3);
  ASSERT_TRUE(CheckpointReader::Open(dir).value()->VerifyEveryBlock().ok());
  const v1::CheckpointManifest manifest = CheckpointReader::Open(dir).value()->manifest();
  for (int p = 0; p < manifest.parts_size(); ++p) {
    const v1::CheckpointPart& part = manifest.parts(p);
    const v1::CheckpointSection& last = part.sections(part.sections_size() - 1);
    const long offset = static_cast<long>(last.file_offset() + last.num_elements() * 4 - 1);
    const std::string file = JoinPath(dir, part.file());
    FlipByte(file, offset);
    const absl::Status s = CheckpointReader::Open(dir).value()->VerifyEveryBlock();
    EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << "part " << p;
    EXPECT_THAT(std::string(s.message()), HasSubstr(file));
    EXPECT_THAT(std::string(s.message()), HasSubstr("of section '" + last.name() + "'"));
    FlipByte(file, offset);  // Back.
  }
  EXPECT_TRUE(CheckpointReader::Open(dir).value()->VerifyEveryBlock().ok());
}

TEST(CheckpointFilesTest, StepDirectoriesAreListedByStepTornOnesToo) {
  const std::string root = TempDir("steps");
  EXPECT_TRUE(ListStepDirectories(root).value().empty());  // No root yet.
  const v1::ModelConfig config = Config(2);
  for (int64_t step : {12, 4, 100000000}) {
    const std::string dir = root + "/" + CheckpointStepDirName(step);
    // Step 12 is torn: one part only.
    for (uint32_t i = 0; i < (step == 12 ? 1u : 2u); ++i) {
      ASSERT_TRUE(WritePart(dir, config, i, step).ok());
    }
  }
  // Not step directories.
  ASSERT_EQ(mkdir((root + "/step-x").c_str(), 0755), 0);
  ASSERT_EQ(mkdir((root + "/.damaged.step-00000008.1f").c_str(), 0755), 0);
  const std::vector<StepDirectory> steps = ListStepDirectories(root).value();
  ASSERT_EQ(steps.size(), 3u);
  EXPECT_EQ(steps[0].step, 4);
  EXPECT_EQ(steps[1].step, 12);
  EXPECT_EQ(steps[2].step, 100000000);  // Past the zero padding, still by step.
  EXPECT_EQ(steps[1].directory, root + "/" + CheckpointStepDirName(12));
  const std::string file = root + "/" + CheckpointStepDirName(4) + "/manifest.json";
  const absl::Status not_a_directory = ListStepDirectories(file).status();
  EXPECT_FALSE(not_a_directory.ok());
  EXPECT_NE(not_a_directory.message().find(file), absl::string_view::npos) << not_a_directory;
}

TEST(CheckpointFilesTest, PruningKeepsTheNewestCommittedAndEachShardRemovesItsOwn) {
  const std::string root = TempDir("prune");
  const v1::ModelConfig config = Config(2);
  for (int64_t step : {4, 8, 12, 16, 20}) {
    const std::string dir = root + "/" + CheckpointStepDirName(step);
    // Step 20 is torn (shard 1 never wrote it): newer, never pruned.
    for (uint32_t i = 0; i < (step == 20 ? 1u : 2u); ++i) {
      ASSERT_TRUE(WritePart(dir, config, i, step).ok());
    }
  }
  // A leftover temporary file of a killed write of shard 0.
  std::ofstream(root + "/" + CheckpointStepDirName(4) + "/.shard-00000-of-00002.bin.tmp.h.1.2.3")
      << "x";
  EXPECT_EQ(PruneCheckpoints(root, 0, 2, 2, kNoLimit).value(), 2);  // steps 4 and 8
  auto exists = [](const std::string& path) { return access(path.c_str(), F_OK) == 0; };
  const std::string step4 = root + "/" + CheckpointStepDirName(4);
  EXPECT_FALSE(exists(step4 + "/manifest.json"));
  EXPECT_FALSE(exists(step4 + "/" + CheckpointDataFileName(0, 2)));
  EXPECT_FALSE(exists(step4 + "/.shard-00000-of-00002.bin.tmp.h.1.2.3"));
  EXPECT_TRUE(exists(step4 + "/" + CheckpointDataFileName(1, 2)));  // shard 1's own
  EXPECT_EQ(PruneCheckpoints(root, 1, 2, 2, kNoLimit).value(), 2);
  EXPECT_FALSE(exists(step4));
  EXPECT_FALSE(exists(root + "/" + CheckpointStepDirName(8)));
  for (int64_t step : {12, 16}) {
    EXPECT_TRUE(CheckpointReader::Open(root + "/" + CheckpointStepDirName(step)).ok()) << step;
  }
  EXPECT_TRUE(exists(root + "/" + CheckpointStepDirName(20) + "/" + CheckpointDataFileName(0, 2)));
  EXPECT_EQ(ListStepDirectories(root).value().size(), 3u);  // 12, 16 and the torn 20.
  EXPECT_EQ(PruneCheckpoints(root, 0, 2, 2, kNoLimit).value(), 0);  // nothing more to do
}

// A manifest the prune cannot remove (a shared directory another user's
// shard committed into, a transient error) keeps the checkpoint whole: the
// shard's own part stays with it (a committed manifest without its part was
// set aside as damaged at the next restore), and a later prune finishes.
TEST(CheckpointFilesTest, PruningLeavesTheRestWhenTheManifestStays) {
  const std::string root = TempDir("prune_stuck");
  const v1::ModelConfig config = Config(2);
  for (int64_t step : {4, 8, 12}) {
    for (uint32_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(WritePart(root + "/" + CheckpointStepDirName(step), config, i, step).ok());
    }
  }
  class ManifestsStay : public FileEnvWrapper {
   public:
    using FileEnvWrapper::FileEnvWrapper;
    absl::Status RemoveFile(const std::string& path) override {
      if (absl::EndsWith(path, "/manifest.json")) return absl::PermissionDeniedError(path);
      return FileEnvWrapper::RemoveFile(path);
    }
  } stuck(FileEnv::Default());
  EXPECT_EQ(PruneCheckpoints(root, 0, 2, 2, kNoLimit, &stuck).value(), 0);
  const std::string step4 = root + "/" + CheckpointStepDirName(4);
  absl::StatusOr<std::unique_ptr<CheckpointReader>> kept = CheckpointReader::Open(step4);
  ASSERT_TRUE(kept.ok()) << kept.status();
  EXPECT_TRUE((*kept)->VerifyEveryBlock().ok()) << "the part under a manifest was removed";
  EXPECT_EQ(PruneCheckpoints(root, 0, 2, 2, kNoLimit).value(), 1);
  EXPECT_FALSE(CheckpointReader::Open(step4).ok());
}

// Step directories above the step the saver has just saved (a timeline's
// future that a rollback or a restore gives up, before they are set aside)
// neither count among the newest kept nor are touched.
TEST(CheckpointFilesTest, PruningCountsOnlyTheStepsUpToTheNewestSaved) {
  const std::string root = TempDir("prune_newest");
  const v1::ModelConfig config = Config(1);
  for (int64_t step : {4, 8, 12, 16}) {
    ASSERT_TRUE(WritePart(root + "/" + CheckpointStepDirName(step), config, 0, step).ok());
  }
  // Saved step 4 again (a rollback to it): 12 and 16 would keep only 12, 16.
  EXPECT_EQ(PruneCheckpoints(root, 0, 1, 2, /*newest_step=*/4).value(), 0);
  EXPECT_EQ(ListStepDirectories(root).value().size(), 4u);
  EXPECT_EQ(PruneCheckpoints(root, 0, 1, 2, /*newest_step=*/12).value(), 1);  // step 4
  for (int64_t step : {8, 12, 16}) {
    EXPECT_TRUE(CheckpointReader::Open(root + "/" + CheckpointStepDirName(step)).ok()) << step;
  }
}

// A job restored on fewer shards prunes the old checkpoints' parts of the
// indices it no longer has (shard 0 removes them); on more shards, each
// removes its own.
TEST(CheckpointFilesTest, PruningAfterAReshardRemovesEveryOldPart) {
  const std::string root = TempDir("prune_reshard");
  const v1::ModelConfig four = Config(4);
  for (int64_t step : {4, 8}) {
    for (uint32_t i = 0; i < 4; ++i) {
      ASSERT_TRUE(WritePart(root + "/" + CheckpointStepDirName(step), four, i, step).ok());
    }
  }
  const v1::ModelConfig two = Config(2);
  for (int64_t step : {12, 16}) {
    for (uint32_t i = 0; i < 2; ++i) {
      ASSERT_TRUE(WritePart(root + "/" + CheckpointStepDirName(step), two, i, step).ok());
    }
  }
  // Now on two shards: steps 4 and 8 go whole.
  EXPECT_EQ(PruneCheckpoints(root, 1, 2, 2, kNoLimit).value(), 2);
  EXPECT_EQ(PruneCheckpoints(root, 0, 2, 2, kNoLimit).value(), 2);
  EXPECT_EQ(ListStepDirectories(root).value().size(), 2u) << "old parts of shards 2 and 3 stay";
}

// A change for a later step reaches shards around the time they save a
// step: parts that differ only in which of the same changes they hold still
// commit, and a restore gets every one of them; two different changes for
// one step are a real disagreement.
TEST(CheckpointFilesTest, PartsMayHoldDifferentScheduledChangesButNotConflictingOnes) {
  const v1::ModelConfig config = Config(2);
  auto write = [&](const std::string& dir, uint32_t shard, const v1::CheckpointProgress& p) {
    return WritePartWith(dir, config, shard, p);
  };
  v1::HyperparameterChange change;
  change.set_step(9);
  *change.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::AdamW(5e-4));
  v1::CheckpointProgress with = Progress(7), without = Progress(7);
  *with.add_scheduled() = change;
  const std::string dir = TempDir("scheduled");
  ASSERT_TRUE(write(dir, 0, with).ok());
  absl::StatusOr<CheckpointPartWritten> last = write(dir, 1, without);
  ASSERT_TRUE(last.ok()) << last.status();
  EXPECT_TRUE(last->committed);
  std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
  const std::vector<v1::HyperparameterChange> merged = ScheduledChangesOf(reader->manifest());
  ASSERT_EQ(merged.size(), 1u);
  EXPECT_EQ(merged[0].step(), 9);

  v1::HyperparameterChange other = change;
  *other.mutable_optimizer() = OptimizerConfigToProto(OptimizerConfig::AdamW(1e-4));
  v1::CheckpointProgress conflicting = Progress(7);
  *conflicting.add_scheduled() = other;
  const std::string bad = TempDir("scheduled_conflict");
  ASSERT_TRUE(write(bad, 0, with).ok());
  const absl::StatusOr<CheckpointPartWritten> refused = write(bad, 1, conflicting);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
}

// Asynchronous shards count their optimizer steps and skips on their own
// (StepCountsPerShard): parts that differ there commit, and each keeps its
// counts. Synchronous parts must agree; versions must agree in every mode.
TEST(CheckpointFilesTest, OnlyAsynchronousPartsMayCountTheirStepsDifferently) {
  for (const v1::Consistency mode : {v1::CONSISTENCY_ASYNC, v1::CONSISTENCY_SYNC}) {
    v1::ModelConfig config = Config(2);
    config.set_consistency(mode);
    auto write = [&](const std::string& dir, uint32_t shard, const v1::CheckpointProgress& p) {
      return WritePartWith(dir, config, shard, p);
    };
    v1::CheckpointProgress skipped_one = Progress(7);
    skipped_one.set_optimizer_steps(6);
    skipped_one.set_skipped_steps(1);
    const std::string dir = TempDir(absl::StrCat("counts_", mode));
    ASSERT_TRUE(write(dir, 0, Progress(7)).ok());
    const absl::StatusOr<CheckpointPartWritten> last = write(dir, 1, skipped_one);
    if (mode == v1::CONSISTENCY_SYNC) {
      EXPECT_EQ(last.status().code(), absl::StatusCode::kFailedPrecondition) << last.status();
      continue;
    }
    ASSERT_TRUE(last.ok()) << last.status();
    EXPECT_TRUE(last->committed);
    std::unique_ptr<CheckpointReader> reader = CheckpointReader::Open(dir).value();
    EXPECT_EQ(reader->manifest().parts(0).progress().skipped_steps(), 0);
    EXPECT_EQ(reader->manifest().parts(1).progress().skipped_steps(), 1);
    EXPECT_EQ(reader->manifest().parts(1).progress().optimizer_steps(), 6);

    EXPECT_FALSE(PartsCountStepsAlike(reader->manifest()));

    // Per-trainer steps (whose sum is the version) must still agree.
    v1::CheckpointProgress mine = Progress(7), other = Progress(7);
    for (const int64_t step : {3, 4}) mine.add_trainer_steps(step);
    for (const int64_t step : {4, 3}) other.add_trainer_steps(step);
    const std::string bad = TempDir("counts_other_trainer_steps");
    ASSERT_TRUE(write(bad, 0, mine).ok());
    const absl::StatusOr<CheckpointPartWritten> mismatched = write(bad, 1, other);
    EXPECT_EQ(mismatched.status().code(), absl::StatusCode::kFailedPrecondition)
        << mismatched.status();
  }
}

}  // namespace
}  // namespace shardopt
