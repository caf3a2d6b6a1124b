#include "client/socket_payload_transport.h"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/retry.h"
#include "common/dtype_convert.h"
#include "common/fork_private.h"
#include "common/grpc_status.h"
#include "common/logging.h"
#include "common/payload_socket.h"
#include "common/shared_memory.h"

namespace shardopt {
namespace {

constexpr absl::Duration kOpenTimeout = absl::Seconds(2);
// Links kept open per shard: a push and the overlapped pull of a step.
constexpr size_t kMaxIdleLinks = 4;

SocketWait WaitOf(const grpc::ClientContext& context) {
  SocketWait wait;
  wait.deadline = absl::FromChrono(context.deadline());
  wait.stall = SocketPayloadTransport::kStallTimeout;
  return wait;
}

uint64_t RandomStart() {
  std::random_device device;
  return (static_cast<uint64_t>(device()) << 32) ^ device();
}

}  // namespace

SocketPayloadTransport::SocketPayloadTransport(std::string address, uint32_t shard_index)
    : host_(HostOfTarget(address)), shard_index_(shard_index), next_transfer_(RandomStart()) {}

SocketPayloadTransport::~SocketPayloadTransport() {
  absl::MutexLock lock(&mu_);
  for (const Link& link : idle_) CloseForkPrivate(link.socket);
}

absl::StatusOr<SocketPayloadTransport::Link> SocketPayloadTransport::Open(const PayloadCall& call) {
  if (host_.empty()) {
    return absl::FailedPreconditionError("the shard's address names no TCP host");
  }
  if (port_ == 0) {
    grpc::ClientContext context;
    context.set_deadline(absl::ToChronoTime(absl::Now() + kOpenTimeout));
    v1::ServerInfo info;
    absl::Status s =
        ToAbslStatus(call.stub.GetServerInfo(&context, v1::GetServerInfoRequest(), &info));
    if (!s.ok()) return s;
    if (info.payload_socket_port() == 0 || info.payload_socket_port() > 65535) {
      return absl::FailedPreconditionError(
          "the shard offers no payload socket (it serves TLS, or runs with --nopayload_socket)");
    }
    port_ = static_cast<uint16_t>(info.payload_socket_port());
  }
  std::string token = RandomHexToken(kLinkTokenChars / 2);
  absl::StatusOr<int> socket = OpenLink(host_, port_, token, kOpenTimeout);
  if (!socket.ok()) {
    port_ = 0;  // (Asked again: the shard may have restarted on another.)
    return socket.status();
  }
  // (Fork-private already: the shard keeps a link while this end is open,
  // not while a child forked by the trainer lives on after it.)
  return Link{*socket, std::move(token)};
}

std::optional<SocketPayloadTransport::Link> SocketPayloadTransport::Take(const PayloadCall& call) {
  if (call.range.size() == 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  // (Declining covers the idle links too: after a failed transfer they lead
  // to the same shard.)
  const absl::Time now = absl::Now();
  if (now < retry_after_) return std::nullopt;
  while (!idle_.empty()) {
    Link link = idle_.back();
    idle_.pop_back();
    // An idle link carries nothing: bytes or an end there mean the shard
    // dropped it (or went away).
    if (!ReadableOrClosed(link.socket)) return link;
    CloseForkPrivate(link.socket);
  }
  absl::StatusOr<Link> link = Open(call);
  if (link.ok()) {
    if (!announced_) LogInfo("shard %d: payloads go over the payload socket", shard_index_);
    announced_ = true;
    last_refusal_.clear();
    open_backoff_ = absl::ZeroDuration();
    return *link;
  }
  const std::string why(link.status().message());
  if (why != last_refusal_) {
    LogInfo("shard %d: payloads go over the gRPC stream: %s", shard_index_, why);
    last_refusal_ = why;
  }
  announced_ = false;
  // A shard without a socket is asked again rarely; one that did not answer
  // soon (it may be restarting), then less and less often.
  open_backoff_ = DoubledBackoff(open_backoff_, absl::Milliseconds(250), kRetryInterval);
  retry_after_ = now + (absl::IsFailedPrecondition(link.status()) ? kRetryInterval : open_backoff_);
  return std::nullopt;
}

void SocketPayloadTransport::Give(Link link) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() >= kMaxIdleLinks) {
    CloseForkPrivate(link.socket);
    return;
  }
  idle_.push_back(std::move(link));
}

absl::Status SocketPayloadTransport::Broken(Link link, absl::Status status,
                                            const PayloadCall& call) {
  CloseForkPrivate(link.socket);
  if (absl::IsFailedPrecondition(status) && absl::StrContains(status.message(), kLinkNotOpen)) {
    // A server at the port that does not know a link just opened there is
    // not the shard (its port is asked again), or one that restarted.
    absl::MutexLock lock(&mu_);
    port_ = 0;
    if (!link.used) retry_after_ = absl::Now() + kRetryInterval;
    return absl::UnavailableError(
        absl::StrCat("the shard no longer holds this payload link: ", status.message()));
  }
  if (absl::IsFailedPrecondition(status) &&
      absl::StrContains(status.message(), "carries another transfer")) {
    return absl::UnavailableError(status.message());
  }
  // The shard's "still waiting" report (a pull's max_wait_ms, an
  // asynchronous push's wait to be applied) is its answer, not the link's
  // failure.
  if (absl::IsUnavailable(status) ||
      (absl::IsDeadlineExceeded(status) &&
       !IsWaitReport(status, absl::FromChrono(call.context.deadline())))) {
    absl::MutexLock lock(&mu_);
    failure_backoff_ = DoubledBackoff(failure_backoff_, kFailureBackoff, kRetryInterval);
    retry_after_ = std::max(retry_after_, absl::Now() + failure_backoff_);
    announced_ = false;  // (Said again when the socket carries payloads again.)
    LogInfo(
        "shard %d: a payload-socket transfer failed (%s); payloads go over the gRPC stream "
        "for %s",
        shard_index_, status.ToString(), absl::FormatDuration(failure_backoff_));
  }
  return status;
}

void SocketPayloadTransport::Transferred() {
  transfers_.fetch_add(1, std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  failure_backoff_ = absl::ZeroDuration();
}

// The push's bytes go while another thread waits for the answer: a shard
// that answers before it has read them all (a refusal, a push it applied
// before) gets the link shut, so that the sending ends at once instead of at
// the stall bound.
std::optional<absl::Status> SocketPayloadTransport::Push(const PayloadCall& call,
                                                         const v1::PushGradientsRequest& header,
                                                         const char* payload, size_t element_size,
                                                         v1::PushGradientsResponse* response) {
  std::optional<Link> link = Take(call);
  if (!link) return std::nullopt;
  const uint64_t bytes = header.header().num_elements() * element_size;
  const uint64_t transfer = next_transfer_.fetch_add(1);
  v1::PushGradientsRequest named = header;
  v1::SocketPayload* where = named.mutable_header()->mutable_socket_payload();
  where->set_link(link->token);
  where->set_transfer(transfer);
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> writer =
      call.stub.PushGradients(&call.context, response);
  if (!writer->Write(named)) {
    return Broken(*std::move(link), ToAbslStatus(writer->Finish()), call);
  }
  writer->WritesDone();
  absl::Mutex mu;
  bool sending = true;          // Guarded by mu.
  bool shut_by_answer = false;  // Guarded by mu.
  absl::Status answer;
  std::thread finisher([&] {
    answer = ToAbslStatus(writer->Finish());
    absl::MutexLock lock(&mu);
    if (sending) {
      shutdown(link->socket, SHUT_RDWR);
      shut_by_answer = true;
    }
  });
  const SocketWait wait = WaitOf(call.context);
  absl::Status sent;
  for (uint64_t at = 0; at < bytes && sent.ok(); at += kSocketPieceBytes) {
    const uint64_t piece = std::min(kSocketPieceBytes, bytes - at);
    sent = SendFrame(link->socket, PayloadFrame{PayloadFrame::kData, transfer, at, piece},
                     payload + at, wait);
  }
  bool shut = false;
  {
    absl::MutexLock lock(&mu);
    sending = false;
    shut = !sent.ok() || shut_by_answer;
  }
  // A shard that froze, or a deadline that passed, is not waited for.
  if (!sent.ok() && !absl::IsUnavailable(sent)) call.context.TryCancel();
  finisher.join();
  if (answer.ok()) {
    Transferred();
    link->used = true;
    // A push the shard had already (a retry's) was answered without its
    // bytes being read: the shard closes that link, so it is not given back
    // to wait for its end to show. (A link the shard closed after answering
    // otherwise is dropped by Take.)
    const bool unread = response->outcome() == v1::PushGradientsResponse::OUTCOME_DUPLICATE ||
                        response->outcome() == v1::PushGradientsResponse::OUTCOME_ALREADY_APPLIED;
    if (!shut && !unread) {
      Give(*std::move(link));
    } else {
      CloseForkPrivate(link->socket);
    }
    return answer;
  }
  if (!sent.ok() && absl::IsCancelled(answer)) {
    return Broken(*std::move(link),
                  absl::UnavailableError(absl::StrCat("payload socket: ", sent.message())), call);
  }
  return Broken(*std::move(link), answer, call);
}

std::optional<absl::Status> SocketPayloadTransport::Pull(const PayloadCall& call,
                                                         const v1::PullParametersRequest& request,
                                                         DType dtype, float* destination,
                                                         PulledVersion* pulled) {
  if (request.wait_only()) return std::nullopt;  // (No payload.)
  std::optional<Link> link = Take(call);
  if (!link) return std::nullopt;
  const uint64_t transfer = next_transfer_.fetch_add(1);
  v1::PullParametersRequest named = request;
  named.mutable_socket_payload()->set_link(link->token);
  named.mutable_socket_payload()->set_transfer(transfer);
  std::unique_ptr<grpc::ClientReader<v1::PullParametersResponse>> reader =
      call.stub.PullParameters(&call.context, named);
  v1::PullParametersResponse first;
  if (!reader->Read(&first)) {
    // Refused, still waiting, or given up on here: the shard may have taken
    // the link meanwhile, so it is not reused.
    const absl::Status s = ToAbslStatus(reader->Finish());
    return Broken(*std::move(link), s.ok() ? absl::InternalError("a pull ended without a word") : s,
                  call);
  }
  auto fail = [&](absl::Status why) {
    call.context.TryCancel();
    const absl::Status s = ToAbslStatus(reader->Finish());
    // The shard's own reason, when it gave one, says more than a broken link.
    return Broken(*std::move(link), !s.ok() && !absl::IsCancelled(s) ? s : why, call);
  };
  if (first.has_chunk() || first.version() < 0) {
    return fail(absl::InternalError("a pull over the payload socket began with data"));
  }
  const uint64_t count = call.range.size();
  const size_t element = DTypeSize(dtype);
  const uint64_t total = count * element;
  std::vector<char> narrow;
  char* out = reinterpret_cast<char*>(destination);
  if (dtype != DType::kFloat32) {
    narrow.resize(total);
    out = narrow.data();
  }
  const SocketWait wait = WaitOf(call.context);
  uint64_t received = 0;
  for (;;) {
    absl::StatusOr<PayloadFrame> frame = ReceiveFrameHeader(link->socket, wait);
    if (absl::IsInvalidArgument(frame.status())) {
      return fail(absl::InternalError(frame.status().message()));
    }
    if (!frame.ok()) {
      const absl::Status& s = frame.status();
      return fail(absl::IsUnavailable(s) ? s : absl::UnavailableError(s.message()));
    }
    if (frame->transfer != transfer || frame->offset != received) {
      return fail(absl::InternalError(absl::StrCat("the payload socket carried byte ",
                                                   frame->offset, " of transfer ", frame->transfer,
                                                   " after ", received, " bytes of ", transfer)));
    }
    if (frame->flags == PayloadFrame::kEnded) break;
    if (frame->bytes > total - received) {
      return fail(absl::InternalError(
          absl::StrCat("the shard sends more than the ", total, " bytes of this shard's range")));
    }
    if (absl::Status s = ReceiveAll(link->socket, out + received, frame->bytes, wait); !s.ok()) {
      return fail(absl::IsUnavailable(s) ? s : absl::UnavailableError(s.message()));
    }
    received += frame->bytes;
  }
  // The link is clean after an end frame, also one that ends early (the
  // call's status says why).
  link->used = true;
  v1::PullParametersResponse last;
  int messages = 0;
  while (reader->Read(&last)) ++messages;
  const absl::Status s = ToAbslStatus(reader->Finish());
  if (!s.ok() || received != total) {
    Give(*std::move(link));
    return !s.ok() ? s
                   : absl::InternalError(absl::StrCat("a pull over the payload socket ended after ",
                                                      received, " of ", total, " bytes"));
  }
  if (messages != 1 || last.has_chunk() || last.version() != first.version()) {
    return Broken(*std::move(link),
                  absl::InternalError(absl::StrCat("a pull over the payload socket ended with ",
                                                   messages, " messages after its data")),
                  call);
  }
  if (dtype != DType::kFloat32) ConvertToFloatAndFindNonFinite(out, count, dtype, destination);
  pulled->version = last.version();
  pulled->lr = last.lr();
  Give(*std::move(link));
  Transferred();
  return absl::OkStatus();
}

}  // namespace shardopt
