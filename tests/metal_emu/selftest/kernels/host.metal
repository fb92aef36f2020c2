// Kernels driven by host_metal_cpp.cpp through real metal-cpp on the fake Metal runtime.
#include <metal_stdlib>
using namespace metal;

struct RmsArgs {
    uint  ncols;
    float eps;
};

// y = x * w / rms(x), one threadgroup per row.
kernel void rms_norm(
        constant RmsArgs   & args    [[buffer(0)]],
        device const float * x       [[buffer(1)]],
        device const float * w       [[buffer(2)]],
        device       float * y       [[buffer(3)]],
        threadgroup  float * partial [[threadgroup(0)]],
        uint   row  [[threadgroup_position_in_grid]],
        ushort tid  [[thread_position_in_threadgroup]],
        ushort ntg  [[threads_per_threadgroup]],
        ushort lane [[thread_index_in_simdgroup]],
        ushort sg   [[simdgroup_index_in_threadgroup]],
        ushort nsg  [[simdgroups_per_threadgroup]]) {
    threadgroup float scale;
    device const float * xr = x + row * args.ncols;
    float acc = 0.0f;
    for (uint i = tid; i < args.ncols; i += ntg) {
        acc += xr[i] * xr[i];
    }
    acc = simd_sum(acc);
    if (lane == 0) {
        partial[sg] = acc;
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    if (tid == 0) {
        float s = 0.0f;
        for (ushort k = 0; k < nsg; ++k) {
            s += partial[k];
        }
        scale = rsqrt(s / args.ncols + args.eps);
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    for (uint i = tid; i < args.ncols; i += ntg) {
        y[row * args.ncols + i] = xr[i] * scale * w[i];
    }
}

// Counts the elements above a threshold.
kernel void count_above(
        device const float * x         [[buffer(0)]],
        device atomic_uint * count     [[buffer(1)]],
        constant     float & threshold [[buffer(2)]],
        uint gid [[thread_position_in_grid]]) {
    if (x[gid] > threshold) {
        atomic_fetch_add_explicit(count, 1u, memory_order_relaxed);
    }
}

// The GPU decides the next dispatch's size: one threadgroup of 32 per 32 counted elements.
kernel void make_dispatch_args(
        device const uint * count [[buffer(0)]],
        device       uint * args  [[buffer(1)]]) {
    args[0] = (count[0] + 31) / 32;
    args[1] = 1;
    args[2] = 1;
}

// Marks one slot per launched thread.
kernel void mark(
        device uint * marks [[buffer(0)]],
        uint gid [[thread_position_in_grid]]) {
    marks[gid] = 1;
}

// y[i] += a[i] for the slice the host binds with offsets.
kernel void add_into(
        device const float * a [[buffer(0)]],
        device       float * y [[buffer(1)]],
        uint gid [[thread_position_in_grid]]) {
    y[gid] += a[gid];
}
