// ReadyRanges: which parts of a flat gradient buffer are final while the
// gradient is still being computed (shardopt.torch marks each bucket as its
// backward hooks fire), so that a push can stream each chunk as soon as it is
// (TrainerClient::BeginStreamedPush). Pushes wait on it before each chunk and
// before ending their stream, which they do only once the caller has checked
// the whole gradient (AllowCommit); Fail() ends every wait with false.
// It also keeps a digest of every chunk a push handed to gRPC (RecordSent),
// so that the caller can tell whether the final gradient still is what was
// sent (FirstChangedChunk) before it allows the commit.
// Thread-safe.
#ifndef SHARDOPT_CLIENT_READY_RANGES_H_
#define SHARDOPT_CLIENT_READY_RANGES_H_

#include <cstdint>
#include <map>
#include <optional>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace shardopt {

class ReadyRanges {
 public:
  // Elements [begin, end) of the flat buffer are final (any order, overlaps
  // allowed).
  void MarkReady(uint64_t begin, uint64_t end);
  void AllowCommit();
  void Fail();

  // Blocks until [begin, end) is ready (true) or Fail() (false).
  bool WaitReady(uint64_t begin, uint64_t end) const;
  // Blocks until AllowCommit() (true) or Fail() (false).
  bool WaitCommit() const;
  bool failed() const;

  // Elements [begin, end) of the flat fp32 buffer at `chunk` are about to be
  // handed to gRPC (before the write: a write after the caller's check then
  // reads the final values). Kept per call, retries too.
  void RecordSent(uint64_t begin, uint64_t end, const float* chunk) const;
  // Payload bytes of the chunks recorded so far (retries count again).
  uint64_t sent() const;
  // The first recorded chunk whose elements in `flat` (the whole buffer) are
  // no longer what was recorded, as [begin, end); nullopt when all still are.
  std::optional<std::pair<uint64_t, uint64_t>> FirstChangedChunk(const float* flat) const;

 private:
  bool CoveredLocked(uint64_t begin, uint64_t end) const ABSL_SHARED_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::map<uint64_t, uint64_t> ready_ ABSL_GUARDED_BY(mu_);  // begin -> end, disjoint, merged.
  bool commit_ ABSL_GUARDED_BY(mu_) = false;
  bool failed_ ABSL_GUARDED_BY(mu_) = false;
  struct SentChunk {
    uint64_t begin, end, digest;
  };
  mutable absl::Mutex sent_mu_;
  mutable std::vector<SentChunk> sent_chunks_ ABSL_GUARDED_BY(sent_mu_);
  mutable uint64_t sent_bytes_ ABSL_GUARDED_BY(sent_mu_) = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_READY_RANGES_H_
