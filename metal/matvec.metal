// Matrix-vector products for decode (and short steps of up to MV_MAX_T tokens): each simdgroup
// computes one output row for every token, its 32 lanes walking the row four weights at a time
// and decoding them straight from the quantized blocks (metal/dequant.h), so each weight byte
// is read once per step. simd_sum reduces the lanes' partial dots. One kernel per tensor type.
#include "dequant.h"
#include "kernel_args.h"

#define MV_SG 4      // simdgroups (rows) per threadgroup
#define MV_MAX_T 8   // tokens per dispatch

// The RMS norm fused into the product (decode): rnorm[t] = 1 / rms(a[t]), computed by every
// simdgroup for itself (the row is in cache; this saves a dispatch and a round trip through
// memory), and 1 for every token when there is no norm.
inline void row_norms(constant MatArgs& args, device const float* a, uint lane, thread float* rnorm) {
  for (int t = 0; t < args.T; ++t) {
    float s = 0.0f;
    if (args.has_norm) {
      device const float* x = a + long(t) * args.a_stride;
      for (int i = int(lane); i < args.k; i += 32) s += x[i] * x[i];
    }
    s = simd_sum(s);
    rnorm[t] = args.has_norm ? rsqrt(s / float(args.k) + args.eps) : 1.0f;
  }
}

// Weight row r's dot with T activation rows (each times rnorm[t] * nw, the fused norm, when
// has_norm); lane's partial sums in acc.
template <int TYPE>
inline void row_dots(device const uchar* wrow, device const float* a, int a_stride, int k, int T,
                     int has_norm, device const float* nw, thread const float* rnorm, uint lane,
                     thread float* acc) {
  for (int t = 0; t < MV_MAX_T; ++t) acc[t] = 0.0f;
  for (int i = int(lane) * 4; i < k; i += 128) {
    const float4 w4 = dequant4(TYPE, wrow, i);  // TYPE is a constant: the switch folds away
    const float4 g = has_norm ? float4(nw[i], nw[i + 1], nw[i + 2], nw[i + 3]) : float4(1.0f);
    for (int t = 0; t < T; ++t) {
      device const float* x = a + long(t) * a_stride + i;
      // (x * r) * w, as the separate norm computes it
      acc[t] += dot(w4, (float4(x[0], x[1], x[2], x[3]) * rnorm[t]) * g);
    }
  }
}

// out[t, r] = dot(W[r], a[t]) (softcapped when args.softcap > 0: the head of Gemma 2-style
// models, fused here so the logits are written once). Grid: (ceil(n / MV_SG), 1), 32 * MV_SG threads.
template <int TYPE>
kernel void mul_mv(constant MatArgs& args [[buffer(0)]],
                   device const uchar* w [[buffer(1)]],
                   device const float* a [[buffer(2)]],
                   device float* out [[buffer(3)]],
                   device const float* nw [[buffer(4)]],
                   uint tgid [[threadgroup_position_in_grid]],
                   uint lane [[thread_index_in_simdgroup]],
                   uint sg [[simdgroup_index_in_threadgroup]]) {
  const int r = int(tgid) * MV_SG + int(sg);
  if (r >= args.n) return;
  float acc[MV_MAX_T], rnorm[MV_MAX_T];
  row_norms(args, a, lane, rnorm);
  row_dots<TYPE>(w + long(r) * args.row_bytes, a, args.a_stride, args.k, args.T, args.has_norm, nw,
                 rnorm, lane, acc);
  for (int t = 0; t < args.T; ++t) {
    float v = simd_sum(acc[t]);
    if (args.softcap > 0.0f) v = args.softcap * tanh(v / args.softcap);
    if (lane == 0) out[long(t) * args.out_stride + r] = v;
  }
}

// GeGLU fused into the gate and up products: out[t, r] = gelu(Wg[r] . a[t]) * (Wu[r] . a[t]).
template <int TYPE>
kernel void mul_mv_geglu(constant MatArgs& args [[buffer(0)]],
                         device const uchar* wg [[buffer(1)]],
                         device const uchar* wu [[buffer(2)]],
                         device const float* a [[buffer(3)]],
                         device float* out [[buffer(4)]],
                         device const float* nw [[buffer(5)]],
                         uint tgid [[threadgroup_position_in_grid]],
                         uint lane [[thread_index_in_simdgroup]],
                         uint sg [[simdgroup_index_in_threadgroup]]) {
  const int r = int(tgid) * MV_SG + int(sg);
  if (r >= args.n) return;
  float g[MV_MAX_T], u[MV_MAX_T], rnorm[MV_MAX_T];
  row_norms(args, a, lane, rnorm);
  row_dots<TYPE>(wg + long(r) * args.row_bytes, a, args.a_stride, args.k, args.T, args.has_norm, nw,
                 rnorm, lane, g);
  row_dots<TYPE>(wu + long(r) * args.row_bytes, a, args.a_stride, args.k, args.T, args.has_norm, nw,
                 rnorm, lane, u);
  for (int t = 0; t < args.T; ++t) {
    const float gv = simd_sum(g[t]), uv = simd_sum(u[t]);
    if (lane == 0) out[long(t) * args.out_stride + r] = mb_gelu_tanh(gv) * uv;
  }
}

// One instance per tensor type (the host picks by name: mul_mv_<type>).
template [[host_name("mul_mv_f32")]] kernel decltype(mul_mv<MB_F32>) mul_mv<MB_F32>;
template [[host_name("mul_mv_f16")]] kernel decltype(mul_mv<MB_F16>) mul_mv<MB_F16>;
template [[host_name("mul_mv_bf16")]] kernel decltype(mul_mv<MB_BF16>) mul_mv<MB_BF16>;
template [[host_name("mul_mv_q8_0")]] kernel decltype(mul_mv<MB_Q8_0>) mul_mv<MB_Q8_0>;
template [[host_name("mul_mv_q4_0")]] kernel decltype(mul_mv<MB_Q4_0>) mul_mv<MB_Q4_0>;
template [[host_name("mul_mv_q4_1")]] kernel decltype(mul_mv<MB_Q4_1>) mul_mv<MB_Q4_1>;
template [[host_name("mul_mv_q5_0")]] kernel decltype(mul_mv<MB_Q5_0>) mul_mv<MB_Q5_0>;
template [[host_name("mul_mv_q5_1")]] kernel decltype(mul_mv<MB_Q5_1>) mul_mv<MB_Q5_1>;
template [[host_name("mul_mv_q4_k")]] kernel decltype(mul_mv<MB_Q4_K>) mul_mv<MB_Q4_K>;
template [[host_name("mul_mv_q5_k")]] kernel decltype(mul_mv<MB_Q5_K>) mul_mv<MB_Q5_K>;
template [[host_name("mul_mv_q6_k")]] kernel decltype(mul_mv<MB_Q6_K>) mul_mv<MB_Q6_K>;
template [[host_name("mul_mv_geglu_f32")]] kernel decltype(mul_mv_geglu<MB_F32>) mul_mv_geglu<MB_F32>;
template [[host_name("mul_mv_geglu_f16")]] kernel decltype(mul_mv_geglu<MB_F16>) mul_mv_geglu<MB_F16>;
template [[host_name("mul_mv_geglu_bf16")]] kernel decltype(mul_mv_geglu<MB_BF16>) mul_mv_geglu<MB_BF16>;
template [[host_name("mul_mv_geglu_q8_0")]] kernel decltype(mul_mv_geglu<MB_Q8_0>) mul_mv_geglu<MB_Q8_0>;
template [[host_name("mul_mv_geglu_q4_0")]] kernel decltype(mul_mv_geglu<MB_Q4_0>) mul_mv_geglu<MB_Q4_0>;
template [[host_name("mul_mv_geglu_q4_1")]] kernel decltype(mul_mv_geglu<MB_Q4_1>) mul_mv_geglu<MB_Q4_1>;
template [[host_name("mul_mv_geglu_q5_0")]] kernel decltype(mul_mv_geglu<MB_Q5_0>) mul_mv_geglu<MB_Q5_0>;
template [[host_name("mul_mv_geglu_q5_1")]] kernel decltype(mul_mv_geglu<MB_Q5_1>) mul_mv_geglu<MB_Q5_1>;
template [[host_name("mul_mv_geglu_q4_k")]] kernel decltype(mul_mv_geglu<MB_Q4_K>) mul_mv_geglu<MB_Q4_K>;
template [[host_name("mul_mv_geglu_q5_k")]] kernel decltype(mul_mv_geglu<MB_Q5_K>) mul_mv_geglu<MB_Q5_K>;
template [[host_name("mul_mv_geglu_q6_k")]] kernel decltype(mul_mv_geglu<MB_Q6_K>) mul_mv_geglu<MB_Q6_K>;
