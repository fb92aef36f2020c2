// Writing K and V rows into a layer's cache ([kv_heads][capacity][head_dim], f16 or f32) at the
// step's positions; sliding layers use a ring of `capacity` positions. The fused form takes the
// raw K projection: per-head RMS norm with weight, RoPE, and V's weightless RMS norm, then stores.
#include "dequant.h"
#include "kernel_args.h"

inline int cache_row(int pos, int capacity, int ring) { return ring ? pos % capacity : pos; }

// Grid: (kv_heads, T) threadgroups of 32 * k threads.
template <typename C>
kernel void store_kv(constant KVArgs& args [[buffer(0)]],
                     device const float* k [[buffer(1)]],
                     device const float* v [[buffer(2)]],
                     device const int* step [[buffer(3)]],
                     device C* kc [[buffer(4)]],
                     device C* vc [[buffer(5)]],
                     uint2 tgid [[threadgroup_position_in_grid]],
                     uint tid [[thread_index_in_threadgroup]],
                     uint ntg [[threads_per_threadgroup]]) {
  const int d = args.head_dim, h = int(tgid.x), t = int(tgid.y);
  const long off = (long(h) * args.capacity + cache_row(step[0] + t, args.capacity, args.ring)) * d;
  device const float* kr = k + long(t) * args.k_stride + h * d;
  device const float* vr = v + long(t) * args.v_stride + h * d;
  for (int j = int(tid); j < d; j += int(ntg)) {
    kc[off + j] = C(kr[j]);
    vc[off + j] = C(vr[j]);
  }
}
template [[host_name("store_kv_f16")]] kernel decltype(store_kv<half>) store_kv<half>;
template [[host_name("store_kv_f32")]] kernel decltype(store_kv<float>) store_kv<float>;

// The fused K path: k_out = rope(norm(k_raw) * kw) (also written to the k slot, which later ops
// of the graph may read), v_out = v_norm ? norm(v_raw) : v_raw; both stored into the cache.
// Grid: (kv_heads, T) threadgroups of 32 * k threads.
template <typename C>
kernel void norm_rope_store_kv(constant KVArgs& args [[buffer(0)]],
                               device const float* k_raw [[buffer(1)]],
                               device const float* v_raw [[buffer(2)]],
                               device const float* kw [[buffer(3)]],
                               device const float* inv_freq [[buffer(4)]],
                               device const int* step [[buffer(5)]],
                               device float* k_out [[buffer(6)]],
                               device float* v_out [[buffer(7)]],
                               device C* kc [[buffer(8)]],
                               device C* vc [[buffer(9)]],
                               uint2 tgid [[threadgroup_position_in_grid]],
                               uint tid [[thread_index_in_threadgroup]],
                               uint ntg [[threads_per_threadgroup]],
                               uint lane [[thread_index_in_simdgroup]],
                               uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float pk[32];
  threadgroup float pv[32];
  const int d = args.head_dim, half_d = d / 2, h = int(tgid.x), t = int(tgid.y);
  device const float* kr = k_raw + long(t) * args.k_stride + h * d;
  device const float* vr = v_raw + long(t) * args.v_stride + h * d;
  device float* ko = k_out + long(t) * args.ko_stride + h * d;
  device float* vo = v_out + long(t) * args.vo_stride + h * d;
  float sk = 0.0f, sv = 0.0f;
  for (int j = int(tid); j < d; j += int(ntg)) { sk += kr[j] * kr[j]; sv += vr[j] * vr[j]; }
  sk = simd_sum(sk);
  sv = simd_sum(sv);
  if (lane == 0) { pk[sg] = sk; pv[sg] = sv; }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  float tk = 0.0f, tv = 0.0f;
  for (uint i = 0; i < ntg / 32; ++i) { tk += pk[i]; tv += pv[i]; }
  const float rk = rsqrt(tk / float(d) + args.eps);
  const float rv = args.v_norm ? rsqrt(tv / float(d) + args.eps) : 1.0f;
  const int pos = step[0] + t;
  const long off = (long(h) * args.capacity + cache_row(pos, args.capacity, args.ring)) * d;
  for (int j = int(tid); j < half_d; j += int(ntg)) {
    const float x0 = (kr[j] * rk) * kw[j], x1 = (kr[j + half_d] * rk) * kw[j + half_d];
    const float ang = float(pos) * inv_freq[j];
    const float c = precise::cos(ang), s = precise::sin(ang);
    const float y0 = x0 * c - x1 * s, y1 = x1 * c + x0 * s;
    ko[j] = y0;
    ko[j + half_d] = y1;
    kc[off + j] = C(y0);
    kc[off + j + half_d] = C(y1);
  }
  for (int j = int(tid); j < d; j += int(ntg)) {
    const float y = vr[j] * rv;
    vo[j] = y;
    vc[off + j] = C(y);
  }
}
template [[host_name("norm_rope_store_kv_f16")]] kernel decltype(norm_rope_store_kv<half>) norm_rope_store_kv<half>;
template [[host_name("norm_rope_store_kv_f32")]] kernel decltype(norm_rope_store_kv<float>) norm_rope_store_kv<float>;
