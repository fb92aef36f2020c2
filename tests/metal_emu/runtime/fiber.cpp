// fiber.cpp -- context switch and fiber stacks (see fiber.h).
#include "fiber.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cstring>
#include <new>

namespace msl_emu {
namespace fiber {

#ifndef MSL_EMU_USE_UCONTEXT
extern "C" void msl_emu_switch(void** save_sp, void* new_sp);
extern "C" void msl_emu_fiber_start();
// msl_emu_switch pushes the callee-saved registers and the two FP control words, stores the
// stack pointer, loads the other one and pops the same layout. A new fiber's stack is laid out
// as if it had been switched away from just before msl_emu_fiber_start, which calls
// entry(arg) from r13(r12).
asm(R"(
.text
.globl msl_emu_switch
.type msl_emu_switch,@function
msl_emu_switch:
  pushq %rbp
  pushq %rbx
  pushq %r12
  pushq %r13
  pushq %r14
  pushq %r15
  subq $8, %rsp
  stmxcsr (%rsp)
  fnstcw 4(%rsp)
  movq %rsp, (%rdi)
  movq %rsi, %rsp
  ldmxcsr (%rsp)
  fldcw 4(%rsp)
  addq $8, %rsp
  popq %r15
  popq %r14
  popq %r13
  popq %r12
  popq %rbx
  popq %rbp
  ret
.size msl_emu_switch,.-msl_emu_switch
.globl msl_emu_fiber_start
.type msl_emu_fiber_start,@function
msl_emu_fiber_start:
  movq %r12, %rdi
  callq *%r13
  ud2
.size msl_emu_fiber_start,.-msl_emu_fiber_start
.section .note.GNU-stack,"",@progbits
.text
)");

void prepare(Context* ctx, char* stack, size_t size, void (*entry)(void*), void* arg) {
  uintptr_t top = ((uintptr_t)(stack + size)) & ~(uintptr_t)15;
  uintptr_t* sp = (uintptr_t*)top - 8;
  const uint32_t csr[2] = {0x1F80, 0x037F};  // default MXCSR, default x87 control word
  std::memcpy(&sp[0], csr, 8);
  sp[1] = 0;                  // r15
  sp[2] = 0;                  // r14
  sp[3] = (uintptr_t)entry;   // r13
  sp[4] = (uintptr_t)arg;     // r12
  sp[5] = 0;                  // rbx
  sp[6] = 0;                  // rbp
  sp[7] = (uintptr_t)&msl_emu_fiber_start;  // return address; rsp is 16-aligned after the ret
  ctx->sp = sp;
}

void switch_to(Context* from, Context* to) { msl_emu_switch(&from->sp, to->sp); }

#else  // ucontext

namespace {
// makecontext passes int arguments only: split the two pointers.
void uc_entry(unsigned e_lo, unsigned e_hi, unsigned a_lo, unsigned a_hi) {
  auto entry = (void (*)(void*))(((uintptr_t)e_hi << 32) | e_lo);
  void* arg = (void*)(((uintptr_t)a_hi << 32) | a_lo);
  entry(arg);
}
}  // namespace

void prepare(Context* ctx, char* stack, size_t size, void (*entry)(void*), void* arg) {
  getcontext(&ctx->uc);
  ctx->uc.uc_stack.ss_sp = stack;
  ctx->uc.uc_stack.ss_size = size;
  ctx->uc.uc_link = nullptr;
  uintptr_t e = (uintptr_t)entry, a = (uintptr_t)arg;
  makecontext(&ctx->uc, (void (*)())uc_entry, 4, (unsigned)(e & 0xffffffffu), (unsigned)(e >> 32),
              (unsigned)(a & 0xffffffffu), (unsigned)(a >> 32));
}

void switch_to(Context* from, Context* to) { swapcontext(&from->uc, &to->uc); }
#endif

Stacks::~Stacks() {
  if (map_) munmap(map_, span_);
}

void Stacks::ensure(size_t n) {
  if (n <= n_) return;
  if (map_) munmap(map_, span_);
  guard_ = (size_t)sysconf(_SC_PAGESIZE);
  stride_ = kStackBytes + guard_;
  span_ = stride_ * n;
  void* m = mmap(nullptr, span_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) {
    map_ = nullptr;
    n_ = 0;
    throw std::bad_alloc();
  }
  map_ = (char*)m;
  for (size_t i = 0; i < n; ++i) mprotect(map_ + i * stride_, guard_, PROT_NONE);
  n_ = n;
}

}  // namespace fiber
}  // namespace msl_emu
