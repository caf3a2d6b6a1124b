// SegmentFence: a trainer's say over when a shard may touch its shared
// segment (common/shared_memory.h) for one call, through a 64-bit word in
// the segment (SharedMemoryPayload.fence_offset and fence_ticket).
//
// A push through shared memory has the shard read the trainer's memory, a
// pull has it write there, piece by piece, from the shard's process. When
// the trainer gives up on such a call (its deadline passed, Ctrl-C, a broken
// connection), gRPC tells it nothing about when the shard stops: the shard
// sees the cancellation at its next look, or not at all when it reads or
// writes its last piece first. Meanwhile the trainer has moved on: its
// Python layer takes what was written as the servers', its user recomputes
// the gradients in the memory a late read still copies (a torn push the
// retry would only duplicate), or loads weights a late pull overwrites.
//
// The word closes that gap, in the open without a round trip:
//   - The trainer opens the word with a new ticket before each attempt
//     (TryOpen, from closed only), and closes it when the attempt has ended
//     (Revoke).
//   - The shard touches the memory only inside Access(ticket): one piece at
//     a time, while the word holds that ticket (marked busy meanwhile);
//     otherwise ABORTED, and it touches nothing.
//   - Revoke closes the word at once when no piece is in progress; during
//     one it marks the word revoked, so that the piece in progress is the
//     call's last (the shard closes the word when it ends), and waits for
//     it. Once Revoke returns OK the attempt touches the trainer's memory no
//     more; when it gave up waiting, the piece in progress is still the
//     last one.
// The word lives in memory both processes map; its operations are
// lock-free atomics on it, so the word must be 8-byte aligned.
// Thread-safe; one attempt per word at a time (the trainer's side: a word
// that is not closed is not opened again).
#ifndef SHARDOPT_COMMON_SEGMENT_FENCE_H_
#define SHARDOPT_COMMON_SEGMENT_FENCE_H_

#include <cstdint>
#include <functional>

#include "absl/status/status.h"
#include "absl/time/time.h"

namespace shardopt {

class SegmentFence {
 public:
  static constexpr uint64_t kWordBytes = sizeof(uint64_t);
  // The word: 0 closed, else a ticket in [1, kRevoked), with kBusy while a
  // piece is in progress and kRevoked (with kBusy) once the trainer closed
  // it during that piece.
  static constexpr uint64_t kBusy = uint64_t{1} << 63;
  static constexpr uint64_t kRevoked = uint64_t{1} << 62;

  // INVALID_ARGUMENT unless `ticket` can be one.
  static absl::Status CheckTicket(uint64_t ticket);
  // INVALID_ARGUMENT unless a word at byte `offset` of a segment of
  // `segment_bytes` lies inside it, aligned, and outside the `payload_bytes`
  // at `payload_offset` (a call that wrote over its own fence would lose it).
  static absl::Status CheckPlace(uint64_t offset, uint64_t segment_bytes, uint64_t payload_offset,
                                 uint64_t payload_bytes);

  // The word at `word` (8-byte aligned, in shared memory).
  explicit SegmentFence(char* word);

  // The trainer's side.
  // Opens the closed word to `ticket`'s attempt; false (nothing changed)
  // when it is not closed: an earlier attempt's last piece is still in
  // progress (a Revoke that gave up waiting), or another attempt holds it.
  bool TryOpen(uint64_t ticket);
  // Closes the word to `ticket`'s attempt, waiting up to `timeout` for a
  // piece in progress to end; OK at once when the word moved on from it.
  // `peer_gone` (optional) is asked while waiting: true when the shard's
  // process went away, so that its piece will never end (and touches
  // nothing more): the word is closed then. DEADLINE_EXCEEDED when the
  // piece outlasted `timeout` (it is the call's last all the same).
  absl::Status Revoke(uint64_t ticket, absl::Duration timeout,
                      const std::function<bool()>& peer_gone = nullptr);
  // Closes a word `ticket`'s attempt left in a piece (a Revoke that gave
  // up), for when the shard that was in it is gone; true if it did.
  bool ClearAbandoned(uint64_t ticket);

  // The shard's side: runs `touch` (one piece) while the word holds
  // `ticket`, and returns its status; ABORTED without running it otherwise.
  absl::Status Access(uint64_t ticket, const std::function<absl::Status()>& touch);
  // False once the trainer closed the word to `ticket` (a call that waits
  // need not wait on).
  bool Open(uint64_t ticket) const;

 private:
  uint64_t* word_;
};

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_SEGMENT_FENCE_H_
