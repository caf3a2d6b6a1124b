// Minimal stderr logging for daemons and tools (Abseil 20220623 has no absl/log).
// Each line: "I1129 23:59:01.123456 shardopt_server] message".
#ifndef SHARDOPT_COMMON_LOGGING_H_
#define SHARDOPT_COMMON_LOGGING_H_

#include "absl/strings/str_format.h"
#include "absl/strings/string_view.h"

namespace shardopt {

enum class LogSeverity { kInfo, kWarning, kError };

// Sets the tag printed on every line (usually the program name).
void SetLogTag(absl::string_view tag);

// Writes one line to stderr; thread-safe (one write(2) per line).
void LogLine(LogSeverity severity, absl::string_view message);

template <typename... Args>
void LogInfo(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogSeverity::kInfo, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogWarning(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogSeverity::kWarning, absl::StrFormat(format, args...));
}
template <typename... Args>
void LogError(const absl::FormatSpec<Args...>& format, const Args&... args) {
  LogLine(LogSeverity::kError, absl::StrFormat(format, args...));
}

}  // namespace shardopt

#endif  // SHARDOPT_COMMON_LOGGING_H_
