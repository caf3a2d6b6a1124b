// NCCL between processes of one machine (the tests, benchmarks and GPU
// checks, where trainer and shard processes share one GPU, each with an
// NCCL_HOSTID of its own): NCCL's own socket transport over loopback, no
// network plugin and no InfiniBand probing, and NCCL's warnings in the log.
// This is the setting nccl_pair_test passed in on a GPU; every program that
// starts NCCL peers there uses it, so that their runs and numbers compare.
//
// Call before the process's first NCCL call and before it starts its
// peers (they inherit it). A variable already set (an operator's choice) is
// kept. Builds without CUDA: it only sets the environment.
#ifndef SHARDOPT_COMMON_NCCL_LOOPBACK_ENVIRONMENT_H_
#define SHARDOPT_COMMON_NCCL_LOOPBACK_ENVIRONMENT_H_

#include <cstdlib>

namespace shardopt::nccl {

inline void UseNcclOverLoopback() {
  setenv("NCCL_SOCKET_IFNAME", "lo", 0);
  setenv("NCCL_IB_DISABLE", "1", 0);
  setenv("NCCL_NET", "Socket", 0);
  setenv("NCCL_DEBUG", "WARN", 0);
}

}  // namespace shardopt::nccl

#endif  // SHARDOPT_COMMON_NCCL_LOOPBACK_ENVIRONMENT_H_
