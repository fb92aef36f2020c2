// Row-wise and element-wise ops: embedding rows, RMS norm, GeGLU, add, scale, softcap, RoPE.
// Each mirrors the CPU op of the same name (cpu_backend.cpp) operation for operation.
#include <initializer_list>
#include <utility>

#include "backend/cuda/cp_async.cuh"
#include "backend/cuda/q8.cuh"
#include "backend/cuda/row_chain.cuh"

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
  const float r = rms_scale(ss, G, eps);
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
  else y = softcap_value(x, f);
  out[static_cast<size_t>(row) * os + j] = y;
}

// GeGLU of each row (blockIdx.y), quantized as well (q8.cuh; row r at r * n codes): 32
// consecutive values per warp.
__global__ void gelu_mul_q8_kernel(const float* a, int as, const float* b, int bs, int n, float* out, int os,
                                   Q8Vec q8) {
  pdl_entry();
  const int row = blockIdx.y, j = blockIdx.x * blockDim.x + threadIdx.x;
  float y = 0.0f;
  if (j < n) {
    y = mb_gelu_tanh(a[static_cast<size_t>(row) * as + j]) * b[static_cast<size_t>(row) * bs + j];
    out[static_cast<size_t>(row) * os + j] = y;
  }
  const Q8Vec qr{q8.q + static_cast<size_t>(row) * n, q8.d + static_cast<size_t>(row) * (n / 32)};
  q8_store_warp(y, j, j < n, qr);
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
                                    float* x, int xs, const float* res, int rs, Q8Vec q8, float sx) {
  pdl_entry();
  const int row = blockIdx.x;
  const float* v = a + static_cast<size_t>(row) * as;
  float* y = out + static_cast<size_t>(row) * os;
  float* r = x + static_cast<size_t>(row) * xs;
  const float* r0 = res + static_cast<size_t>(row) * rs;
  float ss = 0.0f;
#pragma unroll 4
  for (int j = threadIdx.x; j < n; j += blockDim.x) ss += v[j] * v[j];
  ss = block_sum(ss);
  const float s = rms_scale(ss, n, eps);
  if constexpr (Q8) {
    for (int j0 = 0; j0 < n; j0 += blockDim.x) {
      const int j = j0 + threadIdx.x;
      float nx = 0.0f;
      if (j < n) {
        const float t = w ? (v[j] * s) * w[j] : v[j] * s;
        y[j] = t;
        nx = r0[j] + t;
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
      const float nx = r0[j] + t;
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
  const float r = rms_scale(ss, d, eps);
  const float pos = static_cast<float>(step->pos0 + t);
  for (int j = threadIdx.x; j < half; j += blockDim.x) {
    float x0 = w ? (x[j] * r) * w[j] : x[j] * r;
    float x1 = w ? (x[j + half] * r) * w[j + half] : x[j + half] * r;
    rope_pair(x0, x1, pos, inv[j]);
    y[j] = x0;
    y[j + half] = x1;
  }
}

// GeGLU of prefill rows on float4s (n % 32 == 0, float4 rows), quantized as well (row r at
// r * n codes): a block of 32 values is the float4s of 8 neighbouring lanes. out may be null when
// only the quantized copy is read (the down product's input): a third less traffic.
__global__ void gelu_mul_q8_rows_kernel(const float* a, int as, const float* b, int bs, int n, float* out, int os,
                                        Q8Vec q8) {
  pdl_entry();
  const int row = blockIdx.y, j0 = blockIdx.x * blockDim.x, j = j0 + threadIdx.x, n4 = n / 4;
  float4 y[1] = {make_float4(0.0f, 0.0f, 0.0f, 0.0f)};
  if (j < n4) {
    const float4 x = reinterpret_cast<const float4*>(a + static_cast<size_t>(row) * as)[j];
    const float4 u = reinterpret_cast<const float4*>(b + static_cast<size_t>(row) * bs)[j];
    y[0] = make_float4(mb_gelu_tanh(x.x) * u.x, mb_gelu_tanh(x.y) * u.y, mb_gelu_tanh(x.z) * u.z, mb_gelu_tanh(x.w) * u.w);
    if (out) reinterpret_cast<float4*>(out + static_cast<size_t>(row) * os)[j] = y[0];
  }
  // this block's float4s j0 .. of the row: codes from byte 4 j0, scales from j0 / 8
  const Q8Vec qb{q8.q + static_cast<size_t>(row) * n + 4 * j0, q8.d + static_cast<size_t>(row) * (n / 32) + j0 / 8};
  quantize_float4s<256>(y, qb, n4 - j0);
}

// Prefill rows (one norm group per row): a block per row, each thread holding its float4s in
// registers from the sum of squares to the scaling, so the row is read once and there is one
// barrier (rms_norm_kernel reads it twice around a 1024-thread reduction: ~10 us for 512 rows of
// 2560 on the H200). ADD: the residual add (and layer scalar) of rms_norm_add_kernel. Q8: the row
// (the new residual with ADD) is also quantized, row r at r * n codes, as quantize_q8 writes the
// prefill products' input.
constexpr int kRowThreads = 256;
constexpr int kRowVec = kChainMaxN / 4 / kRowThreads;

template <bool ADD, bool Q8>
__global__ void __launch_bounds__(kRowThreads) rms_norm_rows_kernel(const float* a, int as, const float* w, int n,
                                                                    float eps, float* out, int os, float* x, int xs,
                                                                    const float* res, int rs, float sx, Q8Vec q8) {
  pdl_entry();
  const int row = blockIdx.x, n4 = n / 4, t = threadIdx.x;
  const float4* A = reinterpret_cast<const float4*>(a + static_cast<size_t>(row) * as);
  const float4* W = reinterpret_cast<const float4*>(w);
  float4* Y = reinterpret_cast<float4*>(out + static_cast<size_t>(row) * os);
  float4* X = ADD ? reinterpret_cast<float4*>(x + static_cast<size_t>(row) * xs) : nullptr;
  const float4* R = ADD ? reinterpret_cast<const float4*>(res + static_cast<size_t>(row) * rs) : nullptr;
  float4 v[kRowVec];
  float ss = 0.0f;
#pragma unroll
  for (int c = 0; c < kRowVec; ++c) {
    const int j = t + kRowThreads * c;
    v[c] = j < n4 ? A[j] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    ss += dot4(v[c], v[c]);
  }
  const float r = rms_scale(block_sum(ss), n, eps);
#pragma unroll
  for (int c = 0; c < kRowVec; ++c) {
    const int j = t + kRowThreads * c;
    if (j >= n4) continue;
    float4 y = make_float4(v[c].x * r, v[c].y * r, v[c].z * r, v[c].w * r);
    if (W) {
      const float4 g = W[j];
      y = make_float4(y.x * g.x, y.y * g.y, y.z * g.z, y.w * g.w);
    }
    Y[j] = y;
    if constexpr (ADD) {
      const float4 o = R[j];
      float4 nx = make_float4(o.x + y.x, o.y + y.y, o.z + y.z, o.w + y.w);
      if (sx != 1.0f) nx = make_float4(nx.x * sx, nx.y * sx, nx.z * sx, nx.w * sx);
      X[j] = nx;
      y = nx;
    }
    v[c] = y;
  }
  if constexpr (Q8) {
    const Q8Vec qr{q8.q + static_cast<size_t>(row) * n, q8.d + static_cast<size_t>(row) * (n / 32)};
    quantize_float4s<kRowThreads>(v, qr, n4);
  }
}

// Whether these rows (pointer, stride in floats) can be read as float4s.
bool float4_rows(std::initializer_list<std::pair<const float*, int>> rows) {
  for (const auto& [p, stride] : rows)
    if (p && ((reinterpret_cast<uintptr_t>(p) & 15) != 0 || stride % 4 != 0)) return false;
  return true;
}
// Whether a prefill row op can take rms_norm_rows_kernel.
bool rows_fit(int n, std::initializer_list<std::pair<const float*, int>> rows) {
  return n % 4 == 0 && n <= kChainMaxN && float4_rows(rows);
}

// The row chain as its own launch (row_chain.cuh's run_chain). PROBE: chain_probe.cuh's stamps.
template <bool COMPACT, bool PROBE = false>
__global__ void __launch_bounds__(kChainThreads) row_chain_kernel(const __grid_constant__ ChainPlan p) {
  extern __shared__ float4 sm[];  // p.slots rows of p.n4 float4s
  ChainProbe<PROBE> probe;
  probe.start();
  pdl_trigger();
  chain_load_all(p, sm, probe);
  run_chain<COMPACT>(p, sm, p.c.count, true, 0, [&](int i) { probe.stamp(kStageOp0 + i); });
  probe.commit(kProbeRowChain, p.c.count);
}

// The fused row chain as its own launch (row_chain.cuh's run_fused_chain): no shared memory rows.
template <bool PROBE = false>
__global__ void __launch_bounds__(kChainThreads) fused_chain_kernel(const __grid_constant__ FusedChain f) {
  ChainProbe<PROBE> probe;
  probe.start();
  pdl_trigger();
  run_fused_chain(f, probe);
  probe.commit(kProbeFusedChain, f.ops);
}

}  // namespace

void row_chain_setup() {
  for (auto k : {row_chain_kernel<true>, row_chain_kernel<false>, row_chain_kernel<true, true>})
    cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kChainSmem));
}

// Launches the chain as few pieces as fit the shared memory (one for Gemma's chains).
int row_chain(cudaStream_t s, const RowChain& c) {
  static const bool compact = env_flag("MARKBASE_CUDA_CHAIN_COMPACT", true);
  if (FusedChain f; chain_fused() && fuse_chain(c, &f)) {
    enqueue(chain_probe() ? fused_chain_kernel<true> : fused_chain_kernel<false>, 1, kChainThreads, 0, s, f);
    return 1;
  }
  int launches = 0;
  for (int first = 0; first < c.count;) {
    int count = 1;
    while (first + count < c.count &&
           static_cast<size_t>(chain_plan(c, first, count + 1).slots) * (c.op[first].n / 4) * 16 <= kChainSmem)
      ++count;
    const ChainPlan p = chain_plan(c, first, count);
    const auto kernel = chain_probe() ? row_chain_kernel<true, true>
                        : compact     ? row_chain_kernel<true>
                                      : row_chain_kernel<false>;
    enqueue(kernel, 1, kChainThreads, static_cast<size_t>(p.slots) * p.n4 * 16, s, p);
    ++launches;
    first += count;
  }
  return launches;
}

int rms_norm_add(cudaStream_t s, const float* a, int as, const float* w, int n, float eps, int rows, float* out,
                 int os, float* x, int xs, const float* res, int rs, Q8Vec q8, float scale_x) {
  if (rows > 1 && rows_fit(n, {{a, as}, {w, 0}, {out, os}, {x, xs}, {res, rs}})) {
    if (q8.q)
      enqueue(rms_norm_rows_kernel<true, true>, rows, kRowThreads, 0, s, a, as, w, n, eps, out, os, x, xs, res, rs,
              scale_x, q8);
    else
      enqueue(rms_norm_rows_kernel<true, false>, rows, kRowThreads, 0, s, a, as, w, n, eps, out, os, x, xs, res, rs,
              scale_x, q8);
    return 1;
  }
  const int threads = n <= 1024 ? 256 : 1024;
  if (q8.q && rows > 1) {  // the kernel quantizes one row: the others through quantize_q8
    enqueue(rms_norm_add_kernel<false>, rows, threads, 0, s, a, as, w, n, eps, out, os, x, xs, res, rs, q8, scale_x);
    return 1 + quantize_q8(s, x, xs, n, rows, q8, n);
  }
  if (q8.q) enqueue(rms_norm_add_kernel<true>, rows, threads, 0, s, a, as, w, n, eps, out, os, x, xs, res, rs, q8, scale_x);
  else enqueue(rms_norm_add_kernel<false>, rows, threads, 0, s, a, as, w, n, eps, out, os, x, xs, res, rs, q8, scale_x);
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
  if (rows > 1 && groups == 1 && rows_fit(n, {{a, a_stride}, {w, 0}, {out, out_stride}})) {
    if (q8.q) enqueue(rms_norm_rows_kernel<false, true>, rows, kRowThreads, 0, s, a, a_stride, w, n, eps, out, out_stride, nullptr, 0, nullptr, 0, 1.0f, q8);
    else enqueue(rms_norm_rows_kernel<false, false>, rows, kRowThreads, 0, s, a, a_stride, w, n, eps, out, out_stride, nullptr, 0, nullptr, 0, 1.0f, q8);
    return 1;
  }
  const int threads = group <= 256 ? 64 : group <= 1024 ? 256 : 1024;
  if (q8.q && rows > 1) {
    enqueue(rms_norm_kernel<false>, rows * groups, threads, 0, s, a, a_stride, w, groups, group, eps, out, out_stride, q8);
    return 1 + quantize_q8(s, out, out_stride, n, rows, q8, n);
  }
  if (q8.q) enqueue(rms_norm_kernel<true>, rows * groups, threads, 0, s, a, a_stride, w, groups, group, eps, out, out_stride, q8);
  else enqueue(rms_norm_kernel<false>, rows * groups, threads, 0, s, a, a_stride, w, groups, group, eps, out, out_stride, q8);
  return 1;
}

int gelu_mul(cudaStream_t s, const float* a, int as, const float* b, int bs, int b_col, int n, int rows,
             float* out, int os, Q8Vec q8, bool floats_read) {
  if (q8.q && rows > 1 && n % 32 == 0 && float4_rows({{a, as}, {b + b_col, bs}, {out, os}})) {
    enqueue(gelu_mul_q8_rows_kernel, dim3(MB_BLOCKS(n / 4, 256), rows), 256, 0, s, a, as, b + b_col, bs, n,
            floats_read ? out : nullptr, os, q8);
    return 1;
  }
  if (q8.q) {
    enqueue(gelu_mul_q8_kernel, dim3(MB_BLOCKS(n, 256), rows), 256, 0, s, a, as, b + b_col, bs, n, out, os, q8);
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

MB_TRACE_ATTACH(trace_attach_norm_rope)

void chain_probe_report_rows() { chain_probe_print("norm_rope.cu"); }

}  // namespace markbase::cuda
