// FuzzInput: reads a fuzzer's bytes as small integers and length-prefixed
// records, running out gracefully (zeros, empty records) at the end, so that
// every byte string is a valid input. (clang's FuzzedDataProvider is not
// available to the GCC build that replays the seed corpus.)
#ifndef SHARDOPT_TOOLS_FUZZ_FUZZ_INPUT_H_
#define SHARDOPT_TOOLS_FUZZ_FUZZ_INPUT_H_

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardopt::fuzz {

class FuzzInput {
 public:
  FuzzInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  bool empty() const { return at_ >= size_; }
  uint8_t Byte() { return at_ < size_ ? data_[at_++] : 0; }
  uint16_t U16() { return static_cast<uint16_t>(Byte() | (Byte() << 8)); }
  uint32_t U32() { return static_cast<uint32_t>(U16()) | (static_cast<uint32_t>(U16()) << 16); }
  // A record: a 16-bit little-endian length, then that many bytes (fewer at
  // the end of the input).
  std::string Record() { return Bytes(U16()); }
  std::string Bytes(size_t n) {
    n = std::min(n, size_ - std::min(at_, size_));
    std::string out(reinterpret_cast<const char*>(data_) + at_, n);
    at_ += n;
    return out;
  }
  std::string Rest() { return Bytes(size_); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t at_ = 0;
};

}  // namespace shardopt::fuzz

#endif  // SHARDOPT_TOOLS_FUZZ_FUZZ_INPUT_H_
