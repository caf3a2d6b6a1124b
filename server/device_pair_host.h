// DevicePairHost: the device pairs (common/device_pair.h) trainers opened
// with this server through OpenDevicePair, all of one kind.
//
// Open makes a pair's id and a name for calls to use, and joins the pair as
// rank 0 on a thread of its own (the trainer joins after it has the
// answer), for at most kJoinTimeout. A push or a pull that names the pair
// takes it for its transfer (Acquire, waiting for a pair still joining or
// busy): one transfer at a time, so that the bytes on the pair are always
// the transfer's. A lease whose transfer Started() and did not end with
// Finished() (it failed or broke off) drops the pair: what is left on it is
// not the next transfer's; so does one whose call was cancelled
// (Abandoned), since the trainer drops its end then. At most kMaxPairs are
// held; a new one then replaces the one idle longest (a trainer that died
// leaves its pairs behind until then). Thread-safe.
#ifndef SHARDOPT_SERVER_DEVICE_PAIR_HOST_H_
#define SHARDOPT_SERVER_DEVICE_PAIR_HOST_H_

#include <memory>
#include <string>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/device_pair.h"

namespace shardopt {

class DevicePairHost {
 public:
  static constexpr absl::Duration kJoinTimeout = absl::Seconds(30);
  static constexpr size_t kMaxPairs = 64;
  static constexpr size_t kMaxJoining = 16;

  // Pairs of `kind` on CUDA device `device` (ignored by host kinds).
  // `join_timeout`: kJoinTimeout but in tests.
  DevicePairHost(const DevicePairKind& kind, int device, absl::Duration join_timeout = kJoinTimeout)
      : kind_(kind), device_(device), join_timeout_(join_timeout) {}
  // Waits for the pairs still joining (at most kJoinTimeout) and drops all.
  ~DevicePairHost();

  const DevicePairKind& kind() const { return kind_; }
  size_t pairs() const;
  // Of those, the ones a transfer's call holds now.
  size_t busy() const;

  struct Opened {
    std::string pair;  // The name calls use.
    std::string id;    // The kind's id, for the trainer to join with.
  };
  // RESOURCE_EXHAUSTED when kMaxJoining pairs are joining, or kMaxPairs are
  // held and none is idle.
  absl::StatusOr<Opened> Open(std::string peer);

  struct Entry;
  class Lease {
   public:
    Lease(Lease&& other) noexcept
        : host_(other.host_),
          entry_(std::move(other.entry_)),
          dirty_(other.dirty_),
          abandoned_(other.abandoned_) {}
    Lease& operator=(Lease&&) = delete;
    ~Lease();
    DevicePair& pair() const;
    // Bytes are about to move: from here on, only Finished() keeps the pair.
    void Started() { dirty_ = true; }
    // The transfer ended cleanly: the pair serves the next one.
    void Finished() { dirty_ = false; }
    // The call was cancelled (by its trainer, its connection or its
    // deadline): the trainer drops its end of the pair whatever moved, as
    // it cannot tell what the shard sent, so the shard drops its end too
    // (Finished or not) rather than keep a pair nobody will name again.
    void Abandoned() { abandoned_ = true; }

   private:
    friend class DevicePairHost;
    Lease(DevicePairHost* host, std::shared_ptr<Entry> entry)
        : host_(host), entry_(std::move(entry)) {}
    DevicePairHost* host_;
    std::shared_ptr<Entry> entry_;
    bool dirty_ = false;
    bool abandoned_ = false;
  };
  // The pair named `pair` for one transfer, waiting while it joins or
  // another transfer holds it, until `deadline` or for kJoinTimeout:
  // FAILED_PRECONDITION saying kDevicePairNotOpen when it is not open here
  // (never was, failed to join, or was dropped); UNAVAILABLE when the wait
  // runs out (so that the trainer retries over another pair or plane: a
  // DEADLINE_EXCEEDED before its call's deadline would read as a "still
  // waiting" report, retried on the same pair).
  absl::StatusOr<Lease> Acquire(absl::string_view pair, absl::Time deadline);

 private:
  void Join(std::shared_ptr<Entry> entry, std::string id);
  void Release(const std::shared_ptr<Entry>& entry, bool finished);

  const DevicePairKind& kind_;
  const int device_;
  const absl::Duration join_timeout_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::shared_ptr<Entry>> pairs_ ABSL_GUARDED_BY(mu_);
  size_t joining_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_DEVICE_PAIR_HOST_H_
