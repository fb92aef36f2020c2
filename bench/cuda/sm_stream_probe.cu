// How fast can a few blocks stream bytes from DRAM? A decode attention that gave each (KV head,
// query group) one block, with no split of the positions and so no combine step, would read a
// head's whole K and V (512 positions x 256 dims x 2 x f16 = 512 KB on a 26B-A4B sliding layer)
// from one SM. This times G blocks of T threads, each summing its own `bytes` of a buffer far
// larger than L2 (16-byte loads, U of them in flight a thread), for several G, T, U and sizes,
// and prints the time and the bandwidth per block. Read with bench/RESULTS.md, sixteenth session.
//   nvcc -std=c++17 -O3 -arch=sm_90a -o /tmp/smstream bench/cuda/sm_stream_probe.cu && /tmp/smstream
#include <cuda_runtime.h>

#include <cstdio>

template <int U>
__global__ void stream_kernel(const float4* buf, size_t per_block, float* out) {
  const float4* p = buf + blockIdx.x * (per_block / 16);
  const size_t n = per_block / 16;
  float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (size_t i = threadIdx.x; i < n; i += static_cast<size_t>(U) * blockDim.x) {
    float4 v[U];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const size_t j = i + static_cast<size_t>(u) * blockDim.x;
      v[u] = j < n ? __ldcs(p + j) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);  // streaming: no reuse
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      acc.x += v[u].x;
      acc.y += v[u].y;
      acc.z += v[u].z;
      acc.w += v[u].w;
    }
  }
  const float s = acc.x + acc.y + acc.z + acc.w;
  if (s == 12345.678f) out[0] = s;  // keeps the loads; never true for the zero buffer
}

template <int U>
float time_us(const float4* buf, size_t total, int G, int T, size_t per_block, float* out, cudaStream_t st) {
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  // Different regions on every repeat (the buffer is several times L2), so that nothing is an L2 hit.
  const size_t span = static_cast<size_t>(G) * per_block, regions = total / span;
  for (int w = 0; w < 200; ++w) stream_kernel<U><<<G, T, 0, st>>>(buf + (w % regions) * (span / 16), per_block, out);
  constexpr int kReps = 200;
  cudaEventRecord(a, st);
  for (int r = 0; r < kReps; ++r) stream_kernel<U><<<G, T, 0, st>>>(buf + (r % regions) * (span / 16), per_block, out);
  cudaEventRecord(b, st);
  cudaEventSynchronize(b);
  float ms = 0.0f;
  cudaEventElapsedTime(&ms, a, b);
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return 1000.0f * ms / kReps;
}

int main() {
  const size_t total = size_t(2) << 30;  // 2 GiB, ~40x the H200's L2
  float4* buf = nullptr;
  float* out = nullptr;
  if (cudaMalloc(&buf, total) != cudaSuccess || cudaMalloc(&out, 4) != cudaSuccess) {
    std::printf("no memory\n");
    return 1;
  }
  cudaMemset(buf, 0, total);
  cudaStream_t st;
  cudaStreamCreate(&st);
  // An empty launch, for the fixed cost included in every time below.
  const float empty = time_us<1>(buf, total, 1, 32, 16, out, st);
  std::printf("launch + 16 bytes: %.2f us (included in every time below)\n", empty);
  for (size_t kb : {128, 512, 1024}) {
    for (int G : {8, 16, 32, 132}) {
      for (int T : {256, 512, 1024}) {
        const size_t per = kb * 1024;
        const float t4 = time_us<4>(buf, total, G, T, per, out, st), t8 = time_us<8>(buf, total, G, T, per, out, st);
        const float t = t4 < t8 ? t4 : t8;
        std::printf("%5zu KB a block, %3d blocks x %4d threads: %7.2f us (4 in flight) %7.2f us (8)  -> %6.1f GB/s a block, %7.1f GB/s in all\n",
                    kb, G, T, t4, t8, per / (t * 1e3), per * G / (t * 1e3));
      }
    }
  }
  return 0;
}
