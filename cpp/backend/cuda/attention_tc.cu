// Prefill attention on the tensor cores (FlashAttention-2 style), for f16 KV caches in default
// mode. Same semantics as attention.cu's float32 attention_kernel: query rows are (token, head of
// the group) pairs of one KV head; token t at position pos0 + t attends to
// [max(0, pos - window + 1), pos] (window > 0) or [0, pos]; ring caches map pos to pos % capacity.
//
// Layout of the work:
//  - A block serves RW * 16 consecutive rows of one KV head (rows in token order, so its tokens
//    are as few as possible and its key range as short as possible). It streams that head's keys
//    and values through shared memory kBN positions at a time, double-buffered with cp.async:
//    one tile load serves every row of the block, all heads of the group included.
//  - Each warp owns 16 rows (one m16 tile). S = Q K^T and O += P V are mma.sync m16n8k16
//    (f16 in, f32 accumulate); the online softmax (running max and sum per row) stays in f32
//    registers; P goes from S's accumulator fragment straight into the A fragment of the P V
//    product (the C layout of m16n8k16 is the A layout of the next one, FlashAttention-2's trick),
//    so S never touches shared memory.
//  - O of 16 rows x d columns is d / 2 floats per thread: 128 registers at d = 256. At d = 512
//    that would spill, so there kCS = 2 warps share the same 16 rows, each owning 256 columns of
//    O; both compute the same S (deterministically, so their softmax statistics agree bit for
//    bit). That repeats the Q K^T half of the math for the d = 512 (full) layers, which is
//    simpler than exchanging S through shared memory and costs ~1.5x on those layers only.
//  - Q is scaled by scale * log2(e) in float32, then rounded to f16 once into shared memory: the
//    scores come out in log2 units and the softmax uses exp2 (ex2.approx).
//  - Tiles outside a warp's key range are skipped; tiles inside every row's range skip the
//    per-element mask; boundary tiles mask per element (causal end, window start).
//  - Shared rows are padded by 16 bytes: the row stride is then an odd multiple of 16 bytes for
//    every d % 16 == 0, so the 8 row addresses of each ldmatrix 8x8 matrix fall in 8 distinct
//    16-byte bank groups (no conflicts).
//  - head_dim is a run-time value: the kernel is compiled for a maximum (64, 128, 256, 512) and
//    guards its column tiles, so every d % 16 == 0 up to 512 runs on the next larger variant.
#include <algorithm>
#include <cstdint>

#include "backend/cuda/attention_tc.h"
#include "backend/cuda/common.cuh"
#include "backend/cuda/cp_async.cuh"

namespace markbase::cuda {
namespace {

constexpr int kPadH = 8;  // halfs of padding per shared row (16 bytes, see above)

template <int DMAX>
struct TcShape {
  static constexpr int kDV = DMAX < 256 ? DMAX : 256;  // columns of O per warp (128 registers)
  static constexpr int kCS = DMAX / kDV;               // warps sharing 16 rows (column slices)
  // Keys per tile: 64 keeps the small head dims' tiles long enough to amortize the barriers;
  // at d >= 256, 32 keeps two stages of K and V (+ Q) small enough for two blocks per SM (d 256).
  static constexpr int kBN = DMAX >= 256 ? 32 : 64;
};

template <int DMAX>
constexpr size_t tc_smem_bytes(int rw, int d) {
  return static_cast<size_t>(16 * rw + 4 * TcShape<DMAX>::kBN) * (d + kPadH) * sizeof(__half);
}

struct TcArgs {
  CacheRef c;
  const float* q;
  int qs;
  const StepBuf* step;
  int T, group, window;
  float qscale;  // scale * log2(e)
  float* out;
  int os;
};

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const __half* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}

// c += a (16x16, row) * b (16x8, col); f16 inputs, f32 accumulators.
__device__ __forceinline__ void mma16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one f16x2 register: the first (lower column) in the low half, as mma expects.
__device__ __forceinline__ uint32_t pack_half2(float lo, float hi) {
  const __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&h);
}

// 2^x; ex2.approx(-inf) = +0, which the masking relies on.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// grid: (row blocks of RW * 16 rows, kv heads); block: RW * kCS warps.
template <int DMAX, int RW>
__global__ void __launch_bounds__(32 * RW * TcShape<DMAX>::kCS) attention_tc_kernel(TcArgs p) {
  pdl_entry();
  constexpr int kDV = TcShape<DMAX>::kDV, kCS = TcShape<DMAX>::kCS, kBN = TcShape<DMAX>::kBN;
  constexpr int kThreads = 32 * RW * kCS;
  extern __shared__ __align__(16) __half smh[];
  const int d = p.c.head_dim, sd = d + kPadH;
  __half* Qs = smh;                   // [RW * 16][sd]
  __half* Ks = Qs + RW * 16 * sd;     // [2][kBN][sd]
  __half* Vs = Ks + 2 * kBN * sd;     // [2][kBN][sd]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
  const int rw = warp / kCS, cw = warp % kCS;  // the warp's 16 rows, its column slice of O
  const int kvh = blockIdx.y, group = p.group;
  const int n_rows = p.T * group;
  const int r0 = blockIdx.x * RW * 16;
  const int pos0 = p.step->pos0;  // device memory: the launch may be replayed from a CUDA graph

  // Rows past the last one borrow its token (their range is then valid; they write nothing).
  auto token = [&](int r) { return min(r, n_rows - 1) / group; };
  auto first_pos = [&](int t) { return p.window > 0 ? max(0, pos0 + t - p.window + 1) : 0; };

  // The block's keys: the union of its rows' ranges (both ends grow with the token).
  const int blo = first_pos(token(r0)), bhi = pos0 + token(r0 + RW * 16 - 1) + 1;

  // Q: scaled, rounded to f16, once.
  const int half_d = d >> 1;
  for (int u = tid; u < RW * 16 * half_d; u += kThreads) {
    const int i = u / half_d, c = (u - i * half_d) * 2, r = r0 + i;
    float x = 0.0f, y = 0.0f;
    if (r < n_rows) {
      const int t = r / group, h = kvh * group + r % group;
      const float* qr = p.q + static_cast<size_t>(t) * p.qs + static_cast<size_t>(h) * d + c;
      x = qr[0] * p.qscale;
      y = qr[1] * p.qscale;
    }
    *reinterpret_cast<__half2*>(Qs + i * sd + c) = __floats2half2_rn(x, y);
  }

  const size_t head_off = static_cast<size_t>(kvh) * p.c.capacity * d;
  const __half* Kg = static_cast<const __half*>(p.c.k) + head_off;
  const __half* Vg = static_cast<const __half*>(p.c.v) + head_off;
  const int chunks = d >> 3;  // 16-byte pieces per cache row
  auto load_tile = [&](int buf, int p0) {
    __half* kd = Ks + buf * kBN * sd;
    __half* vd = Vs + buf * kBN * sd;
    for (int u = tid; u < kBN * chunks; u += kThreads) {
      const int j = u / chunks, c = (u - j * chunks) * 8, pos = p0 + j;
      const bool ok = pos < bhi;  // every position of [blo, bhi) is in the cache (store_kv ran)
      const size_t off = ok ? static_cast<size_t>(p.c.ring ? pos % p.c.capacity : pos) * d + c : 0;
      cp_async16(kd + j * sd + c, Kg + off, ok);
      cp_async16(vd + j * sd + c, Vg + off, ok);
    }
    cp_async_commit();
  };

  // This warp's rows: the union and the intersection of their key ranges.
  const int wr0 = r0 + rw * 16;
  const bool warp_active = wr0 < n_rows;
  const int wt0 = token(wr0), wt1 = token(wr0 + 15);
  const int wlo = first_pos(wt0), whi = pos0 + wt1 + 1;
  const int wlo_all = first_pos(wt1), whi_all = pos0 + wt0 + 1;
  // Fragment coordinates (PTX ISA, mma.m16n8k16): lane = 4 * g + tg; accumulator elements 0, 1
  // are row g, columns 2 tg, 2 tg + 1; elements 2, 3 the same columns of row g + 8.
  const int g = lane >> 2, tg = lane & 3;
  int lo[2], hi[2];
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    const int t = token(wr0 + g + 8 * i);
    lo[i] = first_pos(t);
    hi[i] = pos0 + t + 1;
  }
  const int col0 = cw * kDV, ncol = min(kDV, d - col0);

  // ldmatrix addresses (lane l supplies row l % 8 of matrix l / 8):
  //  Q (A operand, x4): matrices (rows 0-7, k 0-7), (rows 8-15, k 0-7), (rows 0-7, k 8-15),
  //    (rows 8-15, k 8-15) = a0..a3.
  //  K (B operand of S = Q K^T, x4, keys as rows): (keys 0-7, k 0-7), (keys 0-7, k 8-15),
  //    (keys 8-15, k 0-7), (keys 8-15, k 8-15) = b0, b1 of key tile 0, b0, b1 of key tile 1.
  //  V (B operand of O = P V, x4 .trans, keys as rows): (keys 0-7, cols 0-7), (keys 8-15,
  //    cols 0-7), (keys 0-7, cols 8-15), (keys 8-15, cols 8-15) = b0, b1 of column tile 0,
  //    b0, b1 of column tile 1.
  const int lr = lane & 7, l8 = (lane >> 3) & 1, l16 = lane >> 4;
  const __half* q_lane = Qs + (rw * 16 + lr + 8 * l8) * sd + 8 * l16;
  const int k_lane = (lr + 8 * l16) * sd + 8 * l8;
  const int v_lane = (lr + 8 * l8) * sd + col0 + 8 * l16;

  float o[kDV / 8][4];
#pragma unroll
  for (int j = 0; j < kDV / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // l: this thread's partial sums

  const int n_tiles = (bhi - blo + kBN - 1) / kBN;
  load_tile(0, blo);
  for (int it = 0; it < n_tiles; ++it) {
    const int p0 = blo + it * kBN, buf = it & 1;
    if (it + 1 < n_tiles) {
      load_tile(buf ^ 1, p0 + kBN);  // the next tile streams in while this one is used
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();  // this tile (and, the first time, Q) is visible to every warp
    if (warp_active && p0 < whi && p0 + kBN > wlo) {
      const __half* kt = Ks + buf * kBN * sd + k_lane;
      const __half* vt = Vs + buf * kBN * sd + v_lane;

      // S = Q K^T: 16 rows x kBN keys, k over the head dim.
      float s[kBN / 8][4];
#pragma unroll
      for (int j = 0; j < kBN / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll 2
      for (int k0 = 0; k0 < d; k0 += 16) {
        uint32_t a[4];
        ldmatrix_x4(a, q_lane + k0);
#pragma unroll
        for (int np = 0; np < kBN / 16; ++np) {
          uint32_t b[4];
          ldmatrix_x4(b, kt + np * 16 * sd + k0);
          mma16816(s[2 * np], a, b[0], b[1]);
          mma16816(s[2 * np + 1], a, b[2], b[3]);
        }
      }

      // Mask where some row's range ends inside the tile (the causal diagonal, the window's
      // start, tile rows past the block's range).
      if (!(p0 >= wlo_all && p0 + kBN <= whi_all)) {
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = p0 + 8 * j + 2 * tg + (e & 1), i = e >> 1;
            if (key < lo[i] || key >= hi[i]) s[j][e] = -INFINITY;
          }
      }

      // Online softmax, per row: the 4 lanes of a quad hold one row's kBN scores.
      float corr[2];
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) mx = fmaxf(mx, fmaxf(s[j][2 * i], s[j][2 * i + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float mn = fmaxf(m[i], mx);
        // A row with no key yet (mn = -inf) subtracts 0: its weights exp2(-inf) are 0, not NaN.
        const float base = mn == -INFINITY ? 0.0f : mn;
        corr[i] = fast_exp2(m[i] - base);  // m = -inf (no key before): 0
        m[i] = mn;
        float sum = 0.0f;
#pragma unroll
        for (int j = 0; j < kBN / 8; ++j) {
          s[j][2 * i] = fast_exp2(s[j][2 * i] - base);
          s[j][2 * i + 1] = fast_exp2(s[j][2 * i + 1] - base);
          sum += s[j][2 * i] + s[j][2 * i + 1];
        }
        l[i] = l[i] * corr[i] + sum;
      }
      // Rescale O only when some row's maximum grew: past the first tiles it mostly does not,
      // and the rescale is kDV / 2 multiplies per thread, as many instructions as the mma.
      if (!__all_sync(0xffffffffu, corr[0] == 1.0f && corr[1] == 1.0f)) {
#pragma unroll
        for (int j = 0; j < kDV / 8; ++j) {
          o[j][0] *= corr[0];
          o[j][1] *= corr[0];
          o[j][2] *= corr[1];
          o[j][3] *= corr[1];
        }
      }

      // O += P V: P's A fragment for keys 16 kk..16 kk + 15 is S tiles 2 kk and 2 kk + 1.
#pragma unroll
      for (int kk = 0; kk < kBN / 16; ++kk) {
        const uint32_t a[4] = {pack_half2(s[2 * kk][0], s[2 * kk][1]), pack_half2(s[2 * kk][2], s[2 * kk][3]),
                               pack_half2(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                               pack_half2(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
        for (int np = 0; np < kDV / 16; ++np) {
          if (16 * np < ncol) {  // d below the variant's maximum: the slice's last tiles are idle
            uint32_t b[4];
            ldmatrix_x4_trans(b, vt + kk * 16 * sd + 16 * np);
            mma16816(o[2 * np], a, b[0], b[1]);
            mma16816(o[2 * np + 1], a, b[2], b[3]);
          }
        }
      }
    }
    __syncthreads();  // every warp is done with this buffer before the next load refills it
  }

  if (!warp_active) return;
#pragma unroll
  for (int i = 0; i < 2; ++i) {
    float li = l[i];
    li += __shfl_xor_sync(0xffffffffu, li, 1);
    li += __shfl_xor_sync(0xffffffffu, li, 2);
    const int r = wr0 + g + 8 * i;
    if (r >= n_rows) continue;
    const int t = r / group, h = kvh * group + r % group;
    float* orow = p.out + static_cast<size_t>(t) * p.os + static_cast<size_t>(h) * d + col0;
    const float inv = 1.0f / li;  // li > 0: every row's own position is among its keys
#pragma unroll
    for (int j = 0; j < kDV / 8; ++j) {
      const int c = 8 * j + 2 * tg;
      if (c < ncol) {
        orow[c] = o[j][2 * i] * inv;
        orow[c + 1] = o[j][2 * i + 1] * inv;
      }
    }
  }
}

// The compiled variants: head-dim maximum x row warps.
using TcKernel = void (*)(TcArgs);
struct TcVariant {
  TcKernel fn;
  int dmax, rw, threads;
  size_t max_smem;  // at d = dmax
  bool ok;          // fits this device (set by attention_tc_init)
};

template <int DMAX, int RW>
constexpr TcVariant variant() {
  return {attention_tc_kernel<DMAX, RW>, DMAX, RW, 32 * RW * TcShape<DMAX>::kCS, tc_smem_bytes<DMAX>(RW, DMAX), false};
}

TcVariant g_variants[] = {
    variant<64, 1>(),  variant<64, 2>(),  variant<64, 4>(),  variant<128, 1>(), variant<128, 2>(), variant<128, 4>(),
    variant<256, 1>(), variant<256, 2>(), variant<256, 4>(), variant<512, 1>(), variant<512, 2>(), variant<512, 4>(),
};
bool g_inited = false;

int dmax_for(int d) { return d <= 64 ? 64 : d <= 128 ? 128 : d <= 256 ? 256 : 512; }

const TcVariant* find_variant(int dmax, int rw) {
  for (const TcVariant& v : g_variants)
    if (v.dmax == dmax && v.rw == rw && v.ok) return &v;
  return nullptr;
}

size_t smem_for(const TcVariant& v, int d) {
  switch (v.dmax) {
    case 64: return tc_smem_bytes<64>(v.rw, d);
    case 128: return tc_smem_bytes<128>(v.rw, d);
    case 256: return tc_smem_bytes<256>(v.rw, d);
    default: return tc_smem_bytes<512>(v.rw, d);
  }
}

}  // namespace

bool attention_tc_eligible(const CacheRef& c, int T) {
  return T > 1 && c.f16 && c.head_dim >= 16 && c.head_dim % 16 == 0 && c.head_dim <= 512;
}

void attention_tc_init() {
  int dev = 0, optin = 48 * 1024;
  cudaGetDevice(&dev);
  if (cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) != cudaSuccess) optin = 48 * 1024;
  for (TcVariant& v : g_variants) {
    v.ok = v.max_smem <= static_cast<size_t>(optin) &&
           cudaFuncSetAttribute(v.fn, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(v.max_smem)) ==
               cudaSuccess;
  }
  cudaGetLastError();  // a variant too large for this device is not an error of the next launch
  g_inited = true;
}

int attention_tc(cudaStream_t s, const CacheRef& c, const float* q, int qs, const StepBuf* step, int T, int heads,
                 float scale, int window, float* out, int os, int row_warps) {
  if (!g_inited || !attention_tc_eligible(c, T)) return 0;
  const int group = heads / c.kv_heads, n_rows = T * group, dmax = dmax_for(c.head_dim);
  const TcVariant* v = nullptr;
  if (row_warps > 0) {
    v = find_variant(dmax, row_warps);
  } else {
    // The most rows per block (each K/V tile load serves more rows) that still gives about one
    // block per SM: a 256-token chunk of a sliding layer has only 8 KV heads x 512 rows, and
    // blocks of 64 rows would leave half of an H200's 132 SMs idle.
    for (int rw : {4, 2, 1}) {
      const TcVariant* cand = find_variant(dmax, rw);
      if (!cand) continue;
      v = cand;  // else the next smaller one: more blocks (or the only one that fits)
      const long blocks = static_cast<long>(MB_BLOCKS(n_rows, 16 * rw)) * c.kv_heads;
      if (blocks * 4 >= static_cast<long>(sm_count()) * 3) break;
    }
  }
  if (!v) return 0;
  constexpr float kLog2e = 1.4426950408889634f;
  const TcArgs p{c, q, qs, step, T, group, window, scale * kLog2e, out, os};
  const dim3 grid(MB_BLOCKS(n_rows, 16 * v->rw), c.kv_heads);
  enqueue(v->fn, grid, v->threads, smem_for(*v, c.head_dim), s, p);
  return 1;
}

MB_TRACE_ATTACH(trace_attach_attention_tc)

}  // namespace markbase::cuda
