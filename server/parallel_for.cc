#include "server/parallel_for.h"

#include <algorithm>

namespace shardopt {

ThreadPool::ThreadPool(int threads) {
  const int workers = std::max(threads, 1) - 1;
  pieces_.resize(workers);
  for (int i = 0; i < workers; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  for (std::thread& t : workers_) t.join();
}

void ThreadPool::WorkerLoop(int worker_index) {
  uint64_t seen_generation = 0;
  while (true) {
    const std::function<void(size_t, size_t)>* job;
    std::pair<size_t, size_t> piece;
    {
      std::unique_lock<std::mutex> lock(mu_);
      work_cv_.wait(lock, [&] { return stopping_ || generation_ != seen_generation; });
      if (stopping_) return;
      seen_generation = generation_;
      job = job_;
      piece = pieces_[worker_index];
    }
    if (piece.first < piece.second) (*job)(piece.first, piece.second);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (--pending_ > 0) continue;
    }
    done_cv_.notify_one();
  }
}

void ThreadPool::ParallelFor(size_t n, size_t grain,
                             const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  const size_t parts = static_cast<size_t>(threads());
  // Piece size: n / parts rounded up to the grain.
  const size_t per = ((n + parts - 1) / parts + grain - 1) / grain * grain;
  if (workers_.empty() || per >= n) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> call_lock(call_mu_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t w = 0; w < workers_.size(); ++w) {
      // Workers take pieces 1..parts-1; the caller takes piece 0.
      const size_t begin = std::min(n, (w + 1) * per);
      const size_t end = std::min(n, (w + 2) * per);
      pieces_[w] = {begin, end};
    }
    job_ = &fn;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  work_cv_.notify_all();
  fn(0, std::min(n, per));
  std::unique_lock<std::mutex> lock(mu_);
  done_cv_.wait(lock, [&] { return pending_ == 0; });
  job_ = nullptr;
}

}  // namespace shardopt
