#include "common/logging.h"

#include <unistd.h>

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace shardopt {
namespace {

absl::Mutex tag_mu;
std::string& Tag() {
  static std::string* tag = new std::string("shardopt");
  return *tag;
}

}  // namespace

void SetLogTag(absl::string_view tag) {
  absl::MutexLock lock(&tag_mu);
  Tag() = std::string(tag);
}

void LogLine(LogSeverity severity, absl::string_view message) {
  const char letter = severity == LogSeverity::kInfo      ? 'I'
                      : severity == LogSeverity::kWarning ? 'W'
                                                          : 'E';
  std::string tag;
  {
    absl::MutexLock lock(&tag_mu);
    tag = Tag();
  }
  std::string line = absl::StrCat(
      std::string(1, letter), absl::FormatTime("%m%d %H:%M:%E6S", absl::Now(), absl::UTCTimeZone()),
      " ", tag, "] ", message, "\n");
  ssize_t ignored = write(STDERR_FILENO, line.data(), line.size());
  (void)ignored;
}

}  // namespace shardopt
