// Prefill products on 8-bit activations and the int8 tensor cores (default mode; Q4_0 and Q8_0
// weights): out[m, n] = sum over blocks b of da[m, b] dw[n, b] sum_i qa[m, 32 b + i] qw[n, 32 b + i].
//
// The activation rows arrive quantized (quantize_q8: blocks of 32 int8 values with one float
// scale, the decode products' format), and each weight tile is decoded from its blocks into
// signed int8 codes in shared memory (Q4_0's 4-bit codes minus their offset 8; Q8_0's as they
// are). One mma.sync m16n8k32 spans exactly one block of both sides, so its int32 sums are scaled
// by the two blocks' scales into float32 accumulators, as llama.cpp's MMQ does. Against the f16
// wmma tiles of matmul.cu (decoded weights and activations converted to f16 per tile) this
// moved the 26B-A4B prefill from 2.1k to 7.5k tokens/s on the H200.
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
// shared-memory stores. A row's KB blocks of a stage are contiguous (KB x 18 or 34 bytes), and
// consecutive threads take consecutive 32-bit code words of them (word w of block b of row n:
// bytes 2 + 4w .. 5 + 4w of the block), so a warp's loads cover a few whole rows' stretches
// instead of one word in each of 32 rows: the first version (a thread per block, 32-bit loads)
// spent most of the L1's bandwidth on those scattered words. Blocks start 2-byte aligned (18 and
// 34 bytes), so each word is two 16-bit loads. Thread tid takes words tid + kThreads r, and the
// scales (row, block) tid + kThreads r; kThreads = 2 BN, so the counts per thread do not depend on BN.
template <int TYPE>
struct Staged {
  static constexpr int kBlockBytes = TYPE == MB_Q4_0 ? 18 : 34;
  static constexpr int kWordsPerBlock = TYPE == MB_Q4_0 ? 4 : 8;
  static constexpr int kWords = kWordsPerBlock * KB / 2;  // per thread: BN KB words over 2 BN threads
  static constexpr int kScales = KB / 2;
  unsigned q[kWords];
  unsigned short d[kScales];
};

template <class C, int TYPE>
__device__ __forceinline__ void load_w_stage(const Args& p, const TileRows& tr, int n0, int kb0, int nb,
                                             Staged<TYPE>& s) {
  using S = Staged<TYPE>;
  constexpr int kThreads = C::kThreads, W = S::kWordsPerBlock;
  // Word tid + kThreads r: the block and word stay the thread's own (kThreads is a multiple of the
  // W KB words of a row); the row advances by kThreads / (W KB) per r.
  constexpr int kRowStep = kThreads / (W * KB);
  const int tid = threadIdx.x, n = n0 + tid / (W * KB), b = kb0 + (tid / W) % KB, w = tid % W;
  const size_t step = static_cast<size_t>(kRowStep) * p.w.row_bytes;
  const mb_u8* q = tr.w + static_cast<size_t>(n) * p.w.row_bytes + S::kBlockBytes * b + 2 + 4 * w;
#pragma unroll
  for (int r = 0; r < S::kWords; ++r) {
    if (n + kRowStep * r < p.N && b < nb) {
      const unsigned short* h = reinterpret_cast<const unsigned short*>(q + step * r);
      s.q[r] = static_cast<unsigned>(__ldg(h)) | (static_cast<unsigned>(__ldg(h + 1)) << 16);
    } else {
      s.q[r] = TYPE == MB_Q4_0 ? 0x88888888u : 0u;  // codes of 0 (and a zero scale below)
    }
  }
  constexpr int kScaleStep = kThreads / KB;
  const int sn = n0 + tid / KB, sb = kb0 + tid % KB;
  const mb_u8* d = tr.w + static_cast<size_t>(sn) * p.w.row_bytes + S::kBlockBytes * sb;
  const size_t dstep = static_cast<size_t>(kScaleStep) * p.w.row_bytes;
#pragma unroll
  for (int r = 0; r < S::kScales; ++r)
    s.d[r] = sn + kScaleStep * r < p.N && sb < nb ? __ldg(reinterpret_cast<const unsigned short*>(d + dstep * r))
                                                  : static_cast<unsigned short>(0);
}

template <class C, int TYPE>
__device__ __forceinline__ void store_w_stage(const Staged<TYPE>& s, typename C::Stage& st) {
  using S = Staged<TYPE>;
  constexpr int kThreads = C::kThreads, W = S::kWordsPerBlock;
  const int tid = threadIdx.x;
  const int n = tid / (W * KB), b = (tid / W) % KB, w = tid % W;
#pragma unroll
  for (int r = 0; r < S::kWords; ++r) {
    signed char* dst = &st.w[n + r * (kThreads / (W * KB))][b * 32 + 4 * w];
    if constexpr (TYPE == MB_Q4_0) {
      // Byte j of word w holds weight 4w + j in its low nibble and weight 16 + 4w + j in its high one.
      *reinterpret_cast<unsigned*>(dst) = __vsub4(s.q[r] & 0x0F0F0F0Fu, 0x08080808u);
      *reinterpret_cast<unsigned*>(dst + 16) = __vsub4((s.q[r] >> 4) & 0x0F0F0F0Fu, 0x08080808u);
    } else {
      *reinterpret_cast<unsigned*>(dst) = s.q[r];
    }
  }
#pragma unroll
  for (int r = 0; r < S::kScales; ++r) {
    const int u = tid + kThreads * r;
    st.dw[u % KB][u / KB] = __half2float(__ushort_as_half(s.d[r]));
  }
}

// 128 registers a thread: two blocks of 8 warps (or four of 4) per multiprocessor.
template <int TYPE, int BN>
__global__ void __launch_bounds__(2 * BN, 256 / BN) matmul_q8_kernel(Args p) {
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

  Staged<TYPE> s;
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
  cudaFuncSetAttribute(matmul_q8_kernel<MB_Q4_0, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  cudaFuncSetAttribute(matmul_q8_kernel<MB_Q8_0, BN>, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
}

template <int BN>
void launch(cudaStream_t s, const Args& p, int tiles_m) {
  const dim3 grid(MB_BLOCKS(p.N, BN), tiles_m);
  constexpr int threads = Tiles<BN>::kThreads, smem = Tiles<BN>::kSmemBytes;
  if (p.w.type == MB_Q4_0) matmul_q8_kernel<MB_Q4_0, BN><<<grid, threads, smem, s>>>(p);
  else matmul_q8_kernel<MB_Q8_0, BN><<<grid, threads, smem, s>>>(p);
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
  // 128-row tiles where they make at least four blocks per multiprocessor (two rounds of two)
  const bool wide = MMQ_FORCE_BN ? MMQ_FORCE_BN == 128 : MB_BLOCKS(N, 128) * tiles_m >= 4 * g_sm_count;
  if (wide) launch<128>(s, p, tiles_m);
  else launch<64>(s, p, tiles_m);
  return 1;
}

}  // namespace markbase::cuda
