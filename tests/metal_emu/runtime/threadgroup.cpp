// threadgroup.cpp -- the scheduler of one threadgroup, and the fiber-side msl_emu::rt calls.
//
// The scheduler resumes runnable fibers in the chosen order; a fiber runs until it waits
// (barrier, simd collective) or returns. A barrier opens when every thread of the threadgroup
// arrived at the same call site; a collective completes when every live lane of the simdgroup
// arrived at the same call site. Anything else is a diagnosed error, never a hang: a thread
// returning while others wait, barriers on different lines, and no runnable fiber (deadlock).
#include "threadgroup.h"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <tuple>

#include "msl_emu/rt.h"

namespace msl_emu {
namespace detail {

namespace {
std::atomic<uint64_t> g_serial{0};
thread_local Worker* tls_running = nullptr;  // the worker whose threadgroup is running here

uint64_t mix64(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}
bool same_site(const char* f1, int l1, const char* f2, int l2) {
  return l1 == l2 && (f1 == f2 || (f1 && f2 && std::strcmp(f1, f2) == 0));
}
std::string site(const char* file, int line) { return std::string(file ? file : "?") + ":" + std::to_string(line); }
}  // namespace

Worker& this_thread_worker() {
  thread_local Worker w;
  return w;
}

void Worker::fiber_main(void* self) {
  Worker* w = (Worker*)self;
  Launch L{w->grid_->kernel, w->grid_->bindings, w->tg_mem_, &w->cur_->bi};
  w->grid_->kernel->entry(L);
  w->on_thread_exit();
  for (;;) w->yield();  // never resumed once done
}

void Worker::yield() { fiber::switch_to(&cur_->ctx, &sched_); }

void Worker::set_wait(Wait w, uint64_t gen, const char* op, const char* file, int line) {
  cur_->wait = w;
  cur_->wait_gen = gen;
  cur_->wait_op = op;
  cur_->wait_file = file;
  cur_->wait_line = line;
}

bool Worker::runnable(const Fiber& f) const {
  switch (f.wait) {
    case kRunnable: return true;
    case kBarrier: return bar_gen_ != f.wait_gen;
    case kSimd: return sgs_[f.bi.sgitg].gen != f.wait_gen;
    case kSimdBarrier: return sgs_[f.bi.sgitg].bar_gen != f.wait_gen;
    default: return false;
  }
}

void Worker::fail(const std::string& msg, const char* file, int line) {
  if (!failed_) {
    failed_ = true;
    err_msg_ = msg;
    err_file_ = file ? file : "";
    err_line_ = line;
    err_thread_ = cur_ ? (int64_t)cur_->bi.tiitg : -1;
  }
  for (;;) yield();  // the scheduler sees failed_ and throws; this fiber is abandoned
}

void Worker::throw_error() {
  throw KernelError(err_msg_, grid_->kernel->name, tg_, err_thread_, err_file_, err_line_);
}

void Worker::release_simd(SimdGroup& sg) {
  sg.result_mask[sg.gen & 1] = sg.arrived;
  sg.arrived = 0;
  ++sg.gen;
}

void Worker::on_thread_exit() {
  Fiber* f = cur_;
  f->wait = kDone;
  ++ndone_;
  if (bar_arrived_ > 0)
    fail("barrier divergence: a thread returned while " + std::to_string(bar_arrived_) +
             " threads of its threadgroup wait at threadgroup_barrier (" + site(bar_file_, bar_line_) + ")",
         bar_file_, bar_line_);
  // A returned lane leaves its simdgroup's active mask, as on a GPU.
  SimdGroup& sg = sgs_[f->bi.sgitg];
  sg.live &= ~(1u << f->bi.tiisg);
  if (sg.arrived && sg.arrived == sg.live) release_simd(sg);
  if (sg.bar_arrived && sg.bar_arrived == (uint32_t)__builtin_popcount(sg.live)) {
    sg.bar_arrived = 0;
    ++sg.bar_gen;
  }
}

void Worker::threadgroup_barrier(const char* file, int line) {
  if (ndone_ > 0)
    fail("barrier divergence: threadgroup_barrier reached after " + std::to_string(ndone_) +
             " threads of the threadgroup returned",
         file, line);
  if (bar_arrived_ == 0) {
    bar_file_ = file;
    bar_line_ = line;
  } else if (!same_site(bar_file_, bar_line_, file, line)) {
    fail("barrier divergence: threads of one threadgroup wait at different threadgroup_barrier calls (" +
             site(bar_file_, bar_line_) + " and " + site(file, line) + ")",
         file, line);
  }
  uint64_t g = bar_gen_;
  if (++bar_arrived_ == nthreads_) {  // the last thread opens the barrier and goes on
    bar_arrived_ = 0;
    ++bar_gen_;
    return;
  }
  set_wait(kBarrier, g, "threadgroup_barrier", file, line);
  yield();
}

void Worker::simdgroup_barrier(const char* file, int line) {
  SimdGroup& sg = sgs_[cur_->bi.sgitg];
  uint64_t g = sg.bar_gen;
  if (++sg.bar_arrived == (uint32_t)__builtin_popcount(sg.live)) {
    sg.bar_arrived = 0;
    ++sg.bar_gen;
    return;
  }
  set_wait(kSimdBarrier, g, "simdgroup_barrier", file, line);
  yield();
}

const unsigned char* Worker::simd_exchange(const void* v, size_t n, const char* op, const char* file, int line,
                                           uint32_t* active) {
  SimdGroup& sg = sgs_[cur_->bi.sgitg];
  if (n > rt::kSimdSlotBytes) fail(std::string(op) + " on a value larger than 64 bytes", file, line);
  uint64_t g = sg.gen;
  if (sg.arrived == 0) {
    sg.op = op;
    sg.file = file;
    sg.line = line;
  } else if (!same_site(sg.file, sg.line, file, line) || std::strcmp(sg.op, op) != 0) {
    fail("divergent simd collective: lanes of one simdgroup are in different collectives (" + std::string(sg.op) +
             " at " + site(sg.file, sg.line) + ", " + op + " at " + site(file, line) +
             "); simd_* calls must be in simdgroup-uniform control flow",
         file, line);
  }
  std::memcpy(sg.slots[g & 1][cur_->bi.tiisg], v, n);
  sg.arrived |= 1u << cur_->bi.tiisg;
  if (sg.arrived == sg.live) {
    release_simd(sg);
  } else {
    set_wait(kSimd, g, op, file, line);
    yield();
  }
  *active = sg.result_mask[g & 1];
  return &sg.slots[g & 1][0][0];
}

void Worker::tg_var_init(void* p, size_t bytes, uint64_t* epoch, const char* file, int line) {
  if (*epoch == serial_) return;
  *epoch = serial_;
  std::memset(p, 0xFF, bytes);
  static_tg_bytes_ += bytes;
  if (static_tg_bytes_ + dynamic_tg_bytes_ > kMaxThreadgroupMemory)
    fail("threadgroup memory limit: " + std::to_string(static_tg_bytes_) + " bytes of kernel-scope threadgroup variables + " +
             std::to_string(dynamic_tg_bytes_) + " bytes from setThreadgroupMemoryLength exceed the " +
             std::to_string(kMaxThreadgroupMemory) + "-byte limit",
         file, line);
}

std::string Worker::deadlock_report(std::string* file, int* line) const {
  // Group the waiting threads by where they wait.
  std::map<std::tuple<std::string, std::string, int>, int> where;
  for (uint32_t i = 0; i < nthreads_; ++i) {
    const Fiber& f = fibers_[i];
    if (f.wait == kDone) continue;
    where[{f.wait_op ? f.wait_op : "?", f.wait_file ? f.wait_file : "?", f.wait_line}]++;
  }
  std::string m = "deadlock: no thread of the threadgroup can proceed (a barrier or simd collective in divergent "
                  "control flow):";
  bool first = true;
  for (auto& [k, count] : where) {
    const auto& [op, f, l] = k;
    if (first) {
      *file = f;
      *line = l;
    }
    m += std::string(first ? " " : ", ") + std::to_string(count) + " threads wait in " + op + " (" + f + ":" +
         std::to_string(l) + ")";
    first = false;
  }
  if (ndone_) m += ", " + std::to_string(ndone_) + " threads returned";
  return m;
}

void Worker::run(const Grid& grid, Dim3 tg, uint64_t tg_linear) {
  grid_ = &grid;
  tg_ = tg;
  const Dim3 d = grid.tptg;
  Dim3 valid = d;  // this threadgroup's real size (smaller at the edge of dispatchThreads)
  if (grid.nonuniform) {
    valid.x = std::min(d.x, grid.threads.x - tg.x * d.x);
    valid.y = std::min(d.y, grid.threads.y - tg.y * d.y);
    valid.z = std::min(d.z, grid.threads.z - tg.z * d.z);
  }
  nthreads_ = valid.x * valid.y * valid.z;
  ndone_ = 0;
  bar_arrived_ = 0;
  bar_gen_ = 0;
  failed_ = false;
  serial_ = ++g_serial;
  static_tg_bytes_ = 0;
  dynamic_tg_bytes_ = grid.bindings->dynamic_threadgroup_bytes();

  const uint32_t nsg = (nthreads_ + kSimdWidth - 1) / kSimdWidth;
  if (sgs_.size() < nsg) sgs_.resize(nsg);
  for (uint32_t s = 0; s < nsg; ++s) {
    SimdGroup& q = sgs_[s];
    uint32_t n = std::min<uint32_t>(kSimdWidth, nthreads_ - s * kSimdWidth);
    q.live = n == 32 ? 0xffffffffu : ((1u << n) - 1);
    q.arrived = 0;
    q.gen = 0;
    q.bar_arrived = 0;
    q.bar_gen = 0;
  }
  // Dynamic threadgroup memory, poisoned: reading it before writing gives NaN.
  tg_store_.resize(kMaxThreadgroupMemoryIndex + 1);
  for (unsigned i = 0; i <= kMaxThreadgroupMemoryIndex; ++i) {
    size_t len = grid.bindings->threadgroup_memory(i);
    if (!len) {
      tg_mem_[i] = nullptr;
      continue;
    }
    if (tg_store_[i].size() < len) tg_store_[i].resize(len);
    tg_mem_[i] = tg_store_[i].data();
    std::memset(tg_mem_[i], 0xFF, len);
  }

  stacks_.ensure(nthreads_);
  if (fibers_.size() < nthreads_) fibers_.resize(nthreads_);
  uint32_t t = 0;
  for (uint32_t z = 0; z < valid.z; ++z)
    for (uint32_t y = 0; y < valid.y; ++y)
      for (uint32_t x = 0; x < valid.x; ++x, ++t) {
        Fiber& f = fibers_[t];
        ThreadBuiltins& b = f.bi;
        b.tpitg = {x, y, z};
        b.tgpig = tg;
        b.ntptg = valid;
        b.dtptg = d;
        b.ntgpg = grid.threadgroups;
        b.ntpg = grid.threads;
        b.tpig = {tg.x * d.x + x, tg.y * d.y + y, tg.z * d.z + z};
        b.tiitg = t;
        b.tiisg = t % kSimdWidth;
        b.sgitg = t / kSimdWidth;
        b.nsgptg = nsg;
        b.tpsg = kSimdWidth;
        b.tiiqg = t % 4;
        b.qgitg = t / 4;
        b.nqgptg = (nthreads_ + 3) / 4;
        f.wait = kRunnable;
        fiber::prepare(&f.ctx, stacks_.base(t), stacks_.size(t), &Worker::fiber_main, this);
      }

  order_.resize(nthreads_);
  for (uint32_t i = 0; i < nthreads_; ++i)
    order_[i] = grid.options.order == Order::Reverse ? nthreads_ - 1 - i : i;
  rng_.seed(mix64(grid.options.seed ^ mix64(tg_linear ^ mix64(grid.dispatch_no))));

  Worker* saved = tls_running;
  tls_running = this;
  struct Restore {
    Worker* s;
    ~Restore() { tls_running = s; }
  } restore{saved};
  while (ndone_ < nthreads_) {
    if (grid.options.order == Order::Shuffle) std::shuffle(order_.begin(), order_.end(), rng_);
    bool progress = false;
    for (uint32_t i : order_) {
      Fiber& f = fibers_[i];
      if (!runnable(f)) continue;
      f.wait = kRunnable;
      cur_ = &f;
      fiber::switch_to(&sched_, &f.ctx);
      cur_ = nullptr;
      progress = true;
      if (failed_) throw_error();
    }
    if (!progress) {
      std::string file;
      int line = 0;
      std::string m = deadlock_report(&file, &line);
      throw KernelError(m, grid.kernel->name, tg_, -1, file, line);
    }
  }
}

}  // namespace detail

// ------------------------------------------------------------------ fiber-side API
namespace rt {
namespace {
detail::Worker& running(const char* what) {
  detail::Worker* w = detail::tls_running;
  if (!w) {
    // Only reachable if kernel code is called outside a dispatch (e.g. directly from a test).
    fprintf(stderr, "msl_emu: %s called outside a kernel dispatch\n", what);
    abort();
  }
  return *w;
}
}  // namespace

void threadgroup_barrier(const char* file, int line) { running("threadgroup_barrier").threadgroup_barrier(file, line); }
void simdgroup_barrier(const char* file, int line) { running("simdgroup_barrier").simdgroup_barrier(file, line); }
const unsigned char* simd_exchange(const void* v, size_t n, const char* op, const char* file, int line, uint32_t* active) {
  return running(op).simd_exchange(v, n, op, file, line, active);
}
uint32_t lane() { return running("thread_index_in_simdgroup").lane(); }
void tg_var_init(void* p, size_t bytes, uint64_t* epoch, const char* file, int line) {
  running("threadgroup variable").tg_var_init(p, bytes, epoch, file, line);
}
void fail(const std::string& message, const char* file, int line) { running("fail").fail(message, file, line); }
}  // namespace rt

}  // namespace msl_emu
