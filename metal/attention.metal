// Causal attention of T query rows over a layer's KV cache (f16 or f32), with an optional
// sliding window; head_dim up to 512 (Gemma 4's full layers). One threadgroup of ATT_SG
// simdgroups per (head, row): each simdgroup walks every ATT_SG-th key with an online softmax,
// the lanes holding head_dim / 32 elements of q and of the output; the simdgroups' partial
// results are merged at the end through threadgroup memory.
#include "dequant.h"
#include "kernel_args.h"

#define ATT_SG 4
#define ATT_MAX_PER_LANE 16  // head_dim <= 512

template <typename C>
kernel void attention(constant AttnArgs& args [[buffer(0)]],
                      device const float* q [[buffer(1)]],
                      device const C* kc [[buffer(2)]],
                      device const C* vc [[buffer(3)]],
                      device const int* step [[buffer(4)]],
                      device float* out [[buffer(5)]],
                      uint2 tgid [[threadgroup_position_in_grid]],
                      uint lane [[thread_index_in_simdgroup]],
                      uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float m_sg[ATT_SG];
  threadgroup float l_sg[ATT_SG];
  threadgroup float o_sg[ATT_SG * 512];
  const int d = args.head_dim, h = int(tgid.x), t = int(tgid.y);
  const int kvh = h / (args.heads / args.kv_heads);
  const int pos = step[0] + t;
  const int first = args.window > 0 ? max(0, pos - args.window + 1) : 0;
  const int per_lane = (d + 31) / 32;
  device const float* qv = q + long(t) * args.q_stride + h * d;
  float qr[ATT_MAX_PER_LANE], o[ATT_MAX_PER_LANE];
  for (int i = 0; i < per_lane; ++i) {
    const int j = int(lane) + 32 * i;
    qr[i] = j < d ? qv[j] : 0.0f;
    o[i] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  device const C* kh = kc + long(kvh) * args.capacity * d;
  device const C* vh = vc + long(kvh) * args.capacity * d;
  for (int p = first + int(sg); p <= pos; p += ATT_SG) {
    const long row = long(args.ring ? p % args.capacity : p) * d;
    float s = 0.0f;
    for (int i = 0; i < per_lane; ++i) {
      const int j = int(lane) + 32 * i;
      if (j < d) s += qr[i] * float(kh[row + j]);
    }
    s = simd_sum(s) * args.scale;
    const float m_new = max(m, s);
    const float corr = exp(m - m_new), e = exp(s - m_new);
    l = l * corr + e;
    for (int i = 0; i < per_lane; ++i) {
      const int j = int(lane) + 32 * i;
      o[i] = o[i] * corr + (j < d ? e * float(vh[row + j]) : 0.0f);
    }
    m = m_new;
  }
  if (lane == 0) { m_sg[sg] = m; l_sg[sg] = l; }
  for (int i = 0; i < per_lane; ++i) {
    const int j = int(lane) + 32 * i;
    if (j < d) o_sg[sg * 512 + j] = o[i];
  }
  threadgroup_barrier(mem_flags::mem_threadgroup);
  if (sg != 0) return;
  float mx = -INFINITY;
  for (int s2 = 0; s2 < ATT_SG; ++s2) mx = max(mx, m_sg[s2]);
  float wsum = 0.0f, wts[ATT_SG];
  for (int s2 = 0; s2 < ATT_SG; ++s2) {
    // A simdgroup that saw no key (m = -inf) contributes nothing.
    wts[s2] = m_sg[s2] == -INFINITY ? 0.0f : exp(m_sg[s2] - mx);
    wsum += wts[s2] * l_sg[s2];
  }
  device float* y = out + long(t) * args.out_stride + h * d;
  for (int i = 0; i < per_lane; ++i) {
    const int j = int(lane) + 32 * i;
    if (j >= d) continue;
    float acc = 0.0f;
    for (int s2 = 0; s2 < ATT_SG; ++s2) acc += wts[s2] == 0.0f ? 0.0f : wts[s2] * o_sg[s2 * 512 + j];
    y[j] = acc / wsum;
  }
}
template [[host_name("attention_f16")]] kernel decltype(attention<half>) attention<half>;
template [[host_name("attention_f32")]] kernel decltype(attention<float>) attention<float>;
