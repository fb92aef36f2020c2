// Decode products on 8-bit activations (default mode only; precise mode keeps float32
// activations): a vector is quantized once per step into blocks of 32 int8 values with one float
// scale (Q8Vec), and every product that reads it (q/k/v, gate/up, the experts, the head) dots the
// weights' integer codes with those bytes four at a time (dp4a), as llama.cpp's MMVQ does. Against
// the float path this cuts the instructions and the L1 traffic per weight byte several times over,
// which is what kept the float kernels far under DRAM speed on the H200.
//
// Work unit: half a 32-weight block (16 weights) of one row, or for Q4_K and Q5_K half a pair of
// sub-blocks (32 weights: paired units, below). Q4_0 half-block h of block b holds weights
// 8h..8h+7 in the low nibbles of qs bytes 8h..8h+7 and weights 16+8h..16+8h+7 in their high
// nibbles; Q8_0 half-block h is qs bytes 16h..16h+15. Block layouts are GGML's (metal/dequant.h
// decodes the same bytes to floats); each type's rows are read in the widest words its block size
// keeps aligned (16 bits for the 18-, 22- and 34-byte blocks).
#pragma once
#include <algorithm>
#include <type_traits>

#include "backend/cuda/common.cuh"

namespace markbase::cuda {

// The work units below (loads, decoding, dots) also build as host code, so that
// tests/cuda_units_main.cu checks them on the CPU against the gguf package's dequantizers (CI has
// no GPU). Their device intrinsics go through these twins; on the device they are the intrinsics.
#define MB_UNIT __host__ __device__ __forceinline__
template <typename T>
MB_UNIT T unit_ldg(const T* p) {
#ifdef __CUDA_ARCH__
  return __ldg(p);
#else
  return *p;
#endif
}
MB_UNIT int unit_dp4a(int a, int b, int c) {
#ifdef __CUDA_ARCH__
  return __dp4a(a, b, c);
#else
  for (int i = 0; i < 32; i += 8) c += static_cast<signed char>(a >> i) * static_cast<signed char>(b >> i);
  return c;
#endif
}
MB_UNIT unsigned unit_funnelshift_r(unsigned lo, unsigned hi, unsigned sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_r(lo, hi, sh);
#else
  sh &= 31;
  return sh ? (lo >> sh) | (hi << (32 - sh)) : lo;
#endif
}

// The clamped form: a shift of 32 gives hi (the wrapping form above gives lo).
MB_UNIT unsigned unit_funnelshift_rc(unsigned lo, unsigned hi, unsigned sh) {
#ifdef __CUDA_ARCH__
  return __funnelshift_rc(lo, hi, sh);
#else
  sh = sh > 32 ? 32 : sh;
  return sh == 0 ? lo : sh == 32 ? hi : (lo >> sh) | (hi << (32 - sh));
#endif
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

// Work units by weight type. A unit is 16 weights of one 32-weight block of the row (u >> 1 is
// the block, whose activation scale the unit takes). Split units (the 4- and 5-bit blocks of 32,
// which keep weights j and j + 16 in one byte's two nibbles): unit h is weights 8h .. 8h + 7 and
// 16 + 8h .. 16 + 8h + 7. Q8_0: unit h is weights 16h .. 16h + 15.
constexpr bool q8_split_unit(int t) { return t == MB_Q4_0 || t == MB_Q4_1 || t == MB_Q5_0 || t == MB_Q5_1; }
// Paired units (Q4_K, Q5_K, Q6_K): 32 weights, half h of a pair of 32-weight sub-blocks of a
// super-block whose codes are the low and high nibbles of the same 16 bytes: unit u is
// super-block u >> 3, pair p = (u >> 1) & 3, half u & 1, and dots two activation halves (XPair).
// Q4_K / Q5_K pair sub-blocks 2p and 2p + 1; Q6_K pairs q and q + 2 of its 128-weight half n
// (p = 2n + q, q < 2: sub-blocks 4n + q and 4n + q + 2), which share their ql bytes' nibbles and
// their qh bytes' bit pairs. With 16-weight units each unit loaded the 16 code bytes for half their
// nibbles, and the 16-byte header for 16 weights: a thread's loads in flight held 8 registers for
// 9 bytes of the row, so the products fit fewer blocks an SM than Q4_0's (113 registers a thread
// against 66) and took a second wave where Q4_0's took one (the H200's trace: q/k/v 8.6 against
// 5.6 us, o 5.1 against 2.3, thirty-fifth session). Q6_K's 16-weight units read 32 code bytes for
// 12, and the staged LM head spent 102 instructions a unit and row against Q4_0's 36 (236 us a
// token against 117: instruction-bound).
constexpr bool q8_paired_unit(int t) { return t == MB_Q4_K || t == MB_Q5_K || t == MB_Q6_K; }
// Weights a unit: the kernels' rows hold K / q8_unit_weights units.
constexpr int q8_unit_weights(int t) { return q8_paired_unit(t) ? 32 : 16; }

// Units a thread of the decode row kernels has in flight (matvec_q8_block, moe.cu's gate/up
// blocks): two 16-weight units, or one paired K-quant unit (32 weights and their super-block's
// 16-byte header, 8 registers a row). With two, matvec_q8_kernel held 125 (Q4_K), 166 (Q5_K) and
// 168 (Q6_K) registers a thread against Q4_0's 66, and fewer blocks fit an SM. One each: decode
// 2.3 % (26B-A4B) and 2.1 % (E4B) faster on 6-layer Q4_K_M files on the H200, the 26B-A4B
// experts' Q4_K gate/up 10.8 -> 8.7 us a layer (Q4_0's: 9.0), q/k/v 7.4 -> 6.7 (bench/RESULTS.md,
// thirty-seventh session).
constexpr int q8_units_in_flight(int t) { return q8_paired_unit(t) ? 1 : 2; }

// Warps a block needs for its threads, q8_units_in_flight units each, to cover a row of K weights
// of `type` in one round of loads, within [lo, 4]. Fewer threads than 4 warps when that suffices:
// a thread with one unit or none takes registers that would let more blocks share an SM
// (matvec_q8.cu, moe.cu). The paired units one a thread: 3 warps for K 2816 or 2560. On the
// H200 (bench/RESULTS.md, thirty-seventh session) E4B's Q4_K_M decode was 4.8 % slower with every
// product forced to 2 warps (its Q6_K v launch 3.8 us a layer against 2.4).
inline int q8_row_warps(int K, int type, int lo) {
  const int per_warp = 32 * q8_units_in_flight(type);
  return std::min(4, std::max(lo, (K / q8_unit_weights(type) + per_warp - 1) / per_warp));
}

// Warps a block of the decode products (matvec_q8, and the dense MLP's products in the MoE
// launches, which must match it bit for bit): q8_row_warps, 2 to 4. On the 26B-A4B shape
// (K = 2816: 176 units) 3 warps fit 9 blocks an SM where 4 fit 7 (72 registers a thread), and
// q/k/v took 5.0 us on the critical path against 6.3 (bench/RESULTS.md, thirteenth session).
// MARKBASE_CUDA_MATVEC_WARPS=2, 3 or 4 forces it.
inline int matvec_q8_warps(int K, int type) {
  static const int forced = env_digit("MARKBASE_CUDA_MATVEC_WARPS", 2, 4);
  return forced ? forced : q8_row_warps(K, type, 2);
}

// Whether a unit's dot needs the sum of its activations: weights stored with an offset (Q4_0's 8,
// Q5_0's 16, Q6_K's 32) or with a per-block minimum (Q4_1, Q5_1, Q4_K, Q5_K).
constexpr bool q8_needs_sum(int t) { return t != MB_Q8_0; }

// The activation side of a 16-weight unit: 16 int8 values as 4 words (the weights' order), the
// block's scale, their sum where the type needs it, and the unit's index (Q5_0's and Q5_1's
// half, Q6_K's half; dead code for the others).
struct XUnit {
  int v[4];
  float d;
  int sum;
  int u;
};

// The activation side of a paired unit: the halves of blocks 2p and 2p + 1 that its low and high
// nibbles take, and the pair p within the super-block.
struct XPair {
  XUnit lo, hi;
  int p;
};
template <int TYPE>
using XUnitOf = std::conditional_t<q8_paired_unit(TYPE), XPair, XUnit>;

// The 16-value activation unit u (block u >> 1, half u & 1) in TYPE's order.
template <int TYPE>
MB_UNIT XUnit load_x_half(const signed char* q, const float* d, int u) {
  XUnit x;
  const int b = u >> 1, h = u & 1;
  x.d = unit_ldg(d + b);
  x.u = u;
  if constexpr (q8_split_unit(TYPE)) {
    const int2 lo = unit_ldg(reinterpret_cast<const int2*>(q + 32 * b + 8 * h));
    const int2 hi = unit_ldg(reinterpret_cast<const int2*>(q + 32 * b + 16 + 8 * h));
    x.v[0] = lo.x; x.v[1] = lo.y; x.v[2] = hi.x; x.v[3] = hi.y;
  } else {
    const int4 a = unit_ldg(reinterpret_cast<const int4*>(q + 32 * b + 16 * h));
    x.v[0] = a.x; x.v[1] = a.y; x.v[2] = a.z; x.v[3] = a.w;
  }
  if constexpr (q8_needs_sum(TYPE))
    x.sum = unit_dp4a(0x01010101, x.v[0], unit_dp4a(0x01010101, x.v[1],
            unit_dp4a(0x01010101, x.v[2], unit_dp4a(0x01010101, x.v[3], 0))));
  else
    x.sum = 0;
  return x;
}

// The activation side of unit u of a TYPE row.
template <int TYPE>
MB_UNIT XUnitOf<TYPE> load_x_unit(const signed char* q, const float* d, int u) {
  if constexpr (q8_paired_unit(TYPE)) {
    // the pair's first 32-weight block (Q4_K / Q5_K: 8 sb + 2p, then + 1; Q6_K: 8 sb + 4n + q,
    // then + 2) as a half index, half u & 1
    const int p = (u >> 1) & 3;
    const int first = 8 * (u >> 3) + (TYPE == MB_Q6_K ? 4 * (p >> 1) + (p & 1) : 2 * p);
    const int lo = 2 * first + (u & 1), step = TYPE == MB_Q6_K ? 4 : 2;
    return XPair{load_x_half<TYPE>(q, d, lo), load_x_half<TYPE>(q, d, lo + step), p};
  } else {
    return load_x_half<TYPE>(q, d, u);
  }
}

// The weight side of one unit: its bytes as loaded (scales and codes); unit_dot decodes them, so
// that a kernel's loads for later units go out before the decoding of earlier ones waits on them.
// Q4_0 and Q8_0: the block's scale (f16 bits) and the code words (Q4_0: 2).
template <int TYPE>
struct WUnit {
  unsigned short d;
  unsigned w[4];
};
template <>
struct WUnit<MB_Q4_1> {
  unsigned dm;  // d, m (f16 each)
  unsigned w[2];
};
template <>
struct WUnit<MB_Q5_0> {
  unsigned short d;
  unsigned qh;  // the block's 32 fifth bits
  unsigned w[2];
};
template <>
struct WUnit<MB_Q5_1> {
  unsigned dm, qh;
  unsigned w[2];
};
template <>
struct WUnit<MB_Q4_K> {
  unsigned dm;     // the super-block's d, dmin (f16 each)
  unsigned sc[3];  // its 12 bytes of 6-bit scales and minimums
  unsigned w[4];   // 16 bytes of codes: sub-block 2p's in the low nibbles, 2p + 1's in the high
};
template <>
struct WUnit<MB_Q5_K> {
  unsigned dm;
  unsigned sc[3];
  unsigned w[4];
  unsigned qh[4];  // 16 bytes of fifth bits (bits 2p and 2p + 1 for the pair's sub-blocks)
};
template <>
struct WUnit<MB_Q6_K> {
  unsigned short d;  // the super-block's scale
  unsigned sc;       // int8 scales: bytes 0, 1 of sub-block 4n + q's 16-weight groups, 2, 3 of 4n + q + 2's (byte h: the unit's)
  unsigned ql[4];    // 16 bytes of low 4 bits: sub-block 4n + q's in the low nibbles, 4n + q + 2's in the high
  unsigned qh[4];    // 16 bytes of high 2 bits: bit pair q (4n + q), q + 2 (4n + q + 2), of four sub-blocks
};

// 16 bits of weights: through the read-only cache from global memory (with the L2 evict_first
// policy in a MARKBASE_CUDA_WEIGHTS_EVICT_FIRST build: common.cuh), or a plain load from a copy in
// shared memory (SHARED), which __ldg cannot address.
template <bool SHARED>
MB_UNIT unsigned short ld_u16(const unsigned short* p) {
  if constexpr (SHARED) return *p;
#if MARKBASE_CUDA_WEIGHTS_EVICT_FIRST && defined(__CUDA_ARCH__)  // host builds (tests): plain loads
  else return ldg_u16_policy(p, evict_first_policy());
#else
  else return unit_ldg(p);
#endif
}

template <bool SHARED>
MB_UNIT unsigned ld_u32_from_u16(const unsigned short* p) {
  return static_cast<unsigned>(ld_u16<SHARED>(p)) | (static_cast<unsigned>(ld_u16<SHARED>(p + 1)) << 16);
}

// 32 bits of weights at a 4-byte aligned address (Q4_1's 20-byte blocks). This and the wider
// loads below keep the default L2 policy in every build: MARKBASE_CUDA_WEIGHTS_EVICT_FIRST covers
// the 16-bit loads of Q4_0, Q5_0 and Q8_0, the types it was measured on.
template <bool SHARED>
MB_UNIT unsigned ld_u32(const mb_u8* p) {
  if constexpr (SHARED) return *reinterpret_cast<const unsigned*>(p);
  else return unit_ldg(reinterpret_cast<const unsigned*>(p));
}

// 64 bits of weights at an 8-byte aligned address (Q5_1's 24-byte blocks).
template <bool SHARED>
MB_UNIT uint2 ld_u64(const mb_u8* p) {
  if constexpr (SHARED) return *reinterpret_cast<const uint2*>(p);
  else return unit_ldg(reinterpret_cast<const uint2*>(p));
}

// 128 bits of weights at a 16-byte aligned address. Q4_K's and Q5_K's blocks (144 and 176
// bytes) are multiples of 16, so are their rows and experts, and the backend allocates every
// weight on its own (cudaMalloc: 256-byte aligned): a unit's header and codes are one load each,
// where 32-bit loads took eight (the L1's wavefronts, not DRAM, bounded those products).
template <bool SHARED>
MB_UNIT uint4 ld_u128(const mb_u8* p) {
  if constexpr (SHARED) return *reinterpret_cast<const uint4*>(p);
  else return unit_ldg(reinterpret_cast<const uint4*>(p));
}

// N words of weights at a 2-byte aligned address p in shared memory, a: its low bits (the staged LM head's Q6_K
// rows: 210-byte blocks): the 8-byte words around them in ceil((4 N + 6) / 8) loads, funnel-shifted
// into place, against 2 N 16-bit loads. The window starts at most 6 bytes before p and ends at most
// 8 bytes after p's last byte (Q6_K's codes end 18 bytes before its block does), within the rows'
// copy. Global loads keep the 16-bit form: there the raw words stay live until the unit's dot, and
// the window's extra words took the matrix-vector kernel from 128 registers a thread to 165 (146
// with 4-byte words), with four units of four rows in flight.
template <int N>
MB_UNIT void lds_words_u16_aligned(const mb_u8* p, unsigned a, unsigned (&out)[N]) {
  constexpr int L = (4 * N + 6 + 7) / 8;
  const uint2* q = reinterpret_cast<const uint2*>(p - (a & 7));  // p's own pointer: stays a shared load
  unsigned v[2 * L];
#pragma unroll
  for (int l = 0; l < L; ++l) {
    const uint2 t = q[l];
    v[2 * l] = t.x;
    v[2 * l + 1] = t.y;
  }
  const bool upper = (a & 4) != 0;
  const unsigned sh = 8 * (a & 3);
#pragma unroll
  for (int i = 0; i < N; ++i)
    out[i] = upper ? unit_funnelshift_r(v[i + 1], v[i + 2], sh) : unit_funnelshift_r(v[i], v[i + 1], sh);
}

// The low bits of a shared-memory address (its alignment), without turning the pointer into a
// generic address first (which took two special-register reads a row in the staged head's loop).
MB_UNIT unsigned shared_low_bits(const mb_u8* p) {
#ifdef __CUDA_ARCH__
  return static_cast<unsigned>(__cvta_generic_to_shared(p));
#else
  return static_cast<unsigned>(reinterpret_cast<uintptr_t>(p));
#endif
}

// The 18-, 22- and 34-byte blocks are only 2-byte aligned: their units are read 16 bits at a time.
template <int TYPE, bool SHARED = false>
MB_UNIT WUnit<TYPE> load_w_unit(const mb_u8* row, int u) {
  WUnit<TYPE> w;
  const int b = u >> 1, h = u & 1;
  if constexpr (TYPE == MB_Q4_0) {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row + 18 * b);
    w.d = ld_u16<SHARED>(p);
    w.w[0] = ld_u32_from_u16<SHARED>(p + 1 + 4 * h);
    w.w[1] = ld_u32_from_u16<SHARED>(p + 3 + 4 * h);
  } else if constexpr (TYPE == MB_Q8_0) {
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row + 34 * b);
    w.d = ld_u16<SHARED>(p);
#pragma unroll
    for (int i = 0; i < 4; ++i) w.w[i] = ld_u32_from_u16<SHARED>(p + 1 + 8 * h + 2 * i);
  } else if constexpr (TYPE == MB_Q4_1) {  // d, m, qs[16]
    const mb_u8* p = row + 20 * b;
    w.dm = ld_u32<SHARED>(p);
    w.w[0] = ld_u32<SHARED>(p + 4 + 8 * h);
    w.w[1] = ld_u32<SHARED>(p + 8 + 8 * h);
  } else if constexpr (TYPE == MB_Q5_0) {  // d, qh (4 bytes), qs[16]
    const unsigned short* p = reinterpret_cast<const unsigned short*>(row + 22 * b);
    w.d = ld_u16<SHARED>(p);
    w.qh = ld_u32_from_u16<SHARED>(p + 1);
    w.w[0] = ld_u32_from_u16<SHARED>(p + 3 + 4 * h);
    w.w[1] = ld_u32_from_u16<SHARED>(p + 5 + 4 * h);
  } else if constexpr (TYPE == MB_Q5_1) {  // d, m, qh (4 bytes), qs[16]: 24-byte blocks, 8-byte aligned
    const mb_u8* p = row + 24 * b;
    const uint2 hd = ld_u64<SHARED>(p), c = ld_u64<SHARED>(p + 8 + 8 * h);
    w.dm = hd.x;
    w.qh = hd.y;
    w.w[0] = c.x;
    w.w[1] = c.y;
  } else if constexpr (TYPE == MB_Q4_K || TYPE == MB_Q5_K) {
    // d, dmin, scales[12], (Q5_K: qh[32]), qs[128]; the pair's nibbles in qs[32 pair ..]
    const mb_u8* p = row + (TYPE == MB_Q4_K ? 144 : 176) * (u >> 3);
    const uint4 hd = ld_u128<SHARED>(p);
    w.dm = hd.x;
    w.sc[0] = hd.y;
    w.sc[1] = hd.z;
    w.sc[2] = hd.w;
    const uint4 c = ld_u128<SHARED>(p + (TYPE == MB_Q4_K ? 16 : 48) + 32 * ((u >> 1) & 3) + 16 * h);
    w.w[0] = c.x;
    w.w[1] = c.y;
    w.w[2] = c.z;
    w.w[3] = c.w;
    if constexpr (TYPE == MB_Q5_K) {
      const uint4 qh = ld_u128<SHARED>(p + 16 + 16 * h);
      w.qh[0] = qh.x;
      w.qh[1] = qh.y;
      w.qh[2] = qh.z;
      w.qh[3] = qh.w;
    }
  } else {  // Q6_K: ql[128], qh[64], scales[16] (int8), d; pair p = 2n + q (sub-blocks 4n + q, 4n + q + 2)
    const int pr = (u >> 1) & 3, n = pr >> 1, q = pr & 1;
    const mb_u8* blk = row + 210 * (u >> 3);
    const unsigned short* p = reinterpret_cast<const unsigned short*>(blk);
    const int l0 = 64 * n + 32 * q + 16 * h, h0 = 128 + 32 * n + 16 * h;  // byte offsets
    if constexpr (SHARED) {  // l0 and h0 are multiples of 16: the block's alignment is theirs
      const unsigned a = shared_low_bits(blk);
      lds_words_u16_aligned(blk + l0, a, w.ql);
      lds_words_u16_aligned(blk + h0, a, w.qh);
    } else {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        w.ql[i] = ld_u32_from_u16<SHARED>(p + l0 / 2 + 2 * i);
        w.qh[i] = ld_u32_from_u16<SHARED>(p + h0 / 2 + 2 * i);
      }
    }
    const int g = (192 + 8 * n + 2 * q) / 2;  // the 16-bit word of sub-block 4n + q's two scales
    w.sc = static_cast<unsigned>(ld_u16<SHARED>(p + g)) | (static_cast<unsigned>(ld_u16<SHARED>(p + g + 2)) << 16);
    w.d = ld_u16<SHARED>(p + 104);
  }
  return w;
}

// Q5_0's whole 32-weight blocks (22 bytes, 2-byte aligned) as the six 4-byte words that cover
// them: the block's address rounded down to 4 bytes, then 24 bytes (up to 2 past the block: the
// backend allocates weights with 15 bytes of room). load_w_unit's 16-bit loads take 7 loads and
// registers for 16 weights, held until the unit's dot; these take 3. block_half decodes a half
// into load_w_unit's unit after the loads land: each 4-byte field sits 2 bytes past a multiple of
// 4 in the block, so one clamped funnel shift (by 16, or by 32 when the block itself starts 2
// bytes past a word) moves it into place.
// The MoE down kernel reads Q5_0 rows this way (llama.cpp's K-quant mixes give the 26B-A4B's 704-
// and 2112-wide down rows Q5_0): on the H200 (bench/RESULTS.md, thirty-seventh session) decode
// 1.0-1.8 % faster on 6-layer Q5_0 and Q4_K_M files. The same for Q8_0 (9 words for 34 bytes) was
// no faster, and for Q4_0 (5 for 18) 1.3 % slower: its kernel went from 72 registers a thread to
// 96, and fewer blocks fit an SM. matvec_q8_block reading Q5_0 this way made a Q5_0 file 9.5 %
// slower (q/k/v 6.4 -> 9.0 us a layer, o 2.6 -> 4.8: its threads, sized for two 16-weight units
// each, then had one block each in flight), so it keeps the 16-bit loads.
constexpr bool q8_word_block(int t) { return t == MB_Q5_0; }
struct WBlockQ5 {
  unsigned w[6];
  unsigned sh;  // 8 * (the block's address & 3): 0 or 16
};

MB_UNIT WBlockQ5 load_w_block_q5_0(const mb_u8* row, int b) {
  const mb_u8* p = row + 22 * b;
  const unsigned a = static_cast<unsigned>(reinterpret_cast<uintptr_t>(p)) & 3u;
  WBlockQ5 blk;
#pragma unroll
  for (int i = 0; i < 6; ++i) blk.w[i] = ld_u32<false>(p - a + 4 * i);
  blk.sh = 8 * a;
  return blk;
}

// Half h (a constant) of a block from load_w_block_q5_0, as load_w_unit's unit u = 2 b + h.
MB_UNIT WUnit<MB_Q5_0> block_half(const WBlockQ5& blk, int h) {
  // the 4 bytes at block offset 2 + 4 i
  auto field = [&](int i) { return unit_funnelshift_rc(blk.w[i], blk.w[i + 1], 16 + blk.sh); };
  WUnit<MB_Q5_0> w;
  w.d = static_cast<unsigned short>(blk.w[0] >> blk.sh);  // d, qh[4], qs[16]
  w.qh = field(0);
  w.w[0] = field(1 + 2 * h);  // qs bytes 8h .. 8h + 7
  w.w[1] = field(2 + 2 * h);
  return w;
}

// Bits 0 .. 3 of b moved to bit 4 of bytes 0 .. 3 (Q5_0 / Q5_1: the codes' fifth bits), by one
// multiply: (b & 15) * (2^4 + 2^11 + 2^18 + 2^25) is four copies of b's nibble at bits 4, 11, 18
// and 25, which do not overlap (so nothing carries), and copy k holds bit k at 4 + 8k. A shift
// and a mask a bit took ~9 instructions a word, 36 more a 16-weight unit than Q4_0's decode.
MB_UNIT unsigned q5_bits(unsigned b) { return ((b & 0xFu) * 0x02040810u) & 0x10101010u; }
// Bits 4 .. 7 of b, likewise (copies of b's high nibble at 0, 7, 14 and 21: bit 4 + k at 4 + 8k).
MB_UNIT unsigned q5_bits_high(unsigned b) { return ((b & 0xF0u) * 0x00204081u) & 0x10101010u; }
// Bit s (0 .. 7) of each byte of qh moved to bit 4 of that byte (Q5_K: bit s of qh byte l is the
// fifth bit of weight l of sub-block s), by one rotation: right by s - 4 mod 32 takes bit 8k + s to
// 8k + 4 for every k. A shift, a mask and a shift back took one instruction more a word.
MB_UNIT unsigned q5k_bits(unsigned qh, int s) { return unit_funnelshift_r(qh, qh, (s - 4) & 31) & 0x10101010u; }

// The 6-bit scale and minimum of a Q4_K / Q5_K sub-block s from the 12 scale bytes (GGML's
// get_scale_min_k4): sub-blocks 0-3 in the low 6 bits of bytes s and s + 4, 4-7 in nibbles of
// bytes s + 4 with their top two bits in bytes s - 4 and s.
MB_UNIT void k4_scale_min(const unsigned (&sc)[3], int s, int& scale, int& min) {
  const int sh = 8 * (s & 3);
  const int b0 = (sc[0] >> sh) & 0xFF, b1 = (sc[1] >> sh) & 0xFF;
  if (s < 4) {
    scale = b0 & 63;
    min = b1 & 63;
  } else {
    const int b2 = (sc[2] >> sh) & 0xFF;
    scale = (b2 & 0xF) | ((b0 >> 6) << 4);
    min = (b2 >> 4) | ((b1 >> 6) << 4);
  }
}

// k4_scale_min of both sub-blocks of pair p (2p and 2p + 1: neighbouring bytes, on the same side
// of the 0-3 / 4-7 split), without a branch: the scales in bytes 0 (2p) and 1 (2p + 1) of *scales,
// the minimums likewise in *mins. A pair's side differs between neighbouring lanes (lane l takes
// pair (l >> 1) & 3), so k4_scale_min's branch diverged in every warp of the paired products.
MB_UNIT void k4_scale_min_pair(const unsigned (&sc)[3], int p, unsigned& scales, unsigned& mins) {
  const unsigned sh = 16u * static_cast<unsigned>(p & 1);
  const unsigned b0 = sc[0] >> sh, b1 = sc[1] >> sh, b2 = sc[2] >> sh;  // bytes 2 (p & 1) .. + 1
  const unsigned lo_s = b0 & 0x3F3Fu, lo_m = b1 & 0x3F3Fu;                    // pairs 0, 1
  const unsigned hi_s = (b2 & 0x0F0Fu) | ((b0 & 0xC0C0u) >> 2);              // pairs 2, 3
  const unsigned hi_m = ((b2 >> 4) & 0x0F0Fu) | ((b1 & 0xC0C0u) >> 2);
  scales = p < 2 ? lo_s : hi_s;
  mins = p < 2 ? lo_m : hi_m;
}

MB_UNIT int dp4a4(const unsigned (&c)[4], const XUnit& x) {
  return unit_dp4a(static_cast<int>(c[0]), x.v[0], unit_dp4a(static_cast<int>(c[1]), x.v[1],
         unit_dp4a(static_cast<int>(c[2]), x.v[2], unit_dp4a(static_cast<int>(c[3]), x.v[3], 0))));
}

// dot(weights of the unit, activations of the unit), in float.
template <int TYPE>
MB_UNIT float unit_dot(const WUnit<TYPE>& w, const XUnitOf<TYPE>& x) {
  constexpr unsigned m = 0x0F0F0F0Fu;
  if constexpr (TYPE == MB_Q4_0) {
    int s;
    s = unit_dp4a(static_cast<int>(w.w[0] & m), x.v[0], unit_dp4a(static_cast<int>(w.w[1] & m), x.v[1], 0));
    s = unit_dp4a(static_cast<int>((w.w[0] >> 4) & m), x.v[2], unit_dp4a(static_cast<int>((w.w[1] >> 4) & m), x.v[3], s));
    s -= 8 * x.sum;
    return __half2float(__ushort_as_half(w.d)) * x.d * static_cast<float>(s);
  } else if constexpr (TYPE == MB_Q8_0) {
    int s;
    s = unit_dp4a(static_cast<int>(w.w[0]), x.v[0], unit_dp4a(static_cast<int>(w.w[1]), x.v[1], 0));
    s = unit_dp4a(static_cast<int>(w.w[2]), x.v[2], unit_dp4a(static_cast<int>(w.w[3]), x.v[3], s));
    return __half2float(__ushort_as_half(w.d)) * x.d * static_cast<float>(s);
  } else if constexpr (q8_split_unit(TYPE)) {  // Q4_1, Q5_0, Q5_1
    unsigned c[4] = {w.w[0] & m, w.w[1] & m, (w.w[0] >> 4) & m, (w.w[1] >> 4) & m};
    if constexpr (TYPE != MB_Q4_1) {  // the fifth bits of weights 8h .. 8h + 7 and 16 + 8h ..
      const int h = x.u & 1;
      const unsigned lo = w.qh >> (8 * h), hi = w.qh >> (16 + 8 * h);
      c[0] |= q5_bits(lo);
      c[1] |= q5_bits_high(lo);
      c[2] |= q5_bits(hi);
      c[3] |= q5_bits_high(hi);
    }
    const int s = dp4a4(c, x);
    if constexpr (TYPE == MB_Q5_0) {
      return __half2float(__ushort_as_half(w.d)) * x.d * static_cast<float>(s - 16 * x.sum);
    } else {
      const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&w.dm));
      return x.d * (dm.x * static_cast<float>(s) + dm.y * static_cast<float>(x.sum));
    }
  } else if constexpr (TYPE == MB_Q4_K || TYPE == MB_Q5_K) {
    const int s = 2 * x.p;  // the low nibbles' sub-block; the high nibbles' is s + 1
    unsigned lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      lo[i] = w.w[i] & m;
      hi[i] = (w.w[i] >> 4) & m;
      if constexpr (TYPE == MB_Q5_K) {
        lo[i] |= q5k_bits(w.qh[i], s);
        hi[i] |= q5k_bits(w.qh[i], s + 1);
      }
    }
    unsigned scales, mins;
    k4_scale_min_pair(w.sc, x.p, scales, mins);
    const int scale_lo = scales & 0xFF, scale_hi = (scales >> 8) & 0xFF;
    const int min_lo = mins & 0xFF, min_hi = (mins >> 8) & 0xFF;
    const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&w.dm));
    return x.lo.d * (dm.x * static_cast<float>(scale_lo * dp4a4(lo, x.lo)) - dm.y * static_cast<float>(min_lo * x.lo.sum)) +
           x.hi.d * (dm.x * static_cast<float>(scale_hi * dp4a4(hi, x.hi)) - dm.y * static_cast<float>(min_hi * x.hi.sum));
  } else {  // Q6_K: codes 0 .. 63 (6 bits), offset 32
    const int q = x.p & 1, h = x.lo.u & 1;
    unsigned lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned b = w.qh[i] >> (2 * q);  // bit pairs q (low sub-block) and q + 2 (high) at bits 0, 4
      lo[i] = (w.ql[i] & m) | ((b << 4) & 0x30303030u);
      hi[i] = ((w.ql[i] >> 4) & m) | (b & 0x30303030u);
    }
    const int scale_lo = static_cast<signed char>((w.sc >> (8 * h)) & 0xFF);
    const int scale_hi = static_cast<signed char>((w.sc >> (16 + 8 * h)) & 0xFF);
    return __half2float(__ushort_as_half(w.d)) *
           (x.lo.d * static_cast<float>(scale_lo * (dp4a4(lo, x.lo) - 32 * x.lo.sum)) +
            x.hi.d * static_cast<float>(scale_hi * (dp4a4(hi, x.hi) - 32 * x.hi.sum)));
  }
}

// Calls f(std::integral_constant<int, TYPE>) for a run-time has_q8_dot() type, so that f picks
// TYPE's instance of a kernel template; false for any other type.
// BLOCK32_ONLY: only the 32-weight block types (has_q8_moe_down()).
template <bool BLOCK32_ONLY = false, typename F>
bool with_q8_type(int type, F&& f) {
  switch (type) {
    case MB_Q4_0: f(std::integral_constant<int, MB_Q4_0>{}); return true;
    case MB_Q4_1: f(std::integral_constant<int, MB_Q4_1>{}); return true;
    case MB_Q5_0: f(std::integral_constant<int, MB_Q5_0>{}); return true;
    case MB_Q5_1: f(std::integral_constant<int, MB_Q5_1>{}); return true;
    case MB_Q8_0: f(std::integral_constant<int, MB_Q8_0>{}); return true;
  }
  if constexpr (!BLOCK32_ONLY) {
    switch (type) {
      case MB_Q4_K: f(std::integral_constant<int, MB_Q4_K>{}); return true;
      case MB_Q5_K: f(std::integral_constant<int, MB_Q5_K>{}); return true;
      case MB_Q6_K: f(std::integral_constant<int, MB_Q6_K>{}); return true;
    }
  }
  return false;
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
// 128, only take part in the wait and the barrier). The threads stride over the rows' units,
// q8_units_in_flight units' loads in flight before the first use; the first step's weights are
// loaded before the programmatic wait, so that they stream in while the kernel before still runs
// (longer rows go to L2 meanwhile). Returns row r's sum in thread r (r < R). A row's sum depends
// only on its own weights, x and THREADS, so any kernel calling this with the same THREADS gets
// the same bits.
// trigger_after_wait: the block triggers its dependents right after its wait (a launch whose
// dependents may read its inputs early: moe.cu's gate/up launches).
template <int TYPE, int R, int THREADS>
__device__ __forceinline__ float matvec_q8_block(const mb_u8* const (&rows)[R], int K, size_t row_bytes, Q8Vec x,
                                                 bool trigger_after_wait = false) {
  static_assert(THREADS % 32 == 0 && THREADS <= 128, "at most 4 warps compute");
  constexpr int F = q8_units_in_flight(TYPE);
  const int units = K / q8_unit_weights(TYPE);
  const bool mine = threadIdx.x < THREADS;
  WUnit<TYPE> wa[R], wb[F == 2 ? R : 1];
  auto load_step = [&](int u) {
    const int u2 = u + THREADS < units ? u + THREADS : u;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      wa[r] = load_w_unit<TYPE>(rows[r], u);
      if constexpr (F == 2) wb[r] = load_w_unit<TYPE>(rows[r], u2);
    }
  };
  int u = mine ? static_cast<int>(threadIdx.x) : units;
  if (u < units) load_step(u);
  if (units > F * THREADS)
#pragma unroll
    for (int r = 0; r < R; ++r) prefetch_weights_l2(rows[r], row_bytes);
  pdl_wait();
  if (trigger_after_wait) pdl_trigger();
  float acc[R];
#pragma unroll
  for (int r = 0; r < R; ++r) acc[r] = 0.0f;
  for (; u < units; u += F * THREADS) {
    if constexpr (F == 2) {
      const int u2 = u + THREADS;
      const bool two = u2 < units;
      const XUnitOf<TYPE> xa = load_x_unit<TYPE>(x.q, x.d, u);
      const XUnitOf<TYPE> xb = load_x_unit<TYPE>(x.q, x.d, two ? u2 : u);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += unit_dot<TYPE>(wa[r], xa) + (two ? unit_dot<TYPE>(wb[r], xb) : 0.0f);
    } else {
      const XUnitOf<TYPE> xa = load_x_unit<TYPE>(x.q, x.d, u);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r] += unit_dot<TYPE>(wa[r], xa);
    }
    if (u + F * THREADS < units) load_step(u + F * THREADS);
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
