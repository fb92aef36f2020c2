// Prefill products on 8-bit activations and the int8 tensor cores (default mode; every block
// type): out[m, n] = sum over blocks b of da[m, b] (dw[n, b] sum_i qa[m, 32 b
// + i] qw[n, 32 b + i] + mw[n, b] sum_i qa[m, 32 b + i]), mw being the minimum of the types that
// have one (Q4_1, Q5_1, and the K-quants' sub-blocks: dmin times their 6-bit minimum, negated).
// Q6_K's scales cover 16 weights: its blocks are two m16n8k16 products, each with its scale.
//
// The activation rows arrive quantized (quantize_q8: blocks of 32 int8 values with one float
// scale, the decode products' format), and each weight tile is decoded from its blocks into
// int8 codes in shared memory (Q4_0's 4-bit codes minus their offset 8, Q5_0's 5-bit ones minus
// 16; Q8_0's as they are; the codes of the types with a minimum as they are, 0 to 31). One
// mma.sync m16n8k32 spans exactly one block of both sides, so its int32 sums are scaled by the two
// blocks' scales into float32 accumulators, as llama.cpp's MMQ does. In place of the
// f16 wmma tiles of matmul.cu (weights decoded and activations converted to f16 per tile), this
// and the tensor-core attention moved the 26B-A4B prefill from 2.1k to 11.5k tokens/s on the H200.
//
// Tiles: BM = kMatmulBM token rows (the MoE tile list's granularity) x BN weight rows, 4 blocks
// (128 values) of K per stage, two stages in shared memory: the next stage's loads (cp.async for
// the activations, registers for the weights, which need decoding) are issued before the current
// stage's products. Warps in a 2 x (BN / 32) grid, each owning 32 x 32 outputs (2 x 4 mma tiles).
// BN is 128 (8 warps), or 64 (4 warps) where 128-row tiles would leave the GPU part empty: a
// 512-token prefill has only 8 row tiles, so a 2560-row product makes 160 blocks of 128 rows for
// 132 multiprocessors that each hold two (bench/cuda/mmq_check.cu measures both).
//
// One launch may hold several products of the same quantized rows (q, k and v; gate and up):
// their column tiles side by side in one grid, so that small ones (k, v: 64 blocks each) do not
// leave the GPU idle on their own. And a product whose tiles would fill the GPU badly (o, down:
// long K, few tiles) may split K over gridDim.z blocks per tile: each part stores its sums, and
// the tile's last part to finish adds the parts in the fixed order 0, 1, .. (the same bits
// whichever finishes last). A cost model of the launch (launch_cost) picks the tile width and
// the split.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "backend/cuda/matmul_tiles.cuh"
#include "backend/cuda/q8.cuh"

namespace markbase::cuda {
namespace {

constexpr int BM = kMatmulBM, KB = 4;
static_assert(BM == 64, "the warp grid covers 64 rows");
// One row's codes of a stage, padded by 16 bytes: ldmatrix's 8 rows x 16 bytes then hit 32
// distinct banks (row stride 36 words).
constexpr int kRowBytes = KB * 32 + 16;

// Weight types whose blocks carry a minimum besides the scale (w = dw q + mw): their products add
// mw da sum(qa) per block, the activation codes' sums taken from the mma fragments.
constexpr bool has_min(int t) { return t == MB_Q4_1 || t == MB_Q5_1 || t == MB_Q4_K || t == MB_Q5_K; }
constexpr bool is_k_quant(int t) { return t == MB_Q4_K || t == MB_Q5_K || t == MB_Q6_K; }
// Q6_K: a scale per 16 weights, so each block of 32 is two m16n8k16 products, the second half's
// scale kept where the minimums go (mw).
constexpr bool has_extra(int t) { return has_min(t) || t == MB_Q6_K; }

template <int BN_, bool EXTRA = false>
struct Tiles {
  static constexpr int BN = BN_, kThreads = 2 * BN_, kWarpsN = BN_ / 32;
  static constexpr int kAChunks = BM * KB * 2 / kThreads;  // 16-byte activation chunks per thread
  static constexpr int kAScales = BM * KB / kThreads;      // activation scales per thread
  // The scales of a stage, block-major and permuted (da_pos, dw_pos) so that a lane reads its
  // four rows' activation scales as one float4 and its eight columns' weight scales as two.
  struct Stage {
    signed char a[BM][kRowBytes];
    signed char w[BN][kRowBytes];
    float da[KB][BM];
    float dw[KB][BN];
  };
  static constexpr int kSmemBytes = 2 * static_cast<int>(sizeof(Stage));
};
// A second per-block weight value beside the scale (has_extra types): the minimum, or Q6_K's
// second 16-weight scale.
template <int BN_>
struct Tiles<BN_, true> : Tiles<BN_, false> {
  using Base = Tiles<BN_, false>;
  struct Stage : Base::Stage {
    float mw[KB][BN_];
  };
  static constexpr int kSmemBytes = 2 * static_cast<int>(sizeof(Stage));
};

// Where a stage keeps row m's activation scale and column n's weight scale: the mma fragment
// gives lane (g, t) of a warp rows 32 wm + 16 i + 8 h + g (i, h < 2) and columns
// 32 wn + 8 j + 2 t + c (j < 4, c < 2), stored at 32 wm + 4 g + 2 i + h and 32 wn + 8 t + 2 j + c.
__device__ __forceinline__ int da_pos(int m) { return (m & ~31) | (m & 7) << 2 | (m >> 4 & 1) << 1 | (m >> 3 & 1); }
__device__ __forceinline__ int dw_pos(int n) { return (n & ~31) | (n >> 1 & 3) << 3 | (n >> 3 & 3) << 1 | (n & 1); }

struct Job {
  const mb_u8* w;
  float* out;
  int N, out_stride;
  int x0;  // the job's first column tile (blockIdx.x)
};

struct Args {
  WeightRef w;  // the jobs' weight type, K and row bytes (and expert bytes, grouped); its data: job 0's
  Job job[kMaxMatmulQ8Jobs];
  int jobs;
  Q8Vec a;
  int a_stride;  // bytes of codes per activation row (a multiple of 32); scales: a_stride / 32
  int M;
  Grouped g;
  int split;           // parts of K per tile (gridDim.z)
  unsigned* counters;  // split > 1: per tile (blockIdx.y, blockIdx.x), its parts finished
  float* partial;      // split > 1: per tile and part, the part's BM x BN sums
};

// Integer sums ride in float registers through the magic-number trick: the accumulator starts at
// the bits of 1.5 * 2^23, so after the mma the int32 bits are those of the float M + sum with
// M = 1.5 * 2^23 (|sum| <= 32 * 128 * 127 < 2^22), with no int-to-float conversion. The weight
// scale dw is an f16 value (11 significant bits), so M dw = 3 dw 2^22 is exact in float32, and
// fma(M + sum, dw, -M dw) = sum * dw with a single rounding: two FMAs per value and block
// (this one, then the activation scale's), as exact as converting the sum.
constexpr int kMagicBits = 0x4B400000;
constexpr float kMagic = 12582912.0f;

__device__ __forceinline__ void mma_s8(int (&c)[4], const int (&a)[4], const int (&b)[2]) {
  asm("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

__device__ __forceinline__ void ldmatrix_x4(int (&r)[4], const void* p) {
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(p));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// Copies of global memory into shared memory that bypass the registers (cp.async, sm_80+);
// src_bytes = 0 writes zeros (rows past the tile, blocks past K).
__device__ __forceinline__ void cp_async(void* dst, const void* src, int bytes, int src_bytes) {
  const unsigned d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  if (bytes == 16)
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
  else
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(d), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;\n" ::); }

// The activation side of a stage: thread tid copies 16-byte chunks (row, part) tid + kThreads r of
// the tile's 64 rows x 32 KB codes (r < kAChunks), and scales (row, block) tid + kThreads r
// (r < kAScales). arow[] holds the activation rows of those chunks, then of those scales.
template <class C>
__device__ __forceinline__ void copy_a_stage(const Args& p, const int (&arow)[C::kAChunks + C::kAScales], int kb0,
                                             int nb, typename C::Stage& st) {
  constexpr int kThreads = C::kThreads, kPer = C::kAChunks;
  const int tid = threadIdx.x;
#pragma unroll
  for (int r = 0; r < kPer; ++r) {
    const int idx = tid + kThreads * r, part = idx % (KB * 2), b = kb0 + part / 2;
    const bool ok = arow[r] >= 0 && b < nb;
    const signed char* src = ok ? p.a.q + static_cast<size_t>(arow[r]) * p.a_stride + kb0 * 32 + part * 16 : p.a.q;
    cp_async(&st.a[idx / (KB * 2)][part * 16], src, 16, ok ? 16 : 0);
  }
#pragma unroll
  for (int r = 0; r < C::kAScales; ++r) {
    const int idx = tid + kThreads * r, b = kb0 + idx % KB;
    const bool ok = arow[kPer + r] >= 0 && b < nb;
    const float* src = ok ? p.a.d + static_cast<size_t>(arow[kPer + r]) * (p.a_stride / 32) + b : p.a.d;
    cp_async(&st.da[idx % KB][da_pos(idx / KB)], src, 4, ok ? 4 : 0);
  }
}

// The weight side of a stage, held in registers between its global loads and its decoded
// shared-memory stores. Blocks are 18 (Q4_0) or 34 (Q8_0) bytes, so they start 2-byte aligned;
// where a row holds an even number of blocks (rows 4-byte aligned: PAIRED), a thread loads two
// consecutive blocks as 32-bit words (9 or 17, half the load instructions of 16-bit loads) and
// realigns them with byte permutes; otherwise one block as 16-bit halves.
//   PAIRED: thread tid takes pairs (row, pair) tid + kThreads r (r < KB / 4) of BN rows x KB / 2
//           pairs; else units (row, block) tid + kThreads r (r < KB / 2) of BN rows x KB blocks
//   (kThreads = 2 BN: the counts per thread do not depend on BN).
constexpr int block_bytes(int t) {
  return t == MB_Q4_0 ? 18 : t == MB_Q8_0 ? 34 : t == MB_Q4_1 ? 20 : t == MB_Q5_0 ? 22 : 24;  // Q5_1: 24
}

template <int TYPE, bool PAIRED>
struct Staged {
  static constexpr int kBlockBytes = block_bytes(TYPE);
  static constexpr int kLoads = PAIRED ? KB / 4 : KB / 2;              // pairs or single blocks
  static constexpr int kPerRow = PAIRED ? KB / 2 : KB;                 // loads per weight row
  static constexpr int kWords = kBlockBytes / 2;  // a pair's 32-bit words, or one block's 16-bit halves
  unsigned v[kLoads][kWords];
};

template <class C, int TYPE, bool PAIRED>
__device__ __forceinline__ void load_w_stage(const Args& p, const TileRows& tr, int N, int n0, int kb0, int nb,
                                             Staged<TYPE, PAIRED>& s) {
  using S = Staged<TYPE, PAIRED>;
  constexpr int kThreads = C::kThreads;
  const int tid = threadIdx.x;
#pragma unroll
  for (int r = 0; r < S::kLoads; ++r) {
    const int idx = tid + kThreads * r, n = n0 + idx / S::kPerRow;
    const int b = kb0 + (idx % S::kPerRow) * (PAIRED ? 2 : 1);  // nb is even when PAIRED
    const bool ok = n < N && b < nb;
    const mb_u8* blk = tr.w + static_cast<size_t>(ok ? n : 0) * p.w.row_bytes + S::kBlockBytes * (ok ? b : 0);
    if constexpr (PAIRED) {
      const unsigned* q = reinterpret_cast<const unsigned*>(blk);
#pragma unroll
      for (int i = 0; i < S::kWords; ++i) s.v[r][i] = ok ? __ldg(q + i) : 0u;
    } else {
      const unsigned short* q = reinterpret_cast<const unsigned short*>(blk);
#pragma unroll
      for (int i = 0; i < S::kWords; ++i) s.v[r][i] = ok ? __ldg(q + i) : 0u;
    }
  }
}

// One block's scale and codes into the stage: bytes[] are the block's 2 + 16 (Q4_0) or 2 + 32
// (Q8_0) bytes as 32-bit words starting at its first byte (word i = bytes 4i .. 4i + 3) when
// off == 0, or at 2 bytes before it when off == 2. A zero block (d = 0, codes 0) past N or K
// adds nothing: Q4_0 codes of 0 give -8, times a zero scale.
template <int TYPE, class Stage>
__device__ __forceinline__ void store_block(const unsigned* words, int off, Stage& st, int n, int b) {
  constexpr int kQs = TYPE == MB_Q4_0 ? 4 : 8;  // code words
  // byte k of the block is byte k + off of the words
  auto word_at = [&](int k) {  // the 32-bit word of block bytes k .. k + 3 (k even)
    const int i = (k + off) >> 2;
    return ((k + off) & 3) ? __byte_perm(words[i], words[i + 1], 0x5432) : words[i];
  };
  const unsigned short d = static_cast<unsigned short>(off ? words[0] >> 16 : words[0] & 0xFFFFu);
  st.dw[b][dw_pos(n)] = __half2float(__ushort_as_half(d));
  int4* dst = reinterpret_cast<int4*>(&st.w[n][b * 32]);
  if constexpr (TYPE == MB_Q4_1 || TYPE == MB_Q5_0 || TYPE == MB_Q5_1) {
    // Q4_1: d, m, qs[16]; Q5_0: d, qh[4], qs[16]; Q5_1: d, m, qh[4], qs[16]. Codes as Q4_0's
    // nibbles, with the fifth bits of qh (bit j: weight j) above them; Q5_0's minus 16.
    if constexpr (has_min(TYPE)) {
      const unsigned short m = static_cast<unsigned short>(word_at(2) & 0xFFFFu);
      st.mw[b][dw_pos(n)] = __half2float(__ushort_as_half(m));
    }
    constexpr int qs = TYPE == MB_Q4_1 ? 4 : TYPE == MB_Q5_0 ? 6 : 8;
    const unsigned qh = TYPE == MB_Q4_1 ? 0u : word_at(TYPE == MB_Q5_0 ? 2 : 4);
    unsigned lo[4], hi[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned q = word_at(qs + 4 * i);
      lo[i] = q & 0x0F0F0F0Fu;
      hi[i] = (q >> 4) & 0x0F0F0F0Fu;
      if constexpr (TYPE != MB_Q4_1) {
        lo[i] |= q5_bits(qh >> (4 * i));
        hi[i] |= q5_bits(qh >> (16 + 4 * i));
      }
      if constexpr (TYPE == MB_Q5_0) {
        lo[i] = __vsub4(lo[i], 0x10101010u);
        hi[i] = __vsub4(hi[i], 0x10101010u);
      }
    }
    dst[0] = make_int4(lo[0], lo[1], lo[2], lo[3]);
    dst[1] = make_int4(hi[0], hi[1], hi[2], hi[3]);
  } else {
    unsigned q[kQs];
#pragma unroll
    for (int i = 0; i < kQs; ++i) q[i] = word_at(2 + 4 * i);
    if constexpr (TYPE == MB_Q4_0) {
      // Byte j of code word i holds weight 4i + j in its low nibble and weight 16 + 4i + j in its high one.
      unsigned lo[4], hi[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        lo[i] = __vsub4(q[i] & 0x0F0F0F0Fu, 0x08080808u);
        hi[i] = __vsub4((q[i] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
      }
      dst[0] = make_int4(lo[0], lo[1], lo[2], lo[3]);
      dst[1] = make_int4(hi[0], hi[1], hi[2], hi[3]);
    } else {
      dst[0] = make_int4(q[0], q[1], q[2], q[3]);
      dst[1] = make_int4(q[4], q[5], q[6], q[7]);
    }
  }
}

template <class C, int TYPE, bool PAIRED>
__device__ __forceinline__ void store_w_stage(const Staged<TYPE, PAIRED>& s, typename C::Stage& st) {
  using S = Staged<TYPE, PAIRED>;
  constexpr int kThreads = C::kThreads;
  const int tid = threadIdx.x;
#pragma unroll
  for (int r = 0; r < S::kLoads; ++r) {
    const int idx = tid + kThreads * r, n = idx / S::kPerRow;
    if constexpr (PAIRED) {
      // words 0 .. 8 (Q4_0) hold block 0 at byte 0 and block 1 at byte 18 = word 4 + 2 bytes;
      // words 0 .. 16 (Q8_0): block 1 at byte 34 = word 8 + 2 bytes (Q4_1's 20: word 5 + 0).
      const int b = (idx % S::kPerRow) * 2;
      store_block<TYPE>(s.v[r], 0, st, n, b);
      store_block<TYPE>(s.v[r] + S::kBlockBytes / 4, S::kBlockBytes % 4, st, n, b + 1);
    } else {
      // 16-bit halves: pack them into words first
      unsigned w[S::kWords / 2 + 1];
#pragma unroll
      for (int i = 0; i < S::kWords / 2; ++i) w[i] = s.v[r][2 * i] | (s.v[r][2 * i + 1] << 16);
      w[S::kWords / 2] = S::kWords % 2 ? s.v[r][S::kWords - 1] : 0u;
      store_block<TYPE>(w, 0, st, n, idx % S::kPerRow);
    }
  }
}

// K-quant weights (Q4_K, Q5_K): a stage's 4 blocks of 32 are sub-blocks 4h .. 4h + 3 of one
// 256-weight super-block, and thread tid takes the pair of sub-blocks (row, pair) tid of BN rows
// x 2 pairs, whose codes are the low and high nibbles of the same 32 bytes (Q5_K: plus bits 2j
// and 2j + 1 of the 32 qh bytes): the super-block's d and dmin, its 12 scale bytes, 8 code words
// (and 8 of qh), loaded 32 bits at a time (144- and 176-byte blocks keep 16-byte alignment).
template <int TYPE>
struct StagedK {
  unsigned dm, sc[3], q[8];
  unsigned qh[TYPE == MB_Q5_K ? 8 : 1];
};

template <class C, int TYPE>
__device__ __forceinline__ void load_w_stage_k(const Args& p, const TileRows& tr, int N, int n0, int kb0, int nb,
                                               StagedK<TYPE>& s) {
  static_assert(C::kThreads == 2 * C::BN && KB == 4, "one pair of sub-blocks a thread");
  const int tid = threadIdx.x, n = n0 + tid / 2, b = kb0 + 2 * (tid % 2);
  const bool ok = n < N && b < nb;
  const mb_u8* sb = tr.w + static_cast<size_t>(ok ? n : 0) * p.w.row_bytes + (TYPE == MB_Q4_K ? 144 : 176) * (b >> 3);
  const unsigned* w = reinterpret_cast<const unsigned*>(sb);
  s.dm = ok ? __ldg(w) : 0u;
#pragma unroll
  for (int i = 0; i < 3; ++i) s.sc[i] = ok ? __ldg(w + 1 + i) : 0u;
  const unsigned* q = w + (TYPE == MB_Q4_K ? 4 : 12) + 8 * ((b & 7) >> 1);
#pragma unroll
  for (int i = 0; i < 8; ++i) s.q[i] = ok ? __ldg(q + i) : 0u;
  if constexpr (TYPE == MB_Q5_K) {
#pragma unroll
    for (int i = 0; i < 8; ++i) s.qh[i] = ok ? __ldg(w + 4 + i) : 0u;
  }
}

template <class C, int TYPE>
__device__ __forceinline__ void store_w_stage_k(const StagedK<TYPE>& s, int kb0, typename C::Stage& st) {
  const int tid = threadIdx.x, n = tid / 2, b = 2 * (tid % 2), sub = (kb0 + b) & 7;
  const float2 dm = __half22float2(*reinterpret_cast<const __half2*>(&s.dm));
  unsigned scales, mins;  // both sub-blocks' (sub is even), without k4_scale_min's divergent branch
  k4_scale_min_pair(s.sc, sub >> 1, scales, mins);
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // sub-blocks sub (low nibbles) and sub + 1 (high)
    st.dw[b + h][dw_pos(n)] = dm.x * static_cast<float>((scales >> (8 * h)) & 0xFF);
    st.mw[b + h][dw_pos(n)] = -dm.y * static_cast<float>((mins >> (8 * h)) & 0xFF);
    unsigned c[8];
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      c[i] = (s.q[i] >> (4 * h)) & 0x0F0F0F0Fu;
      if constexpr (TYPE == MB_Q5_K) c[i] |= q5k_bits(s.qh[i], sub + h);
    }
    int4* dst = reinterpret_cast<int4*>(&st.w[n][(b + h) * 32]);
    dst[0] = make_int4(c[0], c[1], c[2], c[3]);
    dst[1] = make_int4(c[4], c[5], c[6], c[7]);
  }
}

// Q6_K weights: a stage's 4 blocks of 32 are one half (h6) of a 210-byte super-block: ql bytes
// 64 h6 .. + 63 (block q's low 4 bits: byte 32 (q & 1) + l, nibble q >> 1), qh bytes 128 + 32 h6 ..
// + 31 (bits 2q, 2q + 1 of byte l), int8 scales 192 + 8 h6 + 2q + l / 16, and d at 208. Thread
// tid takes row tid / 2 and weights l = 16 hh .. 16 hh + 15 (hh = tid % 2) of all 4 blocks, so each
// 16-weight scale is one thread's. Super-blocks are 2-byte aligned: each run of bytes is loaded as
// the 32-bit words around it and realigned when stored (as store_block's word_at).
struct StagedQ6 {
  unsigned qa[5], qb[5], qh[5], sc[3], d;
  int off;  // the super-block's address mod 4: 0 or 2
};

template <class C>
__device__ __forceinline__ void load_w_stage_q6(const Args& p, const TileRows& tr, int N, int n0, int kb0, int nb,
                                                StagedQ6& s) {
  const int tid = threadIdx.x, n = n0 + tid / 2, hh = tid % 2, h6 = (kb0 & 7) >> 2;
  const bool ok = n < N && kb0 < nb;
  const uintptr_t at = reinterpret_cast<uintptr_t>(tr.w + static_cast<size_t>(ok ? n : 0) * p.w.row_bytes +
                                                   210 * static_cast<size_t>(kb0 >> 3));
  s.off = static_cast<int>(at & 3);
  const unsigned* w = reinterpret_cast<const unsigned*>(at - s.off);
  const int qa = (64 * h6 + 16 * hh) / 4, qb = qa + 8, qh = (128 + 32 * h6 + 16 * hh) / 4, sc = (192 + 8 * h6) / 4;
#pragma unroll
  for (int i = 0; i < 5; ++i) {
    s.qa[i] = ok ? __ldg(w + qa + i) : 0u;
    s.qb[i] = ok ? __ldg(w + qb + i) : 0u;
    s.qh[i] = ok ? __ldg(w + qh + i) : 0u;
  }
#pragma unroll
  for (int i = 0; i < 3; ++i) s.sc[i] = ok ? __ldg(w + sc + i) : 0u;
  s.d = ok ? __ldg(w + 52) : 0u;  // block bytes 208, 209: the low half, or the high one when off == 2
}

template <class C>
__device__ __forceinline__ void store_w_stage_q6(const StagedQ6& s, typename C::Stage& st) {
  const int tid = threadIdx.x, n = tid / 2, hh = tid % 2;
  auto word = [&](const unsigned* v, int i) { return s.off ? __byte_perm(v[i], v[i + 1], 0x5432) : v[i]; };
  const float d = __half2float(__ushort_as_half(static_cast<unsigned short>(s.off ? s.d >> 16 : s.d & 0xFFFFu)));
  unsigned scw[2];  // scale bytes 0 .. 7 of the half
#pragma unroll
  for (int i = 0; i < 2; ++i) scw[i] = word(s.sc, i);
#pragma unroll
  for (int q = 0; q < 4; ++q) {
    const int k = 2 * q + hh;  // this thread's scale of block q
    const float scale = static_cast<float>(static_cast<signed char>((scw[k >> 2] >> (8 * (k & 3))) & 0xFFu));
    (hh ? st.mw : st.dw)[q][dw_pos(n)] = d * scale;
    unsigned c[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const unsigned lo = word(q & 1 ? s.qb : s.qa, i), hi = word(s.qh, i);
      c[i] = __vsub4(((lo >> (4 * (q >> 1))) & 0x0F0F0F0Fu) | (((hi >> (2 * q)) & 0x03030303u) << 4), 0x20202020u);
    }
    *reinterpret_cast<int4*>(&st.w[n][q * 32 + 16 * hh]) = make_int4(c[0], c[1], c[2], c[3]);
  }
}

__device__ __forceinline__ void mma_s8_k16(int (&c)[4], int a0, int a1, int b) {
  asm("mma.sync.aligned.m16n8k16.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5}, {%6}, {%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a0), "r"(a1), "r"(b));
}

// This block's product: the last job whose column tiles start at or before blockIdx.x
// (constant indices: the jobs stay in parameter space).
__device__ __forceinline__ Job block_job(const Args& p) {
  Job jb = p.job[0];
#pragma unroll
  for (int j = 1; j < kMaxMatmulQ8Jobs; ++j)
    if (j < p.jobs && static_cast<int>(blockIdx.x) >= p.job[j].x0) jb = p.job[j];
  return jb;
}

// 128 registers a thread: two blocks of 8 warps (or four of 4) per multiprocessor.
// MMA_SUMS (has_min types): the activation blocks' sums by an mma (the default), or by dp4a and
// shuffles (MARKBASE_CUDA_MMQ_MMA_SUMS=0, an A/B switch; the same bits).
template <int TYPE, bool PAIRED, int BN, bool MMA_SUMS = true>
__global__ void __launch_bounds__(2 * BN, 256 / BN) matmul_q8_kernel(Args p) {
  pdl_entry();
  using C = Tiles<BN, has_extra(TYPE)>;
  using Stage = typename C::Stage;
  constexpr int kThreads = C::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  Stage* stages = reinterpret_cast<Stage*>(smem);
  const Job jb = block_job(p);
  WeightRef wr = p.w;
  wr.data = jb.w;
  TileRows tr;
  if (!tr.init(wr, p.g, p.M, BM)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN, g = lane / 4, t = lane % 4;
  const int n0 = (blockIdx.x - jb.x0) * BN, nb = p.w.K / 32, stages_n = (nb + KB - 1) / KB;
  // This part's stages of K: [st0, st1)
  const int z = blockIdx.z, st0 = z * stages_n / p.split, st1 = (z + 1) * stages_n / p.split;
  // The activation rows this thread copies (copy_a_stage): its chunks' rows, then its scales'.
  int arow[C::kAChunks + C::kAScales];
#pragma unroll
  for (int r = 0; r < C::kAChunks; ++r) arow[r] = tr.a_row((tid + kThreads * r) / (KB * 2));
#pragma unroll
  for (int r = 0; r < C::kAScales; ++r) arow[C::kAChunks + r] = tr.a_row((tid + kThreads * r) / KB);

  float acc[2][4][4];
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[i][j][r] = 0.0f;

  std::conditional_t<TYPE == MB_Q6_K, StagedQ6, std::conditional_t<is_k_quant(TYPE), StagedK<TYPE>, Staged<TYPE, PAIRED>>> s;
  auto load_w = [&](int kb0) {
    if constexpr (TYPE == MB_Q6_K) load_w_stage_q6<C>(p, tr, jb.N, n0, kb0, nb, s);
    else if constexpr (is_k_quant(TYPE)) load_w_stage_k<C>(p, tr, jb.N, n0, kb0, nb, s);
    else load_w_stage<C>(p, tr, jb.N, n0, kb0, nb, s);
  };
  auto store_w = [&](int kb0, Stage& dst) {
    if constexpr (TYPE == MB_Q6_K) store_w_stage_q6<C>(s, dst);
    else if constexpr (is_k_quant(TYPE)) store_w_stage_k<C>(s, kb0, dst);
    else store_w_stage<C>(s, dst);
  };
  copy_a_stage<C>(p, arow, st0 * KB, nb, stages[0]);
  load_w(st0 * KB);
  store_w(st0 * KB, stages[0]);
  cp_async_wait_all();
  __syncthreads();
  for (int st = st0; st < st1; ++st) {
    const bool more = st + 1 < st1;
    const int cur = (st - st0) & 1;
    if (more) {  // the next stage's loads, in flight during this stage's products
      copy_a_stage<C>(p, arow, (st + 1) * KB, nb, stages[cur ^ 1]);
      load_w((st + 1) * KB);
    }
    const Stage& S = stages[cur];
#pragma unroll 1
    for (int kb = 0; kb < KB; ++kb) {
      int a[2][4], b[4][2];
      // ldmatrix.x4 hands each lane the fragment words the mma expects: for A, matrices (rows
      // 0-7 | 8-15) x (codes 0-15 | 16-31), lanes 8q..8q+7 addressing matrix q's rows; for B,
      // two 8-column tiles j, j + 1 at once, (codes 0-15 | 16-31) each.
      {
        const int mrow = lane % 8 + 8 * ((lane / 8) % 2), half = 16 * (lane / 16);
#pragma unroll
        for (int i = 0; i < 2; ++i) ldmatrix_x4(a[i], &S.a[wm * 32 + i * 16 + mrow][kb * 32 + half]);
        const int ncol = lane % 8 + 8 * (lane / 16), khalf = 16 * ((lane / 8) % 2);
#pragma unroll
        for (int j = 0; j < 4; j += 2) {
          int r[4];
          ldmatrix_x4(r, &S.w[wn * 32 + j * 8 + ncol][kb * 32 + khalf]);
          b[j][0] = r[0]; b[j][1] = r[1]; b[j + 1][0] = r[2]; b[j + 1][1] = r[3];
        }
      }
      // The scales, in the order da_pos / dw_pos keep them: da[2 i + h], dw[2 j + c]
      const float4 da4 = *reinterpret_cast<const float4*>(&S.da[kb][wm * 32 + 4 * g]);
      const float4 dw4a = *reinterpret_cast<const float4*>(&S.dw[kb][wn * 32 + 8 * t]);
      const float4 dw4b = *reinterpret_cast<const float4*>(&S.dw[kb][wn * 32 + 8 * t + 4]);
      const float da[4] = {da4.x, da4.y, da4.z, da4.w};
      const float dw[8] = {dw4a.x, dw4a.y, dw4a.z, dw4a.w, dw4b.x, dw4b.y, dw4b.z, dw4b.w};
      if constexpr (TYPE == MB_Q6_K) {
        // two m16n8k16 products a block: codes 0-15 (fragment words 0, 1 of a, word 0 of b) with
        // the first 16 weights' scale (dw), codes 16-31 with the second's (mw)
        const float4 w4a = *reinterpret_cast<const float4*>(&S.mw[kb][wn * 32 + 8 * t]);
        const float4 w4b = *reinterpret_cast<const float4*>(&S.mw[kb][wn * 32 + 8 * t + 4]);
        const float dw2[8] = {w4a.x, w4a.y, w4a.z, w4a.w, w4b.x, w4b.y, w4b.z, w4b.w};
#pragma unroll
        for (int i = 0; i < 2; ++i)
#pragma unroll
          for (int j = 0; j < 4; ++j) {
            int c[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
            int c2[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
            mma_s8_k16(c, a[i][0], a[i][1], b[j][0]);
            mma_s8_k16(c2, a[i][2], a[i][3], b[j][1]);
#pragma unroll
            for (int r = 0; r < 4; ++r) {
              const float w = dw[2 * j + (r & 1)], w2 = dw2[2 * j + (r & 1)];
              const float v = fmaf(__int_as_float(c[r]), w, -kMagic * w) + fmaf(__int_as_float(c2[r]), w2, -kMagic * w2);
              acc[i][j][r] = fmaf(v, da[2 * i + (r >> 1)], acc[i][j][r]);
            }
          }
      } else {
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int c[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
          mma_s8(c, a[i], b[j]);
#pragma unroll
          for (int r = 0; r < 4; ++r) {
            const float w = dw[2 * j + (r & 1)];
            acc[i][j][r] = fmaf(fmaf(__int_as_float(c[r]), w, -kMagic * w), da[2 * i + (r >> 1)], acc[i][j][r]);
          }
        }
      }
      if constexpr (has_min(TYPE)) {
        // + mw da sum(qa): the block's activation sums of this lane's rows g and g + 8.
        const float4 mw4a = *reinterpret_cast<const float4*>(&S.mw[kb][wn * 32 + 8 * t]);
        const float4 mw4b = *reinterpret_cast<const float4*>(&S.mw[kb][wn * 32 + 8 * t + 4]);
        const float mw[8] = {mw4a.x, mw4a.y, mw4a.z, mw4a.w, mw4b.x, mw4b.y, mw4b.z, mw4b.w};
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          float sum[2];
          if constexpr (MMA_SUMS) {
            // One more mma, against a B of ones: its C holds each row's sum in every column
            // (words 0, 1: row g; 2, 3: row g + 8), exact through the magic-number trick. The
            // tensor cores are mostly idle here (the loop is bound by its issue), so this costs
            // less than the 4 dp4a and 4 shuffles a tile below.
            const int ones[2] = {0x01010101, 0x01010101};  // a B fragment of int8 ones
            int c[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
            mma_s8(c, a[i], ones);
            sum[0] = __int_as_float(c[0]) - kMagic;
            sum[1] = __int_as_float(c[2]) - kMagic;
          } else {  // fragment words 0 and 2 of a[i] (row g), 1 and 3 (g + 8), over the row's 4 lanes t
            int sg = __dp4a(a[i][0], 0x01010101, __dp4a(a[i][2], 0x01010101, 0));
            int sg8 = __dp4a(a[i][1], 0x01010101, __dp4a(a[i][3], 0x01010101, 0));
            sg += __shfl_xor_sync(0xffffffffu, sg, 1);
            sg8 += __shfl_xor_sync(0xffffffffu, sg8, 1);
            sg += __shfl_xor_sync(0xffffffffu, sg, 2);
            sg8 += __shfl_xor_sync(0xffffffffu, sg8, 2);
            sum[0] = static_cast<float>(sg);
            sum[1] = static_cast<float>(sg8);
          }
          const float dsa[2] = {da[2 * i] * sum[0], da[2 * i + 1] * sum[1]};
#pragma unroll
          for (int j = 0; j < 4; ++j)
#pragma unroll
            for (int r = 0; r < 4; ++r) acc[i][j][r] = fmaf(mw[2 * j + (r & 1)], dsa[r >> 1], acc[i][j][r]);
        }
      }
    }
    if (more) store_w((st + 1) * KB, stages[cur ^ 1]);
    cp_async_wait_all();
    __syncthreads();
  }

  if (p.split > 1) {
    // Split K: this part's sums go to the workspace (float4 (i, j) of thread tid of part q at
    // float4 (8 q + 4 i + j) kThreads + tid of the tile's parts), and the tile's last part to
    // finish adds the parts in the order 0, 1, .., split - 1, reading back the others' (its own
    // from registers, the bits it stored). release (the counter): this block's parts are visible
    // before it is counted; acquire (the last block): the other parts are, after the barrier.
    __shared__ bool last;
    const unsigned tile = blockIdx.y * gridDim.x + blockIdx.x;
    float4* parts = reinterpret_cast<float4*>(p.partial) + static_cast<size_t>(tile) * p.split * 8 * kThreads + tid;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j)
        __stcg(parts + (8 * z + 4 * i + j) * kThreads, make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]));
    __syncthreads();
    if (tid == 0) last = atomic_add_acq_rel(p.counters + tile, 1u) == static_cast<unsigned>(p.split - 1);
    __syncthreads();
    if (!last) return;
#pragma unroll
    for (int i = 0; i < 2; ++i)
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float4 own = make_float4(acc[i][j][0], acc[i][j][1], acc[i][j][2], acc[i][j][3]);
        float4 sum = z == 0 ? own : __ldcg(parts + (4 * i + j) * kThreads);
        for (int q = 1; q < p.split; ++q) {
          const float4 v = q == z ? own : __ldcg(parts + (8 * q + 4 * i + j) * kThreads);
          sum.x += v.x;
          sum.y += v.y;
          sum.z += v.z;
          sum.w += v.w;
        }
        acc[i][j][0] = sum.x;
        acc[i][j][1] = sum.y;
        acc[i][j][2] = sum.z;
        acc[i][j][3] = sum.w;
      }
    if (tid == 0) p.counters[tile] = 0;  // ready for the next launch
  }

  // C fragment: value r of tile (i, j) is row g + 8 (r / 2), column 2 t + r % 2. The job is
  // looked up again rather than kept in registers through the loop.
  const Job ob = block_job(p);
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int orow = tr.o_row(wm * 32 + i * 16 + g + 8 * h);
      if (orow < 0) continue;
      float* o = ob.out + static_cast<size_t>(orow) * ob.out_stride;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + wn * 32 + j * 8 + 2 * t;
        if (n < ob.N) o[n] = acc[i][j][2 * h];
        if (n + 1 < ob.N) o[n + 1] = acc[i][j][2 * h + 1];
      }
    }
}

template <int BN>
void raise_smem_limit() {
  for (int type = 0; type <= MB_Q6_K; ++type)  // GGML's ids: the has_int8_mma() types among them
    with_q8_type(type, [](auto t) {
      constexpr int T = decltype(t)::value, bytes = Tiles<BN, has_extra(T)>::kSmemBytes;
      auto allow = [](auto sums) {  // the instances launch() may take
        constexpr bool S = decltype(sums)::value;
        cudaFuncSetAttribute(matmul_q8_kernel<T, true, BN, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
        if constexpr (!is_k_quant(T))
          cudaFuncSetAttribute(matmul_q8_kernel<T, false, BN, S>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
      };
      allow(std::true_type{});
      if constexpr (has_min(T)) allow(std::false_type{});
    });
}

// Blocks of BN columns one multiprocessor holds at once (the Q4_0 kernel's; the others' match).
template <int BN>
int resident_blocks() {
  const int n = blocks_per_sm(matmul_q8_kernel<MB_Q4_0, true, BN>, Tiles<BN>::kThreads, Tiles<BN>::kSmemBytes);
  return n > 0 ? n : 256 / BN;  // else the launch bounds' count
}

template <int BN>
void launch(cudaStream_t s, const Args& p, dim3 grid, bool paired) {
  static const bool mma_sums = env_flag("MARKBASE_CUDA_MMQ_MMA_SUMS", true);
  with_q8_type(p.w.type, [&](auto t) {
    constexpr int T = decltype(t)::value, threads = Tiles<BN>::kThreads, smem = Tiles<BN, has_extra(T)>::kSmemBytes;
    auto go = [&](auto sums) {
      constexpr bool S = decltype(sums)::value;
      // the K-quants have loaders of their own, which PAIRED does not change: one instance
      if constexpr (is_k_quant(T)) enqueue(matmul_q8_kernel<T, true, BN, S>, grid, threads, smem, s, p);
      else if (paired) enqueue(matmul_q8_kernel<T, true, BN, S>, grid, threads, smem, s, p);
      else enqueue(matmul_q8_kernel<T, false, BN, S>, grid, threads, smem, s, p);
    };
    if constexpr (has_min(T)) {
      if (!mma_sums) return go(std::false_type{});
    }
    go(std::true_type{});
  });
}

int g_resident[2] = {4, 2};  // blocks of 64 and of 128 columns per multiprocessor (setup)

// 32-bit weight loads need 4-byte aligned rows (an even number of blocks) and matrices.
bool paired_rows(const WeightRef& w) {
  return (w.K / 32) % 2 == 0 && (reinterpret_cast<uintptr_t>(w.data) & 3) == 0 && w.row_bytes % 4 == 0 &&
         w.expert_bytes % 4 == 0;
}

int column_tiles(const MatmulQ8Jobs& jobs, int bn) {
  int x = 0;
  for (int j = 0; j < jobs.count; ++j) x += static_cast<int>(MB_BLOCKS(jobs.n[j], bn));
  return x;
}

// The cost model of a launch: blocks are dealt evenly over the multiprocessors, and the busiest
// one runs its share in rounds of at most the resident count; a round of n blocks runs at a speed
// that grows with its warps up to 16, as (warps / 16)^0.3 (more warps hide more latency). A
// block's work: its width times its stages, plus half a stage that nothing overlaps (the first
// loads) and, when split, 1.5 stages for storing its part and its share of the sum; 64-column
// blocks do 0.9 of the work per column (four blocks of 4 warps wait less at their barriers than
// two of 8). The constants are fitted to bench/cuda/mmq_check.cu's sweep of every width and split
// on the H200 (14 shapes of E4B and 26B-A4B, 184 launches: the model's pick is within 1 % of the
// fastest on average, at most 5 %).
double launch_cost(int bn, int split, int tiles, int stages) {
  const int resident = g_resident[bn == 128], warps = bn / 16;
  long busiest = (static_cast<long>(tiles) * split + sm_count() - 1) / sm_count();
  const double work = (bn == 64 ? 0.9 : 1.0) * bn * ((stages + split - 1) / split + 0.5 + (split > 1 ? 1.5 : 0.0));
  double t = 0;
  for (; busiest > 0; busiest -= resident) {
    const int n = static_cast<int>(std::min<long>(busiest, resident));
    t += n * work / std::pow(std::min(n * warps, 16) / 16.0, 0.3);
  }
  return t;
}

struct Plan {
  int bn = 128, split = 1;
};

// The scratch of a split launch: the tile counters at a fixed place (launches of other widths and
// splits share the scratch, so no launch's parts may fall on another's counters), then the parts.
constexpr int kMaxSplitTiles = 16384;
constexpr size_t kCounterBytes = kMaxSplitTiles * sizeof(unsigned);
size_t split_bytes(int tiles, int bn, int split) {
  if (split <= 1) return 0;
  return kCounterBytes + static_cast<size_t>(tiles) * split * BM * bn * sizeof(float);
}

// The cheapest tile width and split by launch_cost (splits of at least 2 stages a part that fit in
// scratch; a split the check harness forces must fit too), preferring narrow tiles and fewer parts
// unless the model saves at least 2 %.
Plan choose_plan(const MatmulQ8Jobs& jobs, int M, size_t scratch, int force_bn, int force_split) {
  const int tiles_m = static_cast<int>(MB_BLOCKS(M, BM)), stages = (jobs.w[0].K / 32 + KB - 1) / KB;
  Plan best;
  double best_cost = 0;
  for (int bn : {64, 128}) {
    if (force_bn && bn != force_bn) continue;
    const int tiles = column_tiles(jobs, bn) * tiles_m;
    for (int split = 1; split <= 8; ++split) {
      const bool fits = tiles <= kMaxSplitTiles && split_bytes(tiles, bn, split) <= scratch;
      if (force_split && split != force_split) continue;
      if (split > 1 && (!fits || (!force_split && stages / split < 2))) continue;
      const double c = launch_cost(bn, split, tiles, stages);
      if (best_cost == 0 || c < 0.98 * best_cost) {
        best = {bn, split};
        best_cost = c;
      }
    }
  }
  return best;
}

}  // namespace

void matmul_q8_setup() {
  raise_smem_limit<64>();
  raise_smem_limit<128>();
  g_resident[0] = resident_blocks<64>();
  g_resident[1] = resident_blocks<128>();
}

size_t matmul_q8_scratch_bytes(const MatmulQ8Jobs& jobs, int M) {
  if (jobs.count < 1) return 0;
  const Plan pl = choose_plan(jobs, M, ~size_t{0}, 0, 0);
  return split_bytes(column_tiles(jobs, pl.bn) * static_cast<int>(MB_BLOCKS(M, BM)), pl.bn, pl.split);
}

int matmul_q8_jobs(cudaStream_t s, const MatmulQ8Jobs& jobs, Q8Vec a, int a_stride, int M, MatmulQ8Scratch scratch,
                   int bn, int split) {
  const WeightRef& w = jobs.w[0];
  if (jobs.count < 1 || jobs.count > kMaxMatmulQ8Jobs || !has_int8_mma(w.type)) return 0;
  const Plan pl = choose_plan(jobs, M, scratch.bytes, bn, split);
  Args p{};
  p.w = w;
  p.jobs = jobs.count;
  p.a = a;
  p.a_stride = a_stride;
  p.M = M;
  p.split = pl.split;
  bool paired = true;
  int x = 0;
  for (int j = 0; j < jobs.count; ++j) {
    p.job[j] = {jobs.w[j].data, jobs.out[j], jobs.n[j], jobs.out_stride[j], x};
    x += static_cast<int>(MB_BLOCKS(jobs.n[j], pl.bn));
    paired = paired && paired_rows(jobs.w[j]);
  }
  const int tiles_m = static_cast<int>(MB_BLOCKS(M, BM));
  if (pl.split > 1) {
    p.counters = static_cast<unsigned*>(scratch.p);
    p.partial = reinterpret_cast<float*>(static_cast<char*>(scratch.p) + kCounterBytes);
  }
  const dim3 grid(x, tiles_m, pl.split);
  if (pl.bn == 128) launch<128>(s, p, grid, paired);
  else launch<64>(s, p, grid, paired);
  return 1;
}

int matmul_q8(cudaStream_t s, const WeightRef& w, int N, Q8Vec a, int a_stride, int M, float* out, int out_stride,
              const Grouped* grouped) {
  if (!has_int8_mma(w.type)) return 0;  // the backend checks has_int8_mma() first
  if (!grouped) {
    MatmulQ8Jobs one;
    one.w[0] = w;
    one.n[0] = N;
    one.out[0] = out;
    one.out_stride[0] = out_stride;
    one.count = 1;
    return matmul_q8_jobs(s, one, a, a_stride, M, {});
  }
  // Grouped (MoE experts): the tile list's length is known on the device only, so its bound
  // (max_tiles) decides the width: 128-row tiles where they make at least four blocks per
  // multiprocessor (two rounds of two).
  Args p{};
  p.w = w;
  p.job[0] = {w.data, out, N, out_stride, 0};
  p.jobs = 1;
  p.a = a;
  p.a_stride = a_stride;
  p.M = M;
  p.g = *grouped;
  p.split = 1;
  const bool wide = MB_BLOCKS(N, 128) * grouped->max_tiles >= 4 * sm_count();
  if (wide) launch<128>(s, p, dim3(MB_BLOCKS(N, 128), grouped->max_tiles), paired_rows(w));
  else launch<64>(s, p, dim3(MB_BLOCKS(N, 64), grouped->max_tiles), paired_rows(w));
  return 1;
}

MB_TRACE_ATTACH(trace_attach_matmul_q8)

}  // namespace markbase::cuda
