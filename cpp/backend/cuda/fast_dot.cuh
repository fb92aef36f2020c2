// Hopper/CUDA fast path for the two types decode reads most (Q4_0, the default of the synthetic
// and llama-quantize files, and Q8_0): a lane reads TWO blocks at a time as 32-bit words
// (36 bytes of Q4_0 = 9 words, 68 bytes of Q8_0 = 17 words) instead of the byte loads of the
// portable decoder in metal/dequant.h, which the H200 measured at about 250 GB/s on decode: the
// loads, not the bytes, were the limit. The arithmetic is the same as dequant4_q4_0/_q8_0
// (w = d * (q - 8), w = d * q); the kernels use it only when a row holds an even number of blocks
// (so every block pair starts on a 4-byte boundary) and fall back to the shared decoder otherwise.
#pragma once
#include "backend/cuda/matvec.cuh"

namespace markbase::cuda {

__host__ __device__ constexpr bool has_fast_dot(int type) { return type == MB_Q4_0 || type == MB_Q8_0; }
// Whether a row of K weights can take the fast path (an even number of 32-weight blocks).
__host__ __device__ inline bool fast_dot_ok(int type, int K) { return has_fast_dot(type) && K % 64 == 0; }

__device__ __forceinline__ float4 ldx4(const float* x) { return *reinterpret_cast<const float4*>(x); }
__device__ __forceinline__ float nib_dot(unsigned w, float4 lo, float4 hi) {
  // the 4 bytes of w hold weights j..j+3 in their low nibbles and j+16..j+19 in their high ones
  return float(w & 15) * lo.x + float((w >> 8) & 15) * lo.y + float((w >> 16) & 15) * lo.z +
         float((w >> 24) & 15) * lo.w + float((w >> 4) & 15) * hi.x + float((w >> 12) & 15) * hi.y +
         float((w >> 20) & 15) * hi.z + float(w >> 28) * hi.w;
}
__device__ __forceinline__ float i8_dot(unsigned w, float4 x) {
  return float(static_cast<signed char>(w)) * x.x + float(static_cast<signed char>(w >> 8)) * x.y +
         float(static_cast<signed char>(w >> 16)) * x.z + float(static_cast<signed char>(w >> 24)) * x.w;
}
__device__ __forceinline__ float half_lo(unsigned w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w))); }
__device__ __forceinline__ float half_hi(unsigned w) { return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> 16))); }

// dot of one Q4_0 block (16 bytes of codes in q[0..3], scale d) with x[0..31]
__device__ __forceinline__ float q4_block(float d, const unsigned q[4], const float* x) {
  float s = 0.0f, sx = 0.0f;
#pragma unroll
  for (int k = 0; k < 4; ++k) {
    const float4 lo = ldx4(x + 4 * k), hi = ldx4(x + 16 + 4 * k);
    s += nib_dot(q[k], lo, hi);
    sx += (lo.x + lo.y + lo.z + lo.w) + (hi.x + hi.y + hi.z + hi.w);
  }
  return d * (s - 8.0f * sx);
}

// One block pair against 64 activations held in registers (xr): the multi-row kernels load the
// activations once and reuse them for several weight rows, because the H200 profile (ncu) showed
// the single-row kernel limited by L1 traffic for x (256 bytes of x per 36 bytes of Q4_0), not DRAM.
template <int TYPE>
__device__ __forceinline__ float pair_dot_regs(const unsigned* w, const float4 (&xr)[16]) {
  if constexpr (TYPE == MB_Q4_0) {
    unsigned v[9];
#pragma unroll
    for (int i = 0; i < 9; ++i) v[i] = __ldg(w + i);
    float s0 = 0.0f, s1 = 0.0f, x0 = 0.0f, x1 = 0.0f;
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      s0 += nib_dot(__funnelshift_r(v[k], v[k + 1], 16), xr[k], xr[4 + k]);
      s1 += nib_dot(v[5 + k], xr[8 + k], xr[12 + k]);
      x0 += (xr[k].x + xr[k].y + xr[k].z + xr[k].w) + (xr[4 + k].x + xr[4 + k].y + xr[4 + k].z + xr[4 + k].w);
      x1 += (xr[8 + k].x + xr[8 + k].y + xr[8 + k].z + xr[8 + k].w) +
            (xr[12 + k].x + xr[12 + k].y + xr[12 + k].z + xr[12 + k].w);
    }
    return half_lo(v[0]) * (s0 - 8.0f * x0) + half_hi(v[4]) * (s1 - 8.0f * x1);
  } else {
    unsigned v[17];
#pragma unroll
    for (int i = 0; i < 17; ++i) v[i] = __ldg(w + i);
    float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
      s0 += i8_dot(__funnelshift_r(v[k], v[k + 1], 16), xr[k]);
      s1 += i8_dot(v[9 + k], xr[8 + k]);
    }
    return half_lo(v[0]) * s0 + half_hi(v[8]) * s1;
  }
}

// R rows at once against the same x: this lane's parts of the R dot products.
template <int TYPE, int R>
__device__ __forceinline__ void pair_dot_rows(const mb_u8* const (&rows)[R], int npairs, const float* x, int sub,
                                              int G, float (&acc)[R]) {
  constexpr int W = TYPE == MB_Q4_0 ? 9 : 17;  // words per block pair
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (int p = sub; p < npairs; p += G) {
    float4 xr[16];
#pragma unroll
    for (int i = 0; i < 16; ++i) xr[i] = ldx4(x + 64 * p + 4 * i);
#pragma unroll
    for (int r = 0; r < R; ++r) acc[r] += pair_dot_regs<TYPE>(reinterpret_cast<const unsigned*>(rows[r]) + W * p, xr);
  }
}

// This lane's part of dot(row, x) for a row of npairs block pairs; the lane takes pairs
// sub, sub + G, ... (G lanes share the row). x must be 16-byte aligned.
template <int TYPE>
__device__ __forceinline__ float pair_dot(const mb_u8* row, int npairs, const float* x, int sub, int G) {
  float acc = 0.0f;
  if constexpr (TYPE == MB_Q4_0) {
    const unsigned* w32 = reinterpret_cast<const unsigned*>(row);
    for (int p = sub; p < npairs; p += G) {
      const unsigned* w = w32 + 9 * p;
      unsigned v[9];
#pragma unroll
      for (int i = 0; i < 9; ++i) v[i] = __ldg(w + i);
      const float* xp = x + 64 * p;
      unsigned q0[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) q0[k] = __funnelshift_r(v[k], v[k + 1], 16);  // bytes 2..17
      const unsigned q1[4] = {v[5], v[6], v[7], v[8]};                          // bytes 20..35
      acc += q4_block(half_lo(v[0]), q0, xp) + q4_block(half_hi(v[4]), q1, xp + 32);
    }
  } else {  // MB_Q8_0
    const unsigned* w32 = reinterpret_cast<const unsigned*>(row);
    for (int p = sub; p < npairs; p += G) {
      const unsigned* w = w32 + 17 * p;
      unsigned v[17];
#pragma unroll
      for (int i = 0; i < 17; ++i) v[i] = __ldg(w + i);
      const float* xp = x + 64 * p;
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int k = 0; k < 8; ++k) {
        s0 += i8_dot(__funnelshift_r(v[k], v[k + 1], 16), ldx4(xp + 4 * k));  // bytes 2..33
        s1 += i8_dot(v[9 + k], ldx4(xp + 32 + 4 * k));                       // bytes 36..67
      }
      acc += half_lo(v[0]) * s0 + half_hi(v[8]) * s1;
    }
  }
  return acc;
}

// Sum over the G lanes (aligned groups of a warp) that share a row.
template <int G>
__device__ __forceinline__ float group_sum(float v) {
#pragma unroll
  for (int o = G / 2; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

}  // namespace markbase::cuda
