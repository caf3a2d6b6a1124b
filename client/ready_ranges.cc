#include "client/ready_ranges.h"

#include <algorithm>
#include <iterator>

#include "client/chunk_digest.h"

namespace shardopt {

void ReadyRanges::MarkReady(uint64_t begin, uint64_t end) {
  if (begin >= end) return;
  absl::MutexLock lock(&mu_);
  // Merge with every interval that touches [begin, end).
  auto it = ready_.upper_bound(begin);
  if (it != ready_.begin() && std::prev(it)->second >= begin) --it;
  while (it != ready_.end() && it->first <= end) {
    begin = std::min(begin, it->first);
    end = std::max(end, it->second);
    it = ready_.erase(it);
  }
  ready_.emplace(begin, end);
}

void ReadyRanges::AllowCommit() {
  absl::MutexLock lock(&mu_);
  commit_ = true;
}

void ReadyRanges::Fail() {
  absl::MutexLock lock(&mu_);
  failed_ = true;
}

bool ReadyRanges::CoveredLocked(uint64_t begin, uint64_t end) const {
  if (begin >= end) return true;
  auto it = ready_.upper_bound(begin);
  if (it == ready_.begin()) return false;
  --it;
  return it->first <= begin && it->second >= end;
}

bool ReadyRanges::WaitReady(uint64_t begin, uint64_t end) const {
  absl::MutexLock lock(&mu_);
  const auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {
    return failed_ || CoveredLocked(begin, end);
  };
  mu_.Await(absl::Condition(&done));
  return !failed_;
}

bool ReadyRanges::WaitCommit() const {
  absl::MutexLock lock(&mu_);
  const auto done = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS { return failed_ || commit_; };
  mu_.Await(absl::Condition(&done));
  return !failed_;
}

void ReadyRanges::RecordSent(uint64_t begin, uint64_t end, const float* chunk) const {
  const uint64_t digest = DigestBytes(chunk, (end - begin) * sizeof(float));
  absl::MutexLock lock(&sent_mu_);
  sent_chunks_.push_back({begin, end, digest});
  sent_bytes_ += (end - begin) * sizeof(float);
}

uint64_t ReadyRanges::sent() const {
  absl::MutexLock lock(&sent_mu_);
  return sent_bytes_;
}

std::optional<std::pair<uint64_t, uint64_t>> ReadyRanges::FirstChangedChunk(
    const float* flat) const {
  std::vector<SentChunk> chunks;
  {
    absl::MutexLock lock(&sent_mu_);
    chunks = sent_chunks_;
  }
  for (const SentChunk& c : chunks) {
    if (DigestBytes(flat + c.begin, (c.end - c.begin) * sizeof(float)) != c.digest) {
      return std::make_pair(c.begin, c.end);
    }
  }
  return std::nullopt;
}

bool ReadyRanges::failed() const {
  absl::MutexLock lock(&mu_);
  return failed_;
}

}  // namespace shardopt
