// ShutdownSignals: SIGTERM and SIGINT for the server process's whole life.
// RunWithShutdownSignals blocks them, runs the program's body on a thread of
// its own, and takes them on the calling (main) thread with sigtimedwait:
// the kernel hands a process's signal to its main thread first when that
// thread takes it, and threads made before main (OpenBLAS's pool) do not
// block them, so the main thread must be the one waiting.
//
//  - Before MarkServing (flag checks, a restore that can take minutes): a
//    signal ends the process at once, as a kill would (every step on disk
//    is crash-safe), without serving: it used to wait for the restore, then
//    serve briefly.
//  - Serving: the first signal is handed to WaitForFirst (the graceful
//    shutdown); a second one ends the process at once (a shutdown stuck on a
//    slow checkpoint write, say), where it used to be ignored.
#ifndef SHARDOPT_SERVER_SHUTDOWN_SIGNALS_H_
#define SHARDOPT_SERVER_SHUTDOWN_SIGNALS_H_

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace shardopt {

class ShutdownSignals {
 public:
  ShutdownSignals() = default;
  ShutdownSignals(const ShutdownSignals&) = delete;
  ShutdownSignals& operator=(const ShutdownSignals&) = delete;

  void MarkServing();
  // The first signal received while serving (its number).
  int WaitForFirst();

  // What the main thread does with a signal (may end the process).
  void Received(int signal_number);

 private:
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  int first_ ABSL_GUARDED_BY(mu_) = 0;
};

// Call from the main thread before any other thread of the program starts;
// returns what `body` returned.
int RunWithShutdownSignals(const std::function<int(ShutdownSignals&)>& body);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SHUTDOWN_SIGNALS_H_
