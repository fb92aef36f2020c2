// What does a decode step gain from one persistent kernel ("megakernel") over one launch per
// product? A chain of S dependent matrix-vector products y_s = W_s y_{s-1} (int8 weights, N = K,
// every output of a step reading every output of the step before, as a decode step's products do)
// run three ways on the same data, each captured in a CUDA graph and replayed:
//   launches      one kernel per step with programmatic dependent launch: each block loads its
//                 rows' weights into registers, then waits (griddepcontrol.wait) for the kernel
//                 before, then reads y_{s-1} (MarkBase's decode products work this way);
//   plain         the same kernels without programmatic launch;
//   persistent    one kernel whose blocks (all resident at once) walk the S steps: each loads
//                 its rows' weights for step s, then waits until every block has counted step
//                 s - 1 done (one device counter per step, read with ld.acquire by one thread a
//                 block), reads y_{s-1} through L2, computes, stores, and counts step s done
//                 (red.release). No grid-wide barrier: a block runs ahead as far as its inputs allow.
//                 Also run with its warps prefetching their rows of step s + 1 or s + 2 to L2.
// Every way has the same rows per warp, the same sums in the same order: the final vectors must
// match bit for bit. Prints us per step and the fraction of the step's byte floor (N K bytes at
// the given read bandwidth). For N = 2816 it also times each product followed by a row op of
// several launch shapes (blocks, threads, unused dynamic shared memory): does a row chain's
// shape (one block of 512 threads and ~100 KB) cost time by itself?
// Results and what they mean: bench/RESULTS.md, sixteenth session.
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/pchain bench/cuda/persistent_chain_probe.cu && /tmp/pchain 4295
#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <vector>

#define CK(x)                                                                          \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

constexpr int kThreads = 128;  // 4 warps a block
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ void pdl_trigger() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }
__device__ __forceinline__ void pdl_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }
__device__ __forceinline__ unsigned ld_acquire(const unsigned* p) {
  unsigned v;
  asm volatile("ld.acquire.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release(unsigned* p, unsigned v) {
  asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

constexpr int kMaxK = 4096;

// The block's copy of the input vector: one round of loads through L2 (it was written by other
// blocks, of this launch or the one before), then a barrier. A warp's rows then read it from
// shared memory (the first version read it from L2 row by row: ~30 us a step, latency-bound).
__device__ __forceinline__ void stage_x(const float* x, int K, float4* xs) {
  for (int i = threadIdx.x; i < K / 4; i += blockDim.x) xs[i] = __ldcg(reinterpret_cast<const float4*>(x) + i);
  __syncthreads();
}

__device__ __forceinline__ float dot4(int w, float4 x) {  // 4 int8 weights . 4 floats
  return static_cast<float>(static_cast<signed char>(w)) * x.x + static_cast<float>(static_cast<signed char>(w >> 8)) * x.y +
         static_cast<float>(static_cast<signed char>(w >> 16)) * x.z + static_cast<float>(w >> 24) * x.w;
}

// One step for one warp: rows w, w + W, ... (at most R), each row K bytes = VPL 4-byte words a
// lane, lane l taking words l, l + 32, ... (so that its reads of the staged x, one float4 a word,
// are consecutive across the warp: no bank conflicts).
template <int R, int VPL>
struct Rows {
  int v[R][VPL];
  __device__ void load(const signed char* W, int N, int K, int warp, int nwarps) {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = warp + r * nwarps;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int c = lane + 32 * i;
        v[r][i] = row < N && c * 4 < K ? reinterpret_cast<const int*>(W + static_cast<size_t>(row) * K)[c] : 0;
      }
    }
  }
  __device__ void compute(const float4* x, float* y, int N, int K, int warp, int nwarps, float scale) const {
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int r = 0; r < R; ++r) {
      const int row = warp + r * nwarps;
      float s = 0.0f;
#pragma unroll
      for (int i = 0; i < VPL; ++i) {
        const int c = lane + 32 * i;
        if (c * 4 < K) s += dot4(v[r][i], x[c]);
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
      if (lane == 0 && row < N) y[row] = s * scale;
    }
  }
};

template <int R, int VPL>
__global__ void __launch_bounds__(kThreads) step_kernel(const signed char* W, const float* x, float* y, int N, int K,
                                                        float scale, bool pdl) {
  if (pdl) pdl_trigger();
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32, nwarps = gridDim.x * kWarps;
  Rows<R, VPL> rows;
  rows.load(W, N, K, warp, nwarps);
  if (pdl) pdl_wait();
  __shared__ float4 xs[kMaxK / 4];
  stage_x(x, K, xs);
  rows.compute(xs, y, N, K, warp, nwarps, scale);
}

template <int R, int VPL>
__global__ void __launch_bounds__(kThreads) persistent_kernel(const signed char* W, float* xv, int N, int K, int S,
                                                              float scale, unsigned* done, int ahead) {
  __shared__ float4 xs[kMaxK / 4];
  const int lane = threadIdx.x & 31;
  const int warp = blockIdx.x * kWarps + threadIdx.x / 32, nwarps = gridDim.x * kWarps;
  for (int s = 0; s < S; ++s) {
    Rows<R, VPL> rows;
    rows.load(W + static_cast<size_t>(s) * N * K, N, K, warp, nwarps);  // before the wait, as above
    // ahead > 0: this warp's rows of step s + ahead go to L2 now, so that their loads, when that
    // step comes, are L2 hits (a persistent kernel can look further ahead than one launch).
    if (ahead > 0 && s + ahead < S) {
      const signed char* next = W + static_cast<size_t>(s + ahead) * N * K;
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const int row = warp + r * nwarps;
        if (row >= N) continue;
        for (int o = lane * 128; o < K; o += 32 * 128)
          asm volatile("prefetch.global.L2 [%0];" ::"l"(next + static_cast<size_t>(row) * K + o));
      }
    }
    if (s > 0) {
      if (threadIdx.x == 0)
        while (ld_acquire(done + s - 1) < gridDim.x) {
        }
      __syncthreads();
    }
    stage_x(xv + static_cast<size_t>(s) * K, K, xs);
    rows.compute(xs, xv + static_cast<size_t>(s + 1) * K, N, K, warp, nwarps, scale);
    __syncthreads();  // the block's stores are done before its count; xs is free again
    if (threadIdx.x == 0) red_release(done + s, 1u);
  }
}

// A row op between products, as the decode step's row chains sit between its products: block 0
// scales the vector in place, the other blocks only pass the wait; each block asks for `smem`
// bytes of dynamic shared memory it never touches.
__global__ void row_kernel(float* x, int K) {
  pdl_trigger();
  pdl_wait();
  if (blockIdx.x != 0) return;
  for (int i = threadIdx.x; i < K; i += blockDim.x) x[i] *= 0.999f;
}

template <int R, int VPL>
void run(int N, int S, double gbs, int sms) {
  const int K = N;
  int per_sm = 0;
  CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, persistent_kernel<R, VPL>, kThreads, 0));
  // A grid that can hold every row with at most R rows a warp, and that fits on the GPU at once.
  int blocks = sms * per_sm;
  const int need = (N + R * kWarps - 1) / (R * kWarps);
  if (need < blocks) blocks = need;
  if (static_cast<long>(blocks) * kWarps * R < N) {
    std::printf("N=%d: %d blocks of %d warps cannot hold %d rows at %d a warp\n", N, blocks, kWarps, N, R);
    return;
  }
  const size_t wbytes = static_cast<size_t>(S) * N * K;
  std::vector<signed char> hw(wbytes);
  unsigned st = 12345u;
  for (auto& b : hw) {
    st = st * 1664525u + 1013904223u;
    b = static_cast<signed char>(static_cast<int>(st >> 24) - 128);
  }
  std::vector<float> hx(K);
  for (int i = 0; i < K; ++i) hx[i] = std::sin(0.37f * i);
  signed char* W;
  float *xa, *xp;
  unsigned* done;
  CK(cudaMalloc(&W, wbytes));
  CK(cudaMalloc(&xa, sizeof(float) * K * (S + 1)));
  CK(cudaMalloc(&xp, sizeof(float) * K * (S + 1)));
  CK(cudaMalloc(&done, sizeof(unsigned) * S));
  CK(cudaMemcpy(W, hw.data(), wbytes, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xa, hx.data(), sizeof(float) * K, cudaMemcpyHostToDevice));
  CK(cudaMemcpy(xp, hx.data(), sizeof(float) * K, cudaMemcpyHostToDevice));
  const float scale = 1.0f / (127.0f * std::sqrt(static_cast<float>(K)) * 0.58f);
  cudaStream_t s;
  CK(cudaStreamCreate(&s));

  auto capture = [&](auto&& body) {
    cudaGraph_t g;
    cudaGraphExec_t e;
    CK(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal));
    body();
    CK(cudaStreamEndCapture(s, &g));
    CK(cudaGraphInstantiate(&e, g, 0));
    CK(cudaGraphDestroy(g));
    return e;
  };
  auto launches = [&](bool pdl) {
    return capture([&] {
      for (int i = 0; i < S; ++i) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = blocks;
        cfg.blockDim = kThreads;
        cfg.stream = s;
        cudaLaunchAttribute attr[1];
        attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = attr;
        cfg.numAttrs = pdl ? 1 : 0;
        CK(cudaLaunchKernelEx(&cfg, step_kernel<R, VPL>, static_cast<const signed char*>(W + static_cast<size_t>(i) * N * K),
                              static_cast<const float*>(xa + static_cast<size_t>(i) * K), xa + static_cast<size_t>(i + 1) * K,
                              N, K, scale, pdl));
      }
    });
  };
  cudaGraphExec_t g_pdl = launches(true), g_plain = launches(false);
  auto persistent = [&](int ahead) {
    return capture([&] {
      CK(cudaMemsetAsync(done, 0, sizeof(unsigned) * S, s));
      persistent_kernel<R, VPL><<<blocks, kThreads, 0, s>>>(W, xp, N, K, S, scale, done, ahead);
    });
  };
  cudaGraphExec_t g_pers = persistent(0), g_pers1 = persistent(1), g_pers2 = persistent(2);
  cudaEvent_t a, b;
  CK(cudaEventCreate(&a));
  CK(cudaEventCreate(&b));
  auto time_us = [&](cudaGraphExec_t e) {
    // Replays for ~300 ms first: an idle H200 sits at a low SM clock and takes a while to raise it
    // (the first version, timed after 3 replays, ran every kernel several times slower).
    for (float ms = 0.0f; ms < 300.0f;) {
      CK(cudaEventRecord(a, s));
      for (int i = 0; i < 20; ++i) CK(cudaGraphLaunch(e, s));
      CK(cudaEventRecord(b, s));
      CK(cudaEventSynchronize(b));
      float t = 0.0f;
      CK(cudaEventElapsedTime(&t, a, b));
      ms += t;
    }
    constexpr int kReps = 100;
    CK(cudaEventRecord(a, s));
    for (int i = 0; i < kReps; ++i) CK(cudaGraphLaunch(e, s));
    CK(cudaEventRecord(b, s));
    CK(cudaEventSynchronize(b));
    float ms = 0.0f;
    CK(cudaEventElapsedTime(&ms, a, b));
    return 1000.0 * ms / kReps / S;
  };
  const double t_pdl = time_us(g_pdl), t_plain = time_us(g_plain), t_pers = time_us(g_pers);
  const double t_pers1 = time_us(g_pers1), t_pers2 = time_us(g_pers2);
  std::vector<float> ya(K), yp(K);
  CK(cudaMemcpy(ya.data(), xa + static_cast<size_t>(S) * K, sizeof(float) * K, cudaMemcpyDeviceToHost));
  CK(cudaMemcpy(yp.data(), xp + static_cast<size_t>(S) * K, sizeof(float) * K, cudaMemcpyDeviceToHost));
  int differ = 0;
  double amax = 0.0;
  for (int i = 0; i < K; ++i) {
    differ += ya[i] != yp[i];
    amax = std::fmax(amax, std::fabs(ya[i]));
  }
  const double floor_us = static_cast<double>(N) * K / (gbs * 1e3);
  std::printf("N=K=%5d  %d steps  grid %4d x %d warps (R=%d rows a warp)  floor %6.2f us/step | "
              "launches+PDL %6.2f us (%4.1f %%)  plain %6.2f us (%4.1f %%)  persistent %6.2f us (%4.1f %%), "
              "with L2 prefetch 1 / 2 steps ahead %6.2f / %6.2f us | "
              "outputs differing: %d of %d (max |y| %.3g)\n",
              N, S, blocks, kWarps, R, floor_us, t_pdl, 100 * floor_us / t_pdl, t_plain, 100 * floor_us / t_plain,
              t_pers, 100 * floor_us / t_pers, t_pers1, t_pers2, differ, K, amax);
  // Products with a row op after each (all with programmatic launch), the row op launched as
  // (blocks, threads, dynamic shared memory): us per (product + row op).
  if (N == 2816) {
    CK(cudaFuncSetAttribute(row_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    const int shapes[][3] = {{1, 512, 0}, {1, 512, 100 * 1024}, {33, 512, 0}, {33, 512, 100 * 1024}, {33, 512, 48 * 1024},
                             {33, 128, 0}, {132, 512, 0}};
    std::printf("  product + row op (PDL), us a pair:");
    for (const auto& sh : shapes) {
      cudaGraphExec_t e = capture([&] {
        for (int i = 0; i < S; ++i) {
          cudaLaunchAttribute attr[1];
          attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
          attr[0].val.programmaticStreamSerializationAllowed = 1;
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = blocks;
          cfg.blockDim = kThreads;
          cfg.stream = s;
          cfg.attrs = attr;
          cfg.numAttrs = 1;
          float* xin = xa + static_cast<size_t>(i) * K;
          CK(cudaLaunchKernelEx(&cfg, step_kernel<R, VPL>, static_cast<const signed char*>(W + static_cast<size_t>(i) * N * K),
                                static_cast<const float*>(xin), xin + K, N, K, scale, true));
          cfg.gridDim = sh[0];
          cfg.blockDim = sh[1];
          cfg.dynamicSmemBytes = sh[2];
          CK(cudaLaunchKernelEx(&cfg, row_kernel, xin + K, K));
        }
      });
      std::printf("  [%d x %d, %3d KB] %6.2f", sh[0], sh[1], sh[2] / 1024, time_us(e));
      CK(cudaGraphExecDestroy(e));
    }
    std::printf("\n");
  }
  CK(cudaFree(W));
  CK(cudaFree(xa));
  CK(cudaFree(xp));
  CK(cudaFree(done));
}

int main(int argc, char** argv) {
  const double gbs = argc > 1 ? std::atof(argv[1]) : 4295.0;
  int sms = 0;
  CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  cudaDeviceProp p;
  CK(cudaGetDeviceProperties(&p, 0));
  std::printf("%s, %d SMs, floor at %.0f GB/s\n", p.name, sms, gbs);
  // N = K: 1024 (1 MB a step: latency), 2048, 2816 (the 26B-A4B's hidden width: 7.9 MB), 4096.
  run<1, 8>(1024, 64, gbs, sms);
  run<1, 16>(2048, 64, gbs, sms);
  run<2, 22>(2816, 64, gbs, sms);
  run<2, 32>(4096, 32, gbs, sms);
  return 0;
}
