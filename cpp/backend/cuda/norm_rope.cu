// Row-wise and element-wise ops: embedding rows, RMS norm, GeGLU, add, scale, softcap, RoPE.
// Each mirrors the CPU op of the same name (cpu_backend.cpp) operation for operation.
#include "backend/cuda/q8.cuh"

namespace markbase::cuda {
namespace {

__global__ void embed_kernel(WeightRef w, const StepBuf* step, int vocab, float f, int n, float* out, int os) {
  pdl_entry();
  const int t = blockIdx.x;
  const int id = min(max(step->tokens[t], 0), vocab - 1);  // the session checks ids before a run
  const mb_u8* row = w.data + static_cast<size_t>(id) * w.row_bytes;
  float* o = out + static_cast<size_t>(t) * os;
  for (int i = threadIdx.x * 4; i < w.K; i += blockDim.x * 4) {
    const float4 v = weights4(w.type, row, i, w.K);
    const float e[4] = {v.x, v.y, v.z, v.w};
    for (int j = 0; j < 4 && i + j < w.K; ++j) o[i + j] = i + j < n ? e[j] * f : e[j];
  }
}

// One block per (row, group). Q8: one row, one group, also quantized (q8.cuh); the loops then
// step by whole blocks of threads so that every warp holds 32 consecutive values.
template <bool Q8>
__global__ void rms_norm_kernel(const float* a, int as, const float* w, int groups, int G, float eps, float* out,
                                int os, Q8Vec q8) {
  pdl_entry();
  const int row = blockIdx.x / groups, g = blockIdx.x % groups;
  const float* x = a + static_cast<size_t>(row) * as + g * G;
  float* y = out + static_cast<size_t>(row) * os + g * G;
  float ss = 0.0f;
#pragma unroll 4  // several loads in flight: these small kernels are latency-bound
  for (int j = threadIdx.x; j < G; j += blockDim.x) ss += x[j] * x[j];
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / G + eps);
  if constexpr (Q8) {
    for (int j0 = 0; j0 < G; j0 += blockDim.x) {
      const int j = j0 + threadIdx.x;
      float v = 0.0f;
      if (j < G) y[j] = v = w ? (x[j] * r) * w[j] : x[j] * r;
      q8_store_warp(v, j, j < G, q8);
    }
  } else {
#pragma unroll 4
    for (int j = threadIdx.x; j < G; j += blockDim.x) y[j] = w ? (x[j] * r) * w[j] : x[j] * r;
  }
}

enum class Ew { GeluMul, Add, Scale, Softcap };

template <Ew OP>
__global__ void elementwise_kernel(const float* a, int as, const float* b, int bs, float f, int n, float* out,
                                   int os) {
  pdl_entry();
  const int row = blockIdx.y;
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j >= n) return;
  const float x = a[static_cast<size_t>(row) * as + j];
  float y;
  if constexpr (OP == Ew::GeluMul) y = mb_gelu_tanh(x) * b[static_cast<size_t>(row) * bs + j];
  else if constexpr (OP == Ew::Add) y = x + b[static_cast<size_t>(row) * bs + j];
  else if constexpr (OP == Ew::Scale) y = x * f;
  else y = f * tanhf(x / f);
  out[static_cast<size_t>(row) * os + j] = y;
}

// GeGLU of one row, quantized as well (q8.cuh): 32 consecutive values per warp.
__global__ void gelu_mul_q8_kernel(const float* a, const float* b, int n, float* out, Q8Vec q8) {
  pdl_entry();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  float y = 0.0f;
  if (j < n) out[j] = y = mb_gelu_tanh(a[j]) * b[j];
  q8_store_warp(y, j, j < n, q8);
}

template <Ew OP>
int launch_ew(cudaStream_t s, const float* a, int as, const float* b, int bs, float f, int n, int rows, float* out,
              int os) {
  enqueue(elementwise_kernel<OP>, dim3(MB_BLOCKS(n, 256), rows), 256, 0, s, a, as, b, bs, f, n, out, os);
  return 1;
}

__global__ void copy_kernel(const float* a, int n, float* out) {
  pdl_entry();
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) out[j] = a[j];
}

// One block per (token, head); the rotation is rope_pair's (common.cuh), as the CPU op's.
__global__ void rope_kernel(const float* a, int as, const float* inv, const StepBuf* step, int heads, int d,
                            float* out, int os) {
  pdl_entry();
  const int t = blockIdx.x / heads, h = blockIdx.x % heads, half = d / 2;
  const float pos = static_cast<float>(step->pos0 + t);
  const float* x = a + static_cast<size_t>(t) * as + h * d;
  float* y = out + static_cast<size_t>(t) * os + h * d;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float x0 = x[j], x1 = x[j + half];
    rope_pair(x0, x1, pos, inv[j]);
    y[j] = x0;
    y[j + half] = x1;
  }
}

// Fused: y = rms_norm(a) * w -> out, then x = (x + y) * sx (a block's post-norm, the residual
// add and the layer scalar that may follow it). Q8: one row, and the new x is quantized too.
template <bool Q8>
__global__ void rms_norm_add_kernel(const float* a, int as, const float* w, int n, float eps, float* out, int os,
                                    float* x, int xs, Q8Vec q8, float sx) {
  pdl_entry();
  const int row = blockIdx.x;
  const float* v = a + static_cast<size_t>(row) * as;
  float* y = out + static_cast<size_t>(row) * os;
  float* r = x + static_cast<size_t>(row) * xs;
  float ss = 0.0f;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += blockDim.x) ss += v[j] * v[j];
  ss = block_sum(ss);
  const float s = 1.0f / sqrtf(ss / n + eps);
  if constexpr (Q8) {
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
      const int j = j0 + threadIdx.x;
      float nx = 0.0f;
      if (j < n) {
        const float t = w ? (v[j] * s) * w[j] : v[j] * s;
        y[j] = t;
        nx = r[j] + t;
        if (sx != 1.0f) nx = nx * sx;
        r[j] = nx;
      }
      q8_store_warp(nx, j, j < n, q8);
    }
  } else {
#pragma unroll 4
    for (int j = threadIdx.x; j < n; j += blockDim.x) {
      const float t = w ? (v[j] * s) * w[j] : v[j] * s;
      y[j] = t;
      const float nx = r[j] + t;
      r[j] = sx != 1.0f ? nx * sx : nx;
    }
  }
}

// Fused: per-head RMS norm then RoPE (QK-norm + rotation), one block per (token, head).
__global__ void rms_norm_rope_kernel(const float* a, int as, const float* w, float eps, const float* inv,
                                     const StepBuf* step, int heads, int d, float* out, int os) {
  pdl_entry();
  const int t = blockIdx.x / heads, h = blockIdx.x % heads, half = d / 2;
  const float* x = a + static_cast<size_t>(t) * as + h * d;
  float* y = out + static_cast<size_t>(t) * os + h * d;
  float ss = 0.0f;
#pragma unroll 4
  for (int j = threadIdx.x; j < d; j += blockDim.x) ss += x[j] * x[j];
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / d + eps);
  const float pos = static_cast<float>(step->pos0 + t);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float x0 = w ? (x[j] * r) * w[j] : x[j] * r;
    float x1 = w ? (x[j + half] * r) * w[j + half] : x[j + half] * r;
    rope_pair(x0, x1, pos, inv[j]);
    y[j] = x0;
    y[j + half] = x1;
  }
}

// Each thread owns elements j = tid + 1024 k (k < kChainPer) of every row of the chain: it loads
// all of an op's operands at once (one memory round trip per op; the first version's strided loops
// made one per 1024 elements, 8 us a chain), and takes an operand that the previous op wrote from
// its registers. Only the norms' sums cross threads (block_sum).
constexpr int kChainThreads = 1024;

__global__ void __launch_bounds__(kChainThreads) row_chain_kernel(RowChain c) {
  pdl_entry();
  float prev[kChainPer];
  const float* prev_out = nullptr;  // the previous op's output, held in prev[] ...
  int prev_n = 0;                   // ... for its first prev_n elements
#pragma unroll
  for (int i = 0; i < kMaxRowOps; ++i) {  // constant indices: the chain stays in parameter space
    if (i >= c.count) break;
    const RowOp o = c.op[i];
    float va[kChainPer], vb[kChainPer];
    const float* held = prev_n >= o.n ? prev_out : nullptr;
#pragma unroll
    for (int k = 0; k < kChainPer; ++k) {
      const int j = threadIdx.x + kChainThreads * k;
      const bool in = j < o.n;
      va[k] = o.a == held ? prev[k] : in ? o.a[j] : 0.0f;
      const float* b = o.kind == RowOpKind::Add ? o.b : o.w;
      vb[k] = b && b == held ? prev[k] : in && b ? b[j] : 1.0f;
    }
    float r = 1.0f;
    if (o.kind == RowOpKind::Norm) {
      float ss = 0.0f;
#pragma unroll
      for (int k = 0; k < kChainPer; ++k) ss += va[k] * va[k];
      ss = block_sum(ss);
      r = 1.0f / sqrtf(ss / o.n + o.f);
    }
    const bool q8 = i == c.count - 1 && c.q8.q;
#pragma unroll
    for (int k = 0; k < kChainPer; ++k) {
      const int j = threadIdx.x + kChainThreads * k;
      float v;
      if (o.kind == RowOpKind::Norm) v = o.w ? (va[k] * r) * vb[k] : va[k] * r;
      else if (o.kind == RowOpKind::Add) v = va[k] + vb[k];
      else v = va[k] * o.f;
      if (j >= o.n) v = 0.0f;
      else o.out[j] = v;
      prev[k] = v;
      if (q8 && kChainThreads * k < o.n) q8_store_warp(v, j, j < o.n, c.q8);
    }
    prev_out = o.out;
    prev_n = o.n;
  }
}

}  // namespace

int row_chain(cudaStream_t s, const RowChain& c) {
  enqueue(row_chain_kernel, 1, kChainThreads, 0, s, c);
  return 1;
}

int rms_norm_add(cudaStream_t s, const float* a, int as, const float* w, int n, float eps, int rows, float* out,
                 int os, float* x, int xs, Q8Vec q8, float scale_x) {
  const int threads = n <= 1024 ? 256 : 1024;
  if (q8.q) enqueue(rms_norm_add_kernel<true>, rows, threads, 0, s, a, as, w, n, eps, out, os, x, xs, q8, scale_x);
  else enqueue(rms_norm_add_kernel<false>, rows, threads, 0, s, a, as, w, n, eps, out, os, x, xs, q8, scale_x);
  return 1;
}

int rms_norm_rope(cudaStream_t s, const float* a, int as, const float* w, float eps, const float* inv,
                  const StepBuf* step, int T, int heads, int head_dim, float* out, int os) {
  enqueue(rms_norm_rope_kernel, T * heads, 64, 0, s, a, as, w, eps, inv, step, heads, head_dim, out, os);
  return 1;
}

int embed(cudaStream_t s, const WeightRef& w, const StepBuf* step, int T, int vocab, float scale, int n,
          float* out, int out_stride) {
  enqueue(embed_kernel, T, 256, 0, s, w, step, vocab, scale, n, out, out_stride);
  return 1;
}

int rms_norm(cudaStream_t s, const float* a, int a_stride, const float* w, int n, int group, float eps, int rows,
             float* out, int out_stride, Q8Vec q8) {
  const int groups = n / group;
  const int threads = group <= 256 ? 64 : group <= 1024 ? 256 : 1024;
  if (q8.q) enqueue(rms_norm_kernel<true>, rows * groups, threads, 0, s, a, a_stride, w, groups, group, eps, out, out_stride, q8);
  else enqueue(rms_norm_kernel<false>, rows * groups, threads, 0, s, a, a_stride, w, groups, group, eps, out, out_stride, q8);
  return 1;
}

int gelu_mul(cudaStream_t s, const float* a, int as, const float* b, int bs, int b_col, int n, int rows,
             float* out, int os, Q8Vec q8) {
  if (q8.q) {
    enqueue(gelu_mul_q8_kernel, MB_BLOCKS(n, 256), 256, 0, s, a, b + b_col, n, out, q8);
    return 1;
  }
  return launch_ew<Ew::GeluMul>(s, a, as, b + b_col, bs, 0.0f, n, rows, out, os);
}
int add(cudaStream_t s, const float* a, int as, const float* b, int bs, int n, int rows, float* out, int os) {
  return launch_ew<Ew::Add>(s, a, as, b, bs, 0.0f, n, rows, out, os);
}
int scale(cudaStream_t s, const float* a, int as, float f, int n, int rows, float* out, int os) {
  return launch_ew<Ew::Scale>(s, a, as, nullptr, 0, f, n, rows, out, os);
}
int softcap(cudaStream_t s, const float* a, int as, float f, int n, int rows, float* out, int os) {
  return launch_ew<Ew::Softcap>(s, a, as, nullptr, 0, f, n, rows, out, os);
}
int copy_row(cudaStream_t s, const float* a, int n, float* out) {
  enqueue(copy_kernel, MB_BLOCKS(n, 256), 256, 0, s, a, n, out);
  return 1;
}
int rope(cudaStream_t s, const float* a, int as, const float* inv, const StepBuf* step, int T, int heads,
         int head_dim, float* out, int os) {
  enqueue(rope_kernel, T * heads, 64, 0, s, a, as, inv, step, heads, head_dim, out, os);
  return 1;
}

}  // namespace markbase::cuda
