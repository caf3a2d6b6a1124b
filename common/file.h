// The one file layer: every file shardopt writes or reads goes through a
// FileEnv (in the manner of LevelDB's Env), so that the durability rules live
// in one place and tests can put a wrapper in between (FileEnvWrapper).
//
// Durability contract of the POSIX FileEnv (FileEnv::Default()):
//  * A file is written with NewAtomicFile: under a unique temporary name in
//    its final directory, then Commit() fsyncs it, renames it onto its path
//    and fsyncs the directory. A crash at any moment leaves either the old
//    file at the path (or none) or the whole new one, never a mix; a writer
//    destroyed without a successful Commit removes its temporary file.
//  * Directories made by CreateDirs are fsync'ed into their parents, so that
//    a file committed inside one survives a power loss along with the path
//    to it.
//  * Errors are absl::Status (never exceptions), mapped from errno by
//    PosixError: NOT_FOUND, RESOURCE_EXHAUSTED, PERMISSION_DENIED,
//    FAILED_PRECONDITION or INTERNAL, the message naming the operation, the path and strerror.
#ifndef SHARDOPT_COMMON_FILE_H_
#define SHARDOPT_COMMON_FILE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace shardopt {

// errno -> status: ENOENT NOT_FOUND; ENOSPC, EDQUOT RESOURCE_EXHAUSTED;
// EACCES, EPERM PERMISSION_DENIED; a path the file system cannot use as
// asked (ENOTDIR, EISDIR, EROFS, ELOOP, ENAMETOOLONG, EEXIST)
// FAILED_PRECONDITION; anything else INTERNAL. The message is
// "<operation> '<path>': <strerror>", e.g. "cannot open
// '/ckpt/manifest.json': No such file or directory". Never OK: `error` 0 (a
// short write that set no errno) reads "unknown I/O error".
absl::Status PosixError(int error, absl::string_view operation, absl::string_view path);

// `dir` + "/" + `name` (no doubled slash).
std::string JoinPath(absl::string_view dir, absl::string_view name);
// The directory part of `path`: "." without a slash, "/" for "/name".
std::string DirectoryOf(absl::string_view path);
// The last component of `path`.
std::string BaseName(absl::string_view path);
// `path` absolute (from the working directory) and lexically normal, without
// a trailing '/': two spellings of one directory compare equal.
std::string NormalPath(const std::string& path);

enum class FileType { kRegular, kDirectory, kOther };

struct FileInfo {
  FileType type = FileType::kOther;
  uint64_t size = 0;  // Bytes (for a regular file).
  // Who besides its owner may read it: the members of its group `group`,
  // everyone else (see WarnIfSecretReadableByOthers).
  bool group_readable = false;
  bool other_readable = false;
  uint32_t group = 0;
};

// A file being written under a temporary name beside `path()`, which
// Commit() makes appear at `path()` atomically. Until then nothing at
// `path()` changes. A writer destroyed before a successful Commit (or whose
// Commit failed before the rename) removes its temporary file. After a
// failed Append, or after Commit, every call returns FAILED_PRECONDITION.
// Not thread-safe.
class AtomicFileWriter {
 public:
  virtual ~AtomicFileWriter() = default;
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  // Appends all `bytes` (retrying short writes and EINTR).
  virtual absl::Status Append(const void* data, size_t bytes) = 0;
  absl::Status Append(absl::string_view data) { return Append(data.data(), data.size()); }
  // fsync, close, rename onto path(), fsync of the directory. When only that
  // last fsync fails, the error says so: the complete file is already at
  // path().
  virtual absl::Status Commit() = 0;

  // Bytes appended so far.
  virtual uint64_t bytes_written() const = 0;
  // Where the file goes, and where it is written until then.
  virtual const std::string& path() const = 0;
  virtual const std::string& temp_path() const = 0;

 protected:
  AtomicFileWriter() = default;
};

// A file open for reading at any offset. Const methods are safe to call from
// several threads at once.
class RandomAccessFile {
 public:
  virtual ~RandomAccessFile() = default;
  RandomAccessFile(const RandomAccessFile&) = delete;
  RandomAccessFile& operator=(const RandomAccessFile&) = delete;

  // Reads `n` bytes at `offset` into `out`, looping over short reads and
  // EINTR until `n` bytes are read or the file ends; returns how many were
  // read (fewer than `n` only at the end of the file).
  virtual absl::StatusOr<size_t> Read(uint64_t offset, size_t n, void* out) const = 0;
  // Of the open file (fstat).
  virtual absl::StatusOr<FileInfo> Stat() const = 0;
  virtual const std::string& path() const = 0;

 protected:
  RandomAccessFile() = default;
};

// The file operations shardopt uses. Implementations must be thread-safe
// (every method may be called from several threads at once); the objects
// they return are governed by their own class comments. Paths are plain
// strings, relative ones to the working directory.
class FileEnv {
 public:
  virtual ~FileEnv() = default;

  // The POSIX file system, with the durability contract in this file's
  // comment. Never destroyed.
  static FileEnv* Default();

  // mkdir -p: creates `path` and any missing parents (mode 0755), fsyncing
  // each new directory into its parent. OK when it exists already;
  // FAILED_PRECONDITION when `path` (or a parent) is not a directory.
  virtual absl::Status CreateDirs(const std::string& path) = 0;

  // A writer for `path`, whose directory must exist (NOT_FOUND otherwise).
  // Its temporary file is ".<name>.tmp.<host>.<pid>.<nonce>.<counter>" in
  // that directory: unique across the processes and hosts sharing it, so
  // that several writers of one path never share a temporary file (the last
  // Commit wins).
  virtual absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(
      const std::string& path) = 0;

  virtual absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) = 0;

  // NOT_FOUND when nothing is at `path`. Follows symbolic links.
  virtual absl::StatusOr<FileInfo> Stat(const std::string& path) = 0;

  // The names in directory `dir` (not "." and ".."), sorted.
  virtual absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) = 0;

  // Removes a file (not a directory).
  virtual absl::Status RemoveFile(const std::string& path) = 0;
  // Removes an empty directory.
  virtual absl::Status RemoveDirectory(const std::string& path) = 0;
  // rename(2): replaces `to` atomically; durable once the directories are
  // synced (SyncDirectory).
  virtual absl::Status Rename(const std::string& from, const std::string& to) = 0;
  // fsync of a directory: makes the creation, removal or renaming of its
  // entries durable.
  virtual absl::Status SyncDirectory(const std::string& dir) = 0;
};

// Forwards every call to `target` (not owned, must outlive it): a base for
// test environments that change one operation. Thread-safe if `target` is.
class FileEnvWrapper : public FileEnv {
 public:
  explicit FileEnvWrapper(FileEnv* target) : target_(target) {}

  FileEnv* target() const { return target_; }

  absl::Status CreateDirs(const std::string& path) override { return target_->CreateDirs(path); }
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(
      const std::string& path) override {
    return target_->NewAtomicFile(path);
  }
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    return target_->NewRandomAccessFile(path);
  }
  absl::StatusOr<FileInfo> Stat(const std::string& path) override { return target_->Stat(path); }
  absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) override {
    return target_->ListDirectory(dir);
  }
  absl::Status RemoveFile(const std::string& path) override { return target_->RemoveFile(path); }
  absl::Status RemoveDirectory(const std::string& path) override {
    return target_->RemoveDirectory(path);
  }
  absl::Status Rename(const std::string& from, const std::string& to) override {
    return target_->Rename(from, to);
  }
  absl::Status SyncDirectory(const std::string& dir) override {
    return target_->SyncDirectory(dir);
  }

 private:
  FileEnv* target_;
};

// Whether directory entry `name` is a temporary file of NewAtomicFile (one a
// killed writer left behind) for a file whose name starts with
// `target_prefix` (for any file when it is empty).
bool IsAtomicTempFile(absl::string_view name, absl::string_view target_prefix = "");

// Creates directory `dir` (and its parents) if needed and checks that a
// file can be made in it (a temporary file, removed at once): a read-only
// or foreign directory is found at start, not at the first write.
absl::Status CheckDirectoryWritable(FileEnv* env, const std::string& dir);

// Writes `content` to `path` atomically (NewAtomicFile, Append, Commit).
absl::Status WriteFileAtomically(FileEnv* env, const std::string& path, absl::string_view content);

// The whole file.
absl::StatusOr<std::string> ReadFileToString(FileEnv* env, const std::string& path);

// Whether anything is at `path` (Stat succeeds).
bool FileExists(FileEnv* env, const std::string& path);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_FILE_H_
