// Fuzzes the client's zero-copy parsing of pulled messages
// (ParsePullResponse, client/wire_frames.h): whatever a shard (or something
// posing as one) sends, the parser stays inside the trainer's buffer.
// Input: a byte choosing the dtype and the buffer's capacity, then the
// message bytes as they come off the wire.
#include <cstdint>
#include <cstdlib>
#include <vector>

#include "client/wire_frames.h"
#include "tools/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardopt::fuzz::FuzzInput input(data, size);
  const uint8_t choice = input.Byte();
  const shardopt::DType dtypes[] = {shardopt::DType::kFloat32, shardopt::DType::kBFloat16,
                                    shardopt::DType::kFloat16};
  std::vector<float> buffer(choice >> 2);
  const std::string message = input.Rest();
  grpc::Slice slice(message.data(), message.size());
  grpc::ByteBuffer bytes(&slice, 1);
  shardopt::PullFrame frame;
  frame.destination = buffer.data();
  frame.capacity = buffer.size();
  frame.dtype = dtypes[(choice & 3) % 3];
  const grpc::Status status = shardopt::ParsePullResponse(&bytes, &frame);
  if (status.ok() && frame.offset + frame.count > frame.capacity) std::abort();
  return 0;
}
