// Token embedding: gather one row per token from the (quantized) table and scale it.
#include "dequant.h"
#include "kernel_args.h"

// Grid: (ceil(n / 4 / 64), T) threadgroups of 64 threads; each thread writes 4 values.
kernel void embed_rows(constant EmbedArgs& args [[buffer(0)]],
                       device const uchar* w [[buffer(1)]],
                       device const int* tokens [[buffer(2)]],
                       device float* out [[buffer(3)]],
                       uint2 tgid [[threadgroup_position_in_grid]],
                       uint tid [[thread_index_in_threadgroup]]) {
  const int t = int(tgid.y);
  const int i = (int(tgid.x) * 64 + int(tid)) * 4;
  if (i >= args.n) return;
  device const uchar* row = w + long(tokens[t]) * args.row_bytes;
  const float4 v = dequant4(args.type, row, i) * args.scale;
  device float* o = out + long(t) * args.out_stride + i;
  o[0] = v.x; o[1] = v.y; o[2] = v.z; o[3] = v.w;
}
