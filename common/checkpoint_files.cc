#include "common/checkpoint_files.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/checkpoint_packing.h"
#include "common/file.h"
#include "common/proto_convert.h"
#include "google/protobuf/util/json_util.h"
#include "google/protobuf/util/message_differencer.h"

namespace shardopt {

namespace {

constexpr char kMagic[8] = {'S', 'H', 'O', 'P', 'T', 'C', 'K', 'P'};
constexpr char kParamsSection[] = "params";

absl::StatusOr<std::string> ToJson(const google::protobuf::Message& message) {
  google::protobuf::util::JsonPrintOptions options;
  options.add_whitespace = true;
  options.preserve_proto_field_names = true;
  std::string json;
  const auto status = google::protobuf::util::MessageToJsonString(message, &json, options);
  if (!status.ok()) return absl::InternalError(std::string(status.message()));
  return json;
}

// DATA_LOSS naming `path` when the file is not a valid manifest / record.
absl::StatusOr<v1::CheckpointManifest> ReadManifestFile(FileEnv* env, const std::string& path) {
  absl::StatusOr<std::string> json = ReadFileToString(env, path);
  if (!json.ok()) return json.status();
  v1::CheckpointManifest manifest;
  // Fields of a newer format are left for its version check to refuse (a
  // FAILED_PRECONDITION), not taken for damage.
  google::protobuf::util::JsonParseOptions options;
  options.ignore_unknown_fields = true;
  const auto status = google::protobuf::util::JsonStringToMessage(*json, &manifest, options);
  if (!status.ok()) {
    return absl::DataLossError(
        absl::StrCat(path, ": not a valid checkpoint manifest: ", status.message().ToString()));
  }
  return manifest;
}

std::vector<std::string> SectionNames(const OptimizerConfig& optimizer) {
  std::vector<std::string> names = {kParamsSection};
  for (std::string& slot : optimizer.StateSlotNames()) names.push_back(std::move(slot));
  return names;
}

std::string DataFileHeader(uint32_t format_version, uint32_t shard_index, uint32_t shard_count,
                           int64_t step) {
  std::string header(kCheckpointHeaderBytes, '\0');
  std::memcpy(&header[0], kMagic, sizeof(kMagic));
  const uint32_t fields[3] = {format_version, shard_index, shard_count};
  std::memcpy(&header[8], fields, sizeof(fields));
  std::memcpy(&header[24], &step, sizeof(step));
  return header;
}

// Appends one section's values to a data file in blocks of `block_elements`
// (the last may be shorter), recording each block's CRC-32 in the section.
// Callers fill room() in place: no copy besides the file's.
class SectionAppender {
 public:
  SectionAppender(AtomicFileWriter* file, v1::CheckpointSection* section, uint64_t block_elements)
      : file_(file), section_(section), block_(block_elements) {}
  // Where the next values go: room_size() of them fit before the block is full.
  float* room() { return block_.data() + filled_; }
  uint64_t room_size() const { return block_.size() - filled_; }
  // `n` values (at most room_size()) were written at room().
  absl::Status Filled(uint64_t n) {
    filled_ += n;
    return filled_ == block_.size() ? Flush() : absl::OkStatus();
  }
  absl::Status Finish() { return filled_ > 0 ? Flush() : absl::OkStatus(); }

 private:
  absl::Status Flush() {
    const size_t bytes = filled_ * sizeof(float);
    section_->add_block_crc32(static_cast<uint32_t>(
        crc32(0L, reinterpret_cast<const Bytef*>(block_.data()), static_cast<uInt>(bytes))));
    filled_ = 0;
    return file_->Append(block_.data(), bytes);
  }

  AtomicFileWriter* const file_;
  v1::CheckpointSection* const section_;
  std::vector<float> block_;
  uint64_t filled_ = 0;
};

// Appends `count` values of section `section` from range-local element
// `range_local` on, read through `read` in pieces of at most a block.
absl::Status AppendValues(const CheckpointSectionReadFn& read, int section, uint64_t range_local,
                          uint64_t count, SectionAppender& out) {
  for (uint64_t done = 0; done < count;) {
    const uint64_t n = std::min(out.room_size(), count - done);
    if (absl::Status s = read(section, range_local + done, n, out.room()); !s.ok()) return s;
    if (absl::Status s = out.Filled(n); !s.ok()) return s;
    done += n;
  }
  return absl::OkStatus();
}

// Of the same model, step and training run (a model id trained twice must
// not have its checkpoints combined).

bool SameCheckpoint(const v1::CheckpointManifest& a, const v1::ModelConfig& config, int64_t step,
                    const std::string& run_id) {
  return a.step() == step && a.parts_size() > 0 && a.parts(0).progress().run_id() == run_id &&
         google::protobuf::util::MessageDifferencer::Equals(a.config(), config);
}

// Writes manifest.json if every part of `config`'s checkpoint at `step` is
// in `dir`; false (and no error) when some part is missing or of another
// checkpoint.
absl::StatusOr<bool> TryCommit(FileEnv* env, const std::string& dir, const v1::ModelConfig& config,
                               int64_t step, const std::string& run_id) {
  v1::CheckpointManifest manifest;
  *manifest.mutable_config() = config;
  manifest.set_step(step);
  for (uint32_t i = 0; i < config.shard_count(); ++i) {
    const std::string record = JoinPath(dir, CheckpointPartRecordName(i, config.shard_count()));
    if (!FileExists(env, record)) return false;
    absl::StatusOr<v1::CheckpointManifest> part = ReadManifestFile(env, record);
    if (!part.ok()) return part.status();
    if (part->step() == step && part->parts_size() == 1 &&
        part->parts(0).progress().run_id() != run_id &&
        google::protobuf::util::MessageDifferencer::Equals(part->config(), config)) {
      // Either a leftover of an older run (its shard rewrites it when it gets
      // here) or shards that hold the model under different runs: say so,
      // it may never commit.
      return absl::FailedPreconditionError(absl::StrCat(
          record, ": shard ", i, " saved this step for run '", part->parts(0).progress().run_id(),
          "', this shard for run '", run_id, "'; not committed (yet)"));
    }
    if (!SameCheckpoint(*part, config, step, run_id) || part->parts_size() != 1 ||
        part->parts(0).shard_index() != i) {
      return false;  // A stale record of another checkpoint: its shard will rewrite it.
    }
    if (manifest.parts_size() > 0 &&
        !SameProgress(part->parts(0).progress(), manifest.parts(0).progress(), config)) {
      // Never commit what Open would refuse: the shards disagree on the state.
      return absl::FailedPreconditionError(
          absl::StrCat(record, ": shard ", i, " saved another step protocol state than shard 0 ",
                       "(hyperparameter changes or step counts differ); not committed"));
    }
    const std::string data = JoinPath(dir, part->parts(0).file());
    absl::StatusOr<FileInfo> info = env->Stat(data);
    if (!info.ok() || info->size != part->parts(0).file_bytes()) return false;
    if (manifest.parts_size() > 0 && part->format_version() != manifest.format_version()) {
      // Shards of different builds (a rolling upgrade): never commit what
      // Open would refuse.
      return absl::FailedPreconditionError(
          absl::StrCat(record, ": shard ", i, " wrote format ", part->format_version(),
                       ", shard 0 format ", manifest.format_version(), "; not committed"));
    }
    *manifest.add_parts() = part->parts(0);
    manifest.set_format_version(part->format_version());
  }
  absl::StatusOr<std::string> json = ToJson(manifest);
  if (!json.ok()) return json.status();
  // The directory's own entry survives a power loss with the manifest that
  // commits it: the shard that made the directory may have died before it
  // synced the parent, and the others found it made.
  if (absl::Status s = env->SyncDirectory(DirectoryOf(NormalPath(dir))); !s.ok()) return s;
  if (absl::Status s = WriteFileAtomically(env, JoinPath(dir, kCheckpointManifestFile), *json);
      !s.ok()) {
    return s;
  }
  return true;
}

// Whether `directory` holds this committed checkpoint already;
// FAILED_PRECONDITION when it holds another one.
absl::StatusOr<bool> HoldsCommitted(FileEnv* env, const std::string& directory,
                                    const v1::ModelConfig& config, int64_t step,
                                    const std::string& run_id) {
  const std::string manifest_path = JoinPath(directory, kCheckpointManifestFile);
  if (!FileExists(env, manifest_path)) return false;
  absl::StatusOr<v1::CheckpointManifest> existing = ReadManifestFile(env, manifest_path);
  if (!existing.ok()) return existing.status();
  if (!SameCheckpoint(*existing, config, step, run_id)) {
    return absl::FailedPreconditionError(absl::StrCat(
        directory, " already holds the checkpoint of model '", existing->config().model_id(),
        "' at step ", existing->step(), existing->step() == step ? " of another training run" : "",
        ": write step ", step, " to a new directory"));
  }
  return true;
}

}  // namespace

absl::StatusOr<CheckpointPartWritten> CommitCheckpointPart(const std::string& directory,
                                                           const v1::ModelConfig& config,
                                                           uint32_t shard_index, int64_t step,
                                                           const std::string& run_id,
                                                           FileEnv* env) {
  CheckpointPartWritten written;
  written.data_file =
      JoinPath(directory, CheckpointDataFileName(shard_index, config.shard_count()));
  const std::string manifest_path = JoinPath(directory, kCheckpointManifestFile);
  absl::StatusOr<bool> held = HoldsCommitted(env, directory, config, step, run_id);
  if (!held.ok()) return held.status();
  if (!*held) {
    absl::StatusOr<bool> committed = TryCommit(env, directory, config, step, run_id);
    if (!committed.ok()) return committed.status();
    written.committed = *committed;
    if (!*committed) return written;
  }
  written.manifest = manifest_path;
  return written;
}

std::string CheckpointDataFileName(uint32_t shard_index, uint32_t shard_count) {
  return absl::StrFormat("shard-%05u-of-%05u.bin", shard_index, shard_count);
}

std::string CheckpointPartRecordName(uint32_t shard_index, uint32_t shard_count) {
  return absl::StrFormat("shard-%05u-of-%05u.part.json", shard_index, shard_count);
}

std::string CheckpointStepDirName(int64_t step) { return absl::StrFormat("step-%08d", step); }

absl::StatusOr<CheckpointPartWritten> WriteCheckpointPart(
    const std::string& directory, const v1::ModelConfig& config, uint32_t shard_index,
    const v1::CheckpointProgress& progress, const CheckpointSectionReadFn& read, FileEnv* env) {
  absl::StatusOr<ModelLayout> layout = LayoutFromProto(config.layout(), config.shard_count());
  if (!layout.ok()) return layout.status();
  absl::StatusOr<OptimizerConfig> optimizer = OptimizerConfigFromProto(config.optimizer());
  if (!optimizer.ok()) return optimizer.status();
  if (shard_index >= config.shard_count()) {
    return absl::InvalidArgumentError(
        absl::StrCat("shard ", shard_index, " of ", config.shard_count()));
  }
  const int64_t step = progress.version();
  if (directory.empty()) return absl::InvalidArgumentError("empty checkpoint directory");
  if (absl::Status s = env->CreateDirs(directory); !s.ok()) return s;
  CheckpointPartWritten written;
  written.data_file =
      JoinPath(directory, CheckpointDataFileName(shard_index, config.shard_count()));
  const std::string manifest_path = JoinPath(directory, kCheckpointManifestFile);
  absl::StatusOr<bool> held = HoldsCommitted(env, directory, config, step, progress.run_id());
  if (!held.ok()) return held.status();
  if (*held) {
    written.manifest = manifest_path;
    return written;
  }

  const FlatRange range = layout->ShardRange(shard_index);
  const std::vector<std::string> names = SectionNames(*optimizer);
  v1::CheckpointManifest record;
  const uint32_t format_version = CheckpointFormatVersionFor(*optimizer);
  record.set_format_version(format_version);
  *record.mutable_config() = config;
  record.set_step(step);
  v1::CheckpointPart* part = record.add_parts();
  part->set_shard_index(shard_index);
  part->mutable_range()->set_begin(range.begin);
  part->mutable_range()->set_end(range.end);
  part->set_file(CheckpointDataFileName(shard_index, config.shard_count()));
  part->set_block_bytes(kCheckpointBlockBytes);
  *part->mutable_progress() = progress;

  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> data =
      env->NewAtomicFile(JoinPath(directory, part->file()));
  if (!data.ok()) return data.status();
  const std::string header =
      DataFileHeader(format_version, shard_index, config.shard_count(), step);
  if (absl::Status s = (*data)->Append(header); !s.ok()) return s;
  const uint64_t block_elements = std::min<uint64_t>(kCheckpointBlockBytes / sizeof(float),
                                                     std::max<uint64_t>(1, range.size()));
  for (size_t section = 0; section < names.size(); ++section) {
    v1::CheckpointSection* out = part->add_sections();
    out->set_name(names[section]);
    out->set_file_offset((*data)->bytes_written());
    SectionAppender appender(data->get(), out, block_elements);
    const int slot = static_cast<int>(section) - 1;
    if (slot >= 0 && optimizer->PacksSlot(slot)) {
      // Only the stored runs (format 2).
      absl::StatusOr<PackedSection> packed =
          PackedSection::Create(*layout, range, *optimizer, slot);
      if (!packed.ok()) return packed.status();
      out->set_num_elements(packed->num_elements());
      for (const PackedSection::Run& run : packed->RunsIn(range.begin, range.end)) {
        if (absl::Status s = AppendValues(read, static_cast<int>(section),
                                          run.flat_begin - range.begin, run.count, appender);
            !s.ok()) {
          return s;
        }
      }
    } else {
      out->set_num_elements(range.size());
      if (absl::Status s = AppendValues(read, static_cast<int>(section), 0, range.size(), appender);
          !s.ok()) {
        return s;
      }
    }
    if (absl::Status s = appender.Finish(); !s.ok()) return s;
  }
  part->set_file_bytes((*data)->bytes_written());
  if (absl::Status s = (*data)->Commit(); !s.ok()) return s;
  written.bytes = (*data)->bytes_written();

  absl::StatusOr<std::string> json = ToJson(record);
  if (!json.ok()) return json.status();
  if (absl::Status s = WriteFileAtomically(
          env, JoinPath(directory, CheckpointPartRecordName(shard_index, config.shard_count())),
          *json);
      !s.ok()) {
    return s;
  }
  absl::StatusOr<bool> committed = TryCommit(env, directory, config, step, progress.run_id());
  if (!committed.ok()) return committed.status();
  written.committed = *committed;
  if (*committed || FileExists(env, manifest_path)) written.manifest = manifest_path;
  return written;
}

int64_t CheckpointReader::trainer_step() const {
  const auto& trainer_steps = manifest_.parts(0).progress().trainer_steps();
  if (trainer_steps.empty()) return step();
  return *std::min_element(trainer_steps.begin(), trainer_steps.end());
}

absl::StatusOr<std::unique_ptr<CheckpointReader>> CheckpointReader::Open(
    const std::string& directory, FileEnv* env) {
  const std::string path = JoinPath(directory, kCheckpointManifestFile);
  if (!FileExists(env, path)) {
    return absl::NotFoundError(absl::StrCat(
        directory, " holds no committed checkpoint: ", kCheckpointManifestFile,
        " is missing (never written, or the checkpoint was interrupted before every shard "
        "finished)"));
  }
  absl::StatusOr<v1::CheckpointManifest> manifest = ReadManifestFile(env, path);
  if (!manifest.ok()) return manifest.status();
  std::unique_ptr<CheckpointReader> reader(new CheckpointReader());
  reader->env_ = env;
  reader->directory_ = directory;
  reader->manifest_ = std::move(*manifest);
  const v1::CheckpointManifest& m = reader->manifest_;
  auto bad = [&path](const std::string& what) {
    return absl::DataLossError(absl::StrCat(path, ": ", what));
  };
  if (m.format_version() < 1 || m.format_version() > kCheckpointFormatVersion) {
    return absl::FailedPreconditionError(absl::StrCat(path, ": format version ", m.format_version(),
                                                      "; this build reads 1 to ",
                                                      kCheckpointFormatVersion));
  }
  absl::StatusOr<ModelLayout> layout =
      LayoutFromProto(m.config().layout(), m.config().shard_count());
  if (!layout.ok()) return bad(absl::StrCat("bad layout: ", layout.status().message()));
  reader->layout_ = std::move(*layout);
  absl::StatusOr<OptimizerConfig> optimizer = OptimizerConfigFromProto(m.config().optimizer());
  if (!optimizer.ok()) return bad(absl::StrCat("bad optimizer: ", optimizer.status().message()));
  reader->optimizer_ = *optimizer;
  reader->section_names_ = SectionNames(*optimizer);
  const uint32_t shards = m.config().shard_count();
  if (static_cast<uint32_t>(m.parts_size()) != shards) {
    return bad(absl::StrCat(m.parts_size(), " parts for ", shards, " shards"));
  }
  for (uint32_t i = 0; i < shards; ++i) {
    const v1::CheckpointPart& part = m.parts(static_cast<int>(i));
    const FlatRange range = reader->layout_->ShardRange(i);
    const std::string file = JoinPath(directory, part.file());
    if (part.shard_index() != i || part.range().begin() != range.begin ||
        part.range().end() != range.end) {
      return bad(absl::StrCat("part ", i, " describes shard ", part.shard_index(), " range [",
                              part.range().begin(), ", ", part.range().end(),
                              ") but the layout gives [", range.begin, ", ", range.end,
                              ") (a manifest from another layout?)"));
    }
    if (part.file().empty() || part.file().find('/') != std::string::npos) {
      return bad(absl::StrCat("part ", i, " names the file '", part.file(), "'"));
    }
    if (part.block_bytes() == 0 || part.block_bytes() % sizeof(float) != 0) {
      return bad(absl::StrCat("part ", i, " has block size ", part.block_bytes()));
    }
    if (part.progress().version() != m.step() ||
        !SameProgress(part.progress(), m.parts(0).progress(), m.config())) {
      return bad(absl::StrCat("part ", i, " was saved at another step or state than part 0"));
    }
    if (static_cast<size_t>(part.sections_size()) != reader->section_names_.size()) {
      return bad(absl::StrCat("part ", i, " has ", part.sections_size(), " sections; ",
                              m.config().optimizer().ShortDebugString(), " keeps ",
                              reader->section_names_.size()));
    }
    uint64_t end = kCheckpointHeaderBytes;
    std::vector<std::optional<PackedSection>>& packed = reader->packed_.emplace_back();
    for (int s = 0; s < part.sections_size(); ++s) {
      const v1::CheckpointSection& section = part.sections(s);
      const uint64_t bytes = section.num_elements() * sizeof(float);
      // Format 2 packs the packed slots (format 1 wrote them full-size).
      // (No field says so: a build before format 2 must be able to parse
      // the manifest to refuse it by its version.)
      uint64_t elements = range.size();
      packed.emplace_back();
      if (m.format_version() >= 2 && s > 0 && optimizer->PacksSlot(s - 1)) {
        absl::StatusOr<PackedSection> p =
            PackedSection::Create(*reader->layout_, range, *optimizer, s - 1);
        if (!p.ok()) {
          return bad(absl::StrCat("section ", s, " ('", section.name(), "') of part ", i,
                                  " is packed: ", p.status().message()));
        }
        elements = p->num_elements();
        packed.back() = *std::move(p);
      }
      if (section.name() != reader->section_names_[s] || section.num_elements() != elements ||
          section.file_offset() < kCheckpointHeaderBytes ||
          static_cast<uint64_t>(section.block_crc32_size()) !=
              (bytes + part.block_bytes() - 1) / part.block_bytes()) {
        return bad(absl::StrCat("section ", s, " ('", section.name(), "') of part ", i,
                                " does not match the layout and optimizer"));
      }
      end = std::max(end, section.file_offset() + bytes);
    }
    if (end > part.file_bytes()) {
      return bad(absl::StrCat("part ", i, "'s sections end past its file size"));
    }
    // Only a missing or wrong file is the checkpoint's damage; any other
    // error (permissions, I/O) is returned as it is.
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> f = env->NewRandomAccessFile(file);
    if (absl::IsNotFound(f.status())) {
      return absl::DataLossError(absl::StrCat(file, ": missing (", path, " lists it)"));
    }
    if (!f.ok()) return f.status();
    absl::StatusOr<FileInfo> info = (*f)->Stat();
    if (!info.ok()) return info.status();
    if (info->size != part.file_bytes()) {
      return absl::DataLossError(
          absl::StrCat(file, ": ", info->size, " bytes, but ", path, " says ", part.file_bytes(),
                       info->size < part.file_bytes() ? " (truncated)" : ""));
    }
    std::string header(kCheckpointHeaderBytes, '\0');
    absl::StatusOr<size_t> n = (*f)->Read(0, header.size(), header.data());
    if (!n.ok()) return n.status();
    if (*n != header.size()) return absl::DataLossError(file + ": short header");
    if (header != DataFileHeader(m.format_version(), i, shards, m.step())) {
      return absl::DataLossError(absl::StrCat(file, ": its header is not that of shard ", i, " of ",
                                              shards, " at step ", m.step()));
    }
  }
  return reader;
}

absl::Status CheckpointReader::Read(int section, uint64_t flat_offset, uint64_t count,
                                    float* out) const {
  BlockCache cache;
  return ReadCached(section, flat_offset, count, out, &cache);
}

absl::Status CheckpointReader::ReadCached(int section, uint64_t flat_offset, uint64_t count,
                                          float* out, BlockCache* cache) const {
  if (section < 0 || static_cast<size_t>(section) >= section_names_.size()) {
    return absl::OutOfRangeError(absl::StrCat("no section ", section));
  }
  const float initial = section == 0 ? 0.0f : optimizer_.InitialSlotValue(section - 1);
  const uint64_t end = flat_offset + count;
  const uint64_t saved = layout_->total_elements();
  if (end > saved) {
    // Padding the saved layout did not have (a layout for more shards).
    const uint64_t from = std::max(flat_offset, saved);
    std::fill(out + (from - flat_offset), out + count, initial);
  }
  cache->files.resize(manifest_.parts_size());
  for (int part_index = 0; part_index < manifest_.parts_size(); ++part_index) {
    const v1::CheckpointPart& part = manifest_.parts(part_index);
    const uint64_t lo = std::max(flat_offset, part.range().begin());
    const uint64_t hi = std::min(end, part.range().end());
    if (lo >= hi) continue;
    const std::optional<PackedSection>& packed = packed_[part_index][section];
    if (!packed.has_value()) {
      if (absl::Status s = ReadSectionValues(part_index, section, lo - part.range().begin(),
                                             hi - lo, out + (lo - flat_offset), cache);
          !s.ok()) {
        return s;
      }
      continue;
    }
    // Packed: what the runs do not cover is not stored.
    std::fill(out + (lo - flat_offset), out + (hi - flat_offset), initial);
    for (const PackedSection::Run& run : packed->RunsIn(lo, hi)) {
      if (absl::Status s = ReadSectionValues(part_index, section, run.packed_begin, run.count,
                                             out + (run.flat_begin - flat_offset), cache);
          !s.ok()) {
        return s;
      }
    }
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadSectionValues(int part_index, int section, uint64_t first,
                                                 uint64_t count, float* out,
                                                 BlockCache* cache) const {
  const v1::CheckpointPart& part = manifest_.parts(part_index);
  const v1::CheckpointSection& s = part.sections(section);
  std::unique_ptr<RandomAccessFile>& f = cache->files[part_index];
  if (f == nullptr) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> opened =
        env_->NewRandomAccessFile(JoinPath(directory_, part.file()));
    if (!opened.ok()) return opened.status();
    f = std::move(*opened);
  }
  const uint64_t block_bytes = part.block_bytes();
  const uint64_t section_bytes = s.num_elements() * sizeof(float);
  const uint64_t first_byte = first * sizeof(float);
  const uint64_t last_byte = (first + count) * sizeof(float);
  for (uint64_t b = first_byte / block_bytes; b * block_bytes < last_byte; ++b) {
    const uint64_t block_begin = b * block_bytes;
    const uint64_t n = std::min(block_bytes, section_bytes - block_begin);
    if (cache->part != part_index || cache->section != section || cache->block != b) {
      cache->part = -1;  // (Not valid while the read is under way or after it failed.)
      if (absl::Status r = ReadBlock(*f, part, s, b, &cache->data); !r.ok()) return r;
      cache->part = part_index;
      cache->section = section;
      cache->block = b;
    }
    const std::vector<char>& block = cache->data;
    const uint64_t copy_begin = std::max(block_begin, first_byte);
    const uint64_t copy_end = std::min(block_begin + n, last_byte);
    std::memcpy(reinterpret_cast<char*>(out) + (copy_begin - first_byte),
                block.data() + (copy_begin - block_begin), copy_end - copy_begin);
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::ReadFor(const ModelLayout& target, int section, uint64_t flat_offset,
                                       uint64_t count, float* out) const {
  if (!target.SameTensors(*layout_)) {
    return absl::FailedPreconditionError(
        absl::StrCat(directory_, " holds a model of other tensors or alignment"));
  }
  // Both flat: every tensor at the same offset whatever the shard counts.
  if (target.partition() == Partition::kFlat && layout_->partition() == Partition::kFlat) {
    return Read(section, flat_offset, count, out);
  }
  if (section < 0 || static_cast<size_t>(section) >= section_names_.size()) {
    return absl::OutOfRangeError(absl::StrCat("no section ", section));
  }
  const float initial = section == 0 ? 0.0f : optimizer_.InitialSlotValue(section - 1);
  std::fill(out, out + count, initial);
  BlockCache cache;
  for (const TensorPiece& piece : target.PiecesIn(FlatRange{flat_offset, flat_offset + count})) {
    const TensorPlacement& saved = layout_->tensors()[piece.tensor_index];
    if (absl::Status s = ReadCached(section, saved.offset + piece.tensor_offset, piece.size,
                                    out + (piece.flat_offset - flat_offset), &cache);
        !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::vector<v1::HyperparameterChange> ScheduledChangesOf(const v1::CheckpointManifest& manifest) {
  std::map<int64_t, v1::HyperparameterChange> by_step;
  for (const v1::CheckpointPart& part : manifest.parts()) {
    for (const v1::HyperparameterChange& c : part.progress().scheduled()) by_step.emplace(c.step(), c);
  }
  std::vector<v1::HyperparameterChange> changes;
  for (auto& [step, change] : by_step) changes.push_back(std::move(change));
  return changes;
}

absl::Status CheckpointReader::ReadBlock(const RandomAccessFile& file,
                                         const v1::CheckpointPart& part,
                                         const v1::CheckpointSection& section, uint64_t b,
                                         std::vector<char>* block) const {
  const uint64_t block_begin = b * part.block_bytes();
  const uint64_t n =
      std::min<uint64_t>(part.block_bytes(), section.num_elements() * sizeof(float) - block_begin);
  block->resize(n);
  absl::StatusOr<size_t> got = file.Read(section.file_offset() + block_begin, n, block->data());
  if (!got.ok()) return got.status();
  if (*got != n || static_cast<uint32_t>(crc32(0L, reinterpret_cast<const Bytef*>(block->data()),
                                               static_cast<uInt>(n))) != section.block_crc32(b)) {
    return absl::DataLossError(absl::StrCat(file.path(), ": block ", b, " of section '",
                                            section.name(), "' (bytes ",
                                            section.file_offset() + block_begin, "..",
                                            section.file_offset() + block_begin + n, ") ",
                                            *got != n ? "is short" : "fails its checksum"));
  }
  return absl::OkStatus();
}

absl::Status CheckpointReader::VerifyEveryBlock() const {
  // Each block once, one at a time (a checkpoint can be many gigabytes).
  std::vector<char> block;
  for (const v1::CheckpointPart& part : manifest_.parts()) {
    absl::StatusOr<std::unique_ptr<RandomAccessFile>> f =
        env_->NewRandomAccessFile(JoinPath(directory_, part.file()));
    if (!f.ok()) return f.status();
    for (const v1::CheckpointSection& section : part.sections()) {
      const uint64_t bytes = section.num_elements() * sizeof(float);
      for (uint64_t b = 0; b * part.block_bytes() < bytes; ++b) {
        if (absl::Status s = ReadBlock(**f, part, section, b, &block); !s.ok()) return s;
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace shardopt
