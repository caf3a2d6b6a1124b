#include "client/device_pair_transport.h"

#include <algorithm>
#include <atomic>
#include <thread>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "client/retry.h"
#include "common/grpc_status.h"
#include "common/logging.h"

namespace shardopt {
namespace {

constexpr absl::Duration kOpenTimeout = absl::Seconds(10);
// Pairs kept per shard: a push and the overlapped pull of a step.
constexpr size_t kMaxIdlePairs = 2;

absl::Time DeadlineOf(const grpc::ClientContext& context) {
  return absl::FromChrono(context.deadline());
}

absl::Status PairFailed(const absl::Status& s) {
  return absl::UnavailableError(absl::StrCat("device pair: ", s.message()));
}

}  // namespace

DevicePairTransport::DevicePairTransport(const DevicePairKind& kind, int device,
                                         uint32_t shard_index, std::string trainer,
                                         std::shared_ptr<DeviceTwins> twins)
    : kind_(kind),
      device_(device),
      shard_index_(shard_index),
      trainer_(std::move(trainer)),
      twins_(std::move(twins)) {}

DevicePairTransport::~DevicePairTransport() = default;

absl::StatusOr<DevicePairTransport::Held> DevicePairTransport::Open(const PayloadCall& call) {
  // Within the call's deadline: a call that could not wait for a pair
  // should not wait for one to open either.
  const absl::Time deadline = DeadlineOf(call.context);
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(std::min(deadline, absl::Now() + kOpenTimeout)));
  v1::OpenDevicePairRequest request;
  request.set_kind(kind_.name());
  request.set_peer(trainer_);
  v1::OpenDevicePairResponse opened;
  if (absl::Status s = ToAbslStatus(call.stub.OpenDevicePair(&context, request, &opened));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<DevicePair>> pair = kind_.Connect(
      opened.id(), /*rank=*/1, device_, std::min(deadline, absl::Now() + kJoinTimeout),
      absl::StrCat("shard ", shard_index_, " (", opened.device(), ")"));
  if (!pair.ok()) return pair.status();
  return Held{opened.pair(), *std::move(pair)};
}

std::optional<DevicePairTransport::Held> DevicePairTransport::Take(const PayloadCall& call) {
  if (call.range.size() == 0) return std::nullopt;
  {
    absl::MutexLock lock(&mu_);
    const absl::Time now = absl::Now();
    // (A shard that refused pairs is left alone for a while, idle pairs
    // included.)
    if (now < retry_after_) return std::nullopt;
    if (!idle_.empty()) {
      Held held = std::move(idle_.back());
      idle_.pop_back();
      return held;
    }
    // A few openings at a time (a push and its overlapped pull each open
    // one at the start); beyond them calls go another way meanwhile.
    if (opening_ >= kMaxIdlePairs) return std::nullopt;
    ++opening_;
  }
  absl::StatusOr<Held> held = Open(call);
  absl::MutexLock lock(&mu_);
  --opening_;
  if (held.ok()) {
    if (!announced_) {
      LogInfo("shard %d: payloads go over %s device pairs", shard_index_, kind_.name());
    }
    announced_ = true;
    last_refusal_.clear();
    open_backoff_ = absl::ZeroDuration();
    return *std::move(held);
  }
  const std::string why(held.status().message());
  if (why != last_refusal_) {
    LogInfo("shard %d: no %s device pair (payloads go another way): %s", shard_index_, kind_.name(),
            why);
    last_refusal_ = why;
  }
  announced_ = false;
  // A shard that offers no such pairs is asked again rarely; one that did
  // not answer or join (it may be restarting), soon, then less and less
  // often.
  open_backoff_ = DoubledBackoff(open_backoff_, absl::Milliseconds(250), kRetryInterval);
  retry_after_ = absl::Now() +
                 (absl::IsFailedPrecondition(held.status()) || absl::IsUnimplemented(held.status())
                      ? kRetryInterval
                      : open_backoff_);
  return std::nullopt;
}

void DevicePairTransport::Succeeded() {
  absl::MutexLock lock(&mu_);
  failure_backoff_ = absl::ZeroDuration();
}

void DevicePairTransport::TransferFailed(const absl::Status& why) {
  absl::MutexLock lock(&mu_);
  // The retry of this transfer, and the calls after it for a while, go
  // another way (the gRPC stream): a pair that failed usually means the
  // peer is gone, and a new pair would wait for it to join.
  failure_backoff_ = DoubledBackoff(failure_backoff_, kFailureBackoff, kRetryInterval);
  retry_after_ = std::max(retry_after_, absl::Now() + failure_backoff_);
  LogInfo("shard %d: a %s device pair failed (%s); payloads go another way for %s", shard_index_,
          kind_.name(), why.ToString(), absl::FormatDuration(failure_backoff_));
}

void DevicePairTransport::Give(Held held) {
  {
    absl::MutexLock lock(&mu_);
    if (idle_.size() < kMaxIdlePairs && held.pair->broken().ok()) {
      idle_.push_back(std::move(held));
      return;
    }
  }
  // (Not kept: torn down here, after the lock.)
}

absl::Status DevicePairTransport::Answered(Held held, absl::Status answer, absl::Time deadline) {
  const bool about_pairs = absl::IsFailedPrecondition(answer) &&
                           (absl::StrContains(answer.message(), kDevicePairWrongMemory) ||
                            absl::StrContains(answer.message(), kDevicePairsOff) ||
                            absl::StrContains(answer.message(), kDevicePairNotOpen));
  std::vector<Held> dropped;  // Torn down after the lock is released.
  if (absl::IsFailedPrecondition(answer) &&
      !absl::StrContains(answer.message(), kDevicePairNotOpen) && about_pairs) {
    // This shard takes no pairs of ours (for now): none is kept, and its
    // calls go another way for a while.
    absl::MutexLock lock(&mu_);
    dropped.swap(idle_);
    retry_after_ = absl::Now() + kRetryInterval;
  }
  // Only called once no byte moved or every byte moved cleanly, so the pair
  // is in step: kept (a "still waiting" DEADLINE_EXCEEDED included) unless
  // the answer is about it, or the shard's connection broke.
  const bool timed_out = absl::IsDeadlineExceeded(answer) && !IsWaitReport(answer, deadline);
  const bool keep = !about_pairs && !absl::IsUnavailable(answer) && !absl::IsCancelled(answer) &&
                    !timed_out;
  if (keep) Give(std::move(held));
  // (So that the retry goes over a new pair or another plane.)
  return about_pairs ? absl::UnavailableError(answer.message()) : answer;
}

absl::Status DevicePairTransport::SendHost(DevicePair& pair, const char* host, uint64_t bytes,
                                           absl::Time deadline, const std::string& what,
                                           const std::function<bool()>& cancelled) {
  // (Host memory is a host kind's own.)
  if (kind_.memory() == PairMemory::kHost) {
    return SendOwn(pair, host, bytes, deadline, what, cancelled);
  }
  for (uint64_t done = 0; done < bytes; done += kDevicePairPieceBytes) {
    const uint64_t piece = std::min(kDevicePairPieceBytes, bytes - done);
    absl::StatusOr<void*> scratch = pair.Scratch(piece);
    if (!scratch.ok()) return scratch.status();
    if (absl::Status s = pair.CopyIn(*scratch, host + done, piece); !s.ok()) return s;
    if (absl::Status s = pair.Send(*scratch, piece, deadline, what, cancelled); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DevicePairTransport::ReceiveHost(DevicePair& pair, char* host, uint64_t bytes,
                                              absl::Time deadline, const std::string& what,
                                              const std::function<bool()>& cancelled) {
  if (kind_.memory() == PairMemory::kHost) {
    return ReceiveOwn(pair, host, bytes, deadline, what, cancelled);
  }
  for (uint64_t done = 0; done < bytes; done += kDevicePairPieceBytes) {
    const uint64_t piece = std::min(kDevicePairPieceBytes, bytes - done);
    absl::StatusOr<void*> scratch = pair.Scratch(piece);
    if (!scratch.ok()) return scratch.status();
    if (absl::Status s = pair.Recv(*scratch, piece, deadline, what, cancelled); !s.ok()) return s;
    if (absl::Status s = pair.CopyOut(host + done, *scratch, piece); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DevicePairTransport::SendOwn(DevicePair& pair, const char* memory, uint64_t bytes,
                                          absl::Time deadline, const std::string& what,
                                          const std::function<bool()>& cancelled) {
  for (uint64_t done = 0; done < bytes; done += kDevicePairPieceBytes) {
    const uint64_t piece = std::min(kDevicePairPieceBytes, bytes - done);
    if (absl::Status s = pair.Send(memory + done, piece, deadline, what, cancelled); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

absl::Status DevicePairTransport::ReceiveOwn(DevicePair& pair, char* memory, uint64_t bytes,
                                             absl::Time deadline, const std::string& what,
                                             const std::function<bool()>& cancelled) {
  for (uint64_t done = 0; done < bytes; done += kDevicePairPieceBytes) {
    const uint64_t piece = std::min(kDevicePairPieceBytes, bytes - done);
    if (absl::Status s = pair.Recv(memory + done, piece, deadline, what, cancelled); !s.ok()) {
      return s;
    }
  }
  return absl::OkStatus();
}

std::optional<absl::Status> DevicePairTransport::Push(const PayloadCall& call,
                                                      const v1::PushGradientsRequest& header,
                                                      const char* payload, size_t element_size,
                                                      v1::PushGradientsResponse* response) {
  if (element_size != sizeof(float) || header.header().dtype() > v1::DTYPE_FLOAT32) {
    return std::nullopt;  // (fp32 only.)
  }
  std::optional<Held> held = Take(call);
  if (!held) return std::nullopt;
  const uint64_t transfer = next_transfer_.fetch_add(1);
  v1::PushGradientsRequest named = header;
  v1::DevicePairPayload* where = named.mutable_header()->mutable_device_pair();
  where->set_pair(held->name);
  where->set_transfer(transfer);
  std::unique_ptr<grpc::ClientWriter<v1::PushGradientsRequest>> writer =
      call.stub.PushGradients(&call.context, response);
  const bool written = writer->Write(named);
  if (written) writer->WritesDone();
  // The shard says when it takes the bytes; an answer without that (a
  // refusal, a push applied before) means none goes over the pair.
  writer->WaitForInitialMetadata();
  const auto& metadata = call.context.GetServerInitialMetadata();
  const auto ready = metadata.find(kDevicePairReadyKey);
  const bool go = written && ready != metadata.end() &&
                  std::string(ready->second.data(), ready->second.size()) == absl::StrCat(transfer);
  if (!go) {
    const absl::Status answer = ToAbslStatus(writer->Finish());
    if (answer.ok()) {
      Give(*std::move(held));
      return answer;
    }
    return Answered(*std::move(held), answer, DeadlineOf(call.context));
  }
  // The answer is awaited meanwhile: a shard that ends the call while the
  // bytes move (it failed) ends the sending too, instead of the deadline.
  std::atomic<bool> failed_answer{false};
  absl::Status answer;
  std::thread finisher([&] {
    answer = ToAbslStatus(writer->Finish());
    if (!answer.ok()) failed_answer.store(true);
  });
  const std::string what =
      absl::StrCat("push of step ", header.header().step(), " to shard ", shard_index_);
  const uint64_t bytes = header.header().num_elements() * element_size;
  const auto failed = [&] { return failed_answer.load(); };
  const void* twin = twins_ != nullptr ? twins_->GradientTwin(payload, bytes) : nullptr;
  const absl::Status sent = twin != nullptr ? SendOwn(*held->pair, static_cast<const char*>(twin),
                                                      bytes, DeadlineOf(call.context), what, failed)
                                            : SendHost(*held->pair, payload, bytes,
                                                       DeadlineOf(call.context), what, failed);
  if (!sent.ok()) call.context.TryCancel();
  finisher.join();
  if (!sent.ok()) {
    // (The pair is dropped with `held`.) The shard's own reason, when it
    // gave one, says more than the pair's.
    TransferFailed(sent);
    return !answer.ok() && !absl::IsCancelled(answer) ? answer : PairFailed(sent);
  }
  // Every byte was taken (the shard drains a refused push): the pair is clean.
  if (answer.ok()) {
    transfers_.fetch_add(1, std::memory_order_relaxed);
    Succeeded();
    if (twin != nullptr) twins_->CountTransfer();
    Give(*std::move(held));
    return answer;
  }
  return Answered(*std::move(held), answer, DeadlineOf(call.context));
}

std::optional<absl::Status> DevicePairTransport::Pull(const PayloadCall& call,
                                                      const v1::PullParametersRequest& request,
                                                      DType dtype, float* destination,
                                                      PulledVersion* pulled) {
  if (request.wait_only() || dtype != DType::kFloat32) return std::nullopt;
  const uint64_t bytes = call.range.size() * sizeof(float);
  // Whatever lands in the range from now on (a pair's bytes or the
  // stream's) is the newest: only a pull into the twin that succeeds marks
  // it written on the device again.
  if (twins_ != nullptr) twins_->Unwritten(destination, bytes);
  std::optional<Held> held = Take(call);
  if (!held) return std::nullopt;
  const uint64_t transfer = next_transfer_.fetch_add(1);
  v1::PullParametersRequest named = request;
  named.mutable_device_pair()->set_pair(held->name);
  named.mutable_device_pair()->set_transfer(transfer);
  named.mutable_device_pair()->set_num_elements(call.range.size());
  std::unique_ptr<grpc::ClientReader<v1::PullParametersResponse>> reader =
      call.stub.PullParameters(&call.context, named);
  v1::PullParametersResponse first;
  if (!reader->Read(&first)) {
    // Nothing goes over the pair before the first message.
    const absl::Status s = ToAbslStatus(reader->Finish());
    return Answered(*std::move(held),
                    s.ok() ? absl::InternalError("a pull ended without a word") : s,
                    DeadlineOf(call.context));
  }
  if (first.has_chunk() || first.version() < 0) {
    call.context.TryCancel();
    reader->Finish().error_code();
    return absl::InternalError("a pull over a device pair began with data");
  }
  // The rest of the stream is read meanwhile: a shard that ends the call
  // with an error while the bytes move ends the receiving too.
  std::atomic<bool> failed_answer{false};
  absl::Status answer;
  v1::PullParametersResponse last;
  int messages = 0;
  std::thread tail([&] {
    v1::PullParametersResponse message;
    while (reader->Read(&message)) {
      last = message;
      ++messages;
    }
    answer = ToAbslStatus(reader->Finish());
    if (!answer.ok()) failed_answer.store(true);
  });
  const std::string what =
      absl::StrCat("pull of version ", first.version(), " from shard ", shard_index_);
  const auto failed = [&] { return failed_answer.load(); };
  void* twin = twins_ != nullptr ? twins_->ParameterTwin(destination, bytes) : nullptr;
  const absl::Status received = twin != nullptr
                                    ? ReceiveOwn(*held->pair, static_cast<char*>(twin), bytes,
                                                 DeadlineOf(call.context), what, failed)
                                    : ReceiveHost(*held->pair, reinterpret_cast<char*>(destination),
                                                  bytes, DeadlineOf(call.context), what, failed);
  if (!received.ok()) call.context.TryCancel();
  tail.join();
  if (!received.ok()) {
    TransferFailed(received);
    return !answer.ok() && !absl::IsCancelled(answer) ? answer : PairFailed(received);
  }
  if (!answer.ok()) return Answered(*std::move(held), answer, DeadlineOf(call.context));
  if (messages != 1 || last.has_chunk() || last.version() != first.version()) {
    return absl::InternalError(absl::StrCat("a pull over a device pair ended with ", messages,
                                            " messages after its data"));
  }
  Give(*std::move(held));
  if (twin != nullptr) {
    twins_->Written(destination, bytes);
    twins_->CountTransfer();
  }
  Succeeded();
  pulled->version = last.version();
  pulled->lr = last.lr();
  transfers_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace shardopt
