#include "common/nccl/nccl_pair.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"

namespace shardopt::nccl {
namespace {

absl::Status CudaCheck(cudaError_t error, absl::string_view what) {
  if (error == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, " failed: ", cudaGetErrorString(error)));
}

// Keeps the calling thread's current device across a call that switches
// it: a pair's and the kind's functions run on the trainer's own threads (a
// PyTorch thread in StepOnDevice), whose current device is their
// framework's. Only a device that changed is set back (setting one makes
// its context).
class KeepCurrentDevice {
 public:
  KeepCurrentDevice() : known_(cudaGetDevice(&device_) == cudaSuccess) {}
  ~KeepCurrentDevice() {
    int now = device_;
    if (known_ && cudaGetDevice(&now) == cudaSuccess && now != device_) cudaSetDevice(device_);
  }
  KeepCurrentDevice(const KeepCurrentDevice&) = delete;
  KeepCurrentDevice& operator=(const KeepCurrentDevice&) = delete;

 private:
  int device_ = 0;
  bool known_;
};

// Short naps while polling: a transfer of a few MiB takes about a
// millisecond on one H200, a dead peer is only noticed at the deadline.
void Nap() { std::this_thread::sleep_for(std::chrono::microseconds(50)); }

}  // namespace

absl::Status NcclPair::Available() { return NcclLibrary::Load().status(); }

absl::StatusOr<std::string> NcclPair::NewUniqueId() {
  absl::StatusOr<const NcclLibrary*> library = NcclLibrary::Load();
  if (!library.ok()) return library.status();
  ncclUniqueId id;
  if (absl::Status s =
          (*library)->Check((*library)->get_unique_id(&id), "ncclGetUniqueId", nullptr);
      !s.ok()) {
    return s;
  }
  return std::string(id.internal, sizeof(id.internal));
}

absl::StatusOr<std::unique_ptr<NcclPair>> NcclPair::Connect(absl::string_view unique_id, int rank,
                                                            int device, absl::Time deadline,
                                                            std::string peer) {
  if (unique_id.size() != kUniqueIdBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("an NCCL unique id is ", kUniqueIdBytes, " bytes, not ", unique_id.size()));
  }
  if (rank != 0 && rank != 1) {
    return absl::InvalidArgumentError(absl::StrCat("rank ", rank, " of a pair (0 or 1)"));
  }
  absl::StatusOr<const NcclLibrary*> library = NcclLibrary::Load();
  if (!library.ok()) return library.status();
  KeepCurrentDevice keep;
  std::unique_ptr<NcclPair> pair(new NcclPair(*library, rank, device, std::move(peer)));
  if (absl::Status s =
          CudaCheck(cudaSetDevice(device), absl::StrCat("cudaSetDevice(", device, ")"));
      !s.ok()) {
    return s;
  }
  cudaStream_t stream = nullptr;
  if (absl::Status s = CudaCheck(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking),
                                 "cudaStreamCreateWithFlags");
      !s.ok()) {
    return s;
  }
  pair->stream_ = stream;
  ncclUniqueId id;
  std::memcpy(id.internal, unique_id.data(), kUniqueIdBytes);
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;
  const std::string what = absl::StrCat("joining the NCCL pair with ", pair->peer_, " as rank ",
                                        rank, " on cuda:", device);
  ncclResult_t result = (*library)->comm_init_rank_config(&pair->comm_, 2, id, rank, &config);
  if (absl::Status s = (*library)->Check(result, what, pair->comm_); !s.ok()) {
    return pair->Break(s);
  }
  if (absl::Status s = pair->Await(/*stream_work=*/false, deadline, what); !s.ok()) return s;
  return pair;
}

NcclPair::~NcclPair() {
  KeepCurrentDevice keep;
  if (comm_ != nullptr) {
    cudaSetDevice(device_);
    // Flush what was issued, briefly: a peer gone meanwhile gets the pair
    // aborted (Await breaks it, freeing the communicator) instead of a hang.
    library_->comm_finalize(comm_);
    Await(false, absl::Now() + absl::Seconds(5), "finalising the NCCL pair").IgnoreError();
    if (comm_ != nullptr) library_->comm_destroy(comm_);
  }
  if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
  if (scratch_ != nullptr) cudaFree(scratch_);
}

absl::Status NcclPair::Break(absl::Status failure) {
  // (A pair never breaks "successfully": an OK here would leave the
  // communicator freed but the pair looking healthy.)
  if (failure.ok()) failure = absl::InternalError("NcclPair broken without a reason");
  if (broken_.ok()) broken_ = failure;
  if (comm_ != nullptr) {
    library_->comm_abort(comm_);
    comm_ = nullptr;  // Abort has freed it.
  }
  return failure;
}

absl::Status NcclPair::Await(bool stream_work, absl::Time deadline, absl::string_view what,
                             const std::function<bool()>& cancelled) {
  for (;;) {
    ncclResult_t state = ncclInProgress;
    ncclResult_t got = library_->comm_get_async_error(comm_, &state);
    if (got != ncclSuccess) {
      return Break(library_->Check(got, absl::StrCat(what, ": ncclCommGetAsyncError"), comm_));
    }
    if (state != ncclSuccess && state != ncclInProgress) {
      // Whatever NCCL's code (a lost socket can surface as an internal or a
      // CUDA error too), a communicator that failed asynchronously has lost
      // its peer for the caller: UNAVAILABLE, so that it falls back to gRPC.
      const absl::Status why =
          library_->Check(state, absl::StrCat(what, " (with ", peer_, ")"), comm_);
      return Break(absl::UnavailableError(why.message()));
    }
    if (state == ncclSuccess) {
      if (!stream_work) return absl::OkStatus();
      const cudaError_t queried = cudaStreamQuery(static_cast<cudaStream_t>(stream_));
      if (queried == cudaSuccess) return absl::OkStatus();
      if (queried != cudaErrorNotReady) {
        return Break(CudaCheck(queried, absl::StrCat(what, ": the pair's stream")));
      }
    }
    if (cancelled && cancelled()) {
      return Break(absl::CancelledError(
          absl::StrCat(what, ": the call ended before the transfer; the pair is aborted")));
    }
    if (absl::Now() >= deadline) {
      return Break(absl::DeadlineExceededError(
          absl::StrCat(what, ": ", peer_, " did not take part before the deadline (",
                       state == ncclInProgress ? "NCCL still in progress" : "transfer unfinished",
                       "); the pair is aborted")));
    }
    Nap();
  }
}

absl::Status NcclPair::Transfer(bool send, void* device_data, size_t bytes, absl::Time deadline,
                                absl::string_view what, const std::function<bool()>& cancelled) {
  if (!broken_.ok()) {
    return absl::Status(broken_.code(), absl::StrCat(what, ": the NCCL pair with ", peer_,
                                                     " failed before: ", broken_.message()));
  }
  KeepCurrentDevice keep;
  if (absl::Status s = CudaCheck(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  const int other = 1 - rank_;
  auto stream = static_cast<cudaStream_t>(stream_);
  const ncclResult_t result =
      send ? library_->send(device_data, bytes, ncclUint8, other, comm_, stream)
           : library_->recv(device_data, bytes, ncclUint8, other, comm_, stream);
  if (absl::Status s = library_->Check(result, std::string(what), comm_); !s.ok()) {
    return Break(s);
  }
  return Await(/*stream_work=*/true, deadline, what, cancelled);
}

absl::Status NcclPair::Send(const void* device_data, size_t bytes, absl::Time deadline,
                            absl::string_view what, const std::function<bool()>& cancelled) {
  return Transfer(true, const_cast<void*>(device_data), bytes, deadline, what, cancelled);
}

absl::Status NcclPair::Recv(void* device_data, size_t bytes, absl::Time deadline,
                            absl::string_view what, const std::function<bool()>& cancelled) {
  return Transfer(false, device_data, bytes, deadline, what, cancelled);
}

absl::StatusOr<void*> NcclPair::Scratch(size_t bytes) {
  if (bytes <= scratch_bytes_) return scratch_;
  // A whole piece at once, so that it never grows in steady state: cudaFree
  // waits for every kernel of the process, other pairs' transfers included.
  bytes = std::max<size_t>(bytes, kDevicePairPieceBytes);
  KeepCurrentDevice keep;
  if (absl::Status s = CudaCheck(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  if (scratch_ != nullptr) cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  if (absl::Status s = CudaCheck(cudaMalloc(&scratch_, bytes),
                                 absl::StrCat("cudaMalloc of ", bytes, " bytes for the pair"));
      !s.ok()) {
    scratch_ = nullptr;
    return s;
  }
  scratch_bytes_ = bytes;
  return scratch_;
}

// On the pair's stream, then waited for: ordered after the pair's last
// transfer and before its next, and done (a pageable source's DMA included)
// when they return.
absl::Status NcclPair::CopyIn(void* device_data, const void* host, size_t bytes) {
  KeepCurrentDevice keep;
  if (absl::Status s = CudaCheck(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  auto stream = static_cast<cudaStream_t>(stream_);
  if (absl::Status s =
          CudaCheck(cudaMemcpyAsync(device_data, host, bytes, cudaMemcpyHostToDevice, stream),
                    "cudaMemcpyAsync to the pair's device");
      !s.ok()) {
    return s;
  }
  return CudaCheck(cudaStreamSynchronize(stream), "the pair's copy to its device");
}

absl::Status NcclPair::CopyOut(void* host, const void* device_data, size_t bytes) {
  KeepCurrentDevice keep;
  if (absl::Status s = CudaCheck(cudaSetDevice(device_), "cudaSetDevice"); !s.ok()) return s;
  auto stream = static_cast<cudaStream_t>(stream_);
  if (absl::Status s =
          CudaCheck(cudaMemcpyAsync(host, device_data, bytes, cudaMemcpyDeviceToHost, stream),
                    "cudaMemcpyAsync from the pair's device");
      !s.ok()) {
    return s;
  }
  return CudaCheck(cudaStreamSynchronize(stream), "the pair's copy from its device");
}

namespace {

class NcclKind final : public DevicePairKind {
 public:
  const char* name() const override { return "nccl"; }
  PairMemory memory() const override { return PairMemory::kDevice; }
  absl::StatusOr<std::string> NewId() const override { return NcclPair::NewUniqueId(); }
  absl::StatusOr<std::unique_ptr<DevicePair>> Connect(absl::string_view id, int rank, int device,
                                                      absl::Time deadline,
                                                      std::string peer) const override {
    absl::StatusOr<std::unique_ptr<NcclPair>> pair =
        NcclPair::Connect(id, rank, device, deadline, std::move(peer));
    if (!pair.ok()) return pair.status();
    return std::unique_ptr<DevicePair>(*std::move(pair));
  }
  absl::StatusOr<std::shared_ptr<void>> Allocate(int device, size_t bytes) const override {
    KeepCurrentDevice keep;
    if (absl::Status s = CudaCheck(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
    void* memory = nullptr;
    if (absl::Status s = CudaCheck(cudaMalloc(&memory, std::max<size_t>(bytes, 1)),
                                   absl::StrCat("cudaMalloc of ", bytes, " bytes"));
        !s.ok()) {
      return s;
    }
    return std::shared_ptr<void>(memory, [device](void* p) {
      KeepCurrentDevice keep;
      cudaSetDevice(device);
      cudaFree(p);
    });
  }
  // (cudaMemcpy to or from pageable memory is synchronous with the host for
  // device-to-host copies; the host-to-device direction is waited for.)
  absl::Status CopyToHost(int device, void* host, const void* memory, size_t bytes) const override {
    KeepCurrentDevice keep;
    if (absl::Status s = CudaCheck(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
    return CudaCheck(cudaMemcpy(host, memory, bytes, cudaMemcpyDeviceToHost),
                     "cudaMemcpy to the host");
  }
  absl::Status CopyFromHost(int device, void* memory, const void* host,
                            size_t bytes) const override {
    KeepCurrentDevice keep;
    if (absl::Status s = CudaCheck(cudaSetDevice(device), "cudaSetDevice"); !s.ok()) return s;
    if (absl::Status s = CudaCheck(cudaMemcpy(memory, host, bytes, cudaMemcpyHostToDevice),
                                   "cudaMemcpy to the device");
        !s.ok()) {
      return s;
    }
    return CudaCheck(cudaStreamSynchronize(nullptr), "the copy to the device");
  }
};

}  // namespace

const DevicePairKind& NcclPairKind() {
  static const NcclKind* const kind = new NcclKind;
  return *kind;
}

}  // namespace shardopt::nccl
