// Prefill products on 8-bit activations and the int8 tensor cores (default mode; Q4_0 and Q8_0
// weights): out[m, n] = sum over blocks b of da[m, b] dw[n, b] sum_i qa[m, 32 b + i] qw[n, 32 b + i].
//
// The activation rows arrive quantized (quantize_q8: blocks of 32 int8 values with one float
// scale, the decode products' format), and each weight tile is decoded from its blocks into
// signed int8 codes in shared memory (Q4_0's 4-bit codes minus their offset 8; Q8_0's as they
// are). One mma.sync m16n8k32 spans exactly one block of both sides, so its int32 sums are scaled
// by the two blocks' scales into float32 accumulators, as llama.cpp's MMQ does. In place of the
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
#include "backend/cuda/matmul_tiles.cuh"

namespace markbase::cuda {
namespace {

#ifndef MMQ_FORCE_BN  // 64 or 128: the check harness times one tile width on every shape
#define MMQ_FORCE_BN 0
#endif
constexpr int BM = kMatmulBM, KB = 4;
static_assert(BM == 64, "the warp grid covers 64 rows");
// One row's codes of a stage, padded by 16 bytes: ldmatrix's 8 rows x 16 bytes then hit 32
// distinct banks (row stride 36 words).
constexpr int kRowBytes = KB * 32 + 16;

template <int BN_>
struct Tiles {
  static constexpr int BN = BN_, kThreads = 2 * BN_, kWarpsN = BN_ / 32;
  static constexpr int kAChunks = BM * KB * 2 / kThreads;  // 16-byte activation chunks per thread
  static constexpr int kAScales = BM * KB / kThreads;      // activation scales per thread
  struct Stage {
    signed char a[BM][kRowBytes];
    signed char w[BN][kRowBytes];
    float da[KB][BM];  // block-major: a lane's two columns' weight scales are one float2
    float dw[KB][BN];
  };
  static constexpr int kSmemBytes = 2 * static_cast<int>(sizeof(Stage));
};

struct Args {
  WeightRef w;
  int N;
  Q8Vec a;
  int a_stride;  // bytes of codes per activation row (a multiple of 32); scales: a_stride / 32
  int M;
  float* out;
  int out_stride;
  Grouped g;
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
    cp_async(&st.da[idx % KB][idx / KB], src, 4, ok ? 4 : 0);
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
template <int TYPE, bool PAIRED>
struct Staged {
  static constexpr int kBlockBytes = TYPE == MB_Q4_0 ? 18 : 34;
  static constexpr int kLoads = PAIRED ? KB / 4 : KB / 2;              // pairs or single blocks
  static constexpr int kPerRow = PAIRED ? KB / 2 : KB;                 // loads per weight row
  static constexpr int kWords = kBlockBytes / 2;  // a pair's 32-bit words, or one block's 16-bit halves
  unsigned v[kLoads][kWords];
};

template <class C, int TYPE, bool PAIRED>
__device__ __forceinline__ void load_w_stage(const Args& p, const TileRows& tr, int n0, int kb0, int nb,
                                             Staged<TYPE, PAIRED>& s) {
  using S = Staged<TYPE, PAIRED>;
  constexpr int kThreads = C::kThreads;
  const int tid = threadIdx.x;
#pragma unroll
  for (int r = 0; r < S::kLoads; ++r) {
    const int idx = tid + kThreads * r, n = n0 + idx / S::kPerRow;
    const int b = kb0 + (idx % S::kPerRow) * (PAIRED ? 2 : 1);  // nb is even when PAIRED
    const bool ok = n < p.N && b < nb;
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
  st.dw[b][n] = __half2float(__ushort_as_half(d));
  unsigned q[kQs];
#pragma unroll
  for (int i = 0; i < kQs; ++i) q[i] = word_at(2 + 4 * i);
  int4* dst = reinterpret_cast<int4*>(&st.w[n][b * 32]);
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
      // words 0 .. 16 (Q8_0): block 1 at byte 34 = word 8 + 2 bytes.
      const int b = (idx % S::kPerRow) * 2;
      store_block<TYPE>(s.v[r], 0, st, n, b);
      store_block<TYPE>(s.v[r] + S::kBlockBytes / 4, 2, st, n, b + 1);
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

// 128 registers a thread: two blocks of 8 warps (or four of 4) per multiprocessor.
template <int TYPE, bool PAIRED, int BN>
__global__ void __launch_bounds__(2 * BN, 256 / BN) matmul_q8_kernel(Args p) {
  pdl_entry();
  using C = Tiles<BN>;
  using Stage = typename C::Stage;
  constexpr int kThreads = C::kThreads;
  extern __shared__ __align__(16) unsigned char smem[];
  Stage* stages = reinterpret_cast<Stage*>(smem);
  TileRows tr;
  if (!tr.init(p.w, p.g, p.M, BM)) return;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int wm = warp / C::kWarpsN, wn = warp % C::kWarpsN, g = lane / 4, t = lane % 4;
  const int n0 = blockIdx.x * BN, nb = p.w.K / 32, stages_n = (nb + KB - 1) / KB;
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

  Staged<TYPE, PAIRED> s;
  copy_a_stage<C>(p, arow, 0, nb, stages[0]);
  load_w_stage<C>(p, tr, n0, 0, nb, s);
  store_w_stage<C>(s, stages[0]);
  cp_async_wait_all();
  __syncthreads();
  for (int st = 0; st < stages_n; ++st) {
    const bool more = st + 1 < stages_n;
    if (more) {  // the next stage's loads, in flight during this stage's products
      copy_a_stage<C>(p, arow, (st + 1) * KB, nb, stages[(st + 1) & 1]);
      load_w_stage<C>(p, tr, n0, (st + 1) * KB, nb, s);
    }
    const Stage& S = stages[st & 1];
#pragma unroll 1
    for (int kb = 0; kb < KB; ++kb) {
      int a[2][4], b[4][2];
      float da[2][2], dw[4][2];
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
#pragma unroll
      for (int i = 0; i < 2; ++i) {
        const int m = wm * 32 + i * 16 + g;
        da[i][0] = S.da[kb][m];
        da[i][1] = S.da[kb][m + 8];
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float2 v = *reinterpret_cast<const float2*>(&S.dw[kb][wn * 32 + j * 8 + 2 * t]);
        dw[j][0] = v.x;
        dw[j][1] = v.y;
      }
#pragma unroll
      for (int i = 0; i < 2; ++i)
#pragma unroll
        for (int j = 0; j < 4; ++j) {
          int c[4] = {kMagicBits, kMagicBits, kMagicBits, kMagicBits};
          mma_s8(c, a[i], b[j]);
#pragma unroll
          for (int r = 0; r < 4; ++r)
            acc[i][j][r] = fmaf(fmaf(__int_as_float(c[r]), dw[j][r & 1], -kMagic * dw[j][r & 1]), da[i][r >> 1],
                                acc[i][j][r]);
        }
    }
    if (more) store_w_stage<C>(s, stages[(st + 1) & 1]);
    cp_async_wait_all();
    __syncthreads();
  }

  // C fragment: value r of tile (i, j) is row g + 8 (r / 2), column 2 t + r % 2.
#pragma unroll
  for (int i = 0; i < 2; ++i)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int orow = tr.o_row(wm * 32 + i * 16 + g + 8 * h);
      if (orow < 0) continue;
      float* o = p.out + static_cast<size_t>(orow) * p.out_stride;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int n = n0 + wn * 32 + j * 8 + 2 * t;
        if (n < p.N) o[n] = acc[i][j][2 * h];
        if (n + 1 < p.N) o[n + 1] = acc[i][j][2 * h + 1];
      }
    }
}

template <int BN>
void raise_smem_limit() {
  constexpr int bytes = Tiles<BN>::kSmemBytes;
  cudaFuncSetAttribute(matmul_q8_kernel<MB_Q4_0, true, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  cudaFuncSetAttribute(matmul_q8_kernel<MB_Q4_0, false, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  cudaFuncSetAttribute(matmul_q8_kernel<MB_Q8_0, true, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  cudaFuncSetAttribute(matmul_q8_kernel<MB_Q8_0, false, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int BN>
void launch(cudaStream_t s, const Args& p, int tiles_m, bool paired) {
  const dim3 grid(MB_BLOCKS(p.N, BN), tiles_m);
  constexpr int threads = Tiles<BN>::kThreads, smem = Tiles<BN>::kSmemBytes;
  if (p.w.type == MB_Q4_0) {
    if (paired) enqueue(matmul_q8_kernel<MB_Q4_0, true, BN>, grid, threads, smem, s, p);
    else enqueue(matmul_q8_kernel<MB_Q4_0, false, BN>, grid, threads, smem, s, p);
  } else {
    if (paired) enqueue(matmul_q8_kernel<MB_Q8_0, true, BN>, grid, threads, smem, s, p);
    else enqueue(matmul_q8_kernel<MB_Q8_0, false, BN>, grid, threads, smem, s, p);
  }
}

int g_sm_count = 132;

}  // namespace

void matmul_q8_setup() {
  raise_smem_limit<64>();
  raise_smem_limit<128>();
  int dev = 0;
  if (cudaGetDevice(&dev) == cudaSuccess) cudaDeviceGetAttribute(&g_sm_count, cudaDevAttrMultiProcessorCount, dev);
}

int matmul_q8(cudaStream_t s, const WeightRef& w, int N, Q8Vec a, int a_stride, int M, float* out, int out_stride,
              const Grouped* grouped) {
  if (w.type != MB_Q4_0 && w.type != MB_Q8_0) return 0;  // the backend checks has_q8_dot() first
  const Args p{w, N, a, a_stride, M, out, out_stride, grouped ? *grouped : Grouped{}};
  const int tiles_m = grouped ? grouped->max_tiles : static_cast<int>(MB_BLOCKS(M, BM));
  // 32-bit weight loads need 4-byte aligned rows (an even number of blocks) and matrices
  const bool paired = (w.K / 32) % 2 == 0 && (reinterpret_cast<uintptr_t>(w.data) & 3) == 0 &&
                      w.row_bytes % 4 == 0 && w.expert_bytes % 4 == 0;
  // 128-row tiles where they make at least four blocks per multiprocessor (two rounds of two)
  const bool wide = MMQ_FORCE_BN ? MMQ_FORCE_BN == 128 : MB_BLOCKS(N, 128) * tiles_m >= 4 * g_sm_count;
  if (wide) launch<128>(s, p, tiles_m, paired);
  else launch<64>(s, p, tiles_m, paired);
  return 1;
}

}  // namespace markbase::cuda
