#include "common/nccl/peer_process.h"

#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

extern char** environ;

namespace shardopt::nccl {

PeerProcess::PeerProcess(const std::string& binary, const std::string& unique_id,
                         const std::string& mode, const std::vector<size_t>& bytes,
                         const std::string& host_id) {
  std::vector<std::string> args = {binary, "--unique_id=" + absl::BytesToHexString(unique_id),
                                   "--mode=" + mode, "--bytes=" + absl::StrJoin(bytes, ",")};
  std::vector<std::string> env = {"NCCL_HOSTID=" + host_id};
  for (char** e = environ; *e != nullptr; ++e) {
    if (std::string(*e).rfind("NCCL_HOSTID=", 0) != 0) env.push_back(*e);
  }
  std::vector<char*> argv, envp;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  if (posix_spawn(&pid_, binary.c_str(), nullptr, nullptr, argv.data(), envp.data()) != 0) {
    pid_ = -1;
  }
}

PeerProcess::~PeerProcess() {
  if (pid_ > 0 && !reaped_) {
    kill(pid_, SIGKILL);
    Wait();
  }
}

int PeerProcess::Wait() {
  int status = 0;
  waitpid(pid_, &status, 0);
  reaped_ = true;
  return status;
}

std::string PeerProcess::ExitedHow() {
  int status = 0;
  if (pid_ <= 0 || reaped_ || waitpid(pid_, &status, WNOHANG) != pid_) return "";
  reaped_ = true;
  return WIFEXITED(status) ? absl::StrCat("the peer exited with ", WEXITSTATUS(status))
                           : absl::StrCat("the peer died of signal ", WTERMSIG(status));
}

}  // namespace shardopt::nccl
