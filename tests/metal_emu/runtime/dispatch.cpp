// dispatch.cpp -- validates a dispatch against Metal's limits and runs its threadgroups on a
// pool of worker OS threads, which take threadgroups from a shared atomic counter.
//
// The pool is created once and reused (dispatches of an LLM forward pass number in the
// hundreds per token); the calling thread works too. Dispatches are serialised: one runs at a
// time, as in one Metal command queue.
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "msl_emu/runtime.h"
#include "threadgroup.h"

namespace msl_emu {
namespace {

// ------------------------------------------------------------------ worker pool
class Pool {
 public:
  ~Pool() { resize(0); }

  // Runs job(worker_index) on `n` threads (the caller is worker 0) and waits for all.
  void run(int n, const std::function<void(int)>& job) {
    if (n - 1 != (int)threads_.size()) resize(n - 1);
    {
      std::lock_guard<std::mutex> l(mu_);
      job_ = &job;
      pending_ = (int)threads_.size();
      ++generation_;
    }
    cv_.notify_all();
    job(0);
    std::unique_lock<std::mutex> l(mu_);
    done_cv_.wait(l, [&] { return pending_ == 0; });
    job_ = nullptr;
  }

 private:
  void resize(int n) {
    {
      std::lock_guard<std::mutex> l(mu_);
      quit_ = true;
      ++generation_;
    }
    cv_.notify_all();
    for (auto& t : threads_) t.join();
    threads_.clear();
    quit_ = false;
    // Each thread starts from the current generation, so that a job posted before it first
    // looks is still seen as new.
    for (int i = 0; i < n; ++i) threads_.emplace_back([this, i, g = generation_] { loop(i + 1, g); });
  }
  void loop(int index, uint64_t seen) {
    for (;;) {
      const std::function<void(int)>* job;
      {
        std::unique_lock<std::mutex> l(mu_);
        cv_.wait(l, [&] { return generation_ != seen; });
        seen = generation_;
        if (quit_) return;
        job = job_;
      }
      (*job)(index);
      std::lock_guard<std::mutex> l(mu_);
      if (--pending_ == 0) done_cv_.notify_all();
    }
  }

  std::vector<std::thread> threads_;
  std::mutex mu_;
  std::condition_variable cv_, done_cv_;
  const std::function<void(int)>* job_ = nullptr;
  int pending_ = 0;
  uint64_t generation_ = 0;
  bool quit_ = false;
};

std::mutex& dispatch_mutex() {
  static std::mutex m;
  return m;
}
Pool& pool() {
  static Pool p;
  return p;
}
std::atomic<uint64_t> g_dispatch_no{0};

[[noreturn]] void refuse(const Kernel& k, const std::string& m) {
  throw KernelError(m, k.name, Dim3{0, 0, 0}, -1, k.file, k.line);
}

std::string dims(Dim3 d) { return "(" + std::to_string(d.x) + "," + std::to_string(d.y) + "," + std::to_string(d.z) + ")"; }

void validate(const Kernel& k, const Bindings& b, Dim3 tptg) {
  if (tptg.x == 0 || tptg.y == 0 || tptg.z == 0) refuse(k, "threadsPerThreadgroup " + dims(tptg) + " has a zero dimension");
  if (tptg.x > kMaxThreadsPerThreadgroup || tptg.y > kMaxThreadsPerThreadgroup || tptg.z > kMaxThreadsPerThreadgroup)
    refuse(k, "threadsPerThreadgroup " + dims(tptg) + ": each dimension is limited to " +
                  std::to_string(kMaxThreadsPerThreadgroup));
  uint64_t n = (uint64_t)tptg.x * tptg.y * tptg.z;
  uint32_t limit = std::min(k.max_total_threads, kMaxThreadsPerThreadgroup);
  if (n > limit)
    refuse(k, "threadsPerThreadgroup " + dims(tptg) + " = " + std::to_string(n) +
                  " threads exceeds the pipeline's maxTotalThreadsPerThreadgroup of " + std::to_string(limit));
  size_t tg = (size_t)k.static_tg_bytes + b.dynamic_threadgroup_bytes();
  if (tg > kMaxThreadgroupMemory)
    refuse(k, "threadgroup memory limit: " + std::to_string(k.static_tg_bytes) + " bytes of kernel-scope threadgroup variables + " +
                  std::to_string(b.dynamic_threadgroup_bytes()) + " bytes from setThreadgroupMemoryLength exceed the " +
                  std::to_string(kMaxThreadgroupMemory) + "-byte limit");
}

void run_grid(const Kernel& k, const Bindings& b, Dim3 ntg, Dim3 tptg, Dim3 nthreads, bool nonuniform, const Options& o) {
  validate(k, b, tptg);
  const uint64_t total = (uint64_t)ntg.x * ntg.y * ntg.z;
  if (total == 0) return;  // an empty grid does nothing, as on a GPU

  std::lock_guard<std::mutex> serial(dispatch_mutex());
  detail::Grid grid{&k, &b, ntg, tptg, nthreads, nonuniform, o, ++g_dispatch_no};
  int nw = o.workers > 0 ? o.workers : (int)std::max(1u, std::thread::hardware_concurrency());
  nw = (int)std::min<uint64_t>((uint64_t)nw, total);

  std::atomic<uint64_t> next{0};
  std::atomic<bool> stop{false};
  std::mutex err_mu;
  std::exception_ptr err;
  uint64_t err_tg = UINT64_MAX;
  auto job = [&](int) {
    detail::Worker& w = detail::this_thread_worker();
    for (uint64_t i; !stop.load(std::memory_order_relaxed) && (i = next.fetch_add(1)) < total;) {
      Dim3 g{(uint32_t)(i % ntg.x), (uint32_t)((i / ntg.x) % ntg.y), (uint32_t)(i / ((uint64_t)ntg.x * ntg.y))};
      try {
        w.run(grid, g, i);
      } catch (...) {
        // Report the lowest failing threadgroup, so that the message doesn't depend on timing.
        std::lock_guard<std::mutex> l(err_mu);
        if (i < err_tg) {
          err_tg = i;
          err = std::current_exception();
        }
        stop = true;
      }
    }
  };
  if (nw == 1) job(0);
  else pool().run(nw, job);
  if (err) std::rethrow_exception(err);
}

}  // namespace

void dispatch_threadgroups(const Kernel& k, const Bindings& b, Dim3 ntg, Dim3 tptg, const Options& o) {
  Dim3 nthreads{ntg.x * tptg.x, ntg.y * tptg.y, ntg.z * tptg.z};
  run_grid(k, b, ntg, tptg, nthreads, false, o);
}

void dispatch_threads(const Kernel& k, const Bindings& b, Dim3 nthreads, Dim3 tptg, const Options& o) {
  if (tptg.x == 0 || tptg.y == 0 || tptg.z == 0) validate(k, b, tptg);  // reports the zero dimension
  Dim3 ntg{(nthreads.x + tptg.x - 1) / tptg.x, (nthreads.y + tptg.y - 1) / tptg.y, (nthreads.z + tptg.z - 1) / tptg.z};
  run_grid(k, b, ntg, tptg, nthreads, true, o);
}

void dispatch_threadgroups(const Kernel& k, const Bindings& b, Dim3 ntg, Dim3 tptg) {
  dispatch_threadgroups(k, b, ntg, tptg, options());
}

void dispatch_threads(const Kernel& k, const Bindings& b, Dim3 nthreads, Dim3 tptg) {
  dispatch_threads(k, b, nthreads, tptg, options());
}

}  // namespace msl_emu
