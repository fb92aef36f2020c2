// msl_emu/runtime.h -- run MSL compute kernels (compiled as C++ by gen.py) on the CPU.
//
// Host-side API. A kernel runs over a grid of threadgroups with GPU semantics: the threads of
// a threadgroup are fibers on one OS thread, so threadgroup_barrier, simd_* collectives over
// 32-lane simdgroups and threadgroup memory behave as on an Apple GPU. Worker OS threads take
// whole threadgroups from a shared counter.
//
//   const msl_emu::Kernel* k = msl_emu::find_kernel("rms_norm_f32");
//   msl_emu::Bindings b;
//   b.set_bytes(0, &args, sizeof args);
//   b.set_buffer(1, x.data());
//   b.set_threadgroup_memory(0, 32 * sizeof(float));
//   msl_emu::dispatch_threadgroups(*k, b, {rows, 1, 1}, {256, 1, 1});
//
// Every error is a msl_emu::KernelError: limits (Apple's), unbound arguments, barrier
// divergence, deadlocks, divergent simd collectives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace msl_emu {

// Apple-silicon limits (GPU family Apple7+), enforced as a Metal device does.
constexpr uint32_t kSimdWidth = 32;
constexpr uint32_t kMaxThreadsPerThreadgroup = 1024;
constexpr size_t kMaxThreadgroupMemory = 32768;  // static (kernel-scope) + dynamic, per threadgroup
constexpr size_t kMaxSetBytes = 4096;            // setBytes:length:atIndex:
constexpr unsigned kMaxBufferIndex = 30;         // [[buffer(0..30)]]
constexpr unsigned kMaxThreadgroupMemoryIndex = 30;

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
};

// A kernel as the generated registration describes it.
struct Kernel;
using EntryFn = void (*)(const struct Launch&);
struct Kernel {
  const char* name;              // registered name (host_name for template instantiations)
  EntryFn entry;
  const char* file;              // .metal file
  int line;                      // line of the kernel's declaration
  uint32_t static_tg_bytes;      // kernel-scope threadgroup memory, when gen.py could size it; else 0
  uint32_t max_total_threads;    // [[max_total_threads_per_threadgroup(n)]], else kMaxThreadsPerThreadgroup
};

// Looks a kernel up by name; nullptr if no linked .metal file registered it.
const Kernel* find_kernel(const std::string& name);
std::vector<std::string> kernel_names();

// Arguments of one dispatch. Copyable: a copy is a snapshot (setBytes data is copied in).
class Bindings {
 public:
  // [[buffer(index)]] points at base + offset. The memory must outlive the dispatch.
  void set_buffer(unsigned index, void* base, size_t offset = 0);
  // [[buffer(index)]] gets a private copy of `length` bytes (at most kMaxSetBytes).
  void set_bytes(unsigned index, const void* data, size_t length);
  // [[threadgroup(index)]] gets `length` bytes per threadgroup (a multiple of 16, as Metal
  // requires), poisoned with 0xFF (NaN) at the start of every threadgroup.
  void set_threadgroup_memory(unsigned index, size_t length);
  void clear_buffer(unsigned index);

  void* buffer(unsigned index) const;          // nullptr when unbound
  size_t threadgroup_memory(unsigned index) const;
  size_t dynamic_threadgroup_bytes() const;    // sum over all indices

 private:
  void* buffers_[kMaxBufferIndex + 1] = {};
  std::shared_ptr<std::vector<unsigned char>> bytes_[kMaxBufferIndex + 1];
  size_t tg_len_[kMaxThreadgroupMemoryIndex + 1] = {};
};

enum class Order { Forward, Reverse, Shuffle };

// The order in which the threads of a threadgroup are scheduled between barriers. Running a
// test in all three orders exposes missing barriers (threadgroup memory starts as NaN).
struct Options {
  Order order = Order::Forward;
  uint64_t seed = 1;   // Shuffle's seed; each threadgroup's shuffle is a function of it
  int workers = 0;     // OS threads running threadgroups; 0: std::thread::hardware_concurrency()
};

// Process-wide options. Until set_options is called, the first use reads the environment:
// MSL_EMU_ORDER (forward|reverse|shuffle), MSL_EMU_SEED (integer), MSL_EMU_WORKERS (integer).
void set_options(const Options& o);
Options options();
const char* order_name(Order o);

// Raised for every error found while validating or running a dispatch.
struct KernelError : std::runtime_error {
  KernelError(std::string message, std::string kernel, Dim3 threadgroup, int64_t thread, std::string file, int line);
  std::string message;   // the bare diagnosis
  std::string kernel;    // kernel name ("" before a kernel was chosen)
  Dim3 threadgroup;      // threadgroup_position_in_grid
  int64_t thread;        // thread_index_in_threadgroup, or -1 when no single thread is at fault
  std::string file;      // .metal file ("" if unknown)
  int line;              // line in `file` (0 if unknown)
};

// Metal's dispatchThreadgroups: `threadgroups` whole threadgroups of `threads_per_threadgroup`.
void dispatch_threadgroups(const Kernel& k, const Bindings& b, Dim3 threadgroups, Dim3 threads_per_threadgroup);
// Metal's dispatchThreads: exactly `threads` threads; edge threadgroups are smaller.
void dispatch_threads(const Kernel& k, const Bindings& b, Dim3 threads, Dim3 threads_per_threadgroup);
// The same with explicit options instead of the process-wide ones.
void dispatch_threadgroups(const Kernel& k, const Bindings& b, Dim3 threadgroups, Dim3 threads_per_threadgroup,
                           const Options& o);
void dispatch_threads(const Kernel& k, const Bindings& b, Dim3 threads, Dim3 threads_per_threadgroup, const Options& o);

// ---------------------------------------------------------------------------------------
// Used by generated code only.
struct ThreadBuiltins {
  Dim3 tpig, tpitg, tgpig, ntptg, dtptg, ntgpg, ntpg;
  uint32_t tiitg, tiisg, sgitg, nsgptg, tpsg, tiiqg, qgitg, nqgptg;
};
struct Launch {  // what a kernel's entry trampoline receives
  const Kernel* kernel;
  const Bindings* bindings;
  void* const* tg_mem;          // per [[threadgroup(n)]] index, nullptr if not set
  const ThreadBuiltins* builtins;
};
struct KernelReg {
  KernelReg(const char* name, EntryFn entry, const char* file, int line, uint32_t static_tg_bytes,
            uint32_t max_total_threads);
};

}  // namespace msl_emu
