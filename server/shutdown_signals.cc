#include "server/shutdown_signals.h"

#include <pthread.h>
#include <signal.h>
#include <string.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <thread>

#include "common/logging.h"

namespace shardopt {
namespace {

// Signals of one request sent twice come closer together than this.
constexpr std::chrono::seconds kRepeatWindow(1);

// Whether `signal_number` came into the process ignored.
bool InheritedIgnored(int signal_number) {
  struct sigaction current;
  return sigaction(signal_number, nullptr, &current) == 0 && current.sa_handler == SIG_IGN;
}

}  // namespace

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

void ShutdownSignals::Received(int signal_number, std::chrono::steady_clock::time_point now) {
  absl::MutexLock lock(&mu_);
  if (!serving_) {
    LogWarning("received %s while starting: exiting without serving", strsignal(signal_number));
    std::_Exit(1);
  }
  if (first_ == 0) {
    first_ = signal_number;
    first_at_ = now;
    return;
  }
  if (now - first_at_ < kRepeatWindow) return;
  LogWarning("received %s again during the shutdown: exiting at once", strsignal(signal_number));
  std::_Exit(1);
}

int RunWithShutdownSignals(const std::function<int(ShutdownSignals&)>& body) {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  if (!InheritedIgnored(SIGINT)) sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGUSR2);  // The body's end (sent by it to this thread).
  // (Inherited by every thread made from here on.)
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  ShutdownSignals shutdown_signals;
  std::atomic<bool> done{false};
  int rc = 0;
  const pthread_t main_thread = pthread_self();
  std::thread program([&] {
    rc = body(shutdown_signals);
    done.store(true);
    pthread_kill(main_thread, SIGUSR2);
  });
  for (;;) {
    siginfo_t info;
    const int signal_number = sigwaitinfo(&signals, &info);
    if (signal_number == SIGUSR2) {
      if (done.load()) break;
      continue;  // (Not the body's: someone else's SIGUSR2.)
    }
    if (signal_number > 0) {
      shutdown_signals.Received(signal_number, std::chrono::steady_clock::now());
    }
  }
  program.join();
  return rc;
}

}  // namespace shardopt
