#include "client/wire_frames.h"

#include <cstring>
#include <string>
#include <vector>

#include "common/dtype_convert.h"
#include "gtest/gtest.h"
#include "proto/shardopt/v1/shard_service.pb.h"

namespace shardopt {
namespace {

std::string Flatten(grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

// `bytes` as a ByteBuffer cut into slices of `piece` bytes, as gRPC may
// deliver a message.
grpc::ByteBuffer Sliced(const std::string& bytes, size_t piece) {
  std::vector<grpc::Slice> slices;
  for (size_t off = 0; off < bytes.size(); off += piece) {
    slices.emplace_back(bytes.data() + off, std::min(piece, bytes.size() - off));
  }
  return grpc::ByteBuffer(slices.data(), slices.size());
}

TEST(WireFramesTest, PushFrameIsAPushGradientsRequestOnTheWire) {
  std::vector<float> data(1000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = 0.5f * static_cast<float>(i) - 3.0f;
  for (uint64_t offset : {uint64_t{0}, uint64_t{1}, uint64_t{300}, uint64_t{1} << 40}) {
    for (uint64_t count : {uint64_t{0}, uint64_t{1}, uint64_t{31}, uint64_t{1000}}) {
      PayloadPins pins;
      PushFrame frame{nullptr, offset, data.data(), count, sizeof(float), &pins};
      v1::PushGradientsRequest parsed;
      {
        grpc::ByteBuffer buffer;
        bool own = false;
        ASSERT_TRUE((grpc::SerializationTraits<PushFrame>::Serialize(frame, &buffer, &own).ok()));
        ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer))) << offset << " " << count;
      }
      pins.WaitUntilReleased();  // The buffer is gone: nothing pins the data.
      ASSERT_TRUE(parsed.has_chunk());
      EXPECT_EQ(parsed.chunk().offset(), offset);
      ASSERT_EQ(parsed.chunk().data().size(), count * 4);
      EXPECT_EQ(std::memcmp(parsed.chunk().data().data(), data.data(), count * 4), 0);
    }
  }
  v1::PushGradientsRequest header;
  header.mutable_header()->set_model_id("m");
  header.mutable_header()->set_step(7);
  PushFrame frame;
  frame.header = &header;
  grpc::ByteBuffer buffer;
  bool own = false;
  ASSERT_TRUE((grpc::SerializationTraits<PushFrame>::Serialize(frame, &buffer, &own).ok()));
  v1::PushGradientsRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(buffer)));
  EXPECT_EQ(parsed.header().model_id(), "m");
  EXPECT_EQ(parsed.header().step(), 7);
}

TEST(WireFramesTest, PullFrameParsesAcrossSliceBoundariesIntoTheDestination) {
  std::vector<float> values(257);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<float>(i) * 1.25f;
  v1::PullParametersResponse response;
  response.set_version(123456789012);
  response.set_lr(0.00125);
  response.mutable_chunk()->set_offset(40);
  response.mutable_chunk()->set_data(values.data(), values.size() * 4);
  const std::string wire = response.SerializeAsString();
  for (size_t piece : {size_t{1}, size_t{3}, size_t{64}, wire.size()}) {
    std::vector<float> destination(400, -1.0f);
    PullFrame frame;
    frame.destination = destination.data();
    frame.capacity = destination.size();
    grpc::ByteBuffer buffer = Sliced(wire, piece);
    ASSERT_TRUE((grpc::SerializationTraits<PullFrame>::Deserialize(&buffer, &frame).ok()))
        << frame.error;
    EXPECT_EQ(frame.version, 123456789012);
    EXPECT_EQ(frame.lr, 0.00125);
    EXPECT_EQ(frame.offset, 40u);
    EXPECT_EQ(frame.count, values.size());
    EXPECT_EQ(std::memcmp(destination.data() + 40, values.data(), values.size() * 4), 0);
    EXPECT_EQ(destination[39], -1.0f);
    EXPECT_EQ(destination[40 + values.size()], -1.0f);
  }
}

TEST(WireFramesTest, SixteenBitPullsAreWidenedExactly) {
  std::vector<uint16_t> half = {0x3c00, 0x0001, 0xc000, 0x7bff, 0x8000};
  v1::PullParametersResponse response;
  response.set_version(3);
  response.mutable_chunk()->set_offset(2);
  response.mutable_chunk()->set_data(half.data(), half.size() * 2);
  std::vector<float> destination(8, -7.0f);
  PullFrame frame;
  frame.destination = destination.data();
  frame.capacity = destination.size();
  frame.dtype = DType::kFloat16;
  grpc::ByteBuffer buffer = Sliced(response.SerializeAsString(), 3);
  ASSERT_TRUE((grpc::SerializationTraits<PullFrame>::Deserialize(&buffer, &frame).ok()))
      << frame.error;
  EXPECT_EQ(frame.count, half.size());
  for (size_t i = 0; i < half.size(); ++i) EXPECT_EQ(destination[2 + i], HalfBitsToFloat(half[i]));
  EXPECT_EQ(destination[1], -7.0f);
  EXPECT_EQ(destination[7], -7.0f);
  // An odd number of bytes is not whole fp16 elements.
  response.mutable_chunk()->set_data(std::string(5, 'x'));
  buffer = Sliced(response.SerializeAsString(), 3);
  EXPECT_FALSE((grpc::SerializationTraits<PullFrame>::Deserialize(&buffer, &frame).ok()));
}

TEST(WireFramesTest, PullFrameRejectsMalformedMessagesWithoutWritingOutside) {
  std::vector<float> destination(100, -1.0f);
  auto parse = [&](const std::string& wire) {
    PullFrame frame;
    frame.destination = destination.data();
    frame.capacity = 64;  // Elements 64..99 must never be written.
    grpc::ByteBuffer buffer = Sliced(wire, 7);
    grpc::Status s = grpc::SerializationTraits<PullFrame>::Deserialize(&buffer, &frame);
    return std::make_pair(s.ok(), frame.error);
  };
  std::vector<float> values(70, 9.0f);
  v1::PullParametersResponse response;
  response.mutable_chunk()->set_offset(0);
  response.mutable_chunk()->set_data(values.data(), 70 * 4);  // Past the capacity.
  EXPECT_FALSE(parse(response.SerializeAsString()).first);
  response.mutable_chunk()->set_data(values.data(), 10 * 4);
  response.mutable_chunk()->set_offset(60);  // [60, 70) overruns 64.
  EXPECT_FALSE(parse(response.SerializeAsString()).first);
  response.mutable_chunk()->set_offset(0);
  response.mutable_chunk()->set_data(std::string(7, 'x'));  // Not whole floats.
  auto [ok, error] = parse(response.SerializeAsString());
  EXPECT_FALSE(ok);
  EXPECT_NE(error.find("not whole float32 elements"), std::string::npos) << error;
  response.mutable_chunk()->set_data(values.data(), 8 * 4);
  const std::string good = response.SerializeAsString();
  EXPECT_TRUE(parse(good).first);
  EXPECT_FALSE(parse(good.substr(0, good.size() - 3)).first);  // Truncated.
  for (size_t i = 64; i < destination.size(); ++i) ASSERT_EQ(destination[i], -1.0f) << i;

  // Two data fields in one chunk (never sent by the server) are refused.
  {
    v1::TensorChunk first, second;
    first.set_data(values.data(), 8 * 4);
    second.set_data(values.data(), 4 * 4);
    // Concatenated TensorChunks parse as one chunk with two `data` fields.
    const std::string chunk = first.SerializeAsString() + second.SerializeAsString();
    std::string outer;
    outer.push_back(static_cast<char>((2 << 3) | 2));
    outer.push_back(static_cast<char>(chunk.size()));  // < 128 bytes here.
    outer += chunk;
    EXPECT_FALSE(parse(outer).first);
  }

  // Unknown fields (a newer server) are skipped.
  std::string with_unknown = good;
  with_unknown += std::string("\x78\x05", 2);        // field 15, varint 5
  with_unknown += std::string("\x82\x01\x02zz", 5);  // field 16, 2 bytes
  EXPECT_TRUE(parse(with_unknown).first);
}

// Found by //tools/fuzz:pull_frame_fuzzer: a chunk with an offset past the
// range and no data was taken as an empty chunk there.
TEST(WireFramesTest, PullFrameRejectsAnOffsetOutsideTheRangeEvenWithoutData) {
  v1::PullParametersResponse response;
  response.set_version(1);
  response.mutable_chunk()->set_offset(1000);
  const std::string bytes = response.SerializeAsString();
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer buffer(&slice, 1);
  std::vector<float> destination(8);
  PullFrame frame;
  frame.destination = destination.data();
  frame.capacity = destination.size();
  const grpc::Status s = ParsePullResponse(&buffer, &frame);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.error_message().find("outside the range"), std::string::npos) << s.error_message();
}

}  // namespace
}  // namespace shardopt
