// PullPlaceClaims: which pull through shared memory may write a place in a
// trainer's attached segment (PullParameters with a shared-memory place,
// server/shard_service.cc).
//
// Such a pull writes the shard's range straight into the trainer's memory,
// piece by piece. A pull its trainer gave up on (its deadline passed, it was
// cancelled) may still be running here when the trainer's retry writes the
// same place: were both to go on, the place could end up holding pieces of
// two versions (an asynchronous model's newest moves on between them), a
// torn mix the trainer would take for one version. So the newest claim on a
// place owns it: once a newer pull has claimed the place, an older one
// writes nothing more (ABORTED), and a piece the older one is writing at
// that moment is finished before the newer one's claim returns. A trainer
// has one pull per place at a time, so this only ever stops abandoned ones.
//
// A place is its segment's memory file and its byte offset there
// (PullPlace), not an address in one mapping: a retry through a new
// attachment of the same segment (the link to the shard broke and the
// trainer attached again) maps it anew, and still takes the place of the
// pull it retries. A retry by another way (a device pair, the payload
// socket or the stream, when the trainer could not attach again or one of
// those came first) is not ordered against an abandoned pull here: the
// trainer's fence (common/segment_fence.h) stops that one, and without a
// fence it stops at its next piece once it sees its call cancelled (the
// trainer's deadline reaches the shard with the call).
// Thread-safe; pulls into different places never wait for each other.
#ifndef SHARDOPT_SERVER_PULL_PLACE_CLAIMS_H_
#define SHARDOPT_SERVER_PULL_PLACE_CLAIMS_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/shared_memory.h"

namespace shardopt {

// Where a pull writes: byte `offset` of the segment whose memory file is
// `file`.
struct PullPlace {
  SharedSegment::FileId file;
  uint64_t offset = 0;

  friend bool operator==(const PullPlace& a, const PullPlace& b) {
    return a.file.device == b.file.device && a.file.inode == b.file.inode && a.offset == b.offset;
  }
  template <typename H>
  friend H AbslHashValue(H h, const PullPlace& p) {
    return H::combine(std::move(h), p.file.device, p.file.inode, p.offset);
  }
};

class PullPlaceClaims {
 private:
  struct Place {
    absl::Mutex mu;
    uint64_t newest ABSL_GUARDED_BY(mu) = 0;
    int holders = 0;  // Claims on it (PullPlaceClaims::mu_).
  };

 public:
  // One pull's claim on its place, until it ends (the claims must outlive
  // it). The pull keeps the segment mapped while its claim lives: a file id
  // is only unique among the segments alive.
  class Claim {
   public:
    Claim(Claim&& other) noexcept;
    Claim& operator=(Claim&&) = delete;
    ~Claim();
    // Runs `write` (one piece into the place) while this is the place's
    // newest claim, under the place's lock; ABORTED, without running it,
    // once a newer pull has claimed the place.
    absl::Status Write(const std::function<absl::Status()>& write);
    // OK while this is the place's newest claim, else that ABORTED status
    // (for a pull that waits: it need not wait on once superseded).
    absl::Status Current() const;

   private:
    friend class PullPlaceClaims;
    Claim(PullPlaceClaims* claims, const PullPlace& place, std::shared_ptr<Place> state,
          uint64_t number)
        : claims_(claims), place_(place), state_(std::move(state)), number_(number) {}
    PullPlaceClaims* claims_;
    PullPlace place_;
    std::shared_ptr<Place> state_;  // Null once moved from.
    uint64_t number_;
  };

  // Claims `place` for a pull starting now: it becomes the newest.
  Claim Take(const PullPlace& place);

  // Places with a claim now.
  size_t places() const;

 private:
  void Release(const PullPlace& place, const std::shared_ptr<Place>& state);

  mutable absl::Mutex mu_;
  absl::flat_hash_map<PullPlace, std::shared_ptr<Place>> places_ ABSL_GUARDED_BY(mu_);
  uint64_t taken_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_PULL_PLACE_CLAIMS_H_
