// PeerProcess: an nccl_peer child process, rank 1 of an NcclPair with the
// calling process, for nccl_pair_test and //tools/gpu:nccl_bench. Started
// with posix_spawn (a fresh process: nothing of the caller's CUDA state) in
// the caller's environment but with its own NCCL_HOSTID, so that NCCL takes
// the two for separate hosts on one GPU (common/nccl/nccl_pair.h). Killed
// and reaped when destroyed unless already reaped.
#ifndef SHARDOPT_COMMON_NCCL_PEER_PROCESS_H_
#define SHARDOPT_COMMON_NCCL_PEER_PROCESS_H_

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace shardopt::nccl {

class PeerProcess {
 public:
  // nccl_peer `binary` joining the pair `unique_id` (raw bytes) in `mode`
  // (see nccl_peer.cc) for transfers of `bytes`.
  PeerProcess(const std::string& binary, const std::string& unique_id, const std::string& mode,
              const std::vector<size_t>& bytes, const std::string& host_id);
  ~PeerProcess();
  PeerProcess(const PeerProcess&) = delete;
  PeerProcess& operator=(const PeerProcess&) = delete;

  bool started() const { return pid_ > 0; }
  // Waits for it; the status as waitpid gives it.
  int Wait();
  // How it ended, if it has ("" while it runs): for failure messages.
  std::string ExitedHow();

 private:
  pid_t pid_ = -1;
  bool reaped_ = false;
};

}  // namespace shardopt::nccl

#endif  // SHARDOPT_COMMON_NCCL_PEER_PROCESS_H_
