// dtype_convert_tool: converts raw little-endian fp32 from a file to bf16 or
// fp16 bit patterns with common/dtype_convert.h, for the PyTorch cross-check
// (dtype_convert_torch_test.py).
//   dtype_convert_tool bfloat16|float16 IN OUT
#include <cstdio>
#include <cstring>
#include <fstream>
#include <iterator>
#include <vector>

#include "common/dtype_convert.h"

int main(int argc, char** argv) {
  if (argc != 4) {
    fprintf(stderr, "usage: dtype_convert_tool bfloat16|float16 IN OUT\n");
    return 2;
  }
  const bool bf16 = std::strcmp(argv[1], "bfloat16") == 0;
  std::ifstream in(argv[2], std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> values(bytes.size() / 4);
  std::memcpy(values.data(), bytes.data(), values.size() * 4);
  std::vector<uint16_t> out(values.size());
  shardopt::ConvertFromFloat(values.data(), values.size(),
                             bf16 ? shardopt::DType::kBFloat16 : shardopt::DType::kFloat16,
                             out.data());
  std::ofstream(argv[3], std::ios::binary)
      .write(reinterpret_cast<const char*>(out.data()), out.size() * 2);
  return 0;
}
