// <simd/simd.h> stand-in. Two users:
//  * kernels (SPIRV-Cross output includes it): the MSL shim already has every vector type;
//  * host code sharing structs with kernels (this directory is on the msl_emu target's public
//    include path): Apple's host-side simd_floatN / simd::floatN names, as clang vectors.
#pragma once
#if defined(MSL_EMU_KERNEL)
#include "msl_emu/shim.h"
#else
#define MSL_EMU_SIMD_HOST(T, n)                                          \
  typedef T simd_##n##2 __attribute__((ext_vector_type(2)));             \
  typedef T simd_##n##3 __attribute__((ext_vector_type(3)));             \
  typedef T simd_##n##4 __attribute__((ext_vector_type(4)));
MSL_EMU_SIMD_HOST(float, float)
MSL_EMU_SIMD_HOST(int, int)
MSL_EMU_SIMD_HOST(unsigned int, uint)
MSL_EMU_SIMD_HOST(short, short)
MSL_EMU_SIMD_HOST(unsigned short, ushort)
MSL_EMU_SIMD_HOST(_Float16, half)
#undef MSL_EMU_SIMD_HOST
#ifdef __cplusplus
namespace simd {
typedef ::simd_float2 float2;
typedef ::simd_float3 float3;
typedef ::simd_float4 float4;
typedef ::simd_int2 int2;
typedef ::simd_int3 int3;
typedef ::simd_int4 int4;
typedef ::simd_uint2 uint2;
typedef ::simd_uint3 uint3;
typedef ::simd_uint4 uint4;
typedef ::simd_half2 half2;
typedef ::simd_half3 half3;
typedef ::simd_half4 half4;
}  // namespace simd
#endif
#endif
