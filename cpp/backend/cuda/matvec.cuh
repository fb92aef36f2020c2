// Row-dot helpers of the decode kernels (matvec.cu, moe.cu): a warp walks one weight row, lane l
// taking weights [8l, 8l + 8) of every 256, with the weight type a template parameter so that the
// block decoding of metal/dequant.h is inlined without a run-time switch.
#pragma once
#include "backend/cuda/common.cuh"

namespace markbase::cuda {

constexpr bool is_float_type(int t) { return t == MB_F32 || t == MB_F16 || t == MB_BF16; }

template <int TYPE>
__device__ __forceinline__ float4 w4(const mb_u8* row, int i, int K) {
  if constexpr (is_float_type(TYPE)) return weights4(TYPE, row, i, K);
  else return dequant4(TYPE, row, i);  // rows are whole blocks: no tail
}

__device__ __forceinline__ float4 x4(const float* x, int i, int K, bool vec) {
  if (vec && i + 4 <= K) return *reinterpret_cast<const float4*>(x + i);
  float r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = i + j < K ? x[i + j] : 0.0f;
  return make_float4(r[0], r[1], r[2], r[3]);
}

// This lane's share of dot(W row, x) over K weights; warp_sum() of it is the dot product.
template <int TYPE>
__device__ __forceinline__ float lane_dot(const mb_u8* row, int K, const float* x, bool vec) {
  float acc = 0.0f;
  for (int i = (threadIdx.x & 31) * 8; i < K; i += 256)
    acc += dot4(w4<TYPE>(row, i, K), x4(x, i, K, vec)) + dot4(w4<TYPE>(row, i + 4, K), x4(x, i + 4, K, vec));
  return acc;
}

// dot(W row, x) by a whole block of THREADS threads, each striding over the row 4 weights at a
// time (few rows, long K: the MoE router); every thread gets the sum.
template <int TYPE, int THREADS>
__device__ __forceinline__ float block_row_dot(const mb_u8* row, int K, const float* x) {
  const bool vec = (reinterpret_cast<uintptr_t>(x) & 15) == 0;
  float acc = 0.0f;
#pragma unroll 8  // the router's 2816-wide rows: every load of a thread in flight at once
  for (int i = threadIdx.x * 4; i < K; i += THREADS * 4) acc += dot4(w4<TYPE>(row, i, K), x4(x, i, K, vec));
  return block_sum(acc);
}

// Expands CALL(TYPE) for the run-time type id; CALL must return.
#define MB_TYPE_DISPATCH(type, CALL)            \
  switch (type) {                               \
    case MB_F32: CALL(MB_F32);                  \
    case MB_F16: CALL(MB_F16);                  \
    case MB_BF16: CALL(MB_BF16);                \
    case MB_Q8_0: CALL(MB_Q8_0);                \
    case MB_Q4_0: CALL(MB_Q4_0);                \
    case MB_Q4_1: CALL(MB_Q4_1);                \
    case MB_Q5_0: CALL(MB_Q5_0);                \
    case MB_Q5_1: CALL(MB_Q5_1);                \
    case MB_Q4_K: CALL(MB_Q4_K);                \
    case MB_Q5_K: CALL(MB_Q5_K);                \
    case MB_Q6_K: CALL(MB_Q6_K);                \
  }

}  // namespace markbase::cuda
