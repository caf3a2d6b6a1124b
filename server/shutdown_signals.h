// ShutdownSignals: SIGTERM and SIGINT for the server process's whole life.
// RunWithShutdownSignals blocks them, runs the program's body on a thread of
// its own, and takes them on the calling (main) thread, which always waits
// in sigwaitinfo: the kernel hands a process's signal to its main thread
// when that thread takes it, and threads made before main (OpenBLAS's pool)
// do not block them, so the main thread must be the one waiting, at every
// moment (the body's end wakes it with SIGUSR2).
//
//  - Before MarkServing (flag checks, a restore that can take minutes): a
//    signal ends the process at once (exit 1), as a kill would (every step
//    on disk is crash-safe), without serving.
//  - Serving: the first signal is handed to WaitForFirst (the graceful
//    shutdown); another one at least 1 s later ends the process at once
//    (exit 1: a shutdown stuck on a slow checkpoint write, say). Closer ones
//    are the same request sent twice (a terminal's Ctrl-C and a script's
//    SIGTERM to its process group, GNU timeout's two kills).
//  - SIGINT the process inherited ignored (a background job of a script) is
//    left ignored.
#ifndef SHARDOPT_SERVER_SHUTDOWN_SIGNALS_H_
#define SHARDOPT_SERVER_SHUTDOWN_SIGNALS_H_

#include <chrono>
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

  // What the main thread does with a signal received at `now` (a steady
  // clock: a wall clock stepped back would hold the repeat window open).
  void Received(int signal_number, std::chrono::steady_clock::time_point now);

 private:
  absl::Mutex mu_;
  bool serving_ ABSL_GUARDED_BY(mu_) = false;
  int first_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point first_at_ ABSL_GUARDED_BY(mu_);
};

// Call from the main thread before any other thread of the program starts;
// returns what `body` returned.
int RunWithShutdownSignals(const std::function<int(ShutdownSignals&)>& body);

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_SHUTDOWN_SIGNALS_H_
