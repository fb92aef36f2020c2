// KV cache writes and attention over (ring) caches: f16 or f32 storage, head dims up to 512,
// sliding windows, grouped-query heads.
//
// Attention: a block holds up to 8 query rows (one per warp) that read the same KV head, and
// streams that head's keys and values through shared memory 32 positions at a time (one load
// serves every row of the group); each warp keeps an online softmax (running max, sum and
// output row in registers). For decode (one token) the positions are also split over `splits`
// blocks per head whose partial results a second kernel combines, so that a long context keeps
// the whole GPU busy (flash-decoding). The split count depends on the cache capacity only, never
// on the position, so a captured decode graph stays valid for every token.
// Prefill over f16 caches in default mode goes to the tensor-core kernel of attention_tc.cu
// instead; this float32 kernel stays the reference (precise mode, f32 caches, decode).
#include <algorithm>
#include <cfloat>

#include "backend/cuda/attention_tc.h"
#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/q8.cuh"

namespace markbase::cuda {
namespace {

constexpr int kTile = 32;
constexpr int kMaxWarps = 8;
constexpr int kMaxDim = 512;
constexpr int kMaxSplits = 64;

__device__ __forceinline__ int cache_slot(const CacheRef& c, int pos) { return c.ring ? pos % c.capacity : pos; }

__global__ void store_kv_kernel(CacheRef c, const float* k, int ks, const float* v, int vs, const StepBuf* step,
                                int* error_flag) {
  pdl_entry();
  const int t = blockIdx.x, h = blockIdx.y, d = c.head_dim;
  const int pos = step->pos0 + t;
  if (!c.ring && pos >= c.capacity) {
    if (error_flag && threadIdx.x == 0) *error_flag = 1;
    return;
  }
  const size_t off = (static_cast<size_t>(h) * c.capacity + cache_slot(c, pos)) * d;
  const float* kr = k + static_cast<size_t>(t) * ks + h * d;
  const float* vr = v + static_cast<size_t>(t) * vs + h * d;
  for (int j = threadIdx.x; j < d; j += blockDim.x) {
    if (c.f16) {
      static_cast<__half*>(c.k)[off + j] = __float2half_rn(kr[j]);
      static_cast<__half*>(c.v)[off + j] = __float2half_rn(vr[j]);
    } else {
      static_cast<float*>(c.k)[off + j] = kr[j];
      static_cast<float*>(c.v)[off + j] = vr[j];
    }
  }
}

// Fused per-head finish of q, k and v (norm_rope_store): block (t, head) of the concatenated
// heads of the parts normalizes its head (RMS norm, times the weight if any), rotates it (when
// the part has a RoPE table), writes it to the part's slot and, for k and v, to the cache. Each
// thread holds pairs (j, j + d / 2); d <= 512 with 128 threads is at most 2 pairs.
constexpr int kFinishThreads = 128;
constexpr int kFinishPairs = kMaxDim / 2 / kFinishThreads;

__global__ void __launch_bounds__(kFinishThreads) norm_rope_store_kernel(HeadFinishArgs p) {
  pdl_trigger();
  const int t = blockIdx.x;
  const int pos = p.step->pos0 + t;  // written by the host before the graph: readable before the wait
  int h = blockIdx.y, pi = 0;
#pragma unroll
  for (int i = 0; i < kMaxHeadParts - 1; ++i)  // constant indices: the parts stay in parameter space
    if (pi == i && i + 1 < p.count && h >= p.part[i].heads) { h -= p.part[i].heads; pi = i + 1; }
  HeadPart part = p.part[0];
#pragma unroll
  for (int i = 1; i < kMaxHeadParts; ++i)
    if (pi == i) part = p.part[i];
  const int d = p.c.head_dim, half = d / 2;
  // The norm weights and the RoPE angles (double-precision sincos) depend on no kernel of the step:
  // with p.early they are loaded and computed while the q/k/v product before this kernel runs.
  float w0[kFinishPairs], w1[kFinishPairs], rc[kFinishPairs], rs[kFinishPairs];
  auto constants = [&] {
#pragma unroll
    for (int i = 0; i < kFinishPairs; ++i) {
      const int j = threadIdx.x + kFinishThreads * i;
      const bool in = j < half;
      w0[i] = in && part.norm && part.w ? part.w[j] : 1.0f;
      w1[i] = in && part.norm && part.w ? part.w[j + half] : 1.0f;
      if (in && part.inv) rope_angle(static_cast<float>(pos), part.inv[j], rc[i], rs[i]);
    }
  };
  if (p.early) constants();
  pdl_wait();
  if (!p.early) constants();
  const float* x = part.a + static_cast<size_t>(t) * part.as + h * d;
  float x0[kFinishPairs], x1[kFinishPairs];
  float ss = 0.0f;
#pragma unroll
  for (int i = 0; i < kFinishPairs; ++i) {
    const int j = threadIdx.x + kFinishThreads * i;
    x0[i] = j < half ? x[j] : 0.0f;
    x1[i] = j < half ? x[j + half] : 0.0f;
    ss += x0[i] * x0[i] + x1[i] * x1[i];
  }
  float r = 1.0f;
  if (part.norm) r = rms_scale(block_sum(ss), d, part.eps);
  float* y = part.out + static_cast<size_t>(t) * part.os + h * d;
  const size_t off = (static_cast<size_t>(h) * p.c.capacity + cache_slot(p.c, pos)) * d;
#pragma unroll
  for (int i = 0; i < kFinishPairs; ++i) {
    const int j = threadIdx.x + kFinishThreads * i;
    if (j >= half) break;
    float a0 = x0[i] * r, a1 = x1[i] * r;
    if (part.norm && part.w) {
      a0 *= w0[i];
      a1 *= w1[i];
    }
    if (part.inv) rope_apply(a0, a1, rc[i], rs[i]);
    y[j] = a0;
    y[j + half] = a1;
    if (part.cache && (p.c.ring || pos < p.c.capacity)) {  // (the host checks that the cache has room)
      if (p.c.f16) {
        static_cast<__half*>(part.cache)[off + j] = __float2half_rn(a0);
        static_cast<__half*>(part.cache)[off + j + half] = __float2half_rn(a1);
      } else {
        static_cast<float*>(part.cache)[off + j] = a0;
        static_cast<float*>(part.cache)[off + j + half] = a1;
      }
    }
  }
}

struct AttnArgs {
  CacheRef c;
  const float* q;
  int qs;
  const StepBuf* step;
  int T, heads, group, window, splits, rows_per_block;
  float scale;
  float* out;
  int os;
  float* scratch;
  bool early;  // attention_decode_kernel: the first chunk's cached rows copied before the PDL wait
  int gsplit;  // attention_decode_kernel: blocks a KV head's query rows are split over (grid z)
};

// grid: (row blocks, kv heads, splits); block: rows_per_block warps.
__global__ void attention_kernel(AttnArgs p) {
  pdl_entry();
  extern __shared__ __align__(16) float sm[];
  const int d = p.c.head_dim, kd = d + 4;  // key rows padded by 16 bytes: conflict-free float4 dots
  float* Ks = sm;                           // [kTile][d + 4]
  float* Vs = Ks + kTile * kd;              // [kTile][d]
  float* Qs = Vs + kTile * d;               // [rows_per_block][d]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = blockIdx.y, split = blockIdx.z;
  const int n_rows = p.T * p.group;
  const int r = blockIdx.x * p.rows_per_block + warp;
  const bool active = warp < p.rows_per_block && r < n_rows;  // all 8 warps load, these compute
  const int t = active ? r / p.group : 0, h = kvh * p.group + (active ? r % p.group : 0);

  // This split's range of positions for one row.
  auto range = [&](int tt, int& lo, int& hi) {
    const int pos = p.step->pos0 + tt;
    const int first = p.window > 0 ? max(0, pos - p.window + 1) : 0;
    const int n = pos - first + 1, len = (n + p.splits - 1) / p.splits;
    lo = first + split * len;
    hi = min(lo + len, pos + 1);
  };
  int lo, hi;
  range(t, lo, hi);
  if (!active) hi = lo;
  // The union over the block's rows (rows are in token order: first and last bound it).
  int blo, bhi, x0, x1;
  const int t_first = (blockIdx.x * p.rows_per_block) / p.group;
  const int t_last = min(n_rows - 1, (blockIdx.x + 1) * p.rows_per_block - 1) / p.group;
  range(t_first, blo, x0);
  range(t_last, x1, bhi);
  blo = min(blo, x1);
  bhi = max(bhi, x0);

  const float* qrow = p.q + static_cast<size_t>(t) * p.qs + h * d;
  if (warp < p.rows_per_block)
    for (int j = lane; j < d; j += 32) Qs[warp * d + j] = active ? qrow[j] : 0.0f;

  constexpr int kPer = kMaxDim / 32;
  float acc[kPer];
#pragma unroll
  for (int i = 0; i < kPer; ++i) acc[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  const size_t head_off = static_cast<size_t>(kvh) * p.c.capacity * d;

  for (int p0 = blo; p0 < bhi; p0 += kTile) {
    __syncthreads();
    // The tile, 4 values per thread and step, several steps in flight (the loads are the
    // latency; the first version, one scalar load per step from 64 threads, took ~90 us a layer).
    const int d4 = d / 4;
#pragma unroll 4
    for (int u = threadIdx.x; u < kTile * d4; u += blockDim.x) {
      const int j = u / d4, c = (u - j * d4) * 4, pos = p0 + j;
      float4 kv = make_float4(0, 0, 0, 0), vv = kv;
      if (pos < bhi) {
        const size_t off = head_off + static_cast<size_t>(cache_slot(p.c, pos)) * d + c;
        if (p.c.f16) {
          const uint2 kb = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p.c.k) + off);
          const uint2 vb = *reinterpret_cast<const uint2*>(static_cast<const __half*>(p.c.v) + off);
          const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&kb.x));
          const float2 k1 = __half22float2(*reinterpret_cast<const __half2*>(&kb.y));
          const float2 v0 = __half22float2(*reinterpret_cast<const __half2*>(&vb.x));
          const float2 v1 = __half22float2(*reinterpret_cast<const __half2*>(&vb.y));
          kv = make_float4(k0.x, k0.y, k1.x, k1.y);
          vv = make_float4(v0.x, v0.y, v1.x, v1.y);
        } else {
          kv = *reinterpret_cast<const float4*>(static_cast<const float*>(p.c.k) + off);
          vv = *reinterpret_cast<const float4*>(static_cast<const float*>(p.c.v) + off);
        }
      }
      *reinterpret_cast<float4*>(Ks + j * kd + c) = kv;
      *reinterpret_cast<float4*>(Vs + j * d + c) = vv;
    }
    __syncthreads();
    if (!active || p0 >= hi || p0 + kTile <= lo) continue;
    const int pos = p0 + lane;
    float s = -INFINITY;
    if (pos >= lo && pos < hi) {
      const float4* kr = reinterpret_cast<const float4*>(Ks + lane * kd);
      const float4* qv = reinterpret_cast<const float4*>(Qs + warp * d);
      float d0 = 0.0f, d1 = 0.0f;
#pragma unroll 4
      for (int c = 0; c < d / 4; c += 2) {
        d0 += dot4(qv[c], kr[c]);
        if (c + 1 < d / 4) d1 += dot4(qv[c + 1], kr[c + 1]);
      }
      s = (d0 + d1) * p.scale;
    }
    const float mt = warp_max(s);
    if (mt == -INFINITY) continue;
    const float mn = fmaxf(m, mt);
    const float corr = expf(m - mn);  // m = -inf on the first tile: corr = 0
    const float e = s == -INFINITY ? 0.0f : expf(s - mn);
    l = l * corr + warp_sum(e);
    m = mn;
#pragma unroll
    for (int i = 0; i < kPer; ++i) acc[i] *= corr;
    for (int j = 0; j < kTile; ++j) {
      const float ej = __shfl_sync(0xffffffffu, e, j);
      if (ej == 0.0f) continue;  // uniform across the warp
      const float* vr = Vs + j * d;
#pragma unroll
      for (int i = 0; i < kPer; ++i) {
        const int c = lane + 32 * i;
        if (c < d) acc[i] += ej * vr[c];
      }
    }
  }
  if (!active) return;
  if (p.splits == 1) {
    float* o = p.out + static_cast<size_t>(t) * p.os + h * d;
    const float inv = 1.0f / l;
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = lane + 32 * i;
      if (c < d) o[c] = acc[i] * inv;
    }
  } else {
    float* sp = p.scratch + (static_cast<size_t>(t * p.heads + h) * p.splits + split) * (d + 2);
    if (lane == 0) { sp[0] = m; sp[1] = l; }
#pragma unroll
    for (int i = 0; i < kPer; ++i) {
      const int c = lane + 32 * i;
      if (c < d) sp[2 + c] = acc[i];
    }
  }
}

// Decode (one token) over f16 caches: block (KV head, split, query group) takes the split's
// positions in chunks of kChunk for the group's query rows (all G rows of the KV head, or a half
// or quarter of them when the (KV head, split) grid alone would leave SMs idle: a Gemma 4 full
// layer's 2 KV heads ran 14.3 us in 34 blocks, 9.7 in 136, Nsight Compute on the H200). Each
// chunk's keys and values arrive by cp.async into shared memory (one memory round trip for the
// whole chunk); the first chunk's are asked for before the programmatic wait. With both, this
// kernel's time on a 26B-A4B layer's critical path went from 8.9 to 5.3 us (per-op trace of the
// 6-layer file; decode +2.5 %, bench/RESULTS.md, twelfth session). Then
//  - scores: warp w takes dims [w d / 8, (w + 1) d / 8) of every query row and of key p = lane
//    (queries pre-scaled, float32 in shared memory; keys 16 bytes at a time from rows padded by
//    16 bytes, so the lanes' rows fall in distinct banks); the 8 partial dots go through shared
//    memory. Splitting d rather than the rows keeps all 8 warps busy for any group size: the first
//    version (a warp per query row, 4 warps) ran 13.5 us a sliding layer on the H200, issue-bound
//    with one warp per scheduler;
//  - softmax: warp g % 8 owns row g's running max and sum (a row's 32 scores are one per lane);
//  - P V: thread t owns columns t and t + 256 of every query row.
// A split spans at least one chunk (len = max(kChunk, ceil(n / splits)) positions), so short
// contexts use few splits; splits with no positions write m = -inf, which the combine skips.
constexpr int kChunk = 32;
constexpr int kDecWarps = 8;
constexpr int kDecThreads = 32 * kDecWarps;
constexpr int kDecMaxG = 16;                        // query heads per KV head
constexpr int kDecCols = kMaxDim / kDecThreads;     // output columns per thread
constexpr int kDecRows = kDecMaxG / kDecWarps;      // softmax rows per warp

bool decode_kernel_fits(int d, int G) { return G <= kDecMaxG && d % (8 * kDecWarps) == 0 && d <= kMaxDim; }

size_t decode_smem_bytes(int d, int G) {
  return 2 * static_cast<size_t>(kChunk) * (d + 8) * sizeof(__half) +
         (static_cast<size_t>(G) * d + static_cast<size_t>(kDecWarps + 1) * G * kChunk + kDecMaxG) * sizeof(float);
}

__global__ void __launch_bounds__(kDecThreads) attention_decode_kernel(AttnArgs p) {
  pdl_trigger();
  const int pos = p.step->pos0;  // written by the host before the graph: readable before the wait
  extern __shared__ __align__(16) unsigned char dsm[];
  // This block's G query rows: rows [row0, row0 + G) of the T * heads rows (q and the scratch)
  const int d = p.c.head_dim, G = p.group / p.gsplit, kd = d + 8, dw = d / kDecWarps;
  const int row0 = blockIdx.x * p.group + blockIdx.z * G;
  __half* Ks = reinterpret_cast<__half*>(dsm);
  __half* Vs = Ks + kChunk * kd;
  float* Qs = reinterpret_cast<float*>(Vs + kChunk * kd);
  float* Sp = Qs + G * d;               // [warp][g][p] partial scores
  float* Ps = Sp + kDecWarps * G * kChunk;  // [g][p] probabilities of the chunk
  float* corr_s = Ps + G * kChunk;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int kvh = blockIdx.x, split = blockIdx.y;
  const int first = p.window > 0 ? max(0, pos - p.window + 1) : 0;
  const int n = pos - first + 1;
  const int len = max(kChunk, (n + p.splits - 1) / p.splits);
  const int lo = first + split * len, hi = min(lo + len, pos + 1);
  const __half* kh = static_cast<const __half*>(p.c.k) + static_cast<size_t>(kvh) * p.c.capacity * d;
  const __half* vh = static_cast<const __half*>(p.c.v) + static_cast<size_t>(kvh) * p.c.capacity * d;
  const int d8 = d / 8;
  // Copies the chunk at p0 into Ks/Vs (rows past hi zero-filled). Row `pos` is the one the kernel
  // before this one (norm_rope_store) writes in this step: it is left out (which == 1) or copied
  // alone (which == 2); which == 0 copies every row.
  auto copy_chunk = [&](int p0, int which) {
    const int np = min(kChunk, hi - p0);
    const int slot0 = cache_slot(p.c, p0);  // a chunk's rows wrap at most once (kChunk <= capacity)
    for (int u = threadIdx.x; u < kChunk * d8; u += kDecThreads) {
      const int r = u / d8, c = (u - r * d8) * 8;
      if (which != 0 && (p0 + r == pos) != (which == 2)) continue;
      const bool ok = r < np;
      int slot = slot0 + (ok ? r : 0);
      if (slot >= p.c.capacity) slot -= p.c.capacity;
      const size_t off = static_cast<size_t>(slot) * d + c;
      cp_async16(Ks + r * kd + c, kh + off, ok);
      cp_async16(Vs + r * kd + c, vh + off, ok);
    }
    cp_async_commit();
  };
  // The first chunk's cached rows go out before the wait, while the kernels before this one still
  // run: no kernel of this step writes them (a ring's slot of `pos` held a position outside the
  // window, since the ring is longer than the window), so their DRAM latency is hidden as the
  // products hide their weights'. The new row and q follow the wait.
  const bool early = p.early && lo < hi;
  if (early) copy_chunk(lo, 1);
  pdl_wait();
  float* part = p.scratch + static_cast<size_t>(row0) * p.splits * (d + 2);  // row g at + g * splits * (d + 2)
  if (lo >= hi) {  // no positions: the combine skips this split
    if (threadIdx.x < G) part[(static_cast<size_t>(threadIdx.x) * p.splits + split) * (d + 2)] = -INFINITY;
    return;
  }
  {  // the G query rows (contiguous), 16 bytes a load, all loads in flight before the first store
    constexpr int kQLoads = kDecMaxG * kMaxDim / 4 / kDecThreads;
    const float4* q4 = reinterpret_cast<const float4*>(p.q + static_cast<size_t>(row0) * d);
    const int n4 = G * d / 4;
    float4 qv[kQLoads];
#pragma unroll
    for (int k = 0; k < kQLoads; ++k) {
      const int i = threadIdx.x + kDecThreads * k;
      if (i < n4) qv[k] = q4[i];
    }
#pragma unroll
    for (int k = 0; k < kQLoads; ++k) {
      const int i = threadIdx.x + kDecThreads * k;
      if (i < n4)
        reinterpret_cast<float4*>(Qs)[i] =
            make_float4(qv[k].x * p.scale, qv[k].y * p.scale, qv[k].z * p.scale, qv[k].w * p.scale);
    }
  }
  float m[kDecRows], l[kDecRows];
#pragma unroll
  for (int i = 0; i < kDecRows; ++i) { m[i] = -INFINITY; l[i] = 0.0f; }
  float acc[kDecMaxG][kDecCols];
#pragma unroll
  for (int g = 0; g < kDecMaxG; ++g)
#pragma unroll
    for (int j = 0; j < kDecCols; ++j) acc[g][j] = 0.0f;
  for (int p0 = lo; p0 < hi; p0 += kChunk) {
    const int np = min(kChunk, hi - p0);
    if (p0 == lo && early) {
      if (pos < p0 + kChunk) copy_chunk(p0, 2);  // the new row, if this chunk holds it
    } else {
      __syncthreads();  // the previous chunk's readers are done
      copy_chunk(p0, 0);
    }
    cp_async_wait<0>();
    __syncthreads();
    {  // partial scores over this warp's dims, key p = lane
      float sc[kDecMaxG];
#pragma unroll
      for (int g = 0; g < kDecMaxG; ++g) sc[g] = 0.0f;
      const __half* kr = Ks + lane * kd + warp * dw;
      const float* qw = Qs + warp * dw;
      for (int c = 0; c < dw; c += 8) {
        const uint4 kw = *reinterpret_cast<const uint4*>(kr + c);
        const float2 k0 = __half22float2(*reinterpret_cast<const __half2*>(&kw.x));
        const float2 k1 = __half22float2(*reinterpret_cast<const __half2*>(&kw.y));
        const float2 k2 = __half22float2(*reinterpret_cast<const __half2*>(&kw.z));
        const float2 k3 = __half22float2(*reinterpret_cast<const __half2*>(&kw.w));
#pragma unroll
        for (int g = 0; g < kDecMaxG; ++g) {
          if (g >= G) break;
          const float4 qa = *reinterpret_cast<const float4*>(qw + g * d + c);
          const float4 qb = *reinterpret_cast<const float4*>(qw + g * d + c + 4);
          sc[g] += qa.x * k0.x + qa.y * k0.y + qa.z * k1.x + qa.w * k1.y + qb.x * k2.x + qb.y * k2.y + qb.z * k3.x +
                   qb.w * k3.y;
        }
      }
#pragma unroll
      for (int g = 0; g < kDecMaxG; ++g)
        if (g < G) Sp[(warp * G + g) * kChunk + lane] = sc[g];
    }
    __syncthreads();
#pragma unroll
    for (int i = 0; i < kDecRows; ++i) {  // row g = warp + 8 i: sum the partials, softmax step
      const int g = warp + kDecWarps * i;
      if (g >= G) continue;
      float s = 0.0f;
#pragma unroll
      for (int w = 0; w < kDecWarps; ++w) s += Sp[(w * G + g) * kChunk + lane];
      s = lane < np ? s : -INFINITY;
      const float mn = fmaxf(m[i], warp_max(s));  // finite: the chunk has a position
      const float cr = expf(m[i] - mn);           // m = -inf on the first chunk: 0
      const float e = lane < np ? expf(s - mn) : 0.0f;
      l[i] = l[i] * cr + warp_sum(e);
      m[i] = mn;
      Ps[g * kChunk + lane] = e;
      if (lane == 0) corr_s[g] = cr;
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < kDecMaxG; ++g) {
      if (g >= G) break;
      const float cr = corr_s[g];
#pragma unroll
      for (int j = 0; j < kDecCols; ++j) acc[g][j] *= cr;
    }
    for (int r = 0; r < np; ++r) {
      float v[kDecCols];
#pragma unroll
      for (int j = 0; j < kDecCols; ++j) {
        const int c = threadIdx.x + kDecThreads * j;
        v[j] = c < d ? __half2float(Vs[r * kd + c]) : 0.0f;
      }
#pragma unroll
      for (int g = 0; g < kDecMaxG; ++g) {
        if (g >= G) break;
        const float e = Ps[g * kChunk + r];
#pragma unroll
        for (int j = 0; j < kDecCols; ++j) acc[g][j] += e * v[j];
      }
    }
  }
  // This split's partial result per query row: m, l, then the unnormalised output.
#pragma unroll
  for (int i = 0; i < kDecRows; ++i) {
    const int g = warp + kDecWarps * i;
    if (g < G && lane == 0) {
      float* sp = part + (static_cast<size_t>(g) * p.splits + split) * (d + 2);
      sp[0] = m[i];
      sp[1] = l[i];
    }
  }
#pragma unroll
  for (int g = 0; g < kDecMaxG; ++g) {
    if (g >= G) break;
    float* sp = part + (static_cast<size_t>(g) * p.splits + split) * (d + 2) + 2;
#pragma unroll
    for (int j = 0; j < kDecCols; ++j) {
      const int c = threadIdx.x + kDecThreads * j;
      if (c < d) sp[c] = acc[g][j];
    }
  }
}

// One block per (token, head), one thread per output column: merges the splits' partial softmax
// results. The first warp turns the splits' maxima and sums into one weight per split (the first
// version recomputed them for every column, a chain of dependent loads that took ~30 us a layer
// on the H200); the columns then sum their splits with independent loads. Q8: the output row is
// also quantized (q8.cuh; head_dim % 32 == 0, so each warp holds one block).
// one_trip: every load is issued at once after the wait, so the kernel waits for one memory round
// trip, not three (a split's sum read only once its maximum was, then the columns only once the
// weights were): each split's (m, l) pair is one 8-byte load, and each column's first 32 splits
// are loaded before the weights exist (an empty split's stale values are never summed: its weight
// is 0). The same sums in the same order either way.
template <bool Q8>
__global__ void attention_combine_kernel(const float* scratch, int heads, int d, int splits, float* out, int os,
                                         Q8Vec q8, bool one_trip) {
  pdl_entry();
  __shared__ float wt[kMaxSplits];
  __shared__ int s_count;
  const int row = blockIdx.x, t = row / heads, h = row % heads;
  const float* sp = scratch + static_cast<size_t>(row) * splits * (d + 2);
  const int c = threadIdx.x;
  float x0[32];  // one_trip: column c of splits 0-31
  if (one_trip && c < d) {
#pragma unroll
    for (int i = 0; i < 32; ++i) x0[i] = i < splits ? sp[i * (d + 2) + 2 + c] : 0.0f;
  }
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float m[kMaxSplits / 32], l[kMaxSplits / 32];
    float M = -INFINITY;
    if (one_trip) {  // (m, l) as one 8-byte load: a split's row starts at an even float offset
#pragma unroll
      for (int i = 0; i < kMaxSplits / 32; ++i) {
        const int sidx = lane + 32 * i;
        const float2 ml = sidx < splits ? *reinterpret_cast<const float2*>(sp + sidx * (d + 2))
                                        : make_float2(-INFINITY, 0.0f);
        m[i] = ml.x;
        l[i] = m[i] != -INFINITY ? ml.y : 0.0f;
      }
    } else {
#pragma unroll
      for (int i = 0; i < kMaxSplits / 32; ++i) {
        const int sidx = lane + 32 * i;
        m[i] = sidx < splits ? sp[sidx * (d + 2)] : -INFINITY;
        l[i] = sidx < splits && m[i] != -INFINITY ? sp[sidx * (d + 2) + 1] : 0.0f;
      }
    }
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) M = fmaxf(M, m[i]);
    M = warp_max(M);
    float L = 0.0f;
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) L += m[i] != -INFINITY ? l[i] * expf(m[i] - M) : 0.0f;
    L = warp_sum(L);
    int last = -1;  // the splits past the last one with positions are not read
#pragma unroll
    for (int i = 0; i < kMaxSplits / 32; ++i) {
      const int sidx = lane + 32 * i;
      const float w = m[i] != -INFINITY ? expf(m[i] - M) / L : 0.0f;
      if (sidx < kMaxSplits) wt[sidx] = sidx < splits ? w : 0.0f;
      if (sidx < splits && m[i] != -INFINITY) last = sidx;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) last = max(last, __shfl_xor_sync(0xffffffffu, last, o));
    if (lane == 0) s_count = last + 1;
  }
  __syncthreads();
  const int count = s_count;
  float v = 0.0f;
  if (c < d) {
    int s0 = 0;
    if (one_trip) {
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (i < count) v += wt[i] * (wt[i] != 0.0f ? x0[i] : 0.0f);
      s0 = 32;
    }
    // 32 splits' loads in flight at a time (one memory round trip for up to 32 splits)
    for (; s0 < count; s0 += 32) {
      float x[32];
#pragma unroll
      for (int i = 0; i < 32; ++i) {
        const int sidx = s0 + i;
        x[i] = sidx < count && wt[sidx] != 0.0f ? sp[sidx * (d + 2) + 2 + c] : 0.0f;
      }
#pragma unroll
      for (int i = 0; i < 32; ++i)
        if (s0 + i < count) v += wt[s0 + i] * x[i];
    }
    out[static_cast<size_t>(t) * os + h * d + c] = v;
  }
  if constexpr (Q8) q8_store_warp(v, h * d + c, c < d, q8);
}

size_t smem_bytes(int d, int warps) { return (static_cast<size_t>(kTile) * (2 * d + 4) + warps * d) * sizeof(float); }

}  // namespace

// A/B switches (on by default): MARKBASE_CUDA_ATTN_EARLY=0 copies every chunk of the decode kernel
// after the PDL wait, MARKBASE_CUDA_ATTN_GSPLIT=0 keeps a KV head's query rows in one block,
// MARKBASE_CUDA_FINISH_EARLY=0 has norm_rope_store load its constants after its wait,
// MARKBASE_CUDA_COMBINE_ONE_TRIP=0 has the combine read the splits' sums, then the columns, after
// their maxima. None changes the arithmetic (tests/test_cuda_backend.py checks the logits bit for
// bit).

size_t attention_smem_limit() {
  const size_t need = smem_bytes(kMaxDim, kMaxWarps);
  cudaFuncSetAttribute(attention_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(need));
  cudaFuncSetAttribute(attention_decode_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                       static_cast<int>(decode_smem_bytes(kMaxDim, kDecMaxG)));
  attention_tc_init();
  return need;
}

// One tile of positions per split at a full cache: at 64 positions per split the H200 ran the
// 26B-A4B decode attention on 18 to 72 blocks (2 tiles each, 27-41 us a layer, 10 % occupancy).
int attention_splits(const CacheRef& c, int T) {
  if (T > 1) return 1;
  return std::min(kMaxSplits, std::max(1, (c.capacity + kTile - 1) / kTile));
}

int norm_rope_store(cudaStream_t s, const HeadFinishArgs& args, int T) {
  static const bool early = env_flag("MARKBASE_CUDA_FINISH_EARLY", true);
  HeadFinishArgs p = args;
  p.early = early;
  int heads = 0;
  for (int i = 0; i < p.count; ++i) heads += p.part[i].heads;
  enqueue(norm_rope_store_kernel, dim3(T, heads), kFinishThreads, 0, s, p);
  return 1;
}

int store_kv(cudaStream_t s, const CacheRef& c, const float* k, int ks, const float* v, int vs, const StepBuf* step,
             int T, int* error_flag) {
  enqueue(store_kv_kernel, dim3(T, c.kv_heads), 128, 0, s, c, k, ks, v, vs, step, error_flag);
  return 1;
}

int attention(cudaStream_t s, const CacheRef& c, const float* q, int qs, const StepBuf* step, int T, int heads,
              float scale, int window, float* out, int os, int splits, float* scratch, Q8Vec q8,
              bool tensor_cores) {
  if (tensor_cores && splits == 1 && attention_tc_eligible(c, T)) {
    const int n = attention_tc(s, c, q, qs, step, T, heads, scale, window, out, os);
    if (n > 0) return q8.q ? n + quantize_q8(s, out, os, heads * c.head_dim, 1, q8, 0) : n;
  }
  const int group = heads / c.kv_heads;
  const int rows = T * group, warps = std::min(kMaxWarps, rows);
  static const bool early = env_flag("MARKBASE_CUDA_ATTN_EARLY", true);
  static const bool gsplit_on = env_flag("MARKBASE_CUDA_ATTN_GSPLIT", true);
  static const bool one_trip_on = env_flag("MARKBASE_CUDA_COMBINE_ONE_TRIP", true);
  const bool one_trip = one_trip_on && (reinterpret_cast<uintptr_t>(scratch) & 7) == 0 && c.head_dim % 2 == 0;
  AttnArgs p{c, q, qs, step, T, heads, group, window, splits, warps, scale, out, os, scratch, early, 1};
  if (T == 1 && splits > 1 && c.f16 && decode_kernel_fits(c.head_dim, group) &&
      (reinterpret_cast<uintptr_t>(q) & 15) == 0) {  // decode, f16 caches
    // Few KV heads (a full layer of Gemma 4: 2 KV heads, 8 query heads each) give few (KV head,
    // split) blocks: their query rows are then split over up to 4 blocks that each read the same
    // keys and values (the second reader finds them in L2), until the grid covers the SMs.
    if (gsplit_on)
      while (p.gsplit < 4 && group % (2 * p.gsplit) == 0 && c.kv_heads * splits * p.gsplit < sm_count()) p.gsplit *= 2;
    enqueue(attention_decode_kernel, dim3(c.kv_heads, splits, p.gsplit), kDecThreads,
            decode_smem_bytes(c.head_dim, group / p.gsplit), s, p);
  } else {
    const dim3 grid(MB_BLOCKS(rows, warps), c.kv_heads, splits);
    enqueue(attention_kernel, grid, kMaxWarps * 32, smem_bytes(c.head_dim, warps), s, p);
  }
  const int threads = (c.head_dim + 31) / 32 * 32;
  if (splits > 1 && q8.q && c.head_dim % 32 == 0) {
    enqueue(attention_combine_kernel<true>, T * heads, threads, 0, s, scratch, heads, c.head_dim, splits, out, os, q8,
            one_trip);
    return 2;
  }
  int launched = 1;
  if (splits > 1) {
    enqueue(attention_combine_kernel<false>, T * heads, threads, 0, s, scratch, heads, c.head_dim, splits, out, os, q8,
            one_trip);
    ++launched;
  }
  if (q8.q) launched += quantize_q8(s, out, os, heads * c.head_dim, 1, q8, 0);
  return launched;
}

MB_TRACE_ATTACH(trace_attach_attention)

}  // namespace markbase::cuda
