// Deliberately broken kernels: test_bugs.cpp checks that the emulator reports each one.
#include <metal_stdlib>
using namespace metal;

// Missing threadgroup_barrier between the partial-sum writes and the reads: thread 0 reads
// slots other simdgroups haven't written yet (NaN-poisoned) in Forward and Shuffle order.
kernel void missing_barrier(
        device const float * src [[buffer(0)]],
        device       float * dst [[buffer(1)]],
        uint tid  [[thread_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]],
        uint sg   [[simdgroup_index_in_threadgroup]],
        uint nsg  [[simdgroups_per_threadgroup]]) {
    threadgroup float part[32];
    const float v = simd_sum(src[tid]);
    if (lane == 0) {
        part[sg] = v;
    }
    // BUG: threadgroup_barrier(mem_flags::mem_threadgroup) belongs here
    if (tid == 0) {
        float s = 0.0f;
        for (uint k = 0; k < nsg; ++k) {
            s += part[k];
        }
        dst[0] = s;
    }
}

// Some threads return before a barrier the others wait at.
kernel void early_return(
        device const float * src [[buffer(0)]],
        device       float * dst [[buffer(1)]],
        constant     uint  & n   [[buffer(2)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float tmp[256];
    if (tid >= n) {
        return;                                        // BUG
    }
    tmp[tid] = src[tid];
    threadgroup_barrier(mem_flags::mem_threadgroup);
    dst[tid] = tmp[(tid + 1) % n];
}

// simd_sum in lane-divergent control flow, then a barrier.
kernel void divergent_simd_sum(
        device const float * src [[buffer(0)]],
        device       float * dst [[buffer(1)]],
        uint tid  [[thread_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    float v = src[tid];
    if (lane < 16) {
        v = simd_sum(v);                               // BUG
    }
    threadgroup_barrier(mem_flags::mem_threadgroup);
    dst[tid] = v;
}

// The two halves of a simdgroup in different simd_sum calls.
kernel void split_simd_sum(
        device const float * src [[buffer(0)]],
        device       float * dst [[buffer(1)]],
        uint tid  [[thread_index_in_threadgroup]],
        uint lane [[thread_index_in_simdgroup]]) {
    float v = src[tid];
    if (lane < 16) {
        v = simd_sum(v);                               // BUG: divergent collective
    } else {
        v = simd_sum(v * 2.0f);
    }
    dst[tid] = v;
}

// Threads of one threadgroup at barriers on different lines.
kernel void barrier_lines(
        device float * dst [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    if (tid < 32) {
        threadgroup_barrier(mem_flags::mem_threadgroup);  // BUG
    } else {
        threadgroup_barrier(mem_flags::mem_threadgroup);
    }
    dst[tid] = 1.0f;
}

// 36000 bytes of kernel-scope threadgroup memory: over the 32 KiB limit.
kernel void too_much_tg_memory(
        device float * dst [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float big[9000];                         // BUG
    big[tid] = 1.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    dst[tid] = big[tid];
}

// 16 KiB kernel-scope + whatever setThreadgroupMemoryLength adds.
kernel void half_tg_memory(
        device float      * dst [[buffer(0)]],
        threadgroup float * dyn [[threadgroup(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup float fixed[4096];
    fixed[tid] = 1.0f;
    dyn[tid] = 2.0f;
    threadgroup_barrier(mem_flags::mem_threadgroup);
    dst[tid] = fixed[tid] + dyn[tid];
}

// A correct kernel, for the unbound-argument and limit checks.
kernel void copy(
        device const float * src [[buffer(0)]],
        device       float * dst [[buffer(1)]],
        uint gid [[thread_position_in_grid]]) {
    dst[gid] = src[gid];
}

// Over the limit too, but gen.py can't size a template's threadgroup array before
// instantiation: the runtime counts it when the threads first reach it.
template <typename T>
kernel void big_tg_t(
        device T * dst [[buffer(0)]],
        uint tid [[thread_index_in_threadgroup]]) {
    threadgroup T big[9000];                             // BUG
    big[tid] = T(1);
    threadgroup_barrier(mem_flags::mem_threadgroup);
    dst[tid] = big[tid];
}
template [[host_name("big_tg_f32")]] kernel decltype(big_tg_t<float>) big_tg_t<float>;
