// msl_emu/ctor_macros.h -- MSL's multi-argument vector constructors, e.g. float4(a.xy, b, c).
//
// C++ has no such constructors for ext_vector_type, so each vector type name becomes a
// function-like macro that calls make<V>(...). A function-like macro only expands when the
// name is followed by '(', so the plain type name (declarations, sizeof, template arguments)
// is untouched. Included last: code after this header must name vectors as vec<T, N>.
// One line per type and width.
#pragma once

#define float2(...) ::msl_emu::detail::make<::float2>(__VA_ARGS__)
#define float3(...) ::msl_emu::detail::make<::float3>(__VA_ARGS__)
#define float4(...) ::msl_emu::detail::make<::float4>(__VA_ARGS__)
#define half2(...) ::msl_emu::detail::make<::half2>(__VA_ARGS__)
#define half3(...) ::msl_emu::detail::make<::half3>(__VA_ARGS__)
#define half4(...) ::msl_emu::detail::make<::half4>(__VA_ARGS__)
#define int2(...) ::msl_emu::detail::make<::int2>(__VA_ARGS__)
#define int3(...) ::msl_emu::detail::make<::int3>(__VA_ARGS__)
#define int4(...) ::msl_emu::detail::make<::int4>(__VA_ARGS__)
#define uint2(...) ::msl_emu::detail::make<::uint2>(__VA_ARGS__)
#define uint3(...) ::msl_emu::detail::make<::uint3>(__VA_ARGS__)
#define uint4(...) ::msl_emu::detail::make<::uint4>(__VA_ARGS__)
#define short2(...) ::msl_emu::detail::make<::short2>(__VA_ARGS__)
#define short3(...) ::msl_emu::detail::make<::short3>(__VA_ARGS__)
#define short4(...) ::msl_emu::detail::make<::short4>(__VA_ARGS__)
#define ushort2(...) ::msl_emu::detail::make<::ushort2>(__VA_ARGS__)
#define ushort3(...) ::msl_emu::detail::make<::ushort3>(__VA_ARGS__)
#define ushort4(...) ::msl_emu::detail::make<::ushort4>(__VA_ARGS__)
#define char2(...) ::msl_emu::detail::make<::char2>(__VA_ARGS__)
#define char3(...) ::msl_emu::detail::make<::char3>(__VA_ARGS__)
#define char4(...) ::msl_emu::detail::make<::char4>(__VA_ARGS__)
#define uchar2(...) ::msl_emu::detail::make<::uchar2>(__VA_ARGS__)
#define uchar3(...) ::msl_emu::detail::make<::uchar3>(__VA_ARGS__)
#define uchar4(...) ::msl_emu::detail::make<::uchar4>(__VA_ARGS__)
#define long2(...) ::msl_emu::detail::make<::long2>(__VA_ARGS__)
#define long3(...) ::msl_emu::detail::make<::long3>(__VA_ARGS__)
#define long4(...) ::msl_emu::detail::make<::long4>(__VA_ARGS__)
#define ulong2(...) ::msl_emu::detail::make<::ulong2>(__VA_ARGS__)
#define ulong3(...) ::msl_emu::detail::make<::ulong3>(__VA_ARGS__)
#define ulong4(...) ::msl_emu::detail::make<::ulong4>(__VA_ARGS__)
#define bool2(...) ::msl_emu::detail::make<::bool2>(__VA_ARGS__)
#define bool3(...) ::msl_emu::detail::make<::bool3>(__VA_ARGS__)
#define bool4(...) ::msl_emu::detail::make<::bool4>(__VA_ARGS__)
