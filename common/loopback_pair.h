// LoopbackPair: the "loopback" DevicePairKind (common/device_pair.h): host
// memory on both ends, bytes over a Unix stream socket in the abstract
// namespace of this network namespace, "shardopt-pair-<id>" (the id: 16
// random bytes in hex, so unguessable; the shard also takes only a peer of
// its own effective user, CheckPeerIsSameUser, and keeps waiting for its
// trainer past others). It is the device data plane of a shard on the CPU
// backend: the same bootstrap, transfers and failures as NCCL, so that the
// protocol runs (and is tested) where there is no GPU. Rank 0 listens and
// accepts one connection; rank 1 connects, retrying until the deadline
// (the shard joins in the background after it answered OpenDevicePair).
#ifndef SHARDOPT_COMMON_LOOPBACK_PAIR_H_
#define SHARDOPT_COMMON_LOOPBACK_PAIR_H_

#include "common/device_pair.h"

namespace shardopt {

const DevicePairKind& LoopbackPairKind();

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_LOOPBACK_PAIR_H_
