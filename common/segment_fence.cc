#include "common/segment_fence.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace shardopt {
namespace {

// (GCC's builtins: std::atomic_ref is C++20, and an std::atomic placed on
// memory another process maps is not what the standard promises either.)
uint64_t Load(const uint64_t* word) { return __atomic_load_n(word, __ATOMIC_ACQUIRE); }

bool Exchange(uint64_t* word, uint64_t expected, uint64_t desired) {
  return __atomic_compare_exchange_n(word, &expected, desired, /*weak=*/false, __ATOMIC_ACQ_REL,
                                     __ATOMIC_ACQUIRE);
}

}  // namespace

absl::Status SegmentFence::CheckTicket(uint64_t ticket) {
  if (ticket == 0 || ticket >= kRevoked) {
    return absl::InvalidArgumentError(
        absl::StrCat("fence ticket ", ticket, " is not in [1, 2^62)"));
  }
  return absl::OkStatus();
}

absl::Status SegmentFence::CheckPlace(uint64_t offset, uint64_t segment_bytes,
                                      uint64_t payload_offset, uint64_t payload_bytes) {
  if (offset % kWordBytes != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("the fence word at byte ", offset, " is not 8-byte aligned"));
  }
  if (offset > segment_bytes || segment_bytes - offset < kWordBytes) {
    return absl::InvalidArgumentError(absl::StrCat("the fence word at byte ", offset,
                                                   " overruns the ", segment_bytes,
                                                   " bytes of the shared segment"));
  }
  if (offset + kWordBytes > payload_offset && offset < payload_offset + payload_bytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the fence word at byte ", offset, " lies in the payload's bytes [", payload_offset, ", ",
        payload_offset + payload_bytes, ")"));
  }
  return absl::OkStatus();
}

SegmentFence::SegmentFence(char* word) : word_(reinterpret_cast<uint64_t*>(word)) {}

bool SegmentFence::TryOpen(uint64_t ticket) { return Exchange(word_, 0, ticket); }

absl::Status SegmentFence::Revoke(uint64_t ticket, absl::Duration timeout,
                                  const std::function<bool()>& peer_gone) {
  const uint64_t busy = ticket | kBusy, revoked = busy | kRevoked;
  // At once when no piece is in progress; else the piece in progress is
  // made the last (the shard would otherwise start its next one a moment
  // after this one ends, and a wait could lose that race for the rest of
  // the call).
  for (;;) {
    const uint64_t now = Load(word_);
    if (now == ticket) {
      if (Exchange(word_, ticket, 0)) return absl::OkStatus();
    } else if (now == busy) {
      if (Exchange(word_, busy, revoked)) break;
    } else if (now == revoked) {
      break;  // (Revoked before, the wait given up.)
    } else {
      return absl::OkStatus();  // Not this attempt's any more.
    }
  }
  const absl::Time give_up = absl::Now() + timeout;
  // A piece is one copy of a few MB: waited for in short naps.
  absl::Duration nap = absl::Microseconds(20);
  while (Load(word_) == revoked) {
    if (peer_gone && peer_gone()) {
      // Its piece never ends: the word is this side's to close.
      ClearAbandoned(ticket);
      continue;
    }
    if (absl::Now() >= give_up) {
      return absl::DeadlineExceededError(
          absl::StrCat("the shard was still reading or writing this trainer's shared memory for a "
                       "call it gave up on, ",
                       absl::FormatDuration(timeout), " later (that piece is its last)"));
    }
    absl::SleepFor(nap);
    nap = std::min(nap * 2, absl::Milliseconds(2));
  }
  return absl::OkStatus();
}

bool SegmentFence::ClearAbandoned(uint64_t ticket) {
  return Exchange(word_, ticket | kBusy | kRevoked, 0) || Exchange(word_, ticket | kBusy, 0);
}

bool SegmentFence::Open(uint64_t ticket) const { return (Load(word_) & ~kBusy) == ticket; }

absl::Status SegmentFence::Access(uint64_t ticket, const std::function<absl::Status()>& touch) {
  if (!Exchange(word_, ticket, ticket | kBusy)) {
    return absl::AbortedError(
        "the trainer gave up on this call (it closed its shared-memory fence to it)");
  }
  absl::Status s = touch();
  // Back to open, unless the trainer revoked it meanwhile: then this side
  // closes it, and the call touches nothing more.
  if (!Exchange(word_, ticket | kBusy, ticket)) {
    Exchange(word_, ticket | kBusy | kRevoked, 0);
  }
  return s;
}

}  // namespace shardopt
