// Matrix products of the CPU backend: out[t, n] = dot(a[t], W[n]) for every tensor type, read
// straight from the weight's blocks. The fast path quantizes activations to 8 bits (blocks of
// 32 for Q4_0/Q4_1/Q5_0/Q5_1/Q8_0, of 256 for the K-quants) and uses integer dot products;
// the precise path (and F32/F16/BF16 weights) dequantizes one weight row at a time into floats.
#pragma once
#include <vector>

#include "backend/cpu/kquant_dot.h"
#include "backend/cpu/quant_dot.h"
#include "backend/cpu/thread_pool.h"
#include "formats/tensor.h"

namespace markbase::cpu {

// Quantized activations, reused from one product to the next.
struct MatmulScratch {
  std::vector<BlockQ8> q8;
  std::vector<BlockQ8K> q8k;
};

void matmul(ThreadPool& pool, MatmulScratch& scratch, const TensorView& w, const float* a,
            int a_stride, int T, float* out, int out_stride, int N, bool precise);

}  // namespace markbase::cpu
