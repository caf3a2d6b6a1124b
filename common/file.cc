#include "common/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <filesystem>
#include <utility>

#include "absl/random/random.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

namespace shardopt {
namespace {

FileInfo InfoOf(const struct stat& st) {
  FileInfo info;
  info.type = S_ISREG(st.st_mode)   ? FileType::kRegular
              : S_ISDIR(st.st_mode) ? FileType::kDirectory
                                    : FileType::kOther;
  info.size = static_cast<uint64_t>(st.st_size);
  info.group_readable = (st.st_mode & S_IRGRP) != 0;
  info.other_readable = (st.st_mode & S_IROTH) != 0;
  info.group = static_cast<uint32_t>(st.st_gid);
  return info;
}

constexpr char kTempMarker[] = ".tmp.";

// A unique temporary name in `path`'s directory: several shards (processes,
// on several hosts or in containers where all are pid 1) may write the same
// file at once.
std::string TempPathFor(const std::string& path) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t nonce = absl::Uniform<uint64_t>(absl::BitGen());
  char host[64] = {0};
  ::gethostname(host, sizeof(host) - 1);
  return JoinPath(DirectoryOf(path),
                  absl::StrCat(".", BaseName(path), kTempMarker, host, ".", ::getpid(), ".",
                               absl::Hex(nonce), ".", counter.fetch_add(1)));
}

absl::Status SyncDir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return PosixError(errno, "cannot open directory", dir);
  const int rc = ::fsync(fd);
  const int error = errno;
  ::close(fd);
  if (rc != 0) return PosixError(error, "cannot fsync directory", dir);
  return absl::OkStatus();
}

class PosixAtomicFileWriter final : public AtomicFileWriter {
 public:
  PosixAtomicFileWriter(std::string path, std::string temp, int fd)
      : path_(std::move(path)), temp_(std::move(temp)), fd_(fd) {}
  ~PosixAtomicFileWriter() override { Abandon(); }

  absl::Status Append(const void* data, size_t bytes) override {
    if (!state_.ok()) return state_;
    const char* p = static_cast<const char*>(data);
    while (bytes > 0) {
      const ssize_t n = ::write(fd_, p, bytes);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return Fail(PosixError(n < 0 ? errno : 0, "cannot write", temp_));
      p += n;
      bytes -= static_cast<size_t>(n);
      written_ += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }

  absl::Status Commit() override {
    if (!state_.ok()) return state_;
    if (::fsync(fd_) != 0) return Fail(PosixError(errno, "cannot fsync", temp_));
    const int fd = std::exchange(fd_, -1);  // close releases it even when it fails.
    if (::close(fd) != 0) return Fail(PosixError(errno, "cannot close", temp_));
    if (::rename(temp_.c_str(), path_.c_str()) != 0) {
      return Fail(PosixError(errno, absl::StrCat("cannot rename '", temp_, "' onto"), path_));
    }
    renamed_ = true;
    state_ = absl::FailedPreconditionError(absl::StrCat("'", path_, "' is already committed"));
    if (absl::Status s = SyncDir(DirectoryOf(path_)); !s.ok()) {
      return absl::Status(s.code(), absl::StrCat("'", path_, "' is in place, but ", s.message()));
    }
    return absl::OkStatus();
  }

  uint64_t bytes_written() const override { return written_; }
  const std::string& path() const override { return path_; }
  const std::string& temp_path() const override { return temp_; }

 private:
  // Closes and removes the temporary file; later calls get FAILED_PRECONDITION.
  absl::Status Fail(absl::Status status) {
    Abandon();
    state_ = absl::FailedPreconditionError(absl::StrCat(
        "writer of '", path_, "' is unusable after an earlier error: ", status.message()));
    return status;
  }
  void Abandon() {
    if (fd_ >= 0) ::close(std::exchange(fd_, -1));
    if (!renamed_ && !removed_) {
      ::unlink(temp_.c_str());
      removed_ = true;
    }
  }

  const std::string path_, temp_;
  int fd_;
  uint64_t written_ = 0;
  bool renamed_ = false;
  bool removed_ = false;
  absl::Status state_;  // Non-OK once failed or committed.
};

class PosixRandomAccessFile final : public RandomAccessFile {
 public:
  PosixRandomAccessFile(std::string path, int fd) : path_(std::move(path)), fd_(fd) {}
  ~PosixRandomAccessFile() override { ::close(fd_); }

  absl::StatusOr<size_t> Read(uint64_t offset, size_t n, void* out) const override {
    char* p = static_cast<char*>(out);
    size_t done = 0;
    while (done < n) {
      const ssize_t got = ::pread(fd_, p + done, n - done, static_cast<off_t>(offset + done));
      if (got < 0 && errno == EINTR) continue;
      if (got < 0) {
        return PosixError(
            errno, absl::StrCat("cannot read ", n, " bytes at offset ", offset, " of"), path_);
      }
      if (got == 0) break;
      done += static_cast<size_t>(got);
    }
    return done;
  }

  absl::StatusOr<FileInfo> Stat() const override {
    struct stat st;
    if (::fstat(fd_, &st) != 0) return PosixError(errno, "cannot stat", path_);
    return InfoOf(st);
  }

  const std::string& path() const override { return path_; }

 private:
  const std::string path_;
  const int fd_;
};

class PosixFileEnv final : public FileEnv {
 public:
  absl::Status CreateDirs(const std::string& path_in) override {
    std::string path = path_in;
    while (path.size() > 1 && path.back() == '/') path.pop_back();
    if (path.empty()) return absl::InvalidArgumentError("cannot create a directory with no name");
    for (size_t slash = path.find('/', 1);; slash = path.find('/', slash + 1)) {
      const std::string prefix = slash == std::string::npos ? path : path.substr(0, slash);
      if (::mkdir(prefix.c_str(), 0755) == 0) {
        // The new entry must survive a power loss along with what goes in it.
        if (absl::Status s = SyncDir(DirectoryOf(prefix)); !s.ok()) return s;
      } else if (errno != EEXIST) {
        return PosixError(errno, "cannot create directory", prefix);
      } else if (struct stat st; ::stat(prefix.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "cannot create directory '", path, "': '", prefix, "' exists and is not a directory"));
      }
      if (slash == std::string::npos) break;
    }
    return absl::OkStatus();
  }

  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(
      const std::string& path) override {
    if (path.empty() || path.back() == '/') {
      return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a file name"));
    }
    std::string temp = TempPathFor(path);
    const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
    if (fd < 0) {
      return PosixError(errno, absl::StrCat("cannot create the temporary file '", temp, "' for"),
                        path);
    }
    return std::make_unique<PosixAtomicFileWriter>(path, std::move(temp), fd);
  }

  absl::StatusOr<std::unique_ptr<RandomAccessFile>> NewRandomAccessFile(
      const std::string& path) override {
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return PosixError(errno, "cannot open", path);
    return std::make_unique<PosixRandomAccessFile>(path, fd);
  }

  absl::StatusOr<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return PosixError(errno, "cannot stat", path);
    return InfoOf(st);
  }

  absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& dir) override {
    DIR* d = ::opendir(dir.c_str());
    if (d == nullptr) return PosixError(errno, "cannot list directory", dir);
    std::vector<std::string> names;
    for (;;) {
      errno = 0;
      const dirent* entry = ::readdir(d);
      if (entry == nullptr) break;
      const std::string name = entry->d_name;
      if (name != "." && name != "..") names.push_back(name);
    }
    const int error = errno;
    ::closedir(d);
    if (error != 0) return PosixError(error, "cannot list directory", dir);
    std::sort(names.begin(), names.end());
    return names;
  }

  absl::Status RemoveFile(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return PosixError(errno, "cannot remove", path);
    return absl::OkStatus();
  }

  absl::Status RemoveDirectory(const std::string& path) override {
    if (::rmdir(path.c_str()) != 0) return PosixError(errno, "cannot remove directory", path);
    return absl::OkStatus();
  }

  absl::Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0) {
      return PosixError(errno, absl::StrCat("cannot rename '", from, "' onto"), to);
    }
    return absl::OkStatus();
  }

  absl::Status SyncDirectory(const std::string& dir) override { return SyncDir(dir); }
};

}  // namespace

absl::Status PosixError(int error, absl::string_view operation, absl::string_view path) {
  absl::StatusCode code = absl::StatusCode::kInternal;
  switch (error) {
    case ENOENT:
      code = absl::StatusCode::kNotFound;
      break;
    case ENOSPC:
    case EDQUOT:
      code = absl::StatusCode::kResourceExhausted;
      break;
    case EACCES:
    case EPERM:
      code = absl::StatusCode::kPermissionDenied;
      break;
    case ENOTDIR:
    case EISDIR:
    case EROFS:
    case ELOOP:
    case ENAMETOOLONG:
    case EEXIST:
      code = absl::StatusCode::kFailedPrecondition;
      break;
    default:
      break;
  }
  return absl::Status(code, absl::StrCat(operation, " '", path, "': ",
                                         error == 0 ? "unknown I/O error" : std::strerror(error)));
}

std::string JoinPath(absl::string_view dir, absl::string_view name) {
  if (dir.empty() || dir.back() == '/') return absl::StrCat(dir, name);
  return absl::StrCat(dir, "/", name);
}

std::string NormalPath(const std::string& path) {
  std::string normal = std::filesystem::absolute(path).lexically_normal().string();
  while (normal.size() > 1 && normal.back() == '/') normal.pop_back();
  return normal;
}

std::string DirectoryOf(absl::string_view path) {
  const size_t slash = path.rfind('/');
  if (slash == absl::string_view::npos) return ".";
  if (slash == 0) return "/";
  return std::string(path.substr(0, slash));
}

std::string BaseName(absl::string_view path) {
  const size_t slash = path.rfind('/');
  return std::string(slash == absl::string_view::npos ? path : path.substr(slash + 1));
}

FileEnv* FileEnv::Default() {
  static FileEnv* const env = new PosixFileEnv();
  return env;
}

absl::Status CheckDirectoryWritable(FileEnv* env, const std::string& dir) {
  if (absl::Status s = env->CreateDirs(dir); !s.ok()) return s;
  // (Abandoned unwritten: its destructor removes the temporary file.)
  return env->NewAtomicFile(JoinPath(dir, ".write-probe")).status();
}

absl::Status WriteFileAtomically(FileEnv* env, const std::string& path, absl::string_view content) {
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> file = env->NewAtomicFile(path);
  if (!file.ok()) return file.status();
  if (absl::Status s = (*file)->Append(content); !s.ok()) return s;
  return (*file)->Commit();
}

absl::StatusOr<std::string> ReadFileToString(FileEnv* env, const std::string& path) {
  absl::StatusOr<std::unique_ptr<RandomAccessFile>> file = env->NewRandomAccessFile(path);
  if (!file.ok()) return file.status();
  absl::StatusOr<FileInfo> info = (*file)->Stat();
  if (!info.ok()) return info.status();
  if (info->type == FileType::kDirectory) {
    return absl::FailedPreconditionError(absl::StrCat("cannot read '", path, "': a directory"));
  }
  // The size is a hint: read on until the file ends (it may have grown, or
  // be a file whose size the kernel does not know).
  std::string content(info->size, '\0');
  absl::StatusOr<size_t> got = (*file)->Read(0, content.size(), content.data());
  if (!got.ok()) return got.status();
  content.resize(*got);
  if (*got < info->size) return content;
  constexpr size_t kPiece = 1 << 16;
  for (;;) {
    const size_t before = content.size();
    content.resize(before + kPiece);
    got = (*file)->Read(before, kPiece, content.data() + before);
    if (!got.ok()) return got.status();
    content.resize(before + *got);
    if (*got < kPiece) return content;
  }
}

bool IsAtomicTempFile(absl::string_view name, absl::string_view target_prefix) {
  return absl::StartsWith(name, ".") && absl::StartsWith(name.substr(1), target_prefix) &&
         name.find(kTempMarker, 1 + target_prefix.size()) != absl::string_view::npos;
}

bool FileExists(FileEnv* env, const std::string& path) { return env->Stat(path).ok(); }

}  // namespace shardopt
