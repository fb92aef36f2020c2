// common.h -- a header shared by the self-test kernels (and laid out for the host too):
// plain structs and functions only, as gen.py expects of headers next to a .metal file.
#pragma once
#ifdef __METAL_VERSION__
#include <metal_stdlib>
using namespace metal;
typedef uint u32;
#else
#include <cstdint>
typedef uint32_t u32;
#endif

// Arguments of the reduction kernels (setBytes).
struct ReduceArgs {
  u32 n;
  float scale;
};

#ifdef __METAL_VERSION__
// A helper used by two kernels: a threadgroup-wide sum through simd_sum and threadgroup memory.
inline float tg_sum(float v, threadgroup float* partial, uint lane, uint sg, uint nsg) {
  v = simd_sum(v);
  if (lane == 0) {
    partial[sg] = v;
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float s = 0.0f;
  for (uint k = 0; k < nsg; ++k) {
    s += partial[k];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  return s;
}
#endif
