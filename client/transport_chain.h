// TransportChain: the data planes of one (trainer, shard) pair in order of
// preference (shared memory, then the payload socket): each push or pull
// goes by the first that carries it; when all decline, so does the chain
// (and the gRPC stream carries it). Thread-safe when its parts are.
#ifndef SHARDOPT_CLIENT_TRANSPORT_CHAIN_H_
#define SHARDOPT_CLIENT_TRANSPORT_CHAIN_H_

#include <memory>
#include <vector>

#include "client/payload_transport.h"

namespace shardopt {

class TransportChain final : public PayloadTransport {
 public:
  explicit TransportChain(std::vector<std::shared_ptr<PayloadTransport>> parts)
      : parts_(std::move(parts)) {}

  const char* name() const override { return "chain"; }
  std::optional<absl::Status> Push(const PayloadCall& call, const v1::PushGradientsRequest& header,
                                   const char* payload, size_t element_size,
                                   v1::PushGradientsResponse* response) override {
    for (const auto& part : parts_) {
      if (std::optional<absl::Status> s =
              part->Push(call, header, payload, element_size, response)) {
        return s;
      }
    }
    return std::nullopt;
  }
  std::optional<absl::Status> Pull(const PayloadCall& call,
                                   const v1::PullParametersRequest& request, DType dtype,
                                   float* destination, PulledVersion* pulled) override {
    for (const auto& part : parts_) {
      if (std::optional<absl::Status> s = part->Pull(call, request, dtype, destination, pulled)) {
        return s;
      }
    }
    return std::nullopt;
  }
  int64_t transfers() const override {
    int64_t total = 0;
    for (const auto& part : parts_) total += part->transfers();
    return total;
  }

 private:
  const std::vector<std::shared_ptr<PayloadTransport>> parts_;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_TRANSPORT_CHAIN_H_
