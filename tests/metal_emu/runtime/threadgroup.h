// threadgroup.h -- runs one threadgroup: its threads as fibers on the calling OS thread.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "fiber.h"
#include "msl_emu/runtime.h"

namespace msl_emu {
namespace detail {

// One dispatch as every worker sees it.
struct Grid {
  const Kernel* kernel;
  const Bindings* bindings;
  Dim3 threadgroups;   // threadgroups_per_grid
  Dim3 tptg;           // threads per threadgroup as dispatched
  Dim3 threads;        // threads_per_grid
  bool nonuniform;     // dispatchThreads: edge threadgroups are smaller
  Options options;
  uint64_t dispatch_no;
};

// Per-OS-thread executor of threadgroups. Reused across dispatches (stacks stay mapped).
class Worker {
 public:
  // Runs threadgroup `tg` (linear index `tg_linear`) of `grid`; throws KernelError.
  void run(const Grid& grid, Dim3 tg, uint64_t tg_linear);

  // ---- called from inside a fiber (through msl_emu::rt)
  void threadgroup_barrier(const char* file, int line);
  void simdgroup_barrier(const char* file, int line);
  const unsigned char* simd_exchange(const void* v, size_t n, const char* op, const char* file, int line, uint32_t* active);
  uint32_t lane() const { return cur_->bi.tiisg; }
  void tg_var_init(void* p, size_t bytes, uint64_t* epoch, const char* file, int line);
  [[noreturn]] void fail(const std::string& msg, const char* file, int line);

 private:
  enum Wait : uint8_t { kRunnable, kBarrier, kSimd, kSimdBarrier, kDone };
  struct Fiber {
    fiber::Context ctx;
    ThreadBuiltins bi;
    Wait wait = kRunnable;
    uint64_t wait_gen = 0;
    const char* wait_op = nullptr;
    const char* wait_file = nullptr;
    int wait_line = 0;
  };
  struct SimdGroup {
    uint32_t live = 0, arrived = 0;
    uint64_t gen = 0;
    const char* op = nullptr;
    const char* file = nullptr;
    int line = 0;
    uint32_t result_mask[2] = {0, 0};
    // Double-buffered: a lane can start the next collective before slower lanes have read
    // this one's slots, but it can't finish it before they did.
    alignas(64) unsigned char slots[2][kSimdWidth][64];
    uint32_t bar_arrived = 0;
    uint64_t bar_gen = 0;
  };

  static void fiber_main(void* self);
  bool runnable(const Fiber& f) const;
  void yield();
  void on_thread_exit();
  void release_simd(SimdGroup& sg);
  void set_wait(Wait w, uint64_t gen, const char* op, const char* file, int line);
  std::string deadlock_report(std::string* file, int* line) const;
  [[noreturn]] void throw_error();

  const Grid* grid_ = nullptr;
  fiber::Stacks stacks_;
  std::vector<Fiber> fibers_;
  std::vector<SimdGroup> sgs_;
  std::vector<std::vector<unsigned char>> tg_store_;
  void* tg_mem_[kMaxThreadgroupMemoryIndex + 1] = {};
  fiber::Context sched_;
  Fiber* cur_ = nullptr;
  std::vector<uint32_t> order_;
  std::mt19937_64 rng_;

  // state of the running threadgroup
  Dim3 tg_{};
  uint32_t nthreads_ = 0, ndone_ = 0;
  uint32_t bar_arrived_ = 0;
  uint64_t bar_gen_ = 0;
  const char* bar_file_ = nullptr;
  int bar_line_ = 0;
  uint64_t serial_ = 0;
  size_t static_tg_bytes_ = 0, dynamic_tg_bytes_ = 0;
  bool failed_ = false;
  std::string err_msg_, err_file_;
  int err_line_ = 0;
  int64_t err_thread_ = -1;
};

// The worker of the calling OS thread (created on first use).
Worker& this_thread_worker();

}  // namespace detail
}  // namespace msl_emu
