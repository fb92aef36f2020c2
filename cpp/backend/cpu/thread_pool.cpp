#include "backend/cpu/thread_pool.h"

#include <algorithm>

namespace markbase {

ThreadPool::ThreadPool(int n_threads) : n_(std::max(1, n_threads)) {
  for (int i = 1; i < n_; ++i) threads_.emplace_back(&ThreadPool::worker, this, i);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::worker(int) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lk(mu_);
    cv_.wait(lk, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* fn = fn_;
    const int64_t total = total_, chunk = chunk_;
    lk.unlock();
    for (;;) {
      int64_t b = next_.fetch_add(chunk);
      if (b >= total) break;
      (*fn)(b, std::min(total, b + chunk));
    }
    lk.lock();
    if (--active_ == 0) done_cv_.notify_all();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(1, grain);
  if (n_ == 1 || n <= grain) {
    fn(0, n);
    return;
  }
  // Several chunks per thread balance uneven work; never smaller than the grain.
  const int64_t chunk = std::max(grain, (n + 4 * n_ - 1) / (4 * n_));
  {
    std::lock_guard<std::mutex> lk(mu_);
    fn_ = &fn;
    total_ = n;
    chunk_ = chunk;
    next_.store(0);
    active_ = n_ - 1;
    ++generation_;
  }
  cv_.notify_all();
  for (;;) {
    int64_t b = next_.fetch_add(chunk);
    if (b >= n) break;
    fn(b, std::min(n, b + chunk));
  }
  std::unique_lock<std::mutex> lk(mu_);
  done_cv_.wait(lk, [&] { return active_ == 0; });
}

}  // namespace markbase
