#include "common/fork_private.h"

#include <fcntl.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <mutex>
#include <vector>

namespace shardopt {
namespace {

// A plain std::mutex: the fork handlers lock it before fork() and unlock
// it on both sides after, with nothing that could allocate in between.
std::mutex& RegistryMutex() {
  static std::mutex* mu = new std::mutex;
  return *mu;
}

std::vector<int>& Registry() {
  static std::vector<int>* marked = new std::vector<int>;
  return *marked;
}

void LockBeforeFork() { RegistryMutex().lock(); }
void UnlockInParent() { RegistryMutex().unlock(); }

// Runs in the child, where only async-signal-safe calls are allowed: open,
// dup2 and close are.
void ReplaceInChild() {
  const int null = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd : Registry()) {
    if (null >= 0) {
      dup3(null, fd, O_CLOEXEC);
    } else {
      close(fd);  // (No /dev/null: closing is still better than holding.)
    }
  }
  if (null >= 0) close(null);
  // The child holds none of them now: a number it reuses later is its own
  // (and kept by its children). clear() frees nothing.
  Registry().clear();
  RegistryMutex().unlock();
}

void InstallForkHandlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    // Made before any handler can run (nothing is allocated in the child).
    RegistryMutex();
    Registry().reserve(16);
    pthread_atfork(LockBeforeFork, UnlockInParent, ReplaceInChild);
  });
}

}  // namespace

void MarkForkPrivate(int fd) {
  if (fd < 0) return;
  InstallForkHandlers();
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<int>& marked = Registry();
  if (std::find(marked.begin(), marked.end(), fd) == marked.end()) marked.push_back(fd);
}

void CloseForkPrivate(int fd) {
  if (fd < 0) return;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  std::vector<int>& marked = Registry();
  marked.erase(std::remove(marked.begin(), marked.end(), fd), marked.end());
  close(fd);
}

}  // namespace shardopt
