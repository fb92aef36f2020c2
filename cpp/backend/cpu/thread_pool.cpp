#include "backend/cpu/thread_pool.h"

#include <algorithm>
#include <chrono>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MB_PAUSE() _mm_pause()
#elif defined(__aarch64__)
#define MB_PAUSE() __asm__ __volatile__("yield")  // Arm's spin-wait hint
#else
#define MB_PAUSE() std::this_thread::yield()
#endif

namespace markbase {

ThreadPool::ThreadPool(int n_threads) : n_(std::max(1, n_threads)) {
  for (int i = 1; i < n_; ++i) threads_.emplace_back(&ThreadPool::worker, this);
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  {
    std::lock_guard<std::mutex> lk(mu_);
    state_.store(static_cast<uint64_t>(++gen_counter_) << 32);
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run_claims(uint32_t gen) {
  for (;;) {
    uint64_t s = state_.load();
    if (static_cast<uint32_t>(s >> 32) != gen) return;
    const uint32_t i = static_cast<uint32_t>(s & 0xFFFF), nchunks = static_cast<uint32_t>((s >> 16) & 0xFFFF);
    if (i >= nchunks) return;
    if (!state_.compare_exchange_weak(s, s + 1)) continue;
    // A successful claim proves job `gen` is still current, so its fields are stable.
    const int64_t b = static_cast<int64_t>(i) * chunk_;
    (*fn_)(b, std::min(total_, b + chunk_));
    done_.fetch_add(1);
  }
}

void ThreadPool::worker() {
  uint32_t seen = 0;
  for (;;) {
    auto current = [&] { return static_cast<uint32_t>(state_.load() >> 32); };
    const auto spin_until = std::chrono::steady_clock::now() + std::chrono::microseconds(300);
    int spins = 0;
    while (current() == seen && !stop_.load()) {
      MB_PAUSE();
      if (++spins % 128 == 0 && std::chrono::steady_clock::now() > spin_until) {
        std::unique_lock<std::mutex> lk(mu_);
        sleeping_.fetch_add(1);
        cv_.wait(lk, [&] { return current() != seen || stop_.load(); });
        sleeping_.fetch_sub(1);
        break;
      }
    }
    if (stop_.load()) return;
    seen = current();
    run_claims(seen);
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
  if ((n + chunk_ - 1) / chunk_ > 0xFFFF) chunk_ = (n + 0xFFFE) / 0xFFFF;
  const uint32_t nchunks = static_cast<uint32_t>((n + chunk_ - 1) / chunk_);  // <= 4 * threads
  done_.store(0);
  const uint32_t gen = ++gen_counter_;
  // The chunk count travels in the same atomic word as the generation, so a worker never pairs
  // one job's count with another's generation.
  state_.store(static_cast<uint64_t>(gen) << 32 | static_cast<uint64_t>(nchunks) << 16);
  if (sleeping_.load() > 0) {
    { std::lock_guard<std::mutex> lk(mu_); }
    cv_.notify_all();
  }
  run_claims(gen);
  while (done_.load() < nchunks) MB_PAUSE();
}

}  // namespace markbase
