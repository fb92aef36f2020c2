// Matrix-vector products for decode (one to a few tokens): bound by the bytes of the weights, so
// each weight is read exactly once per launch and dotted with every token's activations.
//
// Layout: one warp per output row; lane l reads weights [8l, 8l + 8) of each 256-weight stretch
// of the row, so a warp's loads cover 256 consecutive weights (144 contiguous bytes of Q4_0) and
// the blocks of a row stream through in order. The weight type is a template parameter: the
// block decoding (metal/dequant.h, shared with the Metal kernels) is then inlined without a
// run-time switch, which matters here because decode does little arithmetic per byte.
#include "backend/cuda/fast_dot.cuh"

namespace markbase::cuda {
namespace {

constexpr int kWarps = 8;  // rows per block

// NT tokens per block row-group (blockIdx.y picks which NT); tokens past T are skipped.
template <int TYPE, int NT>
__global__ void __launch_bounds__(kWarps * 32) matvec_kernel(WeightRef w, int N, const float* __restrict__ a,
                                                              int a_stride, int T, float* __restrict__ out,
                                                              int out_stride) {
  pdl_trigger();
  // The block's rows are contiguous: ask for them in L2 while the previous kernel finishes.
  const int n_first = blockIdx.x * kWarps;
  if (blockIdx.y == 0) prefetch_l2(w.data + static_cast<size_t>(n_first) * w.row_bytes,
                                   static_cast<size_t>(min(kWarps, N - n_first)) * w.row_bytes);
  pdl_wait();
  const int lane = threadIdx.x & 31;
  const int n = n_first + (threadIdx.x >> 5);
  if (n >= N) return;
  const int t0 = blockIdx.y * NT;
  const int K = w.K;
  const mb_u8* row = w.data + static_cast<size_t>(n) * w.row_bytes;
  const bool vec = (a_stride & 3) == 0;
  float acc[NT];
#pragma unroll
  for (int t = 0; t < NT; ++t) acc[t] = 0.0f;
  for (int i = lane * 8; i < K; i += 256) {
    const float4 wa = w4<TYPE>(row, i, K), wb = w4<TYPE>(row, i + 4, K);
#pragma unroll
    for (int t = 0; t < NT; ++t) {
      const int tt = min(t0 + t, T - 1);  // past T: recompute the last token, never stored
      const float* x = a + static_cast<size_t>(tt) * a_stride;
      acc[t] += dot4(wa, x4(x, i, K, vec)) + dot4(wb, x4(x, i + 4, K, vec));
    }
  }
#pragma unroll
  for (int t = 0; t < NT; ++t) {
    const float s = warp_sum(acc[t]);
    if (lane == 0 && t0 + t < T) out[static_cast<size_t>(t0 + t) * out_stride + n] = s;
  }
}

// Few rows (the MoE router: 128 rows of 2816 floats): one row per block, its 128 threads
// striding over the row 4 weights at a time, so that the row count alone does not leave most of
// the GPU idle (one warp per row took 10.6 us on the H200 for the router).
constexpr int kRowBlockThreads = 128;

template <int TYPE>
__global__ void __launch_bounds__(kRowBlockThreads) matvec_row_block_kernel(WeightRef w, const float* __restrict__ x,
                                                                            float* __restrict__ out) {
  pdl_trigger();
  const int n = blockIdx.x;
  prefetch_l2(w.data + static_cast<size_t>(n) * w.row_bytes, w.row_bytes);
  pdl_wait();
  const float acc = block_row_dot<TYPE, kRowBlockThreads>(w.data + static_cast<size_t>(n) * w.row_bytes, w.K, x);
  if (threadIdx.x == 0) out[n] = acc;
}

// The Q4_0 / Q8_0 fast path (fast_dot.cuh) for one token: G lanes share a group of R rows
// (R rows read against one load of x), 4 warps per block.
constexpr int kFastWarps = 4;

template <int TYPE, int G, int R>
__global__ void __launch_bounds__(kFastWarps * 32) matvec_fast_kernel(WeightRef w, int N, const float* __restrict__ a,
                                                                       float* __restrict__ out) {
  pdl_trigger();
  constexpr int kBlockRows = kFastWarps * (32 / G) * R;
  const int b0 = blockIdx.x * kBlockRows;
  prefetch_l2(w.data + static_cast<size_t>(b0) * w.row_bytes, static_cast<size_t>(min(kBlockRows, N - b0)) * w.row_bytes);
  pdl_wait();
  const int lane = threadIdx.x & 31, sub = lane % G;
  const int n0 = ((blockIdx.x * kFastWarps + (threadIdx.x >> 5)) * (32 / G) + lane / G) * R;
  const mb_u8* rows[R];
#pragma unroll
  for (int r = 0; r < R; ++r) rows[r] = w.data + static_cast<size_t>(min(n0 + r, N - 1)) * w.row_bytes;
  float acc[R];
  pair_dot_rows<TYPE, R>(rows, n0 < N ? w.K / 64 : 0, a, sub, G, acc);
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const float v = group_sum<G>(acc[r]);  // every lane takes part in the shuffles
    if (sub == 0 && n0 + r < N) out[n0 + r] = v;
  }
}

template <int TYPE, int G, int R>
int launch_fast(cudaStream_t s, const WeightRef& w, int N, const float* a, float* out) {
  constexpr int rows_per_block = kFastWarps * (32 / G) * R;
  enqueue(matvec_fast_kernel<TYPE, G, R>, MB_BLOCKS(N, rows_per_block), kFastWarps * 32, 0, s, w, N, a, out);
  return 1;
}

template <int TYPE>
int launch_type(cudaStream_t s, const WeightRef& w, int N, const float* a, int as, int T, float* out, int os) {
  const dim3 block(kWarps * 32);
  if constexpr (has_fast_dot(TYPE)) {
    if (T == 1 && fast_dot_ok(TYPE, w.K) && (as & 3) == 0 && (reinterpret_cast<uintptr_t>(a) & 15) == 0 &&
        (reinterpret_cast<uintptr_t>(w.data) & 3) == 0) {
      const int pairs = w.K / 64;
      if (pairs < 24) return launch_fast<TYPE, 8, 2>(s, w, N, a, out);
      // Four rows share each load of x (the H200 tuning run measured 4.95 ms/token on the dense
      // comparison model with 4, 5.08 with 2, 6.45 with 1). Default-mode decode takes the 8-bit
      // path (matvec_q8.cu) instead; this one serves precise mode.
      return launch_fast<TYPE, 32, 4>(s, w, N, a, out);
    }
  }
  if (T == 1 && N < 1024) {
    enqueue(matvec_row_block_kernel<TYPE>, N, kRowBlockThreads, 0, s, w, a, out);
  } else if (T == 1) {
    enqueue(matvec_kernel<TYPE, 1>, dim3(MB_BLOCKS(N, kWarps), 1), block, 0, s, w, N, a, as, T, out, os);
  } else {
    enqueue(matvec_kernel<TYPE, 4>, dim3(MB_BLOCKS(N, kWarps), MB_BLOCKS(T, 4)), block, 0, s, w, N, a, as, T, out, os);
  }
  return 1;
}

}  // namespace

int matvec(cudaStream_t s, const WeightRef& w, int N, const float* a, int a_stride, int T, float* out,
           int out_stride) {
#define MB_MATVEC(TY) return launch_type<TY>(s, w, N, a, a_stride, T, out, out_stride);
  MB_TYPE_DISPATCH(w.type, MB_MATVEC)
#undef MB_MATVEC
  return 0;  // the backend checks types before launching
}

MB_TRACE_ATTACH(trace_attach_matvec)

}  // namespace markbase::cuda
