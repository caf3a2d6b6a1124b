// Shared memory between a trainer and a shard server on one host: the
// segment, and the Unix socket that hands it over.
//
// SharedSegment is an anonymous memfd segment, never a name in /dev/shm:
// nothing can guess or open it, and its memory goes away when the last
// process holding it (a descriptor or a mapping) exits, kill -9 included. Its
// creator allocates every page up front (so that a host short of memory
// refuses at creation, not with SIGBUS later) and seals it against resizing,
// so that a process mapping it can trust its size for as long as it maps it.
// Map() refuses a descriptor that is not sealed so.
//
// The descriptor travels over a Unix seqpacket socket in the abstract
// namespace (SCM_RIGHTS): such a socket exists only in its network namespace, so a
// trainer on another host or in another container cannot reach it and falls
// back to gRPC. The listening side learns the peer's uid from the kernel
// (SO_PEERCRED) and refuses other users.
#ifndef SHARDOPT_COMMON_SHARED_MEMORY_H_
#define SHARDOPT_COMMON_SHARED_MEMORY_H_

#include <sys/stat.h>
#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace shardopt {

// A mapped memfd segment of a fixed size. Move-only; unmaps and closes.
class SharedSegment {
 public:
  // A new zero-filled segment of `bytes` (> 0), every page allocated and
  // sealed against growing and shrinking. RESOURCE_EXHAUSTED when the host,
  // or this process's memory cgroup, lacks the memory.
  static absl::StatusOr<SharedSegment> Create(size_t bytes);
  // Maps a segment received from another process (taking `fd` over, also on
  // error). FAILED_PRECONDITION unless it is sealed against shrinking and
  // growing and holds exactly `expected_bytes`.
  static absl::StatusOr<SharedSegment> Map(int fd, size_t expected_bytes);

  SharedSegment() = default;
  SharedSegment(SharedSegment&& other) noexcept;
  SharedSegment& operator=(SharedSegment&& other) noexcept;
  SharedSegment(const SharedSegment&) = delete;
  SharedSegment& operator=(const SharedSegment&) = delete;
  ~SharedSegment();

  char* data() const { return data_; }
  size_t size() const { return size_; }
  int fd() const { return fd_; }
  // The segment's memory file: (device, inode), the same through every
  // mapping of it (in any process, each attachment of it included). Two
  // segments alive at once differ in it (on kernels before 5.9 only until
  // the 32-bit inode counter of shared memory wraps).
  struct FileId {
    uint64_t device = 0, inode = 0;
  };
  FileId file_id() const { return file_id_; }
  // True when [offset, offset + bytes) lies inside the segment.
  bool Contains(uint64_t offset, uint64_t bytes) const {
    return offset <= size_ && bytes <= size_ - offset;
  }

 private:
  SharedSegment(int fd, char* data, size_t size, FileId file_id)
      : fd_(fd), data_(data), size_(size), file_id_(file_id) {}
  // Maps all `bytes` of `fd` (closed on error); `info`: its fstat.
  static absl::StatusOr<SharedSegment> MapDescriptor(int fd, size_t bytes,
                                                     const struct stat& info);
  void Reset();

  int fd_ = -1;
  char* data_ = nullptr;
  size_t size_ = 0;
  FileId file_id_;
};

// What a shard's refusal of an attachment it does not hold says (the host
// writes it, the client recognises it and attaches again).
inline constexpr char kAttachmentNotOpen[] = "is not open on this shard";

// `bytes` random bytes from the kernel, in hex.
std::string RandomHexToken(int bytes);

// A listening Unix stream socket at abstract name `name` (without the
// leading NUL), non-blocking and close-on-exec.
absl::StatusOr<int> ListenAbstract(absl::string_view name);
// A connected socket to abstract name `name`; UNAVAILABLE when nothing
// listens there in this network namespace, or its backlog is full (the
// connect never blocks).
absl::StatusOr<int> ConnectAbstract(absl::string_view name);
// OK when the process at the other end of `socket` runs (ran, when it
// connected: SO_PEERCRED) as this process's effective user, else
// FAILED_PRECONDITION ("the <peer> runs as another user (uid U; this <self>
// runs as V)"). A segment only crosses between processes of one user, and
// each side checks: the shard before it maps one, the trainer before it
// hands its descriptor over. Same-host links of other kinds (the loopback
// device pair) take the same rule.
absl::Status CheckPeerIsSameUser(int socket, absl::string_view peer, absl::string_view self);

// One message of at most 4096 bytes, with a descriptor attached when `fd` >= 0.
absl::Status SendMessage(int socket, absl::string_view message, int fd = -1);
// Waits up to `timeout` for one message; `fd` (when not null) receives the
// attached descriptor or -1. UNAVAILABLE when the peer closed the socket,
// DEADLINE_EXCEEDED when nothing came in time.
absl::StatusOr<std::string> ReceiveMessage(int socket, absl::Duration timeout, int* fd = nullptr);
// True when the peer of `socket` closed it (or it failed): checked without
// waiting, and without consuming data.
bool PeerClosed(int socket);

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_SHARED_MEMORY_H_
