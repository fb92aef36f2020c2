// Asynchronous global -> shared copies (cp.async, compute capability 8.0+), for kernels that stage
// tiles in shared memory while they compute. The "memory" clobbers keep the compiler from moving
// shared-memory accesses across the copies' issue and wait points.
#pragma once
#include <cstdint>

namespace markbase::cuda {

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, bypassing L1; ok == false zero-fills the 16 bytes (rows past a
// range, so that no stale shared data, possibly NaN bit patterns, meets a zero weight).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool ok) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(ok ? 16 : 0)
               : "memory");
}
// cp_async16 of 16 bytes that are always in range, with an L2 cache policy (createpolicy; the
// weight stream's: common.cuh's evict_first_policy).
__device__ __forceinline__ void cp_async16_policy(void* dst, const void* src, unsigned long long pol) {
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "l"(pol)
               : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

}  // namespace markbase::cuda
