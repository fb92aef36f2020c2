// Self-test kernels of the msl_emu shim: each kernel exercises a family of MSL features and
// writes its results for test_ops.cpp to compare with plain C++ references.
#include <metal_stdlib>
#include <metal_simdgroup_matrix>
#include "common.h"
using namespace metal;

constant float kHalfPi = 1.57079632679f;
constant int kTable[4] = {3, 1, 4, 1};
constant uint kMathOps = 32;

// ------------------------------------------------------------------ math library
// out[i * kMathOps + j] = function j of x[i]
kernel void math_ops(
        device const float * x   [[buffer(0)]],
        device       float * out [[buffer(1)]],
        constant     uint  & n   [[buffer(2)]],
        uint gid [[thread_position_in_grid]]) {
    if (gid >= n) {
        return;
    }
    const float v = x[gid];
    const float a = fabs(v) + 0.1f;
    device float * o = out + gid * kMathOps;
    float c;
    const float s = sincos(v, c);
    o[0]  = exp(v);
    o[1]  = exp2(v);
    o[2]  = log(a);
    o[3]  = log2(a);
    o[4]  = tanh(v);
    o[5]  = sqrt(a);
    o[6]  = rsqrt(a);
    o[7]  = fabs(v);
    o[8]  = fmax(v, 0.25f);
    o[9]  = fmin(v, 0.25f);
    o[10] = max(v, -0.5f);
    o[11] = min(v, 0.5f);
    o[12] = clamp(v, -0.5f, 0.5f);
    o[13] = pow(a, 1.5f);
    o[14] = s;
    o[15] = c;
    o[16] = sin(v) + cos(v) * kHalfPi;
    o[17] = floor(v);
    o[18] = ceil(v);
    o[19] = round(v);
    o[20] = rint(v);
    o[21] = select(-1.0f, 1.0f, v > 0.0f);
    o[22] = mix(v, 2.0f, 0.25f);
    o[23] = copysign(2.0f, v);
    o[24] = fast::exp(v) - precise::exp(v);
    o[25] = abs(v);
    o[26] = (isnan(v) ? 10.0f : 0.0f) + (isinf(v) ? 20.0f : 0.0f);
    o[27] = fract(v);
    o[28] = trunc(v);
    o[29] = fmod(v, 0.75f);
    o[30] = atan2(v, 0.5f);
    o[31] = step(0.0f, v) + sign(v);
}

// ------------------------------------------------------------------ vectors, half, types
// One thread; out[k] are the values listed in test_ops.cpp's vector_expected().
kernel void vector_ops(
        device float       * out [[buffer(0)]],
        device const uchar * q   [[buffer(1)]],
        device const half  * h   [[buffer(2)]]) {
    int k = 0;
    const float4 a = float4(1.0f, 2.0f, 3.0f, 4.0f);
    const float2 b = a.yx;
    const float4 c = float4(b, a.zw);                 // concatenation
    out[k++] = c.x; out[k++] = c.y; out[k++] = c.z; out[k++] = c.w;
    const float3 d = float3(a.x, b);                  // 3-vector from scalar + 2-vector
    out[k++] = d.x + 10.0f * d.y + 100.0f * d.z;
    float4 e = a;
    e.xy = e.yx;                                      // swizzle assignment
    out[k++] = e.x; out[k++] = e.y;
    out[k++] = dot(a, c);
    out[k++] = length(float2(3.0f, 4.0f));
    out[k++] = normalize(float2(3.0f, 4.0f)).y;
    const float4 cl = clamp(a, 1.5f, 3.5f);
    out[k++] = cl.x + cl.w;
    const uchar4 qq = uchar4(q[0], q[1], q[2], q[3]);
    const float4 lo = float4(qq & uchar(0x0F));       // value conversion, not a bitcast
    const float4 hi = float4(qq >> uchar(4));
    out[k++] = lo.x + lo.y + lo.z + lo.w;
    out[k++] = hi.x + hi.y + hi.z + hi.w;
    const half4 hv = half4(h[0], h[1], h[2], h[3]);
    const half4 hs = hv * 2.0h + half4(1.0h);
    const float4 hf = static_cast<float4>(hs);        // gen.py rewrites to float4(hs)
    out[k++] = hf.x + hf.y + hf.z + hf.w;
    const half one_plus = 1.0h + 0.0009765625h;       // 1 + 2^-10 in half
    out[k++] = float(one_plus * one_plus - 1.0h);     // rounded to half after each op: 2^-9
    out[k++] = as_type<float>(0x3f800000u);
    out[k++] = float(as_type<uint>(2.0f) >> 23);
    const int4 iv = int4(-3, 5, -7, 9);
    out[k++] = float(abs(iv).x + max(iv, int4(0)).y + min(iv, 0).z);
    const float4 sel = select(float4(0.0f), a, a > 2.5f);
    out[k++] = sel.x + sel.y + sel.z + sel.w;
    out[k++] = all(a > 0.0f) ? 1.0f : 0.0f;
    out[k++] = any(a > 3.5f) ? 1.0f : 0.0f;
    packed_float3 p = packed_float3(1.0f, 2.0f, 3.0f);
    p[1] = 5.0f;
    const float3 pv = p;
    out[k++] = float(sizeof(packed_float3)) + pv.y;
    out[k++] = float(sizeof(float3));
    const bfloat bf = bfloat(1.00390625f);            // rounds to 1.0 in bfloat (8 mantissa bits)
    out[k++] = float(bf);
    out[k++] = float(numeric_limits<half>::max());
    out[k++] = (INFINITY > FLT_MAX) ? 1.0f : 0.0f;
    out[k++] = -numeric_limits<float>::infinity() < -FLT_MAX ? 1.0f : 0.0f;
    out[k++] = float(kTable[2]) + kHalfPi;
    ReduceArgs ra;
    ra.n = 7;
    ra.scale = 0.5f;
    out[k++] = float(ra.n) * ra.scale;
    out[k++] = float(popcount(0xF0F0u) + clz(1u) + ctz(8u));
    const ushort2 us = ushort2(65535, 1);
    out[k++] = float(us.x + us.y);                    // integer promotion: 65536
    const float2 m = fma(float2(2.0f), float2(3.0f), float2(1.0f));
    out[k++] = m.x + m.y;
    out[k++] = float(half(65504.0f) + half(0.0f));
}

// ------------------------------------------------------------------ simd collectives
// Per thread, out[tid * kSimdOut + j]; partial last simdgroups test the active-lane masks.
constant uint kSimdOut = 24;
kernel void simd_ops(
        device const float * in  [[buffer(0)]],
        device       float * out [[buffer(1)]],
        uint gid  [[thread_position_in_grid]],
        uint lane [[thread_index_in_simdgroup]],
        ushort sg [[simdgroup_index_in_threadgroup]]) {
    const float v = in[gid];
    const uint u = uint(v * 4.0f) & 0xFFu;
    device float * o = out + gid * kSimdOut;
    o[0]  = simd_sum(v);
    o[1]  = simd_product(lane < 4 ? v : 1.0f);
    o[2]  = simd_max(v);
    o[3]  = simd_min(v);
    o[4]  = float(simd_and(u | 0x100u));
    o[5]  = float(simd_or(u));
    o[6]  = float(simd_xor(u));
    o[7]  = simd_prefix_exclusive_sum(v);
    o[8]  = simd_prefix_inclusive_sum(v);
    o[9]  = simd_shuffle(v, ushort((lane * 7) % 32));
    o[10] = simd_shuffle_down(v, ushort(3));
    o[11] = simd_shuffle_up(v, ushort(2));
    o[12] = simd_shuffle_xor(v, ushort(1));
    o[13] = simd_broadcast(v, ushort(4));
    o[14] = simd_broadcast_first(v);
    o[15] = float(ulong(simd_ballot(lane % 3 == 0)));
    o[16] = simd_all(v > 0.0f) ? 1.0f : 0.0f;
    o[17] = simd_any(lane == 5) ? 1.0f : 0.0f;
    o[18] = simd_is_first() ? 1.0f : 0.0f;
    o[19] = quad_sum(v);
    o[20] = quad_shuffle_xor(v, ushort(1));
    o[21] = simd_shuffle_rotate_down(v, ushort(1));
    const float4 v4 = float4(v, 2.0f * v, 1.0f, float(sg));
    const float4 s4 = simd_sum(v4);                   // vector collectives
    o[22] = s4.y + s4.w;
    simdgroup_barrier(mem_flags::mem_none);
    o[23] = simd_prefix_inclusive_product(lane < 5 ? 2.0f : 1.0f);
}

// ------------------------------------------------------------------ threadgroup memory
// One threadgroup per row: out[row] = scale * sum(x[row, :]) and y[row, i] = x[row, i] / out[row].
kernel void tg_reduce(
        constant ReduceArgs & args    [[buffer(0)]],
        device const float  * x       [[buffer(1)]],
        device       float  * sums    [[buffer(2)]],
        device       float  * y       [[buffer(3)]],
        threadgroup  float  * partial [[threadgroup(0)]],
        uint   row  [[threadgroup_position_in_grid]],
        ushort tid  [[thread_position_in_threadgroup]],
        ushort ntg  [[threads_per_threadgroup]],
        ushort lane [[thread_index_in_simdgroup]],
        ushort sg   [[simdgroup_index_in_threadgroup]],
        ushort nsg  [[simdgroups_per_threadgroup]]) {
    threadgroup float total;                          // kernel-scope scalar
    threadgroup float stage[256];                     // kernel-scope array
    device const float * xr = x + row * args.n;
    float acc = 0.0f;
    for (uint i = tid; i < args.n; i += ntg) {
        acc += xr[i];
    }
    const float s = tg_sum(acc, partial, lane, sg, nsg);
    if (tid == 0) {
        total = s * args.scale;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = tid; i < args.n; i += ntg) {
        stage[tid] = xr[i] / total;                   // each thread its own slot (ntg <= 256)
        y[row * args.n + i] = stage[tid];
    }
    if (tid == 0) {
        sums[row] = total;
    }
}

// ------------------------------------------------------------------ grid builtins
// One record of 16 uints per thread of a 3D dispatchThreads grid (edge threadgroups smaller).
kernel void grid_ids(
        device uint * out [[buffer(0)]],
        uint3   pos   [[thread_position_in_grid]],
        ushort3 tpos  [[thread_position_in_threadgroup]],
        uint3   tgpos [[threadgroup_position_in_grid]],
        uint3   tsize [[threads_per_threadgroup]],
        uint3   dsize [[dispatch_threads_per_threadgroup]],
        uint3   ngrid [[threads_per_grid]],
        uint2   ntg   [[threadgroups_per_grid]],
        uint    tidx  [[thread_index_in_threadgroup]],
        ushort  lane  [[thread_index_in_simdgroup]],
        uint    sg    [[simdgroup_index_in_threadgroup]],
        uint    width [[threads_per_simdgroup]]) {
    device uint * o = out + ((pos.z * ngrid.y + pos.y) * ngrid.x + pos.x) * 16;
    o[0] = pos.x; o[1] = pos.y; o[2] = pos.z;
    o[3] = tpos.x; o[4] = tpos.y; o[5] = tpos.z;
    o[6] = tgpos.x; o[7] = tgpos.y; o[8] = tgpos.z;
    o[9] = tsize.x * tsize.y * tsize.z;
    o[10] = dsize.x * dsize.y * dsize.z;
    o[11] = ntg.x * 1000 + ntg.y;
    o[12] = tidx;
    o[13] = lane;
    o[14] = sg;
    o[15] = width;
}

// ------------------------------------------------------------------ atomics
kernel void atomics(
        device atomic_uint  * counter [[buffer(0)]],
        device atomic_float * fsum    [[buffer(1)]],
        device atomic_int   * imax    [[buffer(2)]],
        device atomic_int   * imin    [[buffer(3)]],
        device uint         * per_tg  [[buffer(4)]],
        device atomic_uint  * cas     [[buffer(5)]],
        uint gid  [[thread_position_in_grid]],
        uint tgid [[threadgroup_position_in_grid]],
        uint tid  [[thread_index_in_threadgroup]]) {
    threadgroup atomic_uint tg_count;
    if (tid == 0) {
        atomic_store_explicit(&tg_count, 0u, memory_order_relaxed);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
    atomic_fetch_add_explicit(fsum, 0.5f, memory_order_relaxed);
    atomic_fetch_max_explicit(imax, int(gid) - 100, memory_order_relaxed);
    atomic_fetch_min_explicit(imin, int(gid) - 100, memory_order_relaxed);
    atomic_fetch_add_explicit(&tg_count, tid + 1, memory_order_relaxed);
    uint expected = atomic_load_explicit(cas, memory_order_relaxed);
    while (!atomic_compare_exchange_weak_explicit(cas, &expected, expected + 2u, memory_order_relaxed,
                                                  memory_order_relaxed)) {
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        per_tg[tgid] = atomic_load_explicit(&tg_count, memory_order_relaxed);
    }
}

// ------------------------------------------------------------------ simdgroup matrices
struct MatArgs {
    uint M;
    uint N;
    uint K;
};

// C = A * B (row-major, multiples of 8); one simdgroup per 8x8 tile of C, 2x2 tiles per
// threadgroup. Bt holds B transposed (N x K) and is loaded with transpose_matrix.
kernel void sgmm_f32(
        constant MatArgs & args [[buffer(0)]],
        device const float * A  [[buffer(1)]],
        device const float * Bt [[buffer(2)]],
        device       float * C  [[buffer(3)]],
        uint2  tgpig [[threadgroup_position_in_grid]],
        ushort sg    [[simdgroup_index_in_threadgroup]]) {
    const uint row = (tgpig.y * 2 + sg / 2) * 8;
    const uint col = (tgpig.x * 2 + sg % 2) * 8;
    if (row >= args.M || col >= args.N) {
        return;
    }
    simdgroup_float8x8 acc = make_filled_simdgroup_matrix<float, 8, 8>(0.0f);
    simdgroup_float8x8 a;
    simdgroup_float8x8 b;
    for (uint k = 0; k < args.K; k += 8) {
        simdgroup_load(a, A + row * args.K, args.K, ulong2(k, 0));
        simdgroup_load(b, Bt + col * args.K + k, args.K, ulong2(0, 0), true);
        simdgroup_multiply_accumulate(acc, a, b, acc);
    }
    simdgroup_store(acc, C, args.N, ulong2(col, row));
}

// Half tiles through threadgroup memory: D = (A * B)^T for one 8x8 tile, stored transposed.
kernel void sgmm_f16_tile(
        device const half * A [[buffer(0)]],
        device const half * B [[buffer(1)]],
        device       float * D [[buffer(2)]],
        ushort tid [[thread_index_in_threadgroup]]) {
    threadgroup half ta[64];
    threadgroup half tb[64];
    ta[tid] = A[tid];
    ta[tid + 32] = A[tid + 32];
    tb[tid] = B[tid];
    tb[tid + 32] = B[tid + 32];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    simdgroup_half8x8 a;
    simdgroup_half8x8 b;
    simdgroup_float8x8 d;
    simdgroup_load(a, ta);
    simdgroup_load(b, tb, 8);
    simdgroup_multiply(d, a, b);
    simdgroup_store(d, D, 8, ulong2(0, 0), true);
}

// ------------------------------------------------------------------ templates + host_name
template <typename T>
kernel void axpy_t(
        device const T     * x     [[buffer(0)]],
        device       T     * y     [[buffer(1)]],
        constant     float & alpha [[buffer(2)]],
        uint gid [[thread_position_in_grid]]) {
    y[gid] = T(alpha) * x[gid] + y[gid];
}
template [[host_name("axpy_f32")]] kernel decltype(axpy_t<float>) axpy_t<float>;
template [[host_name("axpy_f16")]] kernel decltype(axpy_t<half>)  axpy_t<half>;

// ------------------------------------------------------------------ pipeline limits
[[max_total_threads_per_threadgroup(64)]]
kernel void limited(
        device uint * out [[buffer(0)]],
        uint gid [[thread_position_in_grid]]) {
    out[gid] = gid;
}
