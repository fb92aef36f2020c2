// The tensor-core prefill attention (attention_tc.cu), as attention.cu and the standalone check
// (bench/cuda/attn_check.cu) call it. Same semantics as attention.cu's float32 kernel; f16 caches
// only, Q and P rounded to f16 (default mode; precise mode keeps the float32 kernel).
#pragma once
#include <cuda_runtime.h>

#include "backend/cuda/kernels.h"

namespace markbase::cuda {

// Whether the kernel handles this call at all: several tokens, f16 cache, head_dim a multiple of
// 16 up to 512.
bool attention_tc_eligible(const CacheRef& c, int T);

// Called once per process before the first launch (attention_smem_limit() does it): reads the
// device's shared-memory limit and SM count and raises each variant's dynamic shared memory.
void attention_tc_init();

// Launches the kernel; returns the kernels launched (1), or 0 when no variant fits this device
// (the caller then runs the float32 kernel). row_warps: 16-row groups per block (1, 2 or 4);
// 0 picks one from the grid size (the check harness passes others to compare them).
int attention_tc(cudaStream_t s, const CacheRef& c, const float* q, int q_stride, const StepBuf* step, int T,
                 int heads, float scale, int window, float* out, int out_stride, int row_warps = 0);

}  // namespace markbase::cuda
