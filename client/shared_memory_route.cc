#include "client/shared_memory_route.h"

#include <unistd.h>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/fork_private.h"
#include "common/logging.h"

namespace shardopt {
namespace {

bool IsSixteenBit(DType dtype) { return DTypeSize(dtype) == 2; }

// A fence word per cache line: the shards of a trainer touch theirs at once.
constexpr uint64_t kFenceSpacing = 64;

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerSegment>> TrainerSegment::Create(uint64_t total_elements,
                                                                       DType push_dtype,
                                                                       DType pull_dtype,
                                                                       uint32_t shards) {
  if (total_elements == 0) return absl::InvalidArgumentError("no elements to share");
  const size_t staging_element = DTypeSize(push_dtype);
  // Gradients, parameters, staging, then the 16-bit pull region.
  uint64_t bytes = (2 * sizeof(float) + staging_element) * total_elements;
  int64_t pull16 = -1;
  if (IsSixteenBit(pull_dtype)) {
    pull16 = static_cast<int64_t>(bytes);
    bytes += total_elements * 2;
  }
  bytes = (bytes + kFenceSpacing - 1) / kFenceSpacing * kFenceSpacing;
  const int64_t fences = static_cast<int64_t>(bytes);
  bytes += uint64_t{2} * shards * kFenceSpacing;
  absl::StatusOr<SharedSegment> segment = SharedSegment::Create(bytes);
  if (!segment.ok()) return segment.status();
  return std::unique_ptr<TrainerSegment>(new TrainerSegment(
      *std::move(segment), total_elements, staging_element, pull16, fences, shards));
}

int64_t TrainerSegment::FenceOffset(uint32_t shard, FenceUse use) const {
  if (shard >= shards_) return -1;
  return fences_ + static_cast<int64_t>((2 * uint64_t{shard} + static_cast<uint64_t>(use)) *
                                        kFenceSpacing);
}

std::optional<TrainerSegment::PushPlace> TrainerSegment::PlacePush(uint64_t begin,
                                                                   const char* payload,
                                                                   size_t element_size) const {
  if (element_size == sizeof(float) &&
      payload == reinterpret_cast<const char*>(gradients() + begin)) {
    return PushPlace{static_cast<int64_t>(begin * sizeof(float)), false};
  }
  if (element_size != staging_element_) return std::nullopt;
  return PushPlace{static_cast<int64_t>(2 * sizeof(float) * total_ + begin * element_size), true};
}

int64_t TrainerSegment::PullOffset(uint64_t begin, DType dtype) const {
  if (!IsSixteenBit(dtype)) return static_cast<int64_t>((total_ + begin) * sizeof(float));
  return pull16_ < 0 ? -1 : pull16_ + static_cast<int64_t>(begin * 2);
}

absl::StatusOr<std::unique_ptr<SharedMemoryLink>> SharedMemoryLink::Attach(
    const std::string& socket_name, const SharedSegment& segment) {
  absl::StatusOr<int> socket = ConnectAbstract(socket_name);
  if (!socket.ok()) {
    return absl::UnavailableError(
        absl::StrCat("its shared-memory socket is not reachable from here (another host or "
                     "network namespace): ",
                     socket.status().message()));
  }
  // (The shard holds the attachment while this end is open: not while a
  // child forked by the trainer lives on after it.)
  MarkForkPrivate(*socket);
  // (The descriptor maps this trainer's buffers: never to another user's
  // process, whatever answers at the name the shard gave.)
  if (absl::Status same = CheckPeerIsSameUser(*socket, "process at the shard's socket", "trainer");
      !same.ok()) {
    CloseForkPrivate(*socket);
    return same;
  }
  absl::Status sent = SendMessage(*socket, absl::StrCat("attach ", segment.size()), segment.fd());
  absl::StatusOr<std::string> answer =
      sent.ok() ? ReceiveMessage(*socket, absl::Seconds(10)) : absl::StatusOr<std::string>(sent);
  if (!answer.ok()) {
    CloseForkPrivate(*socket);
    return answer.status();
  }
  absl::string_view text = *answer;
  if (!absl::ConsumePrefix(&text, "ok ") || text.empty()) {
    CloseForkPrivate(*socket);
    return absl::FailedPreconditionError(
        absl::StrCat("the shard refused the segment: ", absl::StripPrefix(*answer, "error ")));
  }
  return std::unique_ptr<SharedMemoryLink>(new SharedMemoryLink(*socket, std::string(text)));
}

SharedMemoryLink::~SharedMemoryLink() { CloseForkPrivate(socket_); }

bool SharedMemoryLink::alive() const { return !PeerClosed(socket_); }

SharedMemoryRoute::SharedMemoryRoute(std::shared_ptr<const TrainerSegment> segment,
                                     uint32_t shard_index)
    : segment_(std::move(segment)), shard_index_(shard_index) {}

std::shared_ptr<SharedMemoryLink> SharedMemoryRoute::Link(const SocketLookup& lookup) {
  absl::MutexLock lock(&mu_);
  if (link_ != nullptr) {
    if (link_->alive()) return link_;
    // The shard went away: its next process gets the segment again.
    link_.reset();
    retry_after_ = absl::InfinitePast();
  }
  const absl::Time now = absl::Now();
  if (now < retry_after_) return nullptr;
  retry_after_ = now + kRetryInterval;
  absl::StatusOr<std::string> socket_name = lookup();
  absl::Status refusal;
  if (!socket_name.ok()) {
    refusal = socket_name.status();
  } else if (socket_name->empty()) {
    refusal = absl::FailedPreconditionError("the shard runs without shared memory");
  } else {
    absl::StatusOr<std::unique_ptr<SharedMemoryLink>> link =
        SharedMemoryLink::Attach(*socket_name, segment_->segment());
    if (link.ok()) {
      link_ = *std::move(link);
      last_refusal_.clear();
      LogInfo("shard %d: payloads go through shared memory", shard_index_);
      return link_;
    }
    refusal = link.status();
  }
  // Said once per reason, not at every retry.
  const std::string why(refusal.message());
  if (why != last_refusal_) {
    LogInfo("shard %d: payloads go over gRPC: %s", shard_index_, why);
    last_refusal_ = why;
  }
  // A shard that did not answer is asked again soon (it may be restarting).
  if (!socket_name.ok() && !absl::IsFailedPrecondition(socket_name.status())) {
    retry_after_ = now + absl::Milliseconds(250);
  }
  return nullptr;
}

bool SharedMemoryRoute::DropIfDead(const std::shared_ptr<SharedMemoryLink>& link) {
  if (link == nullptr || link->alive()) return false;
  Drop(link);
  return true;
}

void SharedMemoryRoute::Drop(const std::shared_ptr<SharedMemoryLink>& link) {
  absl::MutexLock lock(&mu_);
  if (link_ == link) {
    link_.reset();
    retry_after_ = absl::InfinitePast();
  }
}

}  // namespace shardopt
