#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MB_PAUSE() _mm_pause()
#else
#define MB_PAUSE() std::this_thread::yield()
#endif

namespace markbase {

ThreadPool::ThreadPool(int n_threads) : n_(std::max(1, n_threads)) {
  // Workers start from the generation as it is now: a parallel_for issued before a worker is
  // first scheduled must still be seen by it.
  const uint64_t start = generation_.load();
  for (int i = 1; i < n_; ++i) threads_.emplace_back(&ThreadPool::worker, this, start);
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_chunks() {
  const int64_t total = total_, chunk = chunk_;
  for (;;) {
    const int64_t b = next_.fetch_add(chunk);
    if (b >= total) break;
    (*fn_)(b, std::min(total, b + chunk));
  }
}

void ThreadPool::worker(uint64_t seen) {
  for (;;) {
    // Spin for a short while: the next op usually follows within microseconds.
    auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(200);
    int spins = 0;
    while (generation_.load(std::memory_order_acquire) == seen) {
      MB_PAUSE();
      if (++spins % 256 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lk(mu_);
        sleeping_.fetch_add(1);
        cv_.wait(lk, [&] { return generation_.load() != seen; });
        sleeping_.fetch_sub(1);
        break;
      }
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    run_chunks();
    pending_.fetch_sub(1, std::memory_order_acq_rel);
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
  fn_ = &fn;
  total_ = n;
  chunk_ = std::max(grain, (n + 4 * n_ - 1) / (4 * n_));
  next_.store(0);
  pending_.store(n_ - 1);
  {
    std::lock_guard<std::mutex> lk(mu_);
    generation_.fetch_add(1, std::memory_order_release);
  }
  if (sleeping_.load() > 0) cv_.notify_all();
  run_chunks();
  while (pending_.load(std::memory_order_acquire) != 0) MB_PAUSE();
}

}  // namespace markbase
