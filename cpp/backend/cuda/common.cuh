// Device helpers shared by the CUDA kernels. Block decoding comes from metal/dequant.h, the one
// source of that arithmetic for the Metal and CUDA backends.
#pragma once
#include <cuda_fp16.h>

#include <utility>

#include "../../../metal/dequant.h"
#include "backend/cuda/kernels.h"

namespace markbase::cuda {

// --- Programmatic dependent launch (compute capability 9.0 and newer; no-ops elsewhere).
// Every kernel is launched by enqueue() and starts with these two steps:
//  - pdl_trigger(): the next kernel in the stream may be scheduled now, before this one ends, so
//    its launch latency and its blocks' start overlap this kernel's work;
//  - pdl_wait(): blocks until the kernels before this one have finished and their writes are
//    visible. Nothing before it may read what an earlier kernel writes, or write anything at all;
//    reading weights (which no kernel writes) is allowed, which is how the decode products start
//    their weight loads while the previous kernel still runs.
// A kernel launched without the attribute (programmatic_launch off) passes pdl_wait() at once.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}
// --- Decode timeline (MARKBASE_CUDA_TRACE=1): thread 0 of block 0 of every kernel stamps the
// global timer (ns) as it passes pdl_wait(), i.e. when the kernels before it have finished, so the
// difference of consecutive stamps is a kernel's time on the critical path with programmatic
// launch on (the profile mode's events turn that off). Buffer: [0] the count, then the stamps.
// The stamp's slot is taken (an atomic on the count) before the wait, so that its round trip
// overlaps the wait. Taken after it (until the twenty-ninth session), the atomic's round trip held
// thread 0 of block 0 at the start of every kernel's work, which lengthens most the launches whose
// block 0 is on the critical path (the one-block chains, the router's): the traced 26B-A4B step
// ran 12-17 % slower than the untraced one, and ranked two designs the other way round from it
// (bench/RESULTS.md, twenty-ninth session). Slots are then in the order the blocks reached their
// waits, not the kernels' order; the stamps themselves are in the kernels' order (on one stream
// each wait ends after the kernel before has finished, after that kernel's own wait), so the
// backend sorts them. Thread 0 of block 0 now needs the pointer before its wait; the load was
// already issued there.
// The pointer is a global of each translation unit (no relocatable device code), read by that one
// thread only, before the wait; each .cu file exports its setter through MB_TRACE_ATTACH. It was
// a __constant__ read after the wait, which ptxas hoisted above the thread test and the wait into
// every warp of every block: each stalled on a constant-cache miss for it before its wait (ncu's
// source counters, H200: ~3 % of the MoE router launch's warp samples, ~5 % of a row chain's;
// bench/RESULTS.md, twenty-eighth session). A global load is not speculated that way.
static __device__ unsigned long long* mb_trace_buf = nullptr;
__device__ __forceinline__ void trace_stamp(unsigned long long* b, unsigned long long slot) {
  if (!b || slot >= kTraceMax) return;
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  b[1 + slot] = t;
}
#define MB_TRACE_ATTACH(name) \
  void name(unsigned long long* buf) { cudaMemcpyToSymbol(mb_trace_buf, &buf, sizeof(buf)); }

__device__ __forceinline__ void pdl_wait() {
  unsigned long long* b = nullptr;
  unsigned long long slot = kTraceMax;
  if ((threadIdx.x | blockIdx.x | blockIdx.y | blockIdx.z) == 0) {
    b = reinterpret_cast<unsigned long long*>(__ldg(reinterpret_cast<const unsigned long long*>(&mb_trace_buf)));
    if (b) slot = atomicAdd(b, 1ull);
  }
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
  trace_stamp(b, slot);
}
// Reads a word of each 128-byte line that the kernel parameter p (a __grid_constant__ one: read in
// place, not copied) spans, together, so that the constant cache misses on them overlap here (before
// the programmatic wait) instead of one at a time at each first use after it, where each holds
// the warp for a round trip on the token's critical path (ncu's source counters, H200;
// bench/RESULTS.md, twenty-eighth session). Only for a few lines: each is a load kept live.
template <class T>
__device__ __forceinline__ void touch_param_lines(const T& p) {
  constexpr int kLines = (static_cast<int>(sizeof(T)) + 127) / 128 + 1;  // p need not start a line
  const unsigned* w = reinterpret_cast<const unsigned*>(&p);
  unsigned v[kLines];
#pragma unroll
  for (int i = 0; i < kLines; ++i) v[i] = w[min(i * 32, static_cast<int>(sizeof(T) / 4) - 1)];
  unsigned x = 0;
#pragma unroll
  for (int i = 0; i < kLines; ++i) x ^= v[i];
  // A use that ptxas cannot drop (it would drop the loads for an empty asm): an L2 prefetch of a
  // valid line, made only if the words happen to hash to this constant (harmless if they do).
  asm volatile(
      "{\n .reg .pred p;\n setp.eq.u32 p, %0, 0x5bd1e995;\n @p prefetch.global.L2 [%1];\n}" ::"r"(x),
      "l"(&mb_trace_buf));
}
// Both at a kernel's entry (kernels that read no weights ahead of their inputs).
__device__ __forceinline__ void pdl_entry() {
  pdl_trigger();
  pdl_wait();
}
// --- L2 policy of the weight stream: a build with MARKBASE_CUDA_WEIGHTS_EVICT_FIRST=1 (CMake
// option of the same name, off by default until measured) reads the decode products' weights
// (q8.cuh's unit loads, the LM head's staged rows, the long rows' L2 prefetches) as L2
// evict_first. Decode reads every weight once a token, ~2 GB through a 50 MB L2 on the 26B-A4B
// file, so at the default priority the stream evicts what the next token needs again: each
// kernel's instructions and its parameters (a CUDA graph's fixed buffer), the KV cache, the
// activations. A build option, not a run-time switch: a branch into a second copy of each
// streaming kernel's body changed the default body's registers (bench/RESULTS.md, nineteenth session).
#ifndef MARKBASE_CUDA_WEIGHTS_EVICT_FIRST
#define MARKBASE_CUDA_WEIGHTS_EVICT_FIRST 0
#endif
__device__ __forceinline__ unsigned long long evict_first_policy() {
  unsigned long long pol;
  asm("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  return pol;
}
// 16 bits of a weight through the read-only path with an L2 policy (as __ldg: weights are never
// written by a kernel, so the read may move before the programmatic wait).
__device__ __forceinline__ unsigned short ldg_u16_policy(const unsigned short* p, unsigned long long pol) {
  unsigned short v;
  asm("ld.global.nc.L2::cache_hint.u16 %0, [%1], %2;" : "=h"(v) : "l"(p), "l"(pol));
  return v;
}

// Asks for the bytes [p, p + n) in L2 (one prefetch per 128-byte line, spread over the block).
__device__ __forceinline__ void prefetch_l2(const void* p, size_t n) {
  const char* c = static_cast<const char*>(p);
  for (size_t o = threadIdx.x * 128u; o < n; o += blockDim.x * 128u)
    asm volatile("prefetch.global.L2 [%0];" ::"l"(c + o));
}

// prefetch_l2 of weights; in a MARKBASE_CUDA_WEIGHTS_EVICT_FIRST build with the evict_first
// policy, by bulk prefetches (compute capability 9.0) where the range allows them (16-byte aligned
// start and length).
__device__ __forceinline__ void prefetch_weights_l2(const void* p, size_t n) {
#if MARKBASE_CUDA_WEIGHTS_EVICT_FIRST && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  if (((reinterpret_cast<uintptr_t>(p) | n) & 15) == 0) {
    const unsigned long long pol = evict_first_policy();
    const char* c = static_cast<const char*>(p);
    constexpr size_t kChunk = 4096;  // one bulk prefetch a thread, 4 KB each
    for (size_t o = threadIdx.x * kChunk; o < n; o += blockDim.x * kChunk) {
      const unsigned len = static_cast<unsigned>(n - o < kChunk ? n - o : kChunk);
      asm volatile("cp.async.bulk.prefetch.L2.global.L2::cache_hint [%0], %1, %2;" ::"l"(c + o), "r"(len), "l"(pol)
                   : "memory");
    }
    return;
  }
#endif
  prefetch_l2(p, n);
}

// *p += v, returning the old value, with release and acquire semantics at device scope: the
// "last block done" counters (the writes before it are visible to the block that sees the final
// count, and that block sees theirs). Lighter than __threadfence() (a sequentially consistent
// fence) followed by atomicAdd.
__device__ __forceinline__ unsigned atomic_add_acq_rel(unsigned* p, unsigned v) {
  unsigned old;
  asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}

// *p += v with release semantics at device scope, no value back (the writer's earlier accesses,
// loads included, are done before the count is), and a device-scope acquire load of *p (what the
// counted blocks did before their release is visible after it): a block that waits for others.
__device__ __forceinline__ void red_add_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
// A device-scope relaxed store and load of a float: a value that other blocks poll for while it
// is written (moe.cu's poll buffer), with no ordering of other accesses.
__device__ __forceinline__ void st_relaxed(float* p, float v) {
  asm volatile("st.relaxed.gpu.global.f32 [%0], %1;" ::"l"(p), "f"(v) : "memory");
}
__device__ __forceinline__ float ld_relaxed(const float* p) {
  float v;
  asm volatile("ld.relaxed.gpu.global.f32 %0, [%1];" : "=f"(v) : "l"(p) : "memory");
  return v;
}

// The final logit softcap, y = cap tanh(x / cap): the softcap op and the LM head's product that
// folds it in (matvec_q8.cu) compute it here, so that both give the same bits.
__device__ __forceinline__ float softcap_value(float x, float cap) { return cap * tanhf(x / cap); }

// An RMS norm's scale, 1 / sqrt(ss / n + eps), through the SFU's reciprocal square root and a
// fast division: within a few ulp of the correctly rounded form (which the CPU backend computes),
// where that form's IEEE division, square root and reciprocal, each with its slow-path check,
// were ~40 dependent instructions after every norm's reduction, on the decode chains' critical
// path. Every CUDA norm takes its scale from here, so the backend's own paths (fused or not,
// chain or router) agree to the bit.
// The add is __fadd_rn so that no compiler contracts it with the division's multiply into an FMA
// in some kernels and not in others (the fused and general chains must give the same bits).
__device__ __forceinline__ float rms_scale(float ss, float n, float eps) { return rsqrtf(__fadd_rn(__fdividef(ss, n), eps)); }

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// The warp's sums of N values a lane (N <= 32), by halving exchanges (a reduce-scatter): at each
// of the first L = log2(P) butterfly steps (P: N rounded up to a power of two) a lane keeps half
// of its values and sends its partner the other half, so the warp issues P - 1 + 5 - L shuffles
// where N warp_sums issue 5 N (4 values: 6 against 20). An SM's warps share its shuffle unit (one
// warp's shuffle a cycle), so this pays where the values are ready together and many warps an SM
// reduce at once (the LM head's launch, its rows staged in shared memory: 10 % faster on the
// H200). It costs where the values are ready at different times: its first step needs all N,
// where N warp_sums start as each value is ready, under the loads of the others (the router's
// 12 sums: its norms' sums come from x and a, its dots wait for its rows; SASS: the first
// shuffle ~100 instructions later; its launch 14 % slower). The experts' and q/k/v products ran
// 3-6 % slower with it too, for a reason not settled (bench/RESULTS.md, thirty-first session). Sum
// i is returned in the lanes l with l >> (5 - L) == i (WarpSums<N>::shift), bit-identical to
// warp_sum(v[i]): each step adds the same two partial sums, and a butterfly's lanes all end with
// the same bits (float addition commutes).
template <int N>
struct WarpSums {
  static_assert(N >= 1 && N <= 32, "one to 32 values a lane");
  static constexpr int L = N <= 1 ? 0 : N <= 2 ? 1 : N <= 4 ? 2 : N <= 8 ? 3 : N <= 16 ? 4 : 5;
  static constexpr int P = 1 << L;
  static constexpr int shift = 5 - L;  // sum lane >> shift is in lane; lane % (1 << shift) == 0 writes it
};
template <int N>
__device__ __forceinline__ float warp_sums(const float (&v)[N]) {
  constexpr int P = WarpSums<N>::P;
  const int lane = threadIdx.x & 31;
  float s[P];
#pragma unroll
  for (int i = 0; i < P; ++i) s[i] = i < N ? v[i] : 0.0f;
  int o = 16;
#pragma unroll
  for (int c = P; c > 1; c >>= 1, o >>= 1) {
    const bool hi = lane & o;
#pragma unroll
    for (int i = 0; i < c / 2; ++i) {
      const float keep = hi ? s[i + c / 2] : s[i], send = hi ? s[i] : s[i + c / 2];
      s[i] = keep + __shfl_xor_sync(0xffffffffu, send, o);
    }
  }
  float r = s[0];
#pragma unroll
  for (; o > 0; o >>= 1) r += __shfl_xor_sync(0xffffffffu, r, o);
  return r;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float r = lane < nw ? part[lane] : 0.0f;
  return warp_sum(r);
}

// One weight of any type (for tails of float rows whose length is not a multiple of 4).
__device__ __forceinline__ float weight_at(int type, const mb_u8* row, int i) {
  if (type == MB_F32) return reinterpret_cast<const float*>(row)[i];
  if (type == MB_F16) return __half2float(__ushort_as_half(reinterpret_cast<const mb_u16*>(row)[i]));
  if (type == MB_BF16) return __uint_as_float(mb_u32(reinterpret_cast<const mb_u16*>(row)[i]) << 16);
  const float4 v = dequant4(type, row, i & ~3);  // block types: rows are whole blocks
  const int j = i & 3;
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Weights i..i+3 of a row of K, zero past the end (only float rows can end inside a group of 4).
__device__ __forceinline__ float4 weights4(int type, const mb_u8* row, int i, int K) {
  if (i + 4 <= K) return dequant4(type, row, i);
  float r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = i + j < K ? weight_at(type, row, i + j) : 0.0f;
  return make_float4(r[0], r[1], r[2], r[3]);
}

// RoPE of one pair (x0, x1) = (x[j], x[j + d / 2]) at position pos with inverse frequency inv: the
// angle in float, its cosine and sine in double, as the CPU op computes them.
// rope_angle + rope_apply: the same, with the cosine and sine computed apart (they need only the
// position and the table, so a kernel can compute them before its programmatic wait).
__device__ __forceinline__ void rope_angle(float pos, float inv, float& c, float& sn) {
  double sd, cd;
  sincos(static_cast<double>(pos * inv), &sd, &cd);
  c = static_cast<float>(cd);
  sn = static_cast<float>(sd);
}
__device__ __forceinline__ void rope_apply(float& x0, float& x1, float c, float sn) {
  const float y0 = x0 * c - x1 * sn, y1 = x1 * c + x0 * sn;
  x0 = y0;
  x1 = y1;
}
__device__ __forceinline__ void rope_pair(float& x0, float& x1, float pos, float inv) {
  float c, sn;
  rope_angle(pos, inv, c, sn);
  rope_apply(x0, x1, c, sn);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}
__device__ __forceinline__ float4 mul4(float4 a, float4 b) {
  return make_float4(a.x * b.x, a.y * b.y, a.z * b.z, a.w * b.w);
}

}  // namespace markbase::cuda

namespace markbase::cuda {
// kernel<<<grid, block, smem, s>>>(args...), as a programmatic dependent launch when
// programmatic_launch is on (see pdl_trigger above). Launch errors surface through
// cudaGetLastError, as for <<<>>>.
template <typename... P, typename... A>
inline void enqueue(void (*kernel)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A&&... args) {
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = programmatic_launch ? 1 : 0;
  cudaLaunchKernelEx(&cfg, kernel, std::forward<A>(args)...);
}
}  // namespace markbase::cuda

// Launch checks: a bad launch configuration becomes a BackendError on the host (cuda_backend.cpp
// checks cudaGetLastError after each op).
#define MB_BLOCKS(n, b) static_cast<unsigned>(((n) + (b) - 1) / (b))
