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

// A wait on other blocks or on copies that outlasts this many SM cycles (~1 s) traps, which the
// backend reports as an error, not a hang (moe.cu's poll_logits, mbar_wait_phase0).
constexpr long long kSpinTrapCycles = 2000000000ll;

// --- Bulk copies (the tensor memory accelerator, compute capability 9.0): one thread asks for a
// whole contiguous range global -> shared, which lands without the SM issuing a load per 16 bytes;
// an mbarrier in shared memory counts its bytes in. Addresses and sizes: multiples of 16 bytes.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
// One thread: the barrier armed for `bytes` more bytes, arrived at once (count 1).
__device__ __forceinline__ void mbar_init_expect(unsigned long long* bar, uint32_t bytes) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;\n" ::"r"(smem_addr(bar)) : "memory");
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ void bulk_copy_to_shared(void* dst, const void* src, uint32_t bytes,
                                                    unsigned long long* bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
                   smem_addr(dst)),
               "l"(src), "r"(bytes), "r"(smem_addr(bar))
               : "memory");
}
// Every thread that reads the copies: until the barrier's first phase has completed.
__device__ __forceinline__ void mbar_wait_phase0(unsigned long long* bar) {
  uint32_t done = 0;
  const long long t0 = clock64();
  for (; !done; ) {
    if (clock64() - t0 > kSpinTrapCycles) __trap();
    asm volatile(
        "{\n .reg .pred p;\n mbarrier.try_wait.parity.shared::cta.b64 p, [%1], 0;\n selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(smem_addr(bar))
        : "memory");
  }
}
#endif

}  // namespace markbase::cuda
