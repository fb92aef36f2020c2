// A persistent pool of worker threads: parallel_for splits a range into chunks that the calling
// thread and the workers claim one at a time, with no per-op thread start-up. Workers spin
// briefly between ops (a decode step runs hundreds of small ops back to back), then sleep.
// parallel_for returns as soon as every chunk is done: it never waits for a worker that had no
// chunk (one the OS has descheduled costs nothing unless it holds a chunk).
#pragma once
#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace markbase {

class ThreadPool {
 public:
  explicit ThreadPool(int n_threads);
  ~ThreadPool();
  int size() const { return n_; }
  // fn(begin, end) over [0, n) in contiguous chunks of at least `grain`.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker();
  // Claims and runs chunks of job `gen` until none are left or another job has started.
  void run_claims(uint32_t gen);

  int n_;
  std::vector<std::thread> threads_;
  // The current job; written by the caller only while no chunk of the previous job is running.
  const std::function<void(int64_t, int64_t)>* fn_ = nullptr;
  int64_t total_ = 0, chunk_ = 0;
  uint32_t gen_counter_ = 0;
  // (job generation << 32) | (chunk count << 16) | next chunk to claim
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> done_{0};    // chunks of the current job finished
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<int> sleeping_{0};
  std::atomic<bool> stop_{false};
};

}  // namespace markbase
