// Matrix products for prefill (many tokens): out[m, n] = dot(a[m], W[n]).
//
// Tiles of 64 token rows x 128 weight rows x 32 columns. The weight tile is decoded from its
// blocks (metal/dequant.h) into shared memory, so each weight is read once per 64 tokens and no
// dequantized copy of a tensor ever exists. Two arithmetic paths share the tiling:
//  - precise (float32 activations everywhere, the reference mode): float32 FMAs;
//  - default: the tiles are stored as f16 and multiplied on the tensor cores (wmma 16x16x16,
//    float32 accumulation). Hopper's wgmma would be faster still; wmma is what this first version
//    uses because its fragments are portable to the PTX target as well.
// The grouped form serves MoE prefill: a device tile list (built by moe.cu) says which expert and
// which run of the expert-sorted token entries each tile covers; tiles past the list's length exit.
// The split-K form (matmul_split_k) serves products with few outputs, the MoE router in prefill
// (128 float32 rows): there one column of tiles would give the GPU a handful of blocks, so each
// block takes a run of K instead, writes its partial tile to a scratch buffer, and a second launch
// sums the runs in order (the same bits on every run, unlike atomics).
#include <mma.h>

#include <algorithm>

#include "backend/cuda/matmul_tiles.cuh"
#include "backend/cuda/matvec.cuh"

namespace markbase::cuda {
namespace {

constexpr int BM = kMatmulBM, BN = 128, BK = 32, kThreads = 256;
constexpr int kPadH = 8;   // f16 row padding (wmma needs ldm % 8 == 0; also spreads banks)
constexpr int kPadC = 4;
constexpr int kSmemBytes = BM * (BN + kPadC) * 4;  // the largest use: the f32 output tile (TC path)
static_assert(kSmemBytes >= (BM + BN) * (BK + kPadH) * 2, "f16 tiles fit");
static_assert(kSmemBytes >= (BM + BN) * BK * 4, "f32 tiles fit");

struct Args {
  WeightRef w;
  int N;
  const float* a;
  int a_stride;
  int M;
  float* out;
  int out_stride;
  Grouped g;
  int k_chunk;          // columns a block (a multiple of BK); K when not split
  size_t split_stride;  // floats between split z's output tiles (0: not split)
};

__device__ __forceinline__ float4 load_a4(const float* row, int k, int K, bool vec) {
  if (!row) return make_float4(0, 0, 0, 0);
  if (vec && k + 4 <= K) return *reinterpret_cast<const float4*>(row + k);
  float r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = k + j < K ? row[k + j] : 0.0f;
  return make_float4(r[0], r[1], r[2], r[3]);
}

// TYPE is a template parameter so that the tile decoding has no run-time type switch.
template <bool TC, int TYPE>
__global__ void __launch_bounds__(kThreads) matmul_kernel(Args p) {
  pdl_entry();
  __shared__ __align__(16) unsigned char smem[kSmemBytes];
  TileRows tr;
  if (!tr.init(p.w, p.g, p.M, BM)) return;
  const int tid = threadIdx.x, K = p.w.K, n0 = blockIdx.x * BN;
  const int k_begin = blockIdx.z * p.k_chunk, k_end = min(K, k_begin + p.k_chunk);
  float* const out = p.out + blockIdx.z * p.split_stride;
  const bool vec = (p.a_stride & 3) == 0;
  // Each thread loads 2 float4 of the A tile and 4 of the W tile per step; their rows are fixed.
  const float* arow[2];
  int am[2], ak[2];
  for (int r = 0; r < 2; ++r) {
    const int idx = tid + kThreads * r;
    am[r] = idx / (BK / 4);
    ak[r] = (idx % (BK / 4)) * 4;
    const int ar = tr.a_row(am[r]);
    arow[r] = ar >= 0 ? p.a + static_cast<size_t>(ar) * p.a_stride : nullptr;
  }
  const mb_u8* wrow[4];
  int wn[4], wk[4];
  for (int r = 0; r < 4; ++r) {
    const int idx = tid + kThreads * r;
    wn[r] = idx / (BK / 4);
    wk[r] = (idx % (BK / 4)) * 4;
    wrow[r] = n0 + wn[r] < p.N ? tr.w + static_cast<size_t>(n0 + wn[r]) * p.w.row_bytes : nullptr;
  }

  if constexpr (TC) {
    using namespace nvcuda;
    __half* As = reinterpret_cast<__half*>(smem);                 // [BM][BK + kPadH]
    __half* Ws = As + BM * (BK + kPadH);                          // [BN][BK + kPadH]
    const int warp = tid >> 5, wm = warp / 4, wn_ = warp % 4;     // 2 x 4 warps of 32 x 32
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[2][2];
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j) wmma::fill_fragment(acc[i][j], 0.0f);
    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
      for (int r = 0; r < 2; ++r) {
        const float4 v = load_a4(arow[r], k0 + ak[r], K, vec);
        __half* d = As + am[r] * (BK + kPadH) + ak[r];
        d[0] = __float2half(v.x); d[1] = __float2half(v.y); d[2] = __float2half(v.z); d[3] = __float2half(v.w);
      }
      for (int r = 0; r < 4; ++r) {
        const float4 v = wrow[r] ? w4<TYPE>(wrow[r], k0 + wk[r], K) : make_float4(0, 0, 0, 0);
        __half* d = Ws + wn[r] * (BK + kPadH) + wk[r];
        d[0] = __float2half(v.x); d[1] = __float2half(v.y); d[2] = __float2half(v.z); d[3] = __float2half(v.w);
      }
      __syncthreads();
#pragma unroll
      for (int kk = 0; kk < BK; kk += 16) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __half, wmma::row_major> fa[2];
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __half, wmma::col_major> fb[2];
        for (int i = 0; i < 2; ++i)
          wmma::load_matrix_sync(fa[i], As + (wm * 32 + i * 16) * (BK + kPadH) + kk, BK + kPadH);
        for (int j = 0; j < 2; ++j)
          wmma::load_matrix_sync(fb[j], Ws + (wn_ * 32 + j * 16) * (BK + kPadH) + kk, BK + kPadH);
        for (int i = 0; i < 2; ++i)
          for (int j = 0; j < 2; ++j) wmma::mma_sync(acc[i][j], fa[i], fb[j], acc[i][j]);
      }
      __syncthreads();
    }
    float* Cs = reinterpret_cast<float*>(smem);  // [BM][BN + kPadC], reuses the tiles' memory
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 2; ++j)
        wmma::store_matrix_sync(Cs + (wm * 32 + i * 16) * (BN + kPadC) + wn_ * 32 + j * 16, acc[i][j],
                                BN + kPadC, wmma::mem_row_major);
    __syncthreads();
    for (int idx = tid; idx < BM * BN; idx += kThreads) {
      const int m = idx / BN, n = idx % BN;
      const int orow = tr.o_row(m);
      if (orow >= 0 && n0 + n < p.N) out[static_cast<size_t>(orow) * p.out_stride + n0 + n] = Cs[m * (BN + kPadC) + n];
    }
  } else {
    float* As = reinterpret_cast<float*>(smem);  // [BK][BM], k-major: a thread reads 4 rows as a float4
    float* Ws = As + BK * BM;                    // [BK][BN]
    const int tm = tid / 16, tn = tid % 16;      // rows 4 tm .. 4 tm + 3; columns tn + 16 j
    float acc[4][8];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;
    for (int k0 = k_begin; k0 < k_end; k0 += BK) {
      for (int r = 0; r < 2; ++r) {
        const float4 v = load_a4(arow[r], k0 + ak[r], K, vec);
        As[(ak[r] + 0) * BM + am[r]] = v.x; As[(ak[r] + 1) * BM + am[r]] = v.y;
        As[(ak[r] + 2) * BM + am[r]] = v.z; As[(ak[r] + 3) * BM + am[r]] = v.w;
      }
      for (int r = 0; r < 4; ++r) {
        const float4 v = wrow[r] ? w4<TYPE>(wrow[r], k0 + wk[r], K) : make_float4(0, 0, 0, 0);
        Ws[(wk[r] + 0) * BN + wn[r]] = v.x; Ws[(wk[r] + 1) * BN + wn[r]] = v.y;
        Ws[(wk[r] + 2) * BN + wn[r]] = v.z; Ws[(wk[r] + 3) * BN + wn[r]] = v.w;
      }
      __syncthreads();
#pragma unroll 8
      for (int kk = 0; kk < BK; ++kk) {
        const float4 av = *reinterpret_cast<const float4*>(As + kk * BM + tm * 4);
        const float a4[4] = {av.x, av.y, av.z, av.w};
        float wv[8];
#pragma unroll
        for (int j = 0; j < 8; ++j) wv[j] = Ws[kk * BN + tn + 16 * j];
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(a4[i], wv[j], acc[i][j]);
      }
      __syncthreads();
    }
    for (int i = 0; i < 4; ++i) {
      const int orow = tr.o_row(tm * 4 + i);
      if (orow < 0) continue;
      float* o = out + static_cast<size_t>(orow) * p.out_stride;
      for (int j = 0; j < 8; ++j)
        if (n0 + tn + 16 * j < p.N) o[n0 + tn + 16 * j] = acc[i][j];
    }
  }
}

// out[m, n] = the sum over z < splits of part[z * stride + m * N + n], z in order.
__global__ void sum_splits_kernel(const float* part, int splits, size_t stride, int M, int N, float* out,
                                  int out_stride) {
  pdl_entry();
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= M * N) return;
  float s = 0.0f;
  for (int z = 0; z < splits; ++z) s += part[z * stride + i];
  out[static_cast<size_t>(i / N) * out_stride + i % N] = s;
}

// Runs of K (whole BK steps each) for an M x N product: about one wave of blocks (the float32
// tile kernel's 96 registers a thread fit 2 blocks an SM), at least one step a run.
int split_chunk(int N, int M, int K) {
  const int tiles = static_cast<int>(MB_BLOCKS(N, BN) * MB_BLOCKS(M, BM));
  const int steps = static_cast<int>(MB_BLOCKS(K, BK));
  const int splits = std::max(1, std::min(steps, (2 * sm_count() + tiles - 1) / tiles));
  return static_cast<int>(MB_BLOCKS(steps, splits)) * BK;
}

}  // namespace

size_t matmul_split_k_floats(int N, int M, int K) {
  return static_cast<size_t>(MB_BLOCKS(K, split_chunk(N, M, K))) * M * N;
}

int matmul_split_k(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int M, float* out,
                   int out_stride, float* scratch) {
  const int K = w.K, chunk = split_chunk(N, M, K), splits = static_cast<int>(MB_BLOCKS(K, chunk));
  const size_t stride = static_cast<size_t>(M) * N;
  Args p{w, N, a, a_stride, M, scratch, N, Grouped{}, chunk, stride};
  const dim3 grid(MB_BLOCKS(N, BN), MB_BLOCKS(M, BM), splits);
#define MB_MATMUL(TY) enqueue(matmul_kernel<false, TY>, grid, kThreads, 0, s, p); break;
  MB_TYPE_DISPATCH(w.type, MB_MATMUL)
#undef MB_MATMUL
  enqueue(sum_splits_kernel, MB_BLOCKS(M * N, 256), 256, 0, s, scratch, splits, stride, M, N, out, out_stride);
  return 2;
}

int matmul(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int M, float* out,
           int out_stride, bool precise, const Grouped* grouped) {
  Args p{w, N, a, a_stride, M, out, out_stride, grouped ? *grouped : Grouped{}, w.K, 0};
  const int tiles_m = grouped ? grouped->max_tiles : static_cast<int>(MB_BLOCKS(M, BM));
  const dim3 grid(MB_BLOCKS(N, BN), tiles_m);
#define MB_MATMUL(TY)                                                  \
  if (precise) enqueue(matmul_kernel<false, TY>, grid, kThreads, 0, s, p); \
  else enqueue(matmul_kernel<true, TY>, grid, kThreads, 0, s, p);           \
  return 1;
  MB_TYPE_DISPATCH(w.type, MB_MATMUL)
#undef MB_MATMUL
  return 0;
}

MB_TRACE_ATTACH(trace_attach_matmul)

}  // namespace markbase::cuda
