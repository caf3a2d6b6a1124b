#include "common/file.h"

#include <errno.h>
#include <linux/capability.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace shardopt {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

// A fresh directory per test, under the test's temporary directory.
class FileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = absl::StrCat(::testing::TempDir(), "/file_test_", getpid(), "_", info->name());
    ASSERT_TRUE(env_->CreateDirs(dir_).ok());
  }

  std::string Path(const std::string& name) const { return JoinPath(dir_, name); }
  std::vector<std::string> Entries() const { return env_->ListDirectory(dir_).value(); }

  FileEnv* env_ = FileEnv::Default();
  std::string dir_;
};

TEST_F(FileTest, AtomicWriteLeavesTheOldOrTheNewContent) {
  const std::string path = Path("data");
  ASSERT_TRUE(WriteFileAtomically(env_, path, "old").ok());
  {
    auto writer = env_->NewAtomicFile(path);
    ASSERT_TRUE(writer.ok()) << writer.status();
    ASSERT_TRUE((*writer)->Append("new content, half").ok());
    // Until the commit the path holds the old file, the new one is beside it.
    EXPECT_EQ(ReadFileToString(env_, path).value(), "old");
    EXPECT_EQ(DirectoryOf((*writer)->temp_path()), dir_);
    EXPECT_THAT(Entries(), ElementsAre(BaseName((*writer)->temp_path()), "data"));
    // Destroyed without Commit: the temporary file goes, the old file stays.
  }
  EXPECT_THAT(Entries(), ElementsAre("data"));
  EXPECT_EQ(ReadFileToString(env_, path).value(), "old");

  auto writer = env_->NewAtomicFile(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append("new ").ok());
  ASSERT_TRUE((*writer)->Append("content", 7).ok());
  EXPECT_EQ((*writer)->bytes_written(), 11u);
  EXPECT_EQ((*writer)->path(), path);
  ASSERT_TRUE((*writer)->Commit().ok());
  EXPECT_EQ(ReadFileToString(env_, path).value(), "new content");
  EXPECT_THAT(Entries(), ElementsAre("data"));
  // A committed writer is spent.
  EXPECT_EQ((*writer)->Append("x").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
  writer->reset();
  EXPECT_EQ(ReadFileToString(env_, path).value(), "new content");
}

TEST_F(FileTest, TemporaryNamesAreUniqueAndNameHostAndProcess) {
  const std::string path = Path("manifest.json");
  auto a = env_->NewAtomicFile(path);
  auto b = env_->NewAtomicFile(path);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE((*a)->temp_path(), (*b)->temp_path());
  char host[64] = {0};
  gethostname(host, sizeof(host) - 1);
  const std::string name = BaseName((*a)->temp_path());
  EXPECT_THAT(name, StartsWith(absl::StrCat(".manifest.json.tmp.", host, ".", getpid(), ".")));
  // What the file layer knows to be its temporary files, and of what.
  EXPECT_TRUE(IsAtomicTempFile(name));
  EXPECT_TRUE(IsAtomicTempFile(name, "manifest.json"));
  EXPECT_TRUE(IsAtomicTempFile(name, "manifest"));
  EXPECT_FALSE(IsAtomicTempFile(name, "shard-"));
  EXPECT_FALSE(IsAtomicTempFile("manifest.json"));
  EXPECT_FALSE(IsAtomicTempFile(".manifest.json"));
  EXPECT_FALSE(IsAtomicTempFile(".tmp.x", "tmp"));  // Its marker is after the name.
  // Both write; the last commit wins, and neither leaves a temporary file.
  ASSERT_TRUE((*a)->Append("a").ok());
  ASSERT_TRUE((*b)->Append("b").ok());
  ASSERT_TRUE((*b)->Commit().ok());
  ASSERT_TRUE((*a)->Commit().ok());
  EXPECT_EQ(ReadFileToString(env_, path).value(), "a");
  EXPECT_THAT(Entries(), ElementsAre("manifest.json"));
}

TEST_F(FileTest, FailedCommitRemovesTheTemporaryFile) {
  // rename(2) cannot replace a non-empty directory.
  const std::string path = Path("target");
  ASSERT_TRUE(env_->CreateDirs(JoinPath(path, "inside")).ok());
  auto writer = env_->NewAtomicFile(path);
  ASSERT_TRUE(writer.ok());
  ASSERT_TRUE((*writer)->Append("payload").ok());
  const absl::Status s = (*writer)->Commit();
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr("cannot rename"));
  EXPECT_THAT(std::string(s.message()), HasSubstr(path));
  // Gone at once, not only when the writer is destroyed.
  EXPECT_THAT(Entries(), ElementsAre("target"));
  EXPECT_EQ((*writer)->Append("more").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ((*writer)->Commit().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(FileTest, WriterInAMissingDirectoryIsNotFound) {
  const std::string path = Path("no/such/dir/file");
  auto writer = env_->NewAtomicFile(path);
  EXPECT_EQ(writer.status().code(), absl::StatusCode::kNotFound) << writer.status();
  EXPECT_THAT(std::string(writer.status().message()), HasSubstr(path));
  EXPECT_EQ(env_->NewAtomicFile(Path("dir/")).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileTest, CreateDirsMakesParentsAndIsIdempotent) {
  const std::string deep = Path("a/b/c");
  ASSERT_TRUE(env_->CreateDirs(deep).ok());
  EXPECT_EQ(env_->Stat(deep)->type, FileType::kDirectory);
  EXPECT_TRUE(env_->CreateDirs(deep).ok());
  EXPECT_TRUE(env_->CreateDirs(deep + "/").ok());
  EXPECT_THAT(env_->ListDirectory(Path("a")).value(), ElementsAre("b"));
  ASSERT_TRUE(WriteFileAtomically(env_, JoinPath(deep, "f"), "x").ok());

  // A file in the way.
  ASSERT_TRUE(WriteFileAtomically(env_, Path("file"), "x").ok());
  for (const std::string& bad : {Path("file"), Path("file/sub")}) {
    const absl::Status s = env_->CreateDirs(bad);
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_THAT(std::string(s.message()), HasSubstr("not a directory"));
  }
  EXPECT_EQ(env_->CreateDirs("").code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(FileTest, CreateDirsWorksOnRelativePaths) {
  char* cwd = getcwd(nullptr, 0);
  ASSERT_EQ(chdir(dir_.c_str()), 0);
  const absl::Status s = env_->CreateDirs("rel/one");
  const absl::Status w = WriteFileAtomically(env_, "rel/one/f", "x");
  const absl::Status top = WriteFileAtomically(env_, "top", "y");
  ASSERT_EQ(chdir(cwd), 0);
  free(cwd);
  EXPECT_TRUE(s.ok()) << s;
  EXPECT_TRUE(w.ok()) << w;
  EXPECT_TRUE(top.ok()) << top;
  EXPECT_EQ(ReadFileToString(env_, Path("rel/one/f")).value(), "x");
  EXPECT_EQ(ReadFileToString(env_, Path("top")).value(), "y");
}

TEST_F(FileTest, MissingFileIsNotFoundNamingThePath) {
  const std::string path = Path("absent");
  const absl::StatusOr<std::string> r = ReadFileToString(env_, path);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound) << r.status();
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(path));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("cannot open"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr(std::strerror(ENOENT)));
  EXPECT_EQ(env_->Stat(path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(FileExists(env_, path));
  EXPECT_EQ(env_->RemoveFile(path).code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->ListDirectory(path).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(env_->Rename(path, Path("x")).code(), absl::StatusCode::kNotFound);
}

TEST(PosixErrorTest, MapsErrnoToCodes) {
  EXPECT_EQ(PosixError(ENOENT, "op", "p").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(PosixError(ENOSPC, "op", "p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PosixError(EDQUOT, "op", "p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(PosixError(EACCES, "op", "p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(PosixError(EPERM, "op", "p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(PosixError(EIO, "op", "p").code(), absl::StatusCode::kInternal);
  EXPECT_EQ(PosixError(EISDIR, "op", "p").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PosixError(ENOTDIR, "op", "p").code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(PosixError(EROFS, "op", "p").code(), absl::StatusCode::kFailedPrecondition);
  const absl::Status s = PosixError(ENOSPC, "cannot write", "/data/x");
  EXPECT_EQ(s.message(), absl::StrCat("cannot write '/data/x': ", std::strerror(ENOSPC)));
  // A short write that set no errno is still an error.
  const absl::Status unknown = PosixError(0, "cannot write", "/data/x");
  EXPECT_EQ(unknown.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(std::string(unknown.message()), HasSubstr("unknown I/O error"));
}

// What a writer into a read-only directory reports. Root's capabilities
// override directory permissions, so as root the check runs in a child that
// dropped them all.
TEST_F(FileTest, WritingIntoAReadOnlyDirectoryIsPermissionDenied) {
  const std::string dir = Path("read_only");
  ASSERT_TRUE(env_->CreateDirs(dir).ok());
  ASSERT_EQ(chmod(dir.c_str(), 0555), 0);
  const std::string path = dir + "/out";
  auto check = [&path]() -> std::string {  // "" when as expected.
    FileEnv* env = FileEnv::Default();
    const absl::Status w = WriteFileAtomically(env, path, "x");
    if (w.code() != absl::StatusCode::kPermissionDenied) return "write: " + w.ToString();
    if (std::string(w.message()).find(path) == std::string::npos) return "no path: " + w.ToString();
    const absl::Status d = env->CreateDirs(path + "/sub");
    if (d.code() != absl::StatusCode::kPermissionDenied) return "mkdir: " + d.ToString();
    return "";
  };
  std::string problem;
  bool skipped = false;
  if (geteuid() != 0) {
    problem = check();
  } else {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      __user_cap_header_struct header = {_LINUX_CAPABILITY_VERSION_3, 0};
      __user_cap_data_struct none[2] = {};
      if (syscall(SYS_capset, &header, none) != 0) _exit(77);
      const std::string p = check();
      if (!p.empty()) fprintf(stderr, "child without capabilities: %s\n", p.c_str());
      _exit(p.empty() ? 0 : 1);
    }
    int status = 0;
    ASSERT_EQ(waitpid(pid, &status, 0), pid);
    ASSERT_TRUE(WIFEXITED(status));
    skipped = WEXITSTATUS(status) == 77;
    if (WEXITSTATUS(status) == 1) problem = "see the child's message above";
  }
  EXPECT_EQ(problem, "");
  EXPECT_FALSE(FileExists(env_, path));
  ASSERT_EQ(chmod(dir.c_str(), 0755), 0);
  EXPECT_TRUE(env_->ListDirectory(dir)->empty());  // No temporary file either.
  if (skipped) GTEST_SKIP() << "running as root and cannot drop capabilities";
}

TEST_F(FileTest, ReadsAMultiMebibyteFileWhole) {
  std::string content(5 * (1 << 20) + 123, '\0');
  for (size_t i = 0; i < content.size(); ++i) content[i] = static_cast<char>(i * 131 + i / 4099);
  const std::string path = Path("big");
  ASSERT_TRUE(WriteFileAtomically(env_, path, content).ok());
  EXPECT_EQ(env_->Stat(path)->size, content.size());
  EXPECT_EQ(env_->Stat(path)->type, FileType::kRegular);
  const absl::StatusOr<std::string> read = ReadFileToString(env_, path);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_TRUE(*read == content);

  auto file = env_->NewRandomAccessFile(path);
  ASSERT_TRUE(file.ok());
  EXPECT_EQ((*file)->Stat()->size, content.size());
  // A read of everything past a point, and one running past the end.
  std::string buffer(4 << 20, '\0');
  absl::StatusOr<size_t> got = (*file)->Read(1000, buffer.size(), buffer.data());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, buffer.size());
  EXPECT_TRUE(buffer == content.substr(1000, buffer.size()));
  got = (*file)->Read(content.size() - 10, buffer.size(), buffer.data());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 10u);
  EXPECT_EQ(buffer.substr(0, 10), content.substr(content.size() - 10));
  got = (*file)->Read(content.size() + 5, 8, buffer.data());
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, 0u);
}

TEST_F(FileTest, ReadsFilesWhoseSizeIsUnknown) {
  // /proc files report size 0; the read goes on to the end anyway.
  const absl::StatusOr<std::string> status = ReadFileToString(env_, "/proc/self/status");
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_THAT(*status, HasSubstr("Pid:"));
  EXPECT_EQ(ReadFileToString(env_, dir_).status().code(), absl::StatusCode::kFailedPrecondition);
}

TEST_F(FileTest, ListRemoveRenameStat) {
  ASSERT_TRUE(WriteFileAtomically(env_, Path("b"), "bb").ok());
  ASSERT_TRUE(WriteFileAtomically(env_, Path("a"), "a").ok());
  ASSERT_TRUE(env_->CreateDirs(Path("d")).ok());
  EXPECT_THAT(Entries(), ElementsAre("a", "b", "d"));
  EXPECT_EQ(env_->Stat(Path("b"))->size, 2u);
  EXPECT_TRUE(FileExists(env_, Path("d")));

  ASSERT_TRUE(env_->Rename(Path("b"), Path("a")).ok());
  EXPECT_EQ(ReadFileToString(env_, Path("a")).value(), "bb");
  ASSERT_TRUE(env_->SyncDirectory(dir_).ok());
  ASSERT_TRUE(env_->RemoveFile(Path("a")).ok());
  EXPECT_FALSE(env_->RemoveFile(Path("d")).ok());  // Not for directories.
  ASSERT_TRUE(WriteFileAtomically(env_, Path("d/x"), "").ok());
  EXPECT_FALSE(env_->RemoveDirectory(Path("d")).ok());  // Not empty.
  ASSERT_TRUE(env_->RemoveFile(Path("d/x")).ok());
  ASSERT_TRUE(env_->RemoveDirectory(Path("d")).ok());
  EXPECT_TRUE(Entries().empty());
  EXPECT_EQ(env_->SyncDirectory(Path("gone")).code(), absl::StatusCode::kNotFound);
}

TEST(PathTest, JoinDirectoryAndBaseName) {
  EXPECT_EQ(JoinPath("a", "b"), "a/b");
  EXPECT_EQ(JoinPath("a/", "b"), "a/b");
  EXPECT_EQ(JoinPath("", "b"), "b");
  EXPECT_EQ(DirectoryOf("a/b/c"), "a/b");
  EXPECT_EQ(DirectoryOf("/c"), "/");
  EXPECT_EQ(DirectoryOf("c"), ".");
  EXPECT_EQ(BaseName("a/b/c"), "c");
  EXPECT_EQ(BaseName("c"), "c");
}

// A wrapper sees every call and can change one: here it counts the writers
// and refuses one path.
class CountingEnv : public FileEnvWrapper {
 public:
  using FileEnvWrapper::FileEnvWrapper;
  absl::StatusOr<std::unique_ptr<AtomicFileWriter>> NewAtomicFile(
      const std::string& path) override {
    ++writers;
    if (BaseName(path) == "refused") return absl::UnavailableError("refused by the test");
    return FileEnvWrapper::NewAtomicFile(path);
  }
  std::atomic<int> writers{0};
};

TEST_F(FileTest, WrapperForwardsAndIntercepts) {
  CountingEnv env(env_);
  EXPECT_EQ(env.target(), env_);
  ASSERT_TRUE(WriteFileAtomically(&env, Path("ok"), "fine").ok());
  EXPECT_EQ(WriteFileAtomically(&env, Path("refused"), "no").code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(env.writers, 2);
  EXPECT_EQ(ReadFileToString(&env, Path("ok")).value(), "fine");
  EXPECT_THAT(env.ListDirectory(dir_).value(), ElementsAre("ok"));
}

}  // namespace
}  // namespace shardopt
