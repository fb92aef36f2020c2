// Mixture-of-experts: routing and the expert products. The router's choices never leave the
// GPU: moe_route writes [weight, expert id] pairs to a device buffer; for decode the expert
// kernels read the ids from it; for prefill moe_plan turns them into per-expert lists of
// (token, slot) pairs and the tile table and indirect dispatch sizes of moe_mm (matmul.metal).
#include "dequant.h"
#include "kernel_args.h"

// Softmax over the experts' logits, top-k (ties to the lower id), weights renormalised over the
// k chosen and multiplied by the per-expert scale. Grid: (T) threadgroups of 32 threads.
kernel void moe_route(constant RouteArgs& args [[buffer(0)]],
                      device const float* logits [[buffer(1)]],
                      device const float* expert_scale [[buffer(2)]],
                      device float* route [[buffer(3)]],
                      uint t [[threadgroup_position_in_grid]],
                      uint lane [[thread_index_in_simdgroup]]) {
  device const float* l = logits + long(t) * args.a_stride;
  const int E = args.n_experts;
  float mx = -INFINITY;
  for (int e = int(lane); e < E; e += 32) mx = max(mx, l[e]);
  mx = simd_max(mx);
  float sum = 0.0f;
  for (int e = int(lane); e < E; e += 32) sum += exp(l[e] - mx);
  sum = simd_sum(sum);
  // k rounds of arg-max; chosen experts are remembered as a bit per (lane, slot).
  uint taken = 0;  // bit s: expert lane + 32 s is taken (E <= 1024)
  float picked_p[16];
  int picked_e[16];
  float wsum = 0.0f;
  for (int j = 0; j < args.k; ++j) {
    float best = -1.0f;
    int best_e = 0x7fffffff;
    for (int s = 0; lane + 32 * s < uint(E); ++s) {
      const int e = int(lane) + 32 * s;
      const float p = exp(l[e] - mx) / sum;
      if (!((taken >> s) & 1u) && (p > best || (p == best && e < best_e))) { best = p; best_e = e; }
    }
    const float top = simd_max(best);
    const int top_e = simd_min(best == top ? best_e : 0x7fffffff);
    if (top_e % 32 == int(lane)) taken |= 1u << (top_e / 32);
    picked_p[j] = top;
    picked_e[j] = top_e;
    wsum += top;
  }
  if (lane != 0) return;
  device float* o = route + long(t) * args.out_stride;
  for (int j = 0; j < args.k; ++j) {
    const int e = picked_e[j];
    o[2 * j] = picked_p[j] / wsum * (args.has_scale ? expert_scale[e] : 1.0f);
    o[2 * j + 1] = float(e);
  }
}

// Decode (and short steps): for each (token t, slot j), rows r of the expert route[t][j] chose:
// act[t * k + j, r] = gelu(gate_e[r] . a[t]) * (up_e[r] . a[t]).
// Grid: (ceil(ffn / 4), T * k) threadgroups of 4 simdgroups, one row each.
kernel void moe_gate_up(constant MoeArgs& args [[buffer(0)]],
                        device const uchar* gu [[buffer(1)]],
                        device const float* a [[buffer(2)]],
                        device const float* route [[buffer(3)]],
                        device float* act [[buffer(4)]],
                        uint2 tgid [[threadgroup_position_in_grid]],
                        uint lane [[thread_index_in_simdgroup]],
                        uint sg [[simdgroup_index_in_threadgroup]]) {
  const int r = int(tgid.x) * 4 + int(sg);
  const int pair = int(tgid.y), t = pair / args.k, j = pair % args.k;
  if (r >= args.ffn) return;
  const int e = int(route[long(t) * args.route_stride + 2 * j + 1]);
  device const uchar* we = gu + long(e) * 2 * args.ffn * args.gu_row_bytes;
  device const uchar* wg = we + long(r) * args.gu_row_bytes;
  device const uchar* wu = we + long(args.ffn + r) * args.gu_row_bytes;
  device const float* x = a + long(t) * args.a_stride;
  float g = 0.0f, u = 0.0f;
  for (int i = int(lane) * 4; i < args.hidden; i += 128) {
    const float4 xv = float4(x[i], x[i + 1], x[i + 2], x[i + 3]);
    g += dot(dequant4(args.type_gu, wg, i), xv);
    u += dot(dequant4(args.type_gu, wu, i), xv);
  }
  g = simd_sum(g);
  u = simd_sum(u);
  if (lane == 0) act[long(pair) * args.ffn + r] = mb_gelu_tanh(g) * u;
}

// The weighted sum of the k experts fused into their down products:
// out[t, r] = sum_j w[t][j] * (down_e(j)[r] . act[t * k + j]).
// Grid: (ceil(hidden / 4), T) threadgroups of 4 simdgroups.
kernel void moe_down_sum(constant MoeArgs& args [[buffer(0)]],
                         device const uchar* dn [[buffer(1)]],
                         device const float* act [[buffer(2)]],
                         device const float* route [[buffer(3)]],
                         device float* out [[buffer(4)]],
                         uint2 tgid [[threadgroup_position_in_grid]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]]) {
  const int r = int(tgid.x) * 4 + int(sg), t = int(tgid.y);
  if (r >= args.hidden) return;
  float total = 0.0f;
  for (int j = 0; j < args.k; ++j) {
    const float wj = route[long(t) * args.route_stride + 2 * j];
    const int e = int(route[long(t) * args.route_stride + 2 * j + 1]);
    device const uchar* w = dn + (long(e) * args.hidden + r) * args.dn_row_bytes;
    device const float* x = act + long(t * args.k + j) * args.ffn;
    float s = 0.0f;
    for (int i = int(lane) * 4; i < args.ffn; i += 128)
      s += dot(dequant4(args.type_dn, w, i), float4(x[i], x[i + 1], x[i + 2], x[i + 3]));
    total += wj * simd_sum(s);
  }
  if (lane == 0) out[long(t) * args.out_stride + r] = total;
}

// Prefill plan, one threadgroup of 32 * k threads: thread e lists the (token, slot) pairs routed
// to expert e in pair order (so results do not depend on scheduling), then thread 0 lays out
// tiles of up to 32 pairs and writes the tile table and both indirect dispatch sizes.
// pairs: T * k ints; counts: n_experts ints (scratch); tiles: 3 * (T * k / 32 + n_experts) ints;
// dispatch: {tiles, ceil(2 * ffn / 32), 1} for gate_up and {tiles, ceil(hidden / 32), 1} for down.
kernel void moe_plan(constant MoeArgs& args [[buffer(0)]],
                     device const float* route [[buffer(1)]],
                     device int* pairs [[buffer(2)]],
                     device int* counts [[buffer(3)]],
                     device int* tiles [[buffer(4)]],
                     device uint* dispatch [[buffer(5)]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint ntg [[threads_per_threadgroup]]) {
  const int P = args.T * args.k;
  for (int e = int(tid); e < args.n_experts; e += int(ntg)) {
    int c = 0;
    for (int p = 0; p < P; ++p)
      if (int(route[long(p / args.k) * args.route_stride + 2 * (p % args.k) + 1]) == e) ++c;
    counts[e] = c;
  }
  threadgroup_barrier(mem_flags::mem_device);
  for (int e = int(tid); e < args.n_experts; e += int(ntg)) {
    int off = 0;
    for (int e2 = 0; e2 < e; ++e2) off += counts[e2];
    int c = 0;
    for (int p = 0; p < P; ++p)
      if (int(route[long(p / args.k) * args.route_stride + 2 * (p % args.k) + 1]) == e) pairs[off + c++] = p;
  }
  threadgroup_barrier(mem_flags::mem_device);
  if (tid != 0) return;
  int n_tiles = 0, off = 0;
  for (int e = 0; e < args.n_experts; ++e) {
    for (int s = 0; s < counts[e]; s += 32) {
      tiles[3 * n_tiles] = e;
      tiles[3 * n_tiles + 1] = off + s;
      tiles[3 * n_tiles + 2] = min(32, counts[e] - s);
      ++n_tiles;
    }
    off += counts[e];
  }
  dispatch[0] = uint(n_tiles); dispatch[1] = uint((2 * args.ffn + 31) / 32); dispatch[2] = 1;
  dispatch[3] = uint(n_tiles); dispatch[4] = uint((args.hidden + 31) / 32); dispatch[5] = 1;
}

// Prefill: act[p, r] = gelu(hg[p, r]) * hg[p, ffn + r]. Grid: (ceil(ffn / 256), T * k) x 256.
kernel void moe_geglu(constant MoeArgs& args [[buffer(0)]],
                      device const float* hg [[buffer(1)]],
                      device float* act [[buffer(2)]],
                      uint2 gid [[thread_position_in_grid]]) {
  const int r = int(gid.x), p = int(gid.y);
  if (r >= args.ffn) return;
  device const float* h = hg + long(p) * 2 * args.ffn;
  act[long(p) * args.ffn + r] = mb_gelu_tanh(h[r]) * h[args.ffn + r];
}

// Prefill: out[t, r] = sum_j w[t][j] * y[t * k + j, r], in slot order.
// Grid: (ceil(hidden / 256), T) x 256.
kernel void moe_sum(constant MoeArgs& args [[buffer(0)]],
                    device const float* y [[buffer(1)]],
                    device const float* route [[buffer(2)]],
                    device float* out [[buffer(3)]],
                    uint2 gid [[thread_position_in_grid]]) {
  const int r = int(gid.x), t = int(gid.y);
  if (r >= args.hidden) return;
  float total = 0.0f;
  for (int j = 0; j < args.k; ++j)
    total += route[long(t) * args.route_stride + 2 * j] * y[long(t * args.k + j) * args.hidden + r];
  out[long(t) * args.out_stride + r] = total;
}
