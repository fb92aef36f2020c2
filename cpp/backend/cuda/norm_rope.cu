// Row-wise and element-wise ops: embedding rows, RMS norm, GeGLU, add, scale, softcap, RoPE.
// Each mirrors the CPU op of the same name (cpu_backend.cpp) operation for operation.
#include "backend/cuda/common.cuh"

namespace markbase::cuda {
namespace {

__global__ void embed_kernel(WeightRef w, const StepBuf* step, int vocab, float f, int n, float* out, int os) {
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

// One block per (row, group).
__global__ void rms_norm_kernel(const float* a, int as, const float* w, int groups, int G, float eps, float* out,
                                int os) {
  const int row = blockIdx.x / groups, g = blockIdx.x % groups;
  const float* x = a + static_cast<size_t>(row) * as + g * G;
  float* y = out + static_cast<size_t>(row) * os + g * G;
  float ss = 0.0f;
#pragma unroll 4  // several loads in flight: these small kernels are latency-bound
  for (int j = threadIdx.x; j < G; j += blockDim.x) ss += x[j] * x[j];
  ss = block_sum(ss);
  const float r = 1.0f / sqrtf(ss / G + eps);
#pragma unroll 4
  for (int j = threadIdx.x; j < G; j += blockDim.x) y[j] = w ? (x[j] * r) * w[j] : x[j] * r;
}

enum class Ew { GeluMul, Add, Scale, Softcap };

template <Ew OP>
__global__ void elementwise_kernel(const float* a, int as, const float* b, int bs, float f, int n, float* out,
                                   int os) {
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

template <Ew OP>
int launch_ew(cudaStream_t s, const float* a, int as, const float* b, int bs, float f, int n, int rows, float* out,
              int os) {
  elementwise_kernel<OP><<<dim3(MB_BLOCKS(n, 256), rows), 256, 0, s>>>(a, as, b, bs, f, n, out, os);
  return 1;
}

__global__ void copy_kernel(const float* a, int n, float* out) {
  const int j = blockIdx.x * blockDim.x + threadIdx.x;
  if (j < n) out[j] = a[j];
}

// One block per (token, head); the angle is computed in float (position times inverse
// frequency) and its cosine and sine in double, as the CPU op does.
__global__ void rope_kernel(const float* a, int as, const float* inv, const StepBuf* step, int heads, int d,
                            float* out, int os) {
  const int t = blockIdx.x / heads, h = blockIdx.x % heads, half = d / 2;
  const float pos = static_cast<float>(step->pos0 + t);
  const float* x = a + static_cast<size_t>(t) * as + h * d;
  float* y = out + static_cast<size_t>(t) * os + h * d;
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    const float ang = pos * inv[j];
    double sd, cd;
    sincos(static_cast<double>(ang), &sd, &cd);
    const float c = static_cast<float>(cd), sn = static_cast<float>(sd);
    const float x0 = x[j], x1 = x[j + half];
    y[j] = x0 * c - x1 * sn;
    y[j + half] = x1 * c + x0 * sn;
  }
}

// Fused: y = rms_norm(a) * w -> out, then x += y (a block's post-norm and the residual add).
__global__ void rms_norm_add_kernel(const float* a, int as, const float* w, int n, float eps, float* out, int os,
                                    float* x, int xs) {
  const int row = blockIdx.x;
  const float* v = a + static_cast<size_t>(row) * as;
  float* y = out + static_cast<size_t>(row) * os;
  float* r = x + static_cast<size_t>(row) * xs;
  float ss = 0.0f;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += blockDim.x) ss += v[j] * v[j];
  ss = block_sum(ss);
  const float s = 1.0f / sqrtf(ss / n + eps);
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += blockDim.x) {
    const float t = w ? (v[j] * s) * w[j] : v[j] * s;
    y[j] = t;
    r[j] = r[j] + t;
  }
}

// Fused: per-head RMS norm then RoPE (QK-norm + rotation), one block per (token, head).
__global__ void rms_norm_rope_kernel(const float* a, int as, const float* w, float eps, const float* inv,
                                     const StepBuf* step, int heads, int d, float* out, int os) {
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
    const float x0 = w ? (x[j] * r) * w[j] : x[j] * r;
    const float x1 = w ? (x[j + half] * r) * w[j + half] : x[j + half] * r;
    double sd, cd;
    sincos(static_cast<double>(pos * inv[j]), &sd, &cd);
    const float c = static_cast<float>(cd), sn = static_cast<float>(sd);
    y[j] = x0 * c - x1 * sn;
    y[j + half] = x1 * c + x0 * sn;
  }
}

}  // namespace

int rms_norm_add(cudaStream_t s, const float* a, int as, const float* w, int n, float eps, int rows, float* out,
                 int os, float* x, int xs) {
  rms_norm_add_kernel<<<rows, n <= 1024 ? 256 : 1024, 0, s>>>(a, as, w, n, eps, out, os, x, xs);
  return 1;
}

int rms_norm_rope(cudaStream_t s, const float* a, int as, const float* w, float eps, const float* inv,
                  const StepBuf* step, int T, int heads, int head_dim, float* out, int os) {
  rms_norm_rope_kernel<<<T * heads, 64, 0, s>>>(a, as, w, eps, inv, step, heads, head_dim, out, os);
  return 1;
}

int embed(cudaStream_t s, const WeightRef& w, const StepBuf* step, int T, int vocab, float scale, int n,
          float* out, int out_stride) {
  embed_kernel<<<T, 256, 0, s>>>(w, step, vocab, scale, n, out, out_stride);
  return 1;
}

int rms_norm(cudaStream_t s, const float* a, int a_stride, const float* w, int n, int group, float eps, int rows,
             float* out, int out_stride) {
  const int groups = n / group;
  const int threads = group <= 256 ? 64 : group <= 1024 ? 256 : 1024;
  rms_norm_kernel<<<rows * groups, threads, 0, s>>>(a, a_stride, w, groups, group, eps, out, out_stride);
  return 1;
}

int gelu_mul(cudaStream_t s, const float* a, int as, const float* b, int bs, int b_col, int n, int rows,
             float* out, int os) {
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
  copy_kernel<<<MB_BLOCKS(n, 256), 256, 0, s>>>(a, n, out);
  return 1;
}
int rope(cudaStream_t s, const float* a, int as, const float* inv, const StepBuf* step, int T, int heads,
         int head_dim, float* out, int os) {
  rope_kernel<<<T * heads, 64, 0, s>>>(a, as, inv, step, heads, head_dim, out, os);
  return 1;
}

}  // namespace markbase::cuda
