// Device helpers shared by the CUDA kernels. Block decoding comes from metal/dequant.h, the one
// source of that arithmetic for the Metal and CUDA backends.
#pragma once
#include <cuda_fp16.h>

#include "../../../metal/dequant.h"
#include "backend/cuda/kernels.h"

namespace markbase::cuda {

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}

// Sum over a block of blockDim.x threads (a multiple of 32, at most 1024); every thread gets it.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float part[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // part[] may still be read by a previous call
  if (lane == 0) part[warp] = v;
  __syncthreads();
  float r = lane < nw ? part[lane] : 0.0f;
  return warp_sum(r);
}

// One weight of any type (for tails of float rows whose length is not a multiple of 4).
__device__ __forceinline__ float weight_at(int type, const mb_u8* row, int i) {
  if (type == MB_F32) return reinterpret_cast<const float*>(row)[i];
  if (type == MB_F16) return __half2float(__ushort_as_half(reinterpret_cast<const mb_u16*>(row)[i]));
  if (type == MB_BF16) return __uint_as_float(mb_u32(reinterpret_cast<const mb_u16*>(row)[i]) << 16);
  const float4 v = dequant4(type, row, i & ~3);  // block types: rows are whole blocks
  const int j = i & 3;
  return j == 0 ? v.x : j == 1 ? v.y : j == 2 ? v.z : v.w;
}

// Weights i..i+3 of a row of K, zero past the end (only float rows can end inside a group of 4).
__device__ __forceinline__ float4 weights4(int type, const mb_u8* row, int i, int K) {
  if (i + 4 <= K) return dequant4(type, row, i);
  float r[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) r[j] = i + j < K ? weight_at(type, row, i + j) : 0.0f;
  return make_float4(r[0], r[1], r[2], r[3]);
}

__device__ __forceinline__ float dot4(float4 a, float4 b) {
  return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w;
}

}  // namespace markbase::cuda

// Launch checks: a bad launch configuration becomes a BackendError on the host (cuda_backend.cpp
// checks cudaGetLastError after each op).
#define MB_BLOCKS(n, b) static_cast<unsigned>(((n) + (b) - 1) / (b))
