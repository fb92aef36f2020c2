// fiber.h -- user-space context switching for the threads of a threadgroup.
//
// x86-64: a 20-instruction switch that saves the callee-saved registers plus MXCSR and the x87
// control word (a kernel may change rounding modes; the scheduler must not inherit them).
// Elsewhere, or with -DMSL_EMU_UCONTEXT: swapcontext, 5-10x slower because glibc makes a
// sigprocmask system call per switch.
#pragma once
#include <cstddef>
#include <cstdint>

#if defined(MSL_EMU_UCONTEXT) || !defined(__x86_64__)
#define MSL_EMU_USE_UCONTEXT 1
#include <ucontext.h>
#endif

namespace msl_emu {
namespace fiber {

struct Context {
#ifdef MSL_EMU_USE_UCONTEXT
  ucontext_t uc;
#else
  void* sp = nullptr;
#endif
};

// Makes `ctx` start entry(arg) on the stack [stack, stack + size) at the first switch to it.
// `entry` must never return (it switches away for good instead).
void prepare(Context* ctx, char* stack, size_t size, void (*entry)(void*), void* arg);
// Saves the running context into `from` and resumes `to`.
void switch_to(Context* from, Context* to);

// Fiber stacks with a guard page below each, mapped once and reused across threadgroups.
class Stacks {
 public:
  static constexpr size_t kStackBytes = 128 * 1024;
  Stacks() = default;
  Stacks(const Stacks&) = delete;
  Stacks& operator=(const Stacks&) = delete;
  ~Stacks();
  void ensure(size_t n);  // at least n stacks
  // The usable region of stack i. Its top is staggered by (i % 61) * 64 bytes: without that,
  // the hot frames of all fibers alias to the same L1 sets and two workers gain nothing.
  char* base(size_t i) const { return map_ + i * stride_ + guard_; }
  size_t size(size_t i) const { return kStackBytes - (i % 61) * 64; }

 private:
  char* map_ = nullptr;
  size_t n_ = 0, stride_ = 0, guard_ = 0, span_ = 0;
};

}  // namespace fiber
}  // namespace msl_emu
