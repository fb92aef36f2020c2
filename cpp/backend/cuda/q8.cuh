// Decode products on 8-bit activations (default mode only; precise mode keeps float32
// activations): a vector is quantized once per step into blocks of 32 int8 values with one float
// scale (Q8Vec), and every product that reads it (q/k/v, gate/up, the experts, the head) dots the
// weights' integer codes with those bytes four at a time (dp4a), as llama.cpp's MMVQ does. Against
// the float path this cuts the instructions and the L1 traffic per weight byte several times over,
// which is what kept the float kernels far under DRAM speed on the H200.
//
// Work unit: half a weight block (16 weights) of one row. Q4_0 half-block h of block b holds
// weights 8h..8h+7 in the low nibbles of qs bytes 8h..8h+7 and weights 16+8h..16+8h+7 in their
// high nibbles; Q8_0 half-block h is qs bytes 16h..16h+15. Block layouts are GGML's
// (metal/dequant.h decodes the same bytes to floats); rows and blocks are 2-byte aligned, so the
// codes are read as 16-bit words.
#pragma once
#include <algorithm>

#include "backend/cuda/common.cuh"

namespace markbase::cuda {

// Warps a block needs for its threads, two units each, to cover a row of K weights in one round of
// loads, within [lo, 4]. Fewer threads than 4 warps when that suffices: a thread with one unit or
// none takes registers that would let more blocks share an SM (matvec_q8.cu, moe.cu).
inline int q8_row_warps(int K, int lo) { return std::min(4, std::max(lo, (K / 16 + 63) / 64)); }

// Warps a block of the decode products (matvec_q8, and the dense MLP's products in the MoE
// launches, which must match it bit for bit): q8_row_warps, 2 to 4. On the 26B-A4B shape
// (K = 2816: 176 units) 3 warps fit 9 blocks an SM where 4 fit 7 (72 registers a thread), and
// q/k/v took 5.0 us on the critical path against 6.3 (bench/RESULTS.md, thirteenth session).
// MARKBASE_CUDA_MATVEC_WARPS=2, 3 or 4 forces it.
inline int matvec_q8_warps(int K) {
  static const int forced = env_digit("MARKBASE_CUDA_MATVEC_WARPS", 2, 4);
  return forced ? forced : q8_row_warps(K, 2);
}

// A block's scale and its reciprocal from the block's largest magnitude: one SFU reciprocal
// (__fdividef) and a multiply, where the IEEE divisions (amax / 127, 127 / amax, each with its
// slow-path check) were ~20 dependent instructions at the end of every decode row chain, on the
// critical path. Within an ulp of those; the CPU backend's own quantization (the correctly
// rounded divisions) is the reference, not bit-matched.
__device__ __forceinline__ float q8_inv_scale(float amax) { return amax > 0.0f ? __fdividef(127.0f, amax) : 0.0f; }
__device__ __forceinline__ float q8_scale(float amax) { return amax * (1.0f / 127.0f); }

// Quantizes v into block j / 32 (the 32 lanes of the calling warp hold values j0 .. j0 + 31 of
// one block, j0 % 32 == 0, lane order); every lane must call, with v = 0 past the end. Lanes
// with store == false take part in the block's maximum but write nothing.
__device__ __forceinline__ void q8_store_warp(float v, int j, bool store, const Q8Vec& q) {
  const float amax = warp_max(fabsf(v));
  const float inv = q8_inv_scale(amax);
  if (store) {
    q.q[j] = static_cast<signed char>(__float2int_rn(v * inv));
    if ((j & 31) == 0) q.d[j >> 5] = q8_scale(amax);
  }
}

// One float4 v (values 4 j .. 4 j + 3 of a row) quantized in Q8Vec's format: a block of 32 values
// is the float4s of 8 neighbouring lanes (lanes 8 i .. 8 i + 7 of the warp, j % 8 == lane % 8).
// Every lane of the warp calls it (the shuffles span the whole warp); lanes with store == false
// take part in the shuffles and write nothing.
__device__ __forceinline__ void q8_store_float4(float4 v, int j, bool store, const Q8Vec& q8) {
  float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
#pragma unroll
  for (int o = 4; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
  if (!store) return;
  const float inv = q8_inv_scale(amax);
  char4 q;
  q.x = static_cast<signed char>(__float2int_rn(v.x * inv));
  q.y = static_cast<signed char>(__float2int_rn(v.y * inv));
  q.z = static_cast<signed char>(__float2int_rn(v.z * inv));
  q.w = static_cast<signed char>(__float2int_rn(v.w * inv));
  reinterpret_cast<char4*>(q8.q)[j] = q;
  if ((j & 7) == 0) q8.d[j >> 3] = q8_scale(amax);
}

// A row held as float4s, thread t owning float4 t + THREADS c (c < VEC), quantized (Q8Vec's
// format). Every thread of the block calls it.
template <int THREADS, int VEC>
__device__ __forceinline__ void quantize_float4s(const float4 (&v)[VEC], Q8Vec q8, int n4) {
#pragma unroll
  for (int c = 0; c < VEC; ++c) {
    const int j = threadIdx.x + THREADS * c;
    q8_store_float4(v[c], j, j < n4, q8);
  }
}

// The activation side of one unit: 16 int8 values as 4 words, the block's scale, and (Q4_0)
// their sum, which carries the codes' offset of 8.
struct XUnit {
  int v[4];
  float d;
  int sum;
};

template <int TYPE>
__device__ __forceinline__ XUnit load_x_unit(const signed char* q, const float* d, int u) {
  XUnit x;
  const int b = u >> 1, h = u & 1;
  x.d = __ldg(d + b);
  if constexpr (TYPE == MB_Q4_0) {
    const int2 lo = __ldg(reinterpret_cast<const int2*>(q + 32 * b + 8 * h));
    const int2 hi = __ldg(reinterpret_cast<const int2*>(q + 32 * b + 16 + 8 * h));
    x.v[0] = lo.x; x.v[1] = lo.y; x.v[2] = hi.x; x.v[3] = hi.y;
    x.sum = __dp4a(0x01010101, x.v[0], __dp4a(0x01010101, x.v[1],
            __dp4a(0x01010101, x.v[2], __dp4a(0x01010101, x.v[3], 0))));
  } else {
    const int4 a = __ldg(reinterpret_cast<const int4*>(q + 32 * b + 16 * h));
    x.v[0] = a.x; x.v[1] = a.y; x.v[2] = a.z; x.v[3] = a.w;
    x.sum = 0;
  }
  return x;
}

// The weight side of one unit: the block's scale (as f16 bits) and 4 words of codes.
struct WUnit {
  unsigned short d;
  unsigned w[4];
};

// 16 bits of weights: through the read-only cache from global memory (with the L2 evict_first
// policy in a MARKBASE_CUDA_WEIGHTS_EVICT_FIRST build: common.cuh), or a plain load from a copy in
// shared memory (SHARED), which __ldg cannot address.
template <bool SHARED>
__device__ __forceinline__ unsigned short ld_u16(const unsigned short* p) {
  if constexpr (SHARED) return *p;
#if MARKBASE_CUDA_WEIGHTS_EVICT_FIRST
  else return ldg_u16_policy(p, evict_first_policy());
#else
  else return __ldg(p);
#endif
}

template <bool SHARED>
__device__ __forceinline__ unsigned ld_u32_from_u16(const unsigned short* p) {
  return static_cast<unsigned>(ld_u16<SHARED>(p)) | (static_cast<unsigned>(ld_u16<SHARED>(p + 1)) << 16);
}

// The 18- and 34-byte blocks are only 2-byte aligned: a unit is read 16 bits at a time.
template <int TYPE, bool SHARED = false>
__device__ __forceinline__ WUnit load_w_unit(const mb_u8* row, int u) {
  WUnit w;
  const int b = u >> 1, h = u & 1;
  if constexpr (TYPE == MB_Q4_0) {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row + 18 * b);
    w.d = ld_u16<SHARED>(p);
    w.w[0] = ld_u32_from_u16<SHARED>(p + 1 + 4 * h);
    w.w[1] = ld_u32_from_u16<SHARED>(p + 3 + 4 * h);
  } else {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row + 34 * b);
    w.d = ld_u16<SHARED>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) w.w[i] = ld_u32_from_u16<SHARED>(p + 1 + 8 * h + 2 * i);
  }
  return w;
}

// dot(weights of the unit, activations of the unit), in float.
template <int TYPE>
__device__ __forceinline__ float unit_dot(const WUnit& w, const XUnit& x) {
  int s;
  if constexpr (TYPE == MB_Q4_0) {
    const unsigned m = 0x0F0F0F0Fu;
    s = __dp4a(static_cast<int>(w.w[0] & m), x.v[0], __dp4a(static_cast<int>(w.w[1] & m), x.v[1], 0));
    s = __dp4a(static_cast<int>((w.w[0] >> 4) & m), x.v[2], __dp4a(static_cast<int>((w.w[1] >> 4) & m), x.v[3], s));
    s -= 8 * x.sum;
  } else {
    s = __dp4a(static_cast<int>(w.w[0]), x.v[0], __dp4a(static_cast<int>(w.w[1]), x.v[1], 0));
    s = __dp4a(static_cast<int>(w.w[2]), x.v[2], __dp4a(static_cast<int>(w.w[3]), x.v[3], s));
  }
  return __half2float(__ushort_as_half(w.d)) * x.d * static_cast<float>(s);
}

// The block-wide reduction of R per-thread sums (the 8-bit products keep R rows per block), first
// step: each warp's sum of acc[r] into part[warp][r], then a barrier. Thread r then adds part[.][r]
// over the warps in order; each kernel does that last step in its own shape. SCATTER: the R sums
// by one reduce-scatter (common.cuh's warp_sums; the same bits) instead of a warp_sum each. On the
// H200 (6-layer 26B-A4B file, thirty-first session) that ran the LM head's launch 10 % faster
// (129 -> 117 us a token: many blocks an SM share its shuffle unit) but the experts' and q/k/v
// products 3-6 % slower (few blocks an SM, each waiting on its own reduction's path; not settled).
template <int R, int WARPS, bool SCATTER = false>
__device__ __forceinline__ void warp_partials(const float (&acc)[R], float (&part)[WARPS][R]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  if constexpr (SCATTER) {
    constexpr int sh = WarpSums<R>::shift;
    const float v = warp_sums(acc);
    if ((lane >> sh) < R && (lane & ((1 << sh) - 1)) == 0) part[warp][lane >> sh] = v;
  } else {
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const float v = warp_sum(acc[r]);
      if (lane == 0) part[warp][r] = v;
    }
  }
  __syncthreads();
}

// The matrix-vector product of R weight rows (any rows: one weight's, or gate and up rows
// interleaved) on the quantized x, by the first THREADS threads of the block (the others, up to
// 128, only take part in the wait and the barrier). The threads stride over the rows' units, two
// units' loads in flight before the first use; the first step's weights are loaded before the
// programmatic wait, so that they stream in while the kernel before still runs (longer rows go to
// L2 meanwhile). Returns row r's sum in thread r (r < R). A row's sum depends only on its own
// weights, x and THREADS, so any kernel calling this with the same THREADS gets the same bits.
// trigger_after_wait: the block triggers its dependents right after its wait (a launch whose
// dependents may read its inputs early: moe.cu's gate/up launches).
template <int TYPE, int R, int THREADS>
__device__ __forceinline__ float matvec_q8_block(const mb_u8* const (&rows)[R], int K, size_t row_bytes, Q8Vec x,
                                                 bool trigger_after_wait = false) {
  static_assert(THREADS % 32 == 0 && THREADS <= 128, "at most 4 warps compute");
  const int units = K / 16;
  const bool mine = threadIdx.x < THREADS;
  WUnit wa[R], wb[R];
  auto load_step = [&](int u) {
    const int u2 = u + THREADS < units ? u + THREADS : u;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wa[r] = load_w_unit<TYPE>(rows[r], u);
      wb[r] = load_w_unit<TYPE>(rows[r], u2);
    }
  };
  int u = mine ? static_cast<int>(threadIdx.x) : units;
  if (u < units) load_step(u);
  if (units > 2 * THREADS)
#pragma unroll
    for (int r = 0; r < R; ++r) prefetch_weights_l2(rows[r], row_bytes);
  pdl_wait();
  if (trigger_after_wait) pdl_trigger();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (; u < units; u += 2 * THREADS) {
    const int u2 = u + THREADS;
    const bool two = u2 < units;
    const XUnit xa = load_x_unit<TYPE>(x.q, x.d, u);
    const XUnit xb = load_x_unit<TYPE>(x.q, x.d, two ? u2 : u);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += unit_dot<TYPE>(wa[r], xa) + (two ? unit_dot<TYPE>(wb[r], xb) : 0.0f);
    if (u + 2 * THREADS < units) load_step(u + 2 * THREADS);
  }
  __shared__ float part[4][R];
  warp_partials(acc, part);
  float s = 0.0f;
  if (threadIdx.x < R) {
#pragma unroll
    for (int i = 0; i < THREADS / 32; ++i) s += part[i][threadIdx.x];
  }
  return s;
}

}  // namespace markbase::cuda
