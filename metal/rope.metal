// Rotary position embedding (NeoX layout: pairs (j, j + d/2)), alone or fused with the per-head
// RMS norm before it (QK-norm). Positions are pos0 (the step buffer) + row.
#include "dequant.h"
#include "kernel_args.h"

// Grid: (heads, T) threadgroups of 32 * k threads; each threadgroup rotates one head of one row.
// inv_freq: head_dim / 2 inverse frequencies (0 for the unrotated part of partial RoPE).
kernel void rope_norm(constant RopeArgs& args [[buffer(0)]],
                      device const float* a [[buffer(1)]],
                      device const float* w [[buffer(2)]],
                      device const float* inv_freq [[buffer(3)]],
                      device const int* step [[buffer(4)]],
                      device float* out [[buffer(5)]],
                      uint2 tgid [[threadgroup_position_in_grid]],
                      uint tid [[thread_index_in_threadgroup]],
                      uint ntg [[threads_per_threadgroup]],
                      uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float partial[32];
  const int d = args.head_dim, half_d = d / 2, t = int(tgid.y);
  device const float* x = a + long(t) * args.a_stride + int(tgid.x) * d;
  device float* y = out + long(t) * args.out_stride + int(tgid.x) * d;
  float r = 1.0f;
  if (args.has_norm) {
    float s = 0.0f;
    for (int j = int(tid); j < d; j += int(ntg)) s += x[j] * x[j];
    s = simd_sum(s);
    if (lane == 0) partial[sg] = s;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    float total = 0.0f;
    for (uint i = 0; i < ntg / 32; ++i) total += partial[i];
    r = rsqrt(total / float(d) + args.eps);
  }
  const float pos = float(step[0] + t);
  for (int j = int(tid); j < half_d; j += int(ntg)) {
    float x0 = x[j], x1 = x[j + half_d];
    if (args.has_norm) {
      x0 = (x0 * r) * w[j];
      x1 = (x1 * r) * w[j + half_d];
    }
    const float ang = pos * inv_freq[j];
    const float c = precise::cos(ang), s = precise::sin(ang);
    y[j] = x0 * c - x1 * s;
    y[j + half_d] = x1 * c + x0 * s;
  }
}
