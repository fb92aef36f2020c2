// RMS normalisation of groups of columns, alone or fused into the residual add that follows it.
#include "dequant.h"
#include "kernel_args.h"

// Sum of x^2 over a group of `g` values, by a threadgroup of `ntg` threads (a multiple of 32).
inline float group_sum_sq(device const float* x, int g, uint tid, uint ntg, uint lane, uint sg,
                          threadgroup float* partial) {
  float s = 0.0f;
  for (int j = int(tid); j < g; j += int(ntg)) s += x[j] * x[j];
  s = simd_sum(s);
  if (lane == 0) partial[sg] = s;
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float total = 0.0f;
  for (uint i = 0; i < ntg / 32; ++i) total += partial[i];
  return total;
}

// Grid: (groups per row, rows) threadgroups. out may alias a (each thread rewrites what it read).
kernel void rms_norm(constant NormArgs& args [[buffer(0)]],
                     device const float* a [[buffer(1)]],
                     device const float* w [[buffer(2)]],
                     device float* out [[buffer(3)]],
                     uint2 tgid [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint ntg [[threads_per_threadgroup]],
                     uint lane [[thread_index_in_simdgroup]],
                     uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  const int g = args.group;
  device const float* x = a + long(tgid.y) * args.a_stride + int(tgid.x) * g;
  device float* y = out + long(tgid.y) * args.out_stride + int(tgid.x) * g;
  const float r = rsqrt(group_sum_sq(x, g, tid, ntg, lane, sg, partial) / float(g) + args.eps);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int j = int(tid); j < g; j += int(ntg)) y[j] = args.has_weight ? (x[j] * r) * w[j] : x[j] * r;
}

// The residual add fused with the norm before it: out2[t] = res[t] + (out[t] = norm(a[t]) * w)
// (res may be out2: the add in place). Grid: (1, rows) threadgroups (one group per row).
kernel void rms_norm_add(constant NormArgs& args [[buffer(0)]],
                         device const float* a [[buffer(1)]],
                         device const float* w [[buffer(2)]],
                         device float* out [[buffer(3)]],
                         device float* out2 [[buffer(4)]],
                         device const float* res [[buffer(5)]],
                         uint2 tgid [[threadgroup_position_in_grid]],
                         uint tid [[thread_index_in_threadgroup]],
                         uint ntg [[threads_per_threadgroup]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  const int g = args.n;
  device const float* x = a + long(tgid.y) * args.a_stride;
  device float* y = out + long(tgid.y) * args.out_stride;
  device float* z = out2 + long(tgid.y) * args.out2_stride;
  device const float* x0 = res + long(tgid.y) * args.res_stride;
  const float r = rsqrt(group_sum_sq(x, g, tid, ntg, lane, sg, partial) / float(g) + args.eps);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int j = int(tid); j < g; j += int(ntg)) {
    const float v = args.has_weight ? (x[j] * r) * w[j] : x[j] * r;
    y[j] = v;
    z[j] = x0[j] + v;
  }
}
