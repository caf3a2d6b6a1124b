// TrainerClient::StreamedPush: the state of one streamed push (see
// TrainerClient::BeginStreamedPush), shared by trainer_client.cc (which
// abandons it on destruction) and trainer_client_streamed.cc.
#ifndef SHARDOPT_CLIENT_STREAMED_PUSH_H_
#define SHARDOPT_CLIENT_STREAMED_PUSH_H_

#include <cstdint>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "client/ready_ranges.h"
#include "client/trainer_client.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {

struct TrainerClient::StreamedPush {
  int64_t step = 0;
  const float* grads = nullptr;
  int64_t last_pushed_before = 0;  // TrainerClient::last_pushed_step_ before it.
  ReadyRanges ready;
  absl::Status status;
  std::vector<v1::PushGradientsResponse> responses;
  std::thread thread;
};

}  // namespace shardopt

#endif  // SHARDOPT_CLIENT_STREAMED_PUSH_H_
