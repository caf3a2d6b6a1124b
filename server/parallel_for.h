// ThreadPool: a fixed set of worker threads that split one range of work.
//
// ParallelFor(n, grain, fn) calls fn(begin, end) on disjoint pieces covering
// [0, n), each piece's begin a multiple of `grain` (so vector loads stay
// aligned), using the pool's workers and the calling thread, and returns when
// all pieces are done. Calls from several threads are serialised: one range is
// in flight at a time, which is what an optimizer shard needs (one update at a
// time) and keeps every worker on one cache-friendly piece.
#ifndef SHARDOPT_SERVER_PARALLEL_FOR_H_
#define SHARDOPT_SERVER_PARALLEL_FOR_H_

#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace shardopt {

class ThreadPool {
 public:
  // `threads` >= 1 counts the calling thread: a pool of 1 runs inline.
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }

  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void WorkerLoop(int worker_index);

  std::mutex call_mu_;  // Serialises ParallelFor calls.
  std::mutex mu_;       // Guards everything below but workers_.
  std::condition_variable work_cv_;
  std::condition_variable done_cv_;
  const std::function<void(size_t, size_t)>* job_ = nullptr;
  std::vector<std::pair<size_t, size_t>> pieces_;  // One per worker.
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace shardopt

#endif  // SHARDOPT_SERVER_PARALLEL_FOR_H_
