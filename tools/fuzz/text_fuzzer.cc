// Fuzzes the small parsers of untrusted text: the server's token file
// (AccessControl::FromTokenFileContents) and a bearer value checked against
// it, and the rules for ids, tensor names and paths (common/names.h) with
// the quoting every error uses, which must stay bounded and printable.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "absl/strings/match.h"
#include "common/names.h"
#include "server/access_control.h"
#include "tools/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  shardopt::fuzz::FuzzInput input(data, size);
  const std::string tokens = input.Record();
  const std::string presented = input.Record();
  const std::string name = input.Rest();
  absl::StatusOr<shardopt::AccessControl> control =
      shardopt::AccessControl::FromTokenFileContents(tokens);
  if (control.ok()) {
    control->Check(presented, shardopt::Access::kWrite).IgnoreError();
    control->Check(presented, shardopt::Access::kRead).IgnoreError();
  } else {
    // The refusal never repeats the file (it may hold tokens): it is one of
    // two fixed texts, with at most a line number in it.
    const absl::string_view message = control.status().message();
    if (!(absl::StartsWith(message, "token file line ") && message.size() < 200) &&
        message != "the token file holds no tokens") {
      std::abort();
    }
  }
  const std::string quoted = shardopt::Quoted(name);
  if (quoted.size() > 4 * shardopt::kMaxQuotedBytes + 32) std::abort();
  for (char c : quoted) {
    if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) std::abort();
  }
  for (const absl::Status& s :
       {shardopt::CheckId("model_id", name), shardopt::CheckTensorName(name),
        shardopt::CheckPath("directory", name)}) {
    if (!s.ok() && s.message().size() > 400) std::abort();
  }
  if (shardopt::CheckPath("directory", name).ok() && name.find('\0') != std::string::npos) {
    std::abort();
  }
  return 0;
}
