// Checkpoint files: one model's optimizer state at one step, written by its
// shards in parts and read back for any shard count.
//
// A checkpoint is a directory (docs/checkpoints.md):
//   shard-00000-of-00003.bin        one shard's data: a 64-byte header, then
//                                   sections of raw little-endian fp32:
//                                   "params", then the optimizer slots in
//                                   OptimizerConfig::StateSlotNames() order;
//   shard-00000-of-00003.part.json  that shard's record: range, sections,
//                                   per-block CRC-32s, step protocol state;
//   manifest.json                   the commit record, written last by the
//                                   shard that finds every part present.
// Every file is written through a FileEnv (common/file.h) as an atomic file:
// a temporary name, fsync'ed and renamed, and the directory fsync'ed; a crash
// leaves either the old state or the new file, and a directory without
// manifest.json (a torn checkpoint) is never loaded. Every function takes the
// FileEnv to use, FileEnv::Default() (the POSIX one) unless told otherwise.
//
// Reading verifies everything before handing out a value: the manifest
// against the layout, each data file's size and header, and the CRC of every
// block read. A reader for S' shards reads only the blocks that overlap its
// range, never the whole model.
#ifndef SHARDOPT_COMMON_CHECKPOINT_FILES_H_
#define SHARDOPT_COMMON_CHECKPOINT_FILES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/checkpoint_agreement.h"
#include "common/checkpoint_packing.h"
#include "common/file.h"
#include "common/layout.h"
#include "common/optimizer_config.h"
#include "proto/shardopt/v1/checkpoint.pb.h"

namespace shardopt {

inline constexpr char kCheckpointManifestFile[] = "manifest.json";
// The newest format this build reads and writes: 2 stores packed optimizer
// slots packed (common/checkpoint_packing.h), and only a model with such a
// slot is written as 2; every other checkpoint is format 1, as before.
inline constexpr uint32_t kCheckpointFormatVersion = 2;
// Bytes per checksummed block of a section.
inline constexpr uint32_t kCheckpointBlockBytes = 1 << 20;
inline constexpr uint64_t kCheckpointHeaderBytes = 64;

std::string CheckpointDataFileName(uint32_t shard_index, uint32_t shard_count);
std::string CheckpointPartRecordName(uint32_t shard_index, uint32_t shard_count);
// "step-00000120": the directory a periodic checkpoint of that step goes to.
std::string CheckpointStepDirName(int64_t step);

// Reads values [offset, offset + count) (range-local) of section `section`:
// 0 the parameters, 1.. the optimizer slots.
using CheckpointSectionReadFn =
    std::function<absl::Status(int section, uint64_t offset, uint64_t count, float* out)>;

struct CheckpointPartWritten {
  std::string data_file;   // Path of the data file.
  uint64_t bytes = 0;      // Written now (0 when the checkpoint was already committed).
  bool committed = false;  // This call wrote the manifest.
  std::string manifest;    // Its path, when the checkpoint is committed.
};

// Writes shard `shard_index`'s part of the checkpoint of the model `config`
// at version progress.version() into `directory` (created with its parents),
// then commits the manifest if every part of config.shard_count() is present
// for that step. FAILED_PRECONDITION when `directory` holds a committed
// checkpoint of another model or step; OK without writing when it holds this
// one. The read function is called in order, at most one block at a time. The data
// file is written first (its atomic writer gets the 64-byte header, then the
// sections), then the part record, then maybe the manifest. A packed slot's
// section asks `read` only for the elements it stores (PackedSection).
absl::StatusOr<CheckpointPartWritten> WriteCheckpointPart(const std::string& directory,
                                                          const v1::ModelConfig& config,
                                                          uint32_t shard_index,
                                                          const v1::CheckpointProgress& progress,
                                                          const CheckpointSectionReadFn& read,
                                                          FileEnv* env = FileEnv::Default());

// What WriteCheckpointPart does after writing, alone: for a shard whose part
// of the checkpoint of `config` at `step` (run `run_id`) is in `directory`
// already, commits the manifest if every part is there. Writes no data
// (bytes 0); the same FAILED_PRECONDITION for a directory that holds
// another committed checkpoint.
absl::StatusOr<CheckpointPartWritten> CommitCheckpointPart(const std::string& directory,
                                                           const v1::ModelConfig& config,
                                                           uint32_t shard_index, int64_t step,
                                                           const std::string& run_id,
                                                           FileEnv* env = FileEnv::Default());

// A committed checkpoint, validated, open for reading through the FileEnv it
// was opened with (which must outlive it). Thread-compatible.
class CheckpointReader {
 public:
  // NOT_FOUND when `directory` has no manifest (never committed, or torn);
  // DATA_LOSS for a manifest or data file that is unreadable, truncated or
  // inconsistent; FAILED_PRECONDITION for an unknown format version. Each
  // message names the file and the problem.
  static absl::StatusOr<std::unique_ptr<CheckpointReader>> Open(
      const std::string& directory, FileEnv* env = FileEnv::Default());

  const std::string& directory() const { return directory_; }
  const v1::CheckpointManifest& manifest() const { return manifest_; }
  // The model's version (an asynchronous model's counts every trainer's
  // pushes).
  int64_t step() const { return manifest_.step(); }
  // The step its periodic directory is named by (step-N): the version of a
  // synchronous model's checkpoint; the step every trainer had reached of an
  // asynchronous one's (its cut holds each trainer there).
  int64_t trainer_step() const;
  // The layout the checkpoint was written with (config.shard_count shards).
  const ModelLayout& layout() const { return *layout_; }
  const OptimizerConfig& optimizer() const { return optimizer_; }
  // "params", then the optimizer slots.
  const std::vector<std::string>& section_names() const { return section_names_; }

  // Values [flat_offset, flat_offset + count) of the flat buffer (any shard
  // count's layout of the same tensors and alignment: only the padding at the
  // end differs, and elements past the saved buffer read as the section's
  // initial value). DATA_LOSS, naming the file and block, when a block read
  // fails its checksum or is short.
  absl::Status Read(int section, uint64_t flat_offset, uint64_t count, float* out) const;
  // The same for elements [flat_offset, flat_offset + count) of `target`'s
  // flat buffer, any layout of the same tensors (any shard count, either
  // partition): each tensor's values are read from where the saved layout
  // put it; target padding reads as the section's initial value.
  // FAILED_PRECONDITION when `target` has other tensors or alignment.
  absl::Status ReadFor(const ModelLayout& target, int section, uint64_t flat_offset, uint64_t count,
                       float* out) const;

  // Reads every block of every part and checks its checksum: OK only when
  // the whole checkpoint verifies (Open checks sizes and headers, not data).
  // DATA_LOSS naming the file and block otherwise.
  absl::Status VerifyEveryBlock() const;

 private:
  CheckpointReader() = default;
  // The last block read and the files opened by one ReadFor (or Read) call:
  // a layout's tensor pieces are read one by one, and small tensors share
  // blocks, so each block is read and checked once per call, not once per
  // piece.
  struct BlockCache {
    std::vector<std::unique_ptr<RandomAccessFile>> files;  // By part.
    int part = -1;
    int section = -1;
    uint64_t block = 0;
    std::vector<char> data;
  };
  absl::Status ReadCached(int section, uint64_t flat_offset, uint64_t count, float* out,
                          BlockCache* cache) const;
  // Values [first, first + count) as stored in section `section` of part
  // `part_index` (for a packed section: its packed positions).
  absl::Status ReadSectionValues(int part_index, int section, uint64_t first, uint64_t count,
                                 float* out, BlockCache* cache) const;
  // Block `b` of `section` of `part` (read from `file`, open on it) into
  // `block`, checked against its checksum.
  absl::Status ReadBlock(const RandomAccessFile& file, const v1::CheckpointPart& part,
                         const v1::CheckpointSection& section, uint64_t b,
                         std::vector<char>* block) const;

  FileEnv* env_ = nullptr;
  std::string directory_;
  v1::CheckpointManifest manifest_;
  std::optional<ModelLayout> layout_;
  OptimizerConfig optimizer_;
  std::vector<std::string> section_names_;
  // [part][section]: where a packed section keeps its values; nullopt for
  // the others (and for format 1's full-size slots).
  std::vector<std::vector<std::optional<PackedSection>>> packed_;
};

// The hyperparameter changes scheduled (for steps after the checkpoint's) in
// any part of `manifest`, by step: a change that reached some shards only
// before they saved their parts still reaches every shard.
std::vector<v1::HyperparameterChange> ScheduledChangesOf(const v1::CheckpointManifest& manifest);

// A "step-N" subdirectory (CheckpointStepDirName) of a directory of
// periodic checkpoints, committed or not.
struct StepDirectory {
  int64_t step = 0;
  std::string directory;
};
// The step directories of `root`, by ascending step; an absent root has
// none.
absl::StatusOr<std::vector<StepDirectory>> ListStepDirectories(const std::string& root,
                                                               FileEnv* env = FileEnv::Default());

// Retention for a directory of "step-*" checkpoints (periodic ones): removes
// shard `shard_index`'s files (data file, part record, leftover temporary
// files of its killed writes) - and shard 0 also those of indices
// >= `shard_count`, which checkpoints written by more shards hold (a job
// restored on fewer) - from every step directory older than the
// `keep`-th newest committed one (or than the oldest, with fewer), with their
// manifests, and the directories once empty. Each shard removes only what it wrote, so shards may do this at
// once. Committed checkpoints among the `keep` newest, and anything newer,
// are never touched. (A shard whose newest part is not committed yet when it
// prunes leaves one more step behind, until it prunes again.) Only
// checkpoints of steps <= `newest_step` count, and nothing above it is
// touched: the saver passes the step it has just saved, so that step
// directories of steps this timeline has not reached (a rollback's or a
// restore's, before they are set aside) cannot push its own out. Returns the
// number of step directories pruned.
absl::StatusOr<int> PruneCheckpoints(const std::string& directory, uint32_t shard_index,
                                     uint32_t shard_count, int keep, int64_t newest_step,
                                     FileEnv* env = FileEnv::Default());

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_CHECKPOINT_FILES_H_
