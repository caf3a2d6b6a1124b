// Descriptors that a forked child does not keep open.
//
// A socket's open end tells its peer that this process is still there: a
// shard keeps a trainer's shared-memory attachment (and the mapping of its
// segment) and its payload socket links until every copy of the trainer's
// end is closed. A child forked without exec (a PyTorch DataLoader worker,
// a multiprocessing pool) inherits every descriptor, so after a `kill -9`
// of the trainer its children would hold those ends, and the shard's side
// of them, for as long as they live.
//
// A descriptor marked here is replaced in every forked child by /dev/null
// (dup2, from a pthread_atfork handler): the child's copy of the socket is
// closed, while the number stays taken, so that the child's copies of the
// objects holding it close /dev/null, not whatever opened next. The parent's
// descriptor is untouched. Only fork() without exec needs this (exec closes
// them anyway: they are close-on-exec).
//
// Thread-safe and fork-safe: marking, and the forget-and-close, hold the
// registry's lock, which fork() takes too, so that a child never sees a
// number half-forgotten.
#ifndef SHARDOPT_COMMON_FORK_PRIVATE_H_
#define SHARDOPT_COMMON_FORK_PRIVATE_H_

namespace shardopt {

// Marks `fd` (an open descriptor) as this process's alone.
void MarkForkPrivate(int fd);

// Forgets `fd` and closes it, in one step (a number closed is free to be
// reused by anything, which a child must then keep).
void CloseForkPrivate(int fd);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_FORK_PRIVATE_H_
