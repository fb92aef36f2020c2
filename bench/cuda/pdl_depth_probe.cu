// How far ahead can programmatic dependent launch run? A chain of kernels in one stream, each
// launched with programmatic stream serialization and triggering its dependents at entry, in a
// CUDA graph and then as eager launches: kernel 0 spins 50 us after its wait, kernels 1.. 5 us
// after theirs. Each stamps the global timer at entry (before griddepcontrol.wait) and at its end.
// If kernel n >= 2 enters before kernel n - 2 ends, launches run more than one kernel ahead, and a
// kernel that needs no input from the kernels just before it (only from an earlier one, through a
// flag) could start its work early.
//   nvcc -std=c++17 -O2 -arch=sm_90a -o /tmp/pdl_depth bench/cuda/pdl_depth_probe.cu && /tmp/pdl_depth
#include <cuda_runtime.h>

#include <cstdio>

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void spin(unsigned long long* ts, int slot, unsigned long long ns) {
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
  if (threadIdx.x == 0) ts[2 * slot] = now_ns();
  asm volatile("griddepcontrol.wait;" ::: "memory");
  const unsigned long long t0 = now_ns();
  while (now_ns() - t0 < ns) {
  }
  if (threadIdx.x == 0) ts[2 * slot + 1] = now_ns();
}

int main() {
  constexpr int kN = 6;
  unsigned long long* ts = nullptr;
  cudaMalloc(&ts, 2 * kN * sizeof(unsigned long long));
  cudaStream_t s;
  cudaStreamCreate(&s);
  auto enqueue_chain = [&]() {
    for (int i = 0; i < kN; ++i) {
      cudaLaunchConfig_t cfg = {};
      cfg.gridDim = 1;
      cfg.blockDim = 32;
      cfg.stream = s;
      cudaLaunchAttribute attr[1];
      attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
      attr[0].val.programmaticStreamSerializationAllowed = 1;
      cfg.attrs = attr;
      cfg.numAttrs = 1;
      cudaLaunchKernelEx(&cfg, spin, ts, i, i == 0 ? 50000ull : 5000ull);
    }
  };
  // The chain captured once into a CUDA graph (as the decode step is), then as eager launches.
  cudaGraph_t graph;
  cudaGraphExec_t exec;
  cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal);
  enqueue_chain();
  cudaStreamEndCapture(s, &graph);
  cudaGraphInstantiate(&exec, graph, 0);
  for (int rep = 0; rep < 6; ++rep) {
    cudaMemsetAsync(ts, 0, 2 * kN * sizeof(unsigned long long), s);
    if (rep < 3) cudaGraphLaunch(exec, s);
    else enqueue_chain();
    cudaStreamSynchronize(s);
    unsigned long long h[2 * kN];
    cudaMemcpy(h, ts, sizeof(h), cudaMemcpyDeviceToHost);
    std::printf("%s %d (us from kernel 0's entry): ", rep < 3 ? "graph" : "eager", rep);
    for (int i = 0; i < kN; ++i)
      std::printf(" k%d enter %.1f end %.1f;", i, (h[2 * i] - h[0]) / 1e3, (h[2 * i + 1] - h[0]) / 1e3);
    std::printf("\n");
  }
  std::printf("%s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
