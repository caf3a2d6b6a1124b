#include "server/shutdown_signals.h"

#include <signal.h>
#include <string.h>
#include <time.h>

#include <atomic>
#include <cstdlib>
#include <thread>

#include "common/logging.h"

namespace shardopt {

void ShutdownSignals::MarkServing() {
  absl::MutexLock lock(&mu_);
  serving_ = true;
}

int ShutdownSignals::WaitForFirst() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(
      +[](int* first) { return *first != 0; }, &first_));
  return first_;
}

void ShutdownSignals::Received(int signal_number) {
  absl::MutexLock lock(&mu_);
  if (!serving_) {
    LogWarning("received %s while starting: exiting without serving", strsignal(signal_number));
    std::_Exit(1);
  }
  if (first_ != 0) {
    LogWarning("received %s again during the shutdown: exiting at once", strsignal(signal_number));
    std::_Exit(1);
  }
  first_ = signal_number;
}

int RunWithShutdownSignals(const std::function<int(ShutdownSignals&)>& body) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  // (Inherited by every thread made from here on.)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ShutdownSignals shutdown_signals;
  std::atomic<bool> done{false};
  int rc = 0;
  std::thread program([&] {
    rc = body(shutdown_signals);
    done.store(true);
  });
  // (The 100 ms timeout only lets the loop see the body end.)
  const timespec poll = {0, 100 * 1000 * 1000};
  while (!done.load()) {
    const int signal_number = sigtimedwait(&signals, nullptr, &poll);
    if (signal_number > 0) shutdown_signals.Received(signal_number);
  }
  program.join();
  return rc;
}

}  // namespace shardopt
