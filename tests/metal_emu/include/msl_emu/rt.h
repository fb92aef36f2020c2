// msl_emu/rt.h -- the runtime calls that shim code makes from inside a running kernel thread
// (a fiber). Not for host code: see msl_emu/runtime.h for that.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace msl_emu {
namespace rt {

// Bytes one lane may contribute to a simd collective.
constexpr size_t kSimdSlotBytes = 64;

// Waits until every thread of the threadgroup reached a barrier at the same call site.
void threadgroup_barrier(const char* file, int line);
// Waits until every live lane of the calling simdgroup reached simdgroup_barrier.
void simdgroup_barrier(const char* file, int line);
// Deposits `bytes` of this lane's value under the name `op` and waits until every live lane of
// the simdgroup arrived at the same call site (op, file, line). Returns the 32 slots
// (kSimdSlotBytes apart) and, in *active, the mask of the lanes that took part.
const unsigned char* simd_exchange(const void* value, size_t bytes, const char* op, const char* file, int line,
                                   uint32_t* active);
// thread_index_in_simdgroup of the running thread.
uint32_t lane();
// First-touch of a kernel-scope threadgroup variable in this threadgroup: poison it with 0xFF
// bytes (NaN) and count it against the threadgroup-memory limit. `epoch` is the variable's
// own thread_local marker of the last threadgroup that touched it.
void tg_var_init(void* p, size_t bytes, uint64_t* epoch, const char* file, int line);
// Ends the kernel with a KernelError that names the running thread and file:line.
[[noreturn]] void fail(const std::string& message, const char* file, int line);

}  // namespace rt
}  // namespace msl_emu
