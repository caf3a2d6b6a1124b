#include "client/device_pair_transport.h"

#include <algorithm>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
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
                                         uint32_t shard_index, std::string trainer)
    : kind_(kind), device_(device), shard_index_(shard_index), trainer_(std::move(trainer)) {}

DevicePairTransport::~DevicePairTransport() = default;

absl::StatusOr<DevicePairTransport::Held> DevicePairTransport::Open(const PayloadCall& call) {
  grpc::ClientContext context;
  context.set_deadline(absl::ToChronoTime(absl::Now() + kOpenTimeout));
  v1::OpenDevicePairRequest request;
  request.set_kind(kind_.name());
  request.set_peer(trainer_);
  v1::OpenDevicePairResponse opened;
  if (absl::Status s = ToAbslStatus(call.stub.OpenDevicePair(&context, request, &opened));
      !s.ok()) {
    return s;
  }
  absl::StatusOr<std::unique_ptr<DevicePair>> pair =
      kind_.Connect(opened.id(), /*rank=*/1, device_, absl::Now() + kJoinTimeout,
                    absl::StrCat("shard ", shard_index_, " (", opened.device(), ")"));
  if (!pair.ok()) return pair.status();
  return Held{opened.pair(), *std::move(pair)};
}

std::optional<DevicePairTransport::Held> DevicePairTransport::Take(const PayloadCall& call) {
  if (call.range.size() == 0) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (!idle_.empty()) {
    Held held = std::move(idle_.back());
    idle_.pop_back();
    return held;
  }
  const absl::Time now = absl::Now();
  if (now < retry_after_) return std::nullopt;
  // (Opened under the lock: a second caller waits for this pair rather than
  // opening one more.)
  absl::StatusOr<Held> held = Open(call);
  if (held.ok()) {
    if (!announced_) {
      LogInfo("shard %d: payloads go over %s device pairs", shard_index_, kind_.name());
    }
    announced_ = true;
    last_refusal_.clear();
    return *std::move(held);
  }
  const std::string why(held.status().message());
  if (why != last_refusal_) {
    LogInfo("shard %d: no %s device pair (payloads go another way): %s", shard_index_, kind_.name(),
            why);
    last_refusal_ = why;
  }
  announced_ = false;
  retry_after_ = now + kRetryInterval;
  return std::nullopt;
}

void DevicePairTransport::GiveUnlessRefused(Held held, const absl::Status& answer) {
  // A shard that does not hold the pair (it restarted, or dropped it) will
  // never take it again: a new pair is opened for the next transfer.
  if (absl::IsFailedPrecondition(answer) &&
      absl::StrContains(answer.message(), kDevicePairNotOpen)) {
    return;
  }
  Give(std::move(held));
}

void DevicePairTransport::Give(Held held) {
  absl::MutexLock lock(&mu_);
  if (idle_.size() < kMaxIdlePairs && held.pair->broken().ok()) idle_.push_back(std::move(held));
}

absl::Status DevicePairTransport::Answered(absl::Status status) {
  if (!absl::IsFailedPrecondition(status)) return status;
  if (absl::StrContains(status.message(), kDevicePairWrongMemory)) {
    absl::MutexLock lock(&mu_);
    retry_after_ = absl::Now() + kRetryInterval;
    return absl::UnavailableError(status.message());
  }
  if (absl::StrContains(status.message(), kDevicePairNotOpen) ||
      absl::StrContains(status.message(), "carries another transfer")) {
    return absl::UnavailableError(status.message());
  }
  return status;
}

absl::Status DevicePairTransport::SendHost(DevicePair& pair, const char* host, uint64_t bytes,
                                           absl::Time deadline, const std::string& what) {
  for (uint64_t done = 0; done < bytes; done += kDevicePairPieceBytes) {
    const uint64_t piece = std::min(kDevicePairPieceBytes, bytes - done);
    const void* from = host + done;
    if (kind_.memory() == PairMemory::kDevice) {
      absl::StatusOr<void*> scratch = pair.Scratch(piece);
      if (!scratch.ok()) return scratch.status();
      if (absl::Status s = pair.CopyIn(*scratch, host + done, piece); !s.ok()) return s;
      from = *scratch;
    }
    if (absl::Status s = pair.Send(from, piece, deadline, what); !s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status DevicePairTransport::ReceiveHost(DevicePair& pair, char* host, uint64_t bytes,
                                              absl::Time deadline, const std::string& what) {
  for (uint64_t done = 0; done < bytes; done += kDevicePairPieceBytes) {
    const uint64_t piece = std::min(kDevicePairPieceBytes, bytes - done);
    void* into = host + done;
    if (kind_.memory() == PairMemory::kDevice) {
      absl::StatusOr<void*> scratch = pair.Scratch(piece);
      if (!scratch.ok()) return scratch.status();
      into = *scratch;
    }
    if (absl::Status s = pair.Recv(into, piece, deadline, what); !s.ok()) return s;
    if (kind_.memory() == PairMemory::kDevice) {
      if (absl::Status s = pair.CopyOut(host + done, into, piece); !s.ok()) return s;
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
    GiveUnlessRefused(*std::move(held), answer);
    return answer.ok() ? answer : Answered(answer);
  }
  const std::string what =
      absl::StrCat("push of step ", header.header().step(), " to shard ", shard_index_);
  const absl::Status sent =
      SendHost(*held->pair, payload, header.header().num_elements() * element_size,
               DeadlineOf(call.context), what);
  if (!sent.ok()) {
    call.context.TryCancel();
    writer->Finish().error_code();  // (The pair's failure says more.)
    return PairFailed(sent);        // (The pair is dropped with `held`.)
  }
  const absl::Status answer = ToAbslStatus(writer->Finish());
  // Every byte was taken (the shard drains a refused push): the pair is clean.
  Give(*std::move(held));
  if (answer.ok()) transfers_.fetch_add(1, std::memory_order_relaxed);
  return answer.ok() ? answer : Answered(answer);
}

std::optional<absl::Status> DevicePairTransport::Pull(const PayloadCall& call,
                                                      const v1::PullParametersRequest& request,
                                                      DType dtype, float* destination,
                                                      PulledVersion* pulled) {
  if (request.wait_only() || dtype != DType::kFloat32) return std::nullopt;
  std::optional<Held> held = Take(call);
  if (!held) return std::nullopt;
  const uint64_t transfer = next_transfer_.fetch_add(1);
  v1::PullParametersRequest named = request;
  named.mutable_device_pair()->set_pair(held->name);
  named.mutable_device_pair()->set_transfer(transfer);
  std::unique_ptr<grpc::ClientReader<v1::PullParametersResponse>> reader =
      call.stub.PullParameters(&call.context, named);
  v1::PullParametersResponse first;
  if (!reader->Read(&first)) {
    // Nothing goes over the pair before the first message.
    const absl::Status s = ToAbslStatus(reader->Finish());
    GiveUnlessRefused(*std::move(held), s);
    return Answered(s.ok() ? absl::InternalError("a pull ended without a word") : s);
  }
  if (first.has_chunk() || first.version() < 0) {
    call.context.TryCancel();
    reader->Finish().error_code();
    return absl::InternalError("a pull over a device pair began with data");
  }
  const std::string what =
      absl::StrCat("pull of version ", first.version(), " from shard ", shard_index_);
  const absl::Status received =
      ReceiveHost(*held->pair, reinterpret_cast<char*>(destination),
                  call.range.size() * sizeof(float), DeadlineOf(call.context), what);
  if (!received.ok()) {
    call.context.TryCancel();
    const absl::Status s = ToAbslStatus(reader->Finish());
    // The shard's own reason, when it gave one, says more than the pair's.
    return !s.ok() && !absl::IsCancelled(s) ? Answered(s) : PairFailed(received);
  }
  v1::PullParametersResponse last;
  int messages = 0;
  while (reader->Read(&last)) ++messages;
  const absl::Status s = ToAbslStatus(reader->Finish());
  Give(*std::move(held));
  if (!s.ok()) return Answered(s);
  if (messages != 1 || last.has_chunk() || last.version() != first.version()) {
    return absl::InternalError(absl::StrCat("a pull over a device pair ended with ", messages,
                                            " messages after its data"));
  }
  pulled->version = last.version();
  pulled->lr = last.lr();
  transfers_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

}  // namespace shardopt
