// Matrix-matrix products for prefill: out[t, r] = dot(W[r], a[t]) over tiles of 32 weight rows x
// 32 token rows. The 128 threads of a threadgroup decode a 32 x 32 slice of the weight blocks
// and of the activations into threadgroup memory, then four simdgroups multiply them with 8 x 8
// simdgroup matrices (each simdgroup a 16 x 16 quarter of the tile). The same tile function
// serves the MoE experts, whose token rows come from per-expert lists built on the GPU.
#include "dequant.h"
#include "kernel_args.h"

#define MM_B 32  // tile rows, tile tokens and k step

// Rows of `a` gathered by `list` (nullptr: rows t0 .. t0 + count - 1): token i of the tile reads
// a[list[i] / div] and writes out[list[i]].
template <int TYPE>
inline void mm_tile(device const uchar* w, int row_bytes, int n, int k, int row0,
                    device const float* a, int a_stride, device float* out, int out_stride,
                    int t0, int count, device const int* list, int div,
                    threadgroup float* ws, threadgroup float* as, uint tid, uint sg) {
  simdgroup_float8x8 acc[2][2];
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) acc[i][j] = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
  const int sr = int(sg / 2) * 16, st = int(sg % 2) * 16;  // this simdgroup's quarter
  for (int k0 = 0; k0 < k; k0 += MM_B) {
    for (int c = 0; c < 2; ++c) {
      const int idx = int(tid) + 128 * c, rr = idx / 8, kk = (idx % 8) * 4;
      float4 wv = float4(0.0f), av = float4(0.0f);
      if (row0 + rr < n && k0 + kk < k) wv = dequant4(TYPE, w + long(row0 + rr) * row_bytes, k0 + kk);
      if (rr < count && k0 + kk < k) {
        const int src = list ? list[t0 + rr] / div : t0 + rr;
        device const float* x = a + long(src) * a_stride + k0 + kk;
        av = float4(x[0], x[1], x[2], x[3]);
      }
      for (int e = 0; e < 4; ++e) {
        ws[rr * MM_B + kk + e] = wv[e];
        as[rr * MM_B + kk + e] = av[e];
      }
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (int kk = 0; kk < MM_B; kk += 8) {
      simdgroup_float8x8 wm[2], am[2];
      for (int i = 0; i < 2; ++i) simdgroup_load(wm[i], ws + (sr + 8 * i) * MM_B + kk, MM_B);
      for (int j = 0; j < 2; ++j) simdgroup_load(am[j], as + (st + 8 * j) * MM_B + kk, MM_B, ulong2(0, 0), true);
      for (int i = 0; i < 2; ++i)
        for (int j = 0; j < 2; ++j) simdgroup_multiply_accumulate(acc[i][j], wm[i], am[j], acc[i][j]);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
  }
  // Stage the 32 x 32 result (rows x tokens) in ws, then write the valid part.
  for (int i = 0; i < 2; ++i)
    for (int j = 0; j < 2; ++j) simdgroup_store(acc[i][j], ws + (sr + 8 * i) * MM_B + st + 8 * j, MM_B);
  threadgroup_barrier(mem_flags::mem_threadgroup);
  for (int idx = int(tid); idx < MM_B * MM_B; idx += 128) {
    const int rr = idx % MM_B, tt = idx / MM_B;
    if (row0 + rr >= n || tt >= count) continue;
    const int dst = list ? list[t0 + tt] : t0 + tt;
    out[long(dst) * out_stride + row0 + rr] = ws[rr * MM_B + tt];
  }
}

// Grid: (ceil(n / 32), ceil(T / 32)) threadgroups of 128 threads.
template <int TYPE>
kernel void mul_mm(constant MatArgs& args [[buffer(0)]],
                   device const uchar* w [[buffer(1)]],
                   device const float* a [[buffer(2)]],
                   device float* out [[buffer(3)]],
                   uint2 tgid [[threadgroup_position_in_grid]],
                   uint tid [[thread_index_in_threadgroup]],
                   uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float ws[MM_B * MM_B];
  threadgroup float as[MM_B * MM_B];
  const int t0 = int(tgid.y) * MM_B;
  mm_tile<TYPE>(w, args.row_bytes, args.n, args.k, int(tgid.x) * MM_B, a, args.a_stride, out,
                args.out_stride, t0, min(MM_B, args.T - t0), nullptr, 1, ws, as, tid, sg);
}

// The MoE experts' products over the tiles that moe_plan laid out: tile i covers up to 32
// (token, slot) pairs routed to one expert, listed in `pairs`. Dispatched indirectly: the grid's
// x is the number of tiles, which only the GPU knows. tiles[3 i] = {expert, first pair, count}.
// gate_up (div = k): reads the token's normed row, writes hg[pair] (2 * ffn values);
// down (div = 1): reads act[pair], writes y[pair].
template <int TYPE>
kernel void moe_mm(constant MatArgs& args [[buffer(0)]],
                   device const uchar* w [[buffer(1)]],
                   device const float* a [[buffer(2)]],
                   device float* out [[buffer(3)]],
                   device const int* tiles [[buffer(4)]],
                   device const int* pairs [[buffer(5)]],
                   constant int& div [[buffer(6)]],
                   uint2 tgid [[threadgroup_position_in_grid]],
                   uint tid [[thread_index_in_threadgroup]],
                   uint sg [[simdgroup_index_in_threadgroup]]) {
  threadgroup float ws[MM_B * MM_B];
  threadgroup float as[MM_B * MM_B];
  device const int* tile = tiles + 3 * tgid.x;
  device const uchar* we = w + long(tile[0]) * args.n * args.row_bytes;
  mm_tile<TYPE>(we, args.row_bytes, args.n, args.k, int(tgid.y) * MM_B, a, args.a_stride, out,
                args.out_stride, tile[1], tile[2], pairs, div, ws, as, tid, sg);
}

// One instance per tensor type (the host picks by name: mul_mm_<type>, moe_mm_<type>).
template [[host_name("mul_mm_f32")]] kernel decltype(mul_mm<MB_F32>) mul_mm<MB_F32>;
template [[host_name("mul_mm_f16")]] kernel decltype(mul_mm<MB_F16>) mul_mm<MB_F16>;
template [[host_name("mul_mm_bf16")]] kernel decltype(mul_mm<MB_BF16>) mul_mm<MB_BF16>;
template [[host_name("mul_mm_q8_0")]] kernel decltype(mul_mm<MB_Q8_0>) mul_mm<MB_Q8_0>;
template [[host_name("mul_mm_q4_0")]] kernel decltype(mul_mm<MB_Q4_0>) mul_mm<MB_Q4_0>;
template [[host_name("mul_mm_q4_1")]] kernel decltype(mul_mm<MB_Q4_1>) mul_mm<MB_Q4_1>;
template [[host_name("mul_mm_q5_0")]] kernel decltype(mul_mm<MB_Q5_0>) mul_mm<MB_Q5_0>;
template [[host_name("mul_mm_q5_1")]] kernel decltype(mul_mm<MB_Q5_1>) mul_mm<MB_Q5_1>;
template [[host_name("mul_mm_q4_k")]] kernel decltype(mul_mm<MB_Q4_K>) mul_mm<MB_Q4_K>;
template [[host_name("mul_mm_q5_k")]] kernel decltype(mul_mm<MB_Q5_K>) mul_mm<MB_Q5_K>;
template [[host_name("mul_mm_q6_k")]] kernel decltype(mul_mm<MB_Q6_K>) mul_mm<MB_Q6_K>;
template [[host_name("moe_mm_f32")]] kernel decltype(moe_mm<MB_F32>) moe_mm<MB_F32>;
template [[host_name("moe_mm_f16")]] kernel decltype(moe_mm<MB_F16>) moe_mm<MB_F16>;
template [[host_name("moe_mm_bf16")]] kernel decltype(moe_mm<MB_BF16>) moe_mm<MB_BF16>;
template [[host_name("moe_mm_q8_0")]] kernel decltype(moe_mm<MB_Q8_0>) moe_mm<MB_Q8_0>;
template [[host_name("moe_mm_q4_0")]] kernel decltype(moe_mm<MB_Q4_0>) moe_mm<MB_Q4_0>;
template [[host_name("moe_mm_q4_1")]] kernel decltype(moe_mm<MB_Q4_1>) moe_mm<MB_Q4_1>;
template [[host_name("moe_mm_q5_0")]] kernel decltype(moe_mm<MB_Q5_0>) moe_mm<MB_Q5_0>;
template [[host_name("moe_mm_q5_1")]] kernel decltype(moe_mm<MB_Q5_1>) moe_mm<MB_Q5_1>;
template [[host_name("moe_mm_q4_k")]] kernel decltype(moe_mm<MB_Q4_K>) moe_mm<MB_Q4_K>;
template [[host_name("moe_mm_q5_k")]] kernel decltype(moe_mm<MB_Q5_K>) moe_mm<MB_Q5_K>;
template [[host_name("moe_mm_q6_k")]] kernel decltype(moe_mm<MB_Q6_K>) moe_mm<MB_Q6_K>;
