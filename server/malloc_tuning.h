// Allocator settings for a process that moves multi-MiB messages all day.
//
// gRPC receives every message into fresh buffers, and protobuf parses each
// chunk into a fresh string of a few MiB. With glibc's defaults such blocks
// are mmap'ed and munmap'ed per message and freed heap is trimmed eagerly, so
// every message pays page faults on memory it just gave back. Keeping blocks
// up to 32 MiB (glibc's maximum for the threshold) on the heap and trimming
// only above 1 GiB of free heap removes that churn, at the price of holding
// on to up to that much freed memory.
//
// That hold is per malloc arena, and glibc makes up to 8 arenas per core for
// a process with many threads (gRPC's call threads): under load a server
// grew to ~10x its model state and kept it. Two arenas (unless the
// environment sets MALLOC_ARENA_MAX) keep it flat at the same throughput.
#ifndef SHARDOPT_SERVER_MALLOC_TUNING_H_
#define SHARDOPT_SERVER_MALLOC_TUNING_H_

namespace shardopt {

// Call once at start-up, before threads start. Returns false if glibc
// refused a setting (the process works either way, only slower or larger).
bool TuneMallocForLargeMessages();

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_MALLOC_TUNING_H_
