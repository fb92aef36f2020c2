// msl_emu/types.h -- MSL scalar and vector types for clang C++17.
//
// MSL is clang-based C++ whose vectors are clang ext_vector_type, so the same types give
// swizzles (.xy, .rgba), element-wise operators and vector-scalar operators for free.
// What C++ lacks is added here: `half` (_Float16, rounded after every operation, as on the
// GPU), multi-argument vector constructors (`float4(a.xy, b, c)`, through make<V>(...) and
// one macro per type in ctor_macros.h), `as_type`, packed_ types and a storage-only `bfloat`.
#pragma once
#ifndef __clang__
#error "the msl_emu shim needs clang (ext_vector_type); use clang++-16"
#endif

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#pragma clang diagnostic ignored "-Wunknown-attributes"
#pragma clang diagnostic ignored "-Wuser-defined-literals"
#pragma clang diagnostic ignored "-Wduplicate-decl-specifier"

// ------------------------------------------------------------------ scalars
typedef unsigned int uint;
typedef unsigned short ushort;
typedef unsigned char uchar;
typedef unsigned long ulong;
typedef _Float16 half;

// MSL 3.1's bfloat as a storage type with float arithmetic: every operation converts to
// float, and the result converts back (round to nearest even) when stored as bfloat.
struct bfloat {
  uint16_t bits = 0;
  bfloat() = default;
  bfloat(float f) {  // NOLINT: implicit, as in MSL
    uint32_t u;
    std::memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) { bits = (uint16_t)((u >> 16) | 0x40); return; }  // quiet NaN
    u += 0x7fffu + ((u >> 16) & 1u);
    bits = (uint16_t)(u >> 16);
  }
  operator float() const {  // NOLINT
    uint32_t u = (uint32_t)bits << 16;
    float f;
    std::memcpy(&f, &u, 4);
    return f;
  }
};

// half literals: 1.0h, 2h
constexpr half operator""h(long double v) { return (half)v; }
constexpr half operator""h(unsigned long long v) { return (half)v; }

// ------------------------------------------------------------------ vectors
#define MSL_EMU_VEC(T, n)                             \
  typedef T n##2 __attribute__((ext_vector_type(2))); \
  typedef T n##3 __attribute__((ext_vector_type(3))); \
  typedef T n##4 __attribute__((ext_vector_type(4)));
MSL_EMU_VEC(float, float)
MSL_EMU_VEC(half, half)
MSL_EMU_VEC(int, int)
MSL_EMU_VEC(uint, uint)
MSL_EMU_VEC(short, short)
MSL_EMU_VEC(ushort, ushort)
MSL_EMU_VEC(char, char)
MSL_EMU_VEC(uchar, uchar)
MSL_EMU_VEC(long, long)
MSL_EMU_VEC(ulong, ulong)
MSL_EMU_VEC(bool, bool)
#undef MSL_EMU_VEC

namespace msl_emu {
namespace detail {

// vinfo<T>: is T a vector, how many components, which element type.
template <class T> struct vinfo {
  static constexpr bool is_vec = false;
  static constexpr int N = 1;
  using E = T;
};
template <class T, int N_> struct vinfo<T __attribute__((ext_vector_type(N_)))> {
  static constexpr bool is_vec = true;
  static constexpr int N = N_;
  using E = T;
};
template <class T> using bare_t = std::remove_cv_t<std::remove_reference_t<T>>;
template <class T> constexpr bool is_vec_v = vinfo<bare_t<T>>::is_vec;
template <class T> using elem_t = typename vinfo<bare_t<T>>::E;
template <class T> constexpr bool is_scalar_v = std::is_arithmetic_v<bare_t<T>> || std::is_same_v<bare_t<T>, half>;

template <class E, int N> struct vec_of { typedef E type __attribute__((ext_vector_type(N))); };
template <class E> struct vec_of<E, 1> { using type = E; };
template <class E, int N> using vec = typename vec_of<E, N>::type;

// Puts the components of x (scalar or vector) into t[i...].
template <class E, class X> inline void put(E* t, int& i, const X& x) {
  if constexpr (is_vec_v<X>) {
    for (int k = 0; k < vinfo<bare_t<X>>::N; ++k) t[i++] = (E)x[k];
  } else {
    t[i++] = (E)x;
  }
}

// MSL vector constructor semantics: V() is zero, V(s) splats, V(v) converts component-wise
// (a value conversion, unlike a C-style cast between vectors, which is a bitcast in clang),
// and V(a, b, ...) concatenates scalars and vectors.
template <class V, class A> inline V convert(const A& a) {
  static_assert(vinfo<bare_t<A>>::N == vinfo<V>::N, "vector conversion needs the same component count");
  return __builtin_convertvector(a, V);
}
template <class V, class... A> inline V make(const A&... a) {
  using I = vinfo<V>;
  using E = typename I::E;
  if constexpr (sizeof...(A) == 0) {
    return V{};
  } else if constexpr (sizeof...(A) == 1 && (is_vec_v<A> && ...)) {
    return convert<V>(a...);
  } else if constexpr (sizeof...(A) == 1) {
    return (V)(E)(a, ...);
  } else {
    static_assert((vinfo<bare_t<A>>::N + ...) == I::N, "wrong number of components in a vector constructor");
    E t[I::N];
    int i = 0;
    (put(t, i, a), ...);
    V v;
    for (int k = 0; k < I::N; ++k) v[k] = t[k];
    return v;
  }
}

// Element-wise helpers used by the math library.
template <class T, class F> inline T emap(const T& x, F f) {
  if constexpr (is_vec_v<T>) {
    T r;
    for (int i = 0; i < vinfo<T>::N; ++i) r[i] = f(x[i]);
    return r;
  } else {
    return f(x);
  }
}
template <class T, class F> inline T emap2(const T& x, const T& y, F f) {
  if constexpr (is_vec_v<T>) {
    T r;
    for (int i = 0; i < vinfo<T>::N; ++i) r[i] = f(x[i], y[i]);
    return r;
  } else {
    return f(x, y);
  }
}
template <class T, class F> inline T emap3(const T& x, const T& y, const T& z, F f) {
  if constexpr (is_vec_v<T>) {
    T r;
    for (int i = 0; i < vinfo<T>::N; ++i) r[i] = f(x[i], y[i], z[i]);
    return r;
  } else {
    return f(x, y, z);
  }
}
// For predicates: scalar -> bool, vector -> boolN.
template <class T, class F> inline auto bmap(const T& x, F f) {
  if constexpr (is_vec_v<T>) {
    vec<bool, vinfo<T>::N> r;
    for (int i = 0; i < vinfo<T>::N; ++i) r[i] = f(x[i]);
    return r;
  } else {
    return (bool)f(x);
  }
}

}  // namespace detail
}  // namespace msl_emu

// ------------------------------------------------------------ packed vectors
// packed_floatN etc.: no padding (packed_float3 is 12 bytes), converts to and from the
// aligned vector type, indexable, with .x/.y/.z/.w.
namespace msl_emu {
namespace detail {
template <class E, int N> struct packed;
template <class E> struct packed<E, 2> {
  E x, y;
  packed() = default;
  packed(E a, E b) : x(a), y(b) {}
  packed(vec<E, 2> v) : x(v[0]), y(v[1]) {}  // NOLINT
  operator vec<E, 2>() const { vec<E, 2> v; v[0] = x; v[1] = y; return v; }  // NOLINT
  E& operator[](int i) { return (&x)[i]; }
  const E& operator[](int i) const { return (&x)[i]; }
};
template <class E> struct packed<E, 3> {
  E x, y, z;
  packed() = default;
  packed(E a, E b, E c) : x(a), y(b), z(c) {}
  packed(vec<E, 3> v) : x(v[0]), y(v[1]), z(v[2]) {}  // NOLINT
  operator vec<E, 3>() const { vec<E, 3> v; v[0] = x; v[1] = y; v[2] = z; return v; }  // NOLINT
  E& operator[](int i) { return (&x)[i]; }
  const E& operator[](int i) const { return (&x)[i]; }
};
template <class E> struct packed<E, 4> {
  E x, y, z, w;
  packed() = default;
  packed(E a, E b, E c, E d) : x(a), y(b), z(c), w(d) {}
  packed(vec<E, 4> v) : x(v[0]), y(v[1]), z(v[2]), w(v[3]) {}  // NOLINT
  operator vec<E, 4>() const { vec<E, 4> v; v[0] = x; v[1] = y; v[2] = z; v[3] = w; return v; }  // NOLINT
  E& operator[](int i) { return (&x)[i]; }
  const E& operator[](int i) const { return (&x)[i]; }
};
}  // namespace detail
}  // namespace msl_emu

#define MSL_EMU_PACKED(T)                                         \
  typedef ::msl_emu::detail::packed<T, 2> packed_##T##2;          \
  typedef ::msl_emu::detail::packed<T, 3> packed_##T##3;          \
  typedef ::msl_emu::detail::packed<T, 4> packed_##T##4;
MSL_EMU_PACKED(float)
MSL_EMU_PACKED(half)
MSL_EMU_PACKED(int)
MSL_EMU_PACKED(uint)
MSL_EMU_PACKED(short)
MSL_EMU_PACKED(ushort)
MSL_EMU_PACKED(char)
MSL_EMU_PACKED(uchar)
#undef MSL_EMU_PACKED
static_assert(sizeof(packed_float3) == 12, "packed_float3 must be unpadded");

namespace metal {
// as_type<T>(x): reinterpret the bits (sizes must match, as in MSL).
template <class To, class From> inline To as_type(const From& f) {
  static_assert(sizeof(To) == sizeof(From), "as_type: source and destination sizes differ");
  To t;
  std::memcpy(&t, &f, sizeof t);
  return t;
}
}  // namespace metal
