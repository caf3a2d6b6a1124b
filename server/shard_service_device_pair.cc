// ShardServiceImpl's device data plane (v1::DevicePairPayload,
// server/device_pair_host.h): OpenDevicePair, a push's bytes received over
// the trainer's pair straight into its staging in the backend's memory (a
// GPU's for NCCL pairs) and checked there, a pull's range sent from that
// memory. The rules are the stream's; only the bytes travel elsewhere.
#include <algorithm>
#include <vector>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/names.h"
#include "server/service_replies.h"
#include "server/shard_service.h"

namespace shardopt {
namespace {

constexpr uint64_t kPieceElements = kDevicePairPieceBytes / sizeof(float);

const char* MemoryName(PairMemory memory) {
  return memory == PairMemory::kDevice ? "device memory" : "host memory";
}

}  // namespace

absl::StatusOr<DevicePairHost*> ShardServiceImpl::DevicePairs() const {
  if (device_pairs_ == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this shard ", kDevicePairsOff, " (--device_pairs=off, or the kind cannot run here)"));
  }
  return device_pairs_.get();
}

grpc::Status ShardServiceImpl::OpenDevicePair(grpc::ServerContext* context,
                                              const v1::OpenDevicePairRequest* request,
                                              v1::OpenDevicePairResponse* response) {
  if (absl::Status s = Authorize(*context, Access::kWrite); !s.ok()) return Error(s);
  CallScope call(this);
  if (!call.admitted().ok()) return Error(call.admitted());
  absl::StatusOr<DevicePairHost*> host = DevicePairs();
  if (!host.ok()) return Error(host.status());
  if (request->kind() != (*host)->kind().name()) {
    return Error(
        absl::FailedPreconditionError(absl::StrCat("this shard opens ", (*host)->kind().name(),
                                                   " device pairs, not ", Quoted(request->kind()))));
  }
  // (A label for logs and errors.)
  if (request->peer().size() > kMaxPeerLabelBytes) {
    return Error(absl::InvalidArgumentError(absl::StrCat(
        "peer ", Quoted(request->peer()), " is longer than ", kMaxPeerLabelBytes, " bytes")));
  }
  absl::StatusOr<DevicePairHost::Opened> opened =
      (*host)->Open(request->peer().empty() ? context->peer() : request->peer());
  if (!opened.ok()) return Error(opened.status());
  response->set_pair(opened->pair);
  response->set_id(opened->id);
  response->set_device(options_.gpu_index >= 0 ? absl::StrCat("cuda:", options_.gpu_index)
                                               : std::string("cpu"));
  return grpc::Status::OK;
}

absl::StatusOr<DevicePairHost::Lease> ShardServiceImpl::AcquireDevicePairForPush(
    const v1::PushHeader& header, DType dtype, grpc::ServerContext* context,
    grpc::ServerReader<v1::PushGradientsRequest>* reader, const ModelShard& shard) {
  if (dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("a push over a device pair carries fp32, not ", DTypeName(dtype)));
  }
  absl::StatusOr<DevicePairHost*> host = DevicePairs();
  if (!host.ok()) return host.status();
  const PairMemory memory = (*host)->kind().memory();
  if (shard.own_memory() != memory) {
    return absl::FailedPreconditionError(absl::StrCat(
        "model '", header.model_id(), "' on ", shard.backend_device(), " ", kDevicePairWrongMemory,
        " than ", (*host)->kind().name(), " pairs (", MemoryName(memory), ")"));
  }
  v1::PushGradientsRequest extra;
  if (reader->Read(&extra)) {
    return absl::InvalidArgumentError(
        "PushGradients with its payload on a device pair sent a chunk too");
  }
  return (*host)->Acquire(header.device_pair().pair(), absl::FromChrono(context->deadline()));
}

void ShardServiceImpl::AbandonPairOfCancelledCall(grpc::ServerContext& context,
                                                  DevicePairHost::Lease& lease) {
  if (context.IsCancelled()) lease.Abandoned();
}

absl::Status ShardServiceImpl::ReceiveDevicePairPayload(
    const v1::PushHeader& header, grpc::ServerContext* context,
    grpc::ServerReader<v1::PushGradientsRequest>* reader, StreamWatchdog::Watch& watch,
    ModelShard::PushWriter& writer, DevicePairHost::Lease& lease) {
  DevicePair& pair = lease.pair();
  const PairMemory memory = device_pairs_->kind().memory();
  const absl::Time deadline = absl::FromChrono(context->deadline());
  // A trainer that gave up (its call cancelled) sends no more: the wait
  // ends then, not at the deadline, and the pair is dropped.
  const auto cancelled = [context] { return context->IsCancelled(); };
  // From here on the trainer sends every byte, and every byte is received
  // (a refused piece's rest into scratch), so that the pair stays in step.
  const uint64_t transfer = header.device_pair().transfer();
  context->AddInitialMetadata(kDevicePairReadyKey, absl::StrCat(transfer));
  lease.Started();
  reader->SendInitialMetadata();
  const std::string what = absl::StrCat("push of trainer ", header.trainer_rank(), " step ",
                                        header.step(), " to shard ", header.shard_index());
  absl::Status refused;
  std::vector<float> host_copy;
  for (uint64_t done = 0; done < header.num_elements(); done += kPieceElements) {
    const uint64_t count = std::min(kPieceElements, header.num_elements() - done);
    const size_t bytes = count * sizeof(float);
    void* into = refused.ok() && writer.received() == done
                     ? writer.ReceiveInOwnMemory(count, memory)
                     : nullptr;
    const bool in_place = into != nullptr;
    if (!in_place) {
      absl::StatusOr<void*> scratch = pair.Scratch(bytes);
      // (The lease drops the pair; so does the trainer, told UNAVAILABLE.)
      if (!scratch.ok()) return DataPlaneFailed("the push's payload", scratch.status());
      into = *scratch;
    }
    if (absl::Status s = pair.Recv(into, bytes, deadline, what, cancelled); !s.ok()) {
      return DataPlaneFailed("the push's payload", s);
    }
    watch.Touch();
    if (!refused.ok()) continue;  // (Received only to be dropped.)
    if (in_place) {
      refused = writer.WriteReceived(count);
    } else {
      // Elements a range already consumed (a push repeated after part of it
      // was applied): checked and counted as Write does, from a host copy.
      host_copy.resize(count);
      refused = pair.CopyOut(host_copy.data(), into, bytes);
      if (refused.ok()) refused = writer.Write(done, host_copy.data(), bytes);
    }
  }
  lease.Finished();
  return refused;
}

absl::Status ShardServiceImpl::CheckDevicePairPull(const v1::PullParametersRequest& request,
                                                   DType dtype, const ModelShard& shard,
                                                   bool other_place) const {
  if (other_place) {
    return absl::InvalidArgumentError(
        "PullParameters names a device pair and another place for its payload");
  }
  if (dtype != DType::kFloat32) {
    return absl::InvalidArgumentError(
        absl::StrCat("a pull over a device pair carries fp32, not ", DTypeName(dtype)));
  }
  absl::StatusOr<DevicePairHost*> host = DevicePairs();
  if (!host.ok()) return host.status();
  if (shard.own_memory() != (*host)->kind().memory()) {
    return absl::FailedPreconditionError(
        absl::StrCat("model '", request.model_id(), "' on ", shard.backend_device(), " ",
                     kDevicePairWrongMemory, " than ", (*host)->kind().name(), " pairs"));
  }
  // Both ends must move the same bytes: a trainer that expects another
  // count would wait for bytes that never come, or leave some on the pair.
  if (request.device_pair().num_elements() != shard.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("the pull over a device pair expects ", request.device_pair().num_elements(),
                     " elements; shard ", request.shard_index(), " owns ", shard.size()));
  }
  return absl::OkStatus();
}

grpc::Status ShardServiceImpl::SendDevicePairPull(
    grpc::ServerContext* context, const v1::PullParametersRequest& request, ModelShard& shard,
    int64_t version, absl::Time deadline, ReadPin& pin,
    grpc::ServerWriter<v1::PullParametersResponse>* writer) {
  absl::StatusOr<DevicePairHost*> host = DevicePairs();
  if (!host.ok()) return Error(host.status());
  // `deadline` bounds the wait for the version (max_wait_ms: the trainer's
  // "still waiting" reports); the pair and its bytes get the call's.
  const absl::Time call_deadline = absl::FromChrono(context->deadline());
  absl::StatusOr<DevicePairHost::Lease> lease =
      (*host)->Acquire(request.device_pair().pair(), call_deadline);
  if (!lease.ok()) return Error(lease.status());
  const absl::Cleanup abandon = [&] { AbandonPairOfCancelledCall(*context, *lease); };
  // Nothing goes over the pair before the whole range is at the version:
  // a pull that ends in the wait has sent nothing the trainer must drain.
  const auto cancelled = [context] { return context->IsCancelled(); };
  if (absl::Status s =
          shard.WaitForRanges(version, 0, shard.size(), deadline, cancelled, PushedByOf(request));
      !s.ok()) {
    return Error(s);  // (Nothing went over the pair: it stays, unless abandoned.)
  }
  DevicePair& pair = lease->pair();
  // Asynchronous: the whole range read under the pin first, so that a slow
  // trainer holds no push back (as over the stream).
  const bool read_first = shard.asynchronous();
  const uint64_t size = shard.size();
  absl::StatusOr<void*> scratch = pair.Scratch(
      std::max<uint64_t>(1, read_first ? size : std::min(size, kPieceElements)) * sizeof(float));
  if (!scratch.ok()) return Error(scratch.status());
  float* const own = static_cast<float*>(*scratch);
  if (read_first) {
    if (absl::Status s = shard.ReadParametersInOwnMemory(version, 0, size, own); !s.ok()) {
      return Error(s);
    }
    pin.Release();
  }
  v1::PullParametersResponse response;
  response.set_version(version);
  // The trainer receives once it has this message: from here on only a
  // transfer that ends cleanly keeps the pair.
  lease->Started();
  if (!writer->Write(response)) return grpc::Status(grpc::CANCELLED, "client went away");
  const std::string what =
      absl::StrCat("pull of version ", version, " from shard ", request.shard_index(),
                   " by trainer ", request.trainer_rank());
  for (uint64_t offset = 0; offset < size; offset += kPieceElements) {
    const uint64_t count = std::min(kPieceElements, size - offset);
    float* piece = read_first ? own + offset : own;
    if (!read_first) {
      // (Synchronous: no later version can start before this trainer's next
      // push, so the read does not fail; if it did, the pair is dropped.)
      if (absl::Status s = shard.ReadParametersInOwnMemory(version, offset, count, piece);
          !s.ok()) {
        return Error(s);
      }
    }
    if (absl::Status s = pair.Send(piece, count * sizeof(float), call_deadline, what, cancelled);
        !s.ok()) {
      return Error(DataPlaneFailed("the pull's pair", s));
    }
  }
  pin.Release();
  lease->Finished();
  response.set_lr(shard.LrOfVersion(version));
  if (!writer->Write(response)) return grpc::Status(grpc::CANCELLED, "client went away");
  metrics_.RecordPull(request.model_id());
  return grpc::Status::OK;
}

}  // namespace shardopt
