// Elementwise ops over rows of activations. Grid: (ceil(n / 256), rows) of 256 threads.
#include "dequant.h"
#include "kernel_args.h"

kernel void gelu_mul(constant EltArgs& args [[buffer(0)]],
                     device const float* a [[buffer(1)]],
                     device const float* b [[buffer(2)]],
                     device float* out [[buffer(3)]],
                     uint2 gid [[thread_position_in_grid]]) {
  const int j = int(gid.x), t = int(gid.y);
  if (j >= args.n) return;
  out[long(t) * args.out_stride + j] =
      mb_gelu_tanh(a[long(t) * args.a_stride + j]) * b[long(t) * args.b_stride + args.b_col + j];
}

kernel void add(constant EltArgs& args [[buffer(0)]],
                device const float* a [[buffer(1)]],
                device const float* b [[buffer(2)]],
                device float* out [[buffer(3)]],
                uint2 gid [[thread_position_in_grid]]) {
  const int j = int(gid.x), t = int(gid.y);
  if (j >= args.n) return;
  out[long(t) * args.out_stride + j] = a[long(t) * args.a_stride + j] + b[long(t) * args.b_stride + j];
}

kernel void scale(constant EltArgs& args [[buffer(0)]],
                  device const float* a [[buffer(1)]],
                  device float* out [[buffer(2)]],
                  uint2 gid [[thread_position_in_grid]]) {
  const int j = int(gid.x), t = int(gid.y);
  if (j >= args.n) return;
  out[long(t) * args.out_stride + j] = a[long(t) * args.a_stride + j] * args.f;
}

kernel void softcap(constant EltArgs& args [[buffer(0)]],
                    device const float* a [[buffer(1)]],
                    device float* out [[buffer(2)]],
                    uint2 gid [[thread_position_in_grid]]) {
  const int j = int(gid.x), t = int(gid.y);
  if (j >= args.n) return;
  out[long(t) * args.out_stride + j] = args.f * tanh(a[long(t) * args.a_stride + j] / args.f);
}

// out[0] = a[rows - 1]: the last token's row, for the head of a decode graph.
kernel void last_row(constant EltArgs& args [[buffer(0)]],
                     device const float* a [[buffer(1)]],
                     device float* out [[buffer(2)]],
                     uint2 gid [[thread_position_in_grid]]) {
  const int j = int(gid.x);
  if (j >= args.n) return;
  out[j] = a[long(args.rows - 1) * args.a_stride + j];
}
