// msl_emu/math.h -- the MSL math, common, integer, geometric and relational functions.
//
// Every function works on scalars and on vectors (element-wise). Floating-point work is done
// in float and rounded back to the argument type, which is how half math behaves on Apple
// GPUs closely enough for tolerance-based tests. metal::fast and metal::precise name the same
// functions: the emulator has one precision.
#pragma once
#include <cfloat>
#include <cmath>

#include "msl_emu/types.h"

// MSL's float constants (C's macros INFINITY, NAN, FLT_MAX, HUGE_VALF come from <cmath>/<cfloat>).
#ifndef MAXFLOAT
#define MAXFLOAT FLT_MAX
#endif
#define HALF_MAX ((half)65504.0f)
#define HALF_MIN ((half)6.103515625e-05f)
#define HALF_EPSILON ((half)0.0009765625f)
#define M_PI_F 3.14159265358979323846f
#define M_PI_2_F 1.57079632679489661923f
#define M_PI_4_F 0.78539816339744830962f
#define M_1_PI_F 0.31830988618379067154f
#define M_2_PI_F 0.63661977236758134308f
#define M_2_SQRTPI_F 1.12837916709551257390f
#define M_SQRT2_F 1.41421356237309504880f
#define M_SQRT1_2_F 0.70710678118654752440f
#define M_E_F 2.71828182845904523536f
#define M_LOG2E_F 1.44269504088896340736f
#define M_LOG10E_F 0.43429448190325182765f
#define M_LN2_F 0.69314718055994530942f
#define M_LN10_F 2.30258509299404568402f

namespace metal {
using ::msl_emu::detail::bmap;
using ::msl_emu::detail::emap;
using ::msl_emu::detail::emap2;
using ::msl_emu::detail::emap3;
using ::msl_emu::detail::is_vec_v;
using ::msl_emu::detail::vinfo;

// metal::numeric_limits: std's, plus half (std has none for _Float16).
template <class T> struct numeric_limits : std::numeric_limits<T> {};
template <> struct numeric_limits<half> {
  static constexpr bool is_specialized = true;
  static constexpr bool is_signed = true;
  static constexpr bool has_infinity = true;
  static constexpr bool has_quiet_NaN = true;
  static constexpr int digits = 11;
  static constexpr half min() { return (half)6.103515625e-05f; }
  static constexpr half max() { return (half)65504.0f; }
  static constexpr half lowest() { return (half)-65504.0f; }
  static constexpr half epsilon() { return (half)0.0009765625f; }
  static constexpr half infinity() { return (half)__builtin_inff(); }
  static constexpr half quiet_NaN() { return (half)__builtin_nanf(""); }
  static constexpr half denorm_min() { return (half)5.9604644775390625e-08f; }
};

// ----------------------------------------------------------- unary float functions
#define MSL_EMU_UNARY_F(name, expr)                                 \
  template <class T> inline T name(T x) {                           \
    return emap(x, [](auto v) {                                     \
      using E = decltype(v);                                        \
      float f = (float)v;                                           \
      (void)f;                                                      \
      return (E)(expr);                                             \
    });                                                             \
  }
MSL_EMU_UNARY_F(sqrt, std::sqrt(f))
MSL_EMU_UNARY_F(rsqrt, 1.0f / std::sqrt(f))
MSL_EMU_UNARY_F(cbrt, std::cbrt(f))
MSL_EMU_UNARY_F(exp, std::exp(f))
MSL_EMU_UNARY_F(exp2, std::exp2(f))
MSL_EMU_UNARY_F(exp10, std::pow(10.0f, f))
MSL_EMU_UNARY_F(log, std::log(f))
MSL_EMU_UNARY_F(log2, std::log2(f))
MSL_EMU_UNARY_F(log10, std::log10(f))
MSL_EMU_UNARY_F(sin, std::sin(f))
MSL_EMU_UNARY_F(cos, std::cos(f))
MSL_EMU_UNARY_F(tan, std::tan(f))
MSL_EMU_UNARY_F(sinpi, std::sin(f * 3.14159265358979323846f))
MSL_EMU_UNARY_F(cospi, std::cos(f * 3.14159265358979323846f))
MSL_EMU_UNARY_F(tanpi, std::tan(f * 3.14159265358979323846f))
MSL_EMU_UNARY_F(asin, std::asin(f))
MSL_EMU_UNARY_F(acos, std::acos(f))
MSL_EMU_UNARY_F(atan, std::atan(f))
MSL_EMU_UNARY_F(sinh, std::sinh(f))
MSL_EMU_UNARY_F(cosh, std::cosh(f))
MSL_EMU_UNARY_F(tanh, std::tanh(f))
MSL_EMU_UNARY_F(asinh, std::asinh(f))
MSL_EMU_UNARY_F(acosh, std::acosh(f))
MSL_EMU_UNARY_F(atanh, std::atanh(f))
MSL_EMU_UNARY_F(floor, std::floor(f))
MSL_EMU_UNARY_F(ceil, std::ceil(f))
MSL_EMU_UNARY_F(round, std::round(f))
MSL_EMU_UNARY_F(rint, std::rint(f))
MSL_EMU_UNARY_F(trunc, std::trunc(f))
MSL_EMU_UNARY_F(fabs, std::fabs(f))
MSL_EMU_UNARY_F(fract, std::fmin(f - std::floor(f), 0x1.fffffep-1f))
MSL_EMU_UNARY_F(saturate, f < 0.0f ? 0.0f : (f > 1.0f ? 1.0f : f))
MSL_EMU_UNARY_F(sign, f > 0.0f ? 1.0f : (f < 0.0f ? -1.0f : (f == 0.0f ? f : 0.0f)))
MSL_EMU_UNARY_F(logb, std::logb(f))
#undef MSL_EMU_UNARY_F

// sin and cos together: returns sin(x), stores cos(x).
template <class T> inline T sincos(T x, thread T& cosval) {
  cosval = cos(x);
  return sin(x);
}

// ---------------------------------------------------------- binary / ternary float functions
#define MSL_EMU_BINARY_F(name, expr)                                                    \
  template <class T> inline T name(T a, T b) {                                          \
    return emap2(a, b, [](auto x, auto y) { using E = decltype(x); return (E)(expr); }); \
  }
MSL_EMU_BINARY_F(pow, std::pow((float)x, (float)y))
MSL_EMU_BINARY_F(powr, std::pow((float)x, (float)y))
MSL_EMU_BINARY_F(fmod, std::fmod((float)x, (float)y))
MSL_EMU_BINARY_F(atan2, std::atan2((float)x, (float)y))
MSL_EMU_BINARY_F(copysign, std::copysign((float)x, (float)y))
MSL_EMU_BINARY_F(fdim, std::fdim((float)x, (float)y))
MSL_EMU_BINARY_F(hypot, std::hypot((float)x, (float)y))
MSL_EMU_BINARY_F(nextafter, std::nextafter((float)x, (float)y))
MSL_EMU_BINARY_F(fmax, std::fmax((float)x, (float)y))
MSL_EMU_BINARY_F(fmin, std::fmin((float)x, (float)y))
MSL_EMU_BINARY_F(step, y < x ? 0 : 1)
#undef MSL_EMU_BINARY_F
template <class T> inline T pown(T x, int n) { return emap(x, [n](auto v) { return (decltype(v))std::pow((float)v, (float)n); }); }
template <class T> inline T rootn(T x, int n) { return emap(x, [n](auto v) { return (decltype(v))std::pow((float)v, 1.0f / (float)n); }); }
template <class T> inline T ldexp(T x, int n) { return emap(x, [n](auto v) { return (decltype(v))std::ldexp((float)v, n); }); }
template <class T> inline T fma(T a, T b, T c) {
  return emap3(a, b, c, [](auto x, auto y, auto z) { return (decltype(x))std::fma((float)x, (float)y, (float)z); });
}
template <class T> inline T mad(T a, T b, T c) { return a * b + c; }
template <class T> inline T mix(T x, T y, T a) { return x + (y - x) * a; }
template <class T, class = std::enable_if_t<is_vec_v<T>>> inline T mix(T x, T y, typename vinfo<T>::E a) { return x + (y - x) * a; }
template <class T> inline T smoothstep(T e0, T e1, T x) {
  T t = saturate((x - e0) / (e1 - e0));
  return t * t * ((T)3 - (T)2 * t);
}

// -------------------------------------------------- min / max / clamp / abs (int and float)
template <class T> inline T abs(T x) { return emap(x, [](auto v) { return v < 0 ? (decltype(v))-v : v; }); }
template <class T> inline T min(T a, T b) { return emap2(a, b, [](auto x, auto y) { return y < x ? y : x; }); }
template <class T> inline T max(T a, T b) { return emap2(a, b, [](auto x, auto y) { return x < y ? y : x; }); }
template <class T> inline T clamp(T x, T lo, T hi) { return min(max(x, lo), hi); }
// vector with scalar bounds, as MSL allows
template <class T, class = std::enable_if_t<is_vec_v<T>>> inline T min(T a, typename vinfo<T>::E b) { return min(a, (T)b); }
template <class T, class = std::enable_if_t<is_vec_v<T>>> inline T max(T a, typename vinfo<T>::E b) { return max(a, (T)b); }
template <class T, class = std::enable_if_t<is_vec_v<T>>> inline T fmin(T a, typename vinfo<T>::E b) { return fmin(a, (T)b); }
template <class T, class = std::enable_if_t<is_vec_v<T>>> inline T fmax(T a, typename vinfo<T>::E b) { return fmax(a, (T)b); }
template <class T, class = std::enable_if_t<is_vec_v<T>>>
inline T clamp(T x, typename vinfo<T>::E lo, typename vinfo<T>::E hi) { return clamp(x, (T)lo, (T)hi); }
// An unsuffixed literal (`max(x, 0.0)`) is a double in C++; MSL has no double, so take it as T.
#define MSL_EMU_DBL_OVERLOAD(name)                                                                \
  template <class T, class = std::enable_if_t<std::is_same_v<T, float> || std::is_same_v<T, half>>> \
  inline T name(T a, double b) { return name(a, (T)b); }                                          \
  template <class T, class = std::enable_if_t<std::is_same_v<T, float> || std::is_same_v<T, half>>> \
  inline T name(double a, T b) { return name((T)a, b); }
MSL_EMU_DBL_OVERLOAD(min)
MSL_EMU_DBL_OVERLOAD(max)
MSL_EMU_DBL_OVERLOAD(fmin)
MSL_EMU_DBL_OVERLOAD(fmax)
MSL_EMU_DBL_OVERLOAD(pow)
#undef MSL_EMU_DBL_OVERLOAD

// ---------------------------------------------------------------- integer functions
template <class T> inline T popcount(T x) { return emap(x, [](auto v) { return (decltype(v))__builtin_popcountll((unsigned long long)(std::make_unsigned_t<decltype(v)>)v); }); }
template <class T> inline T clz(T x) {
  return emap(x, [](auto v) {
    using E = decltype(v);
    using U = std::make_unsigned_t<E>;
    U u = (U)v;
    if (!u) return (E)(sizeof(E) * 8);
    return (E)(__builtin_clzll((unsigned long long)u) - (64 - sizeof(E) * 8));
  });
}
template <class T> inline T ctz(T x) {
  return emap(x, [](auto v) {
    using E = decltype(v);
    using U = std::make_unsigned_t<E>;
    U u = (U)v;
    return u ? (E)__builtin_ctzll((unsigned long long)u) : (E)(sizeof(E) * 8);
  });
}
template <class T> inline T mulhi(T a, T b) {
  return emap2(a, b, [](auto x, auto y) {
    using E = decltype(x);
    if constexpr (sizeof(E) == 8) return (E)(((__int128)x * y) >> 64);
    else return (E)(((int64_t)x * (int64_t)y) >> (sizeof(E) * 8));
  });
}
template <class T> inline T rotate(T v, T s) {
  return emap2(v, s, [](auto x, auto y) {
    using E = decltype(x);
    using U = std::make_unsigned_t<E>;
    constexpr unsigned bits = sizeof(E) * 8;
    unsigned k = (unsigned)((U)y % bits);
    U u = (U)x;
    return (E)(k ? (U)((u << k) | (u >> (bits - k))) : u);
  });
}
template <class T> inline T extract_bits(T x, uint offset, uint bits) {
  return emap(x, [=](auto v) {
    using E = decltype(v);
    using U = std::make_unsigned_t<E>;
    if (bits == 0) return (E)0;
    U mask = bits >= sizeof(E) * 8 ? (U)~(U)0 : (U)(((U)1 << bits) - 1);
    return (E)(((U)v >> offset) & mask);
  });
}
template <class T> inline T reverse_bits(T x) {
  return emap(x, [](auto v) {
    using E = decltype(v);
    using U = std::make_unsigned_t<E>;
    U u = (U)v, r = 0;
    for (unsigned i = 0; i < sizeof(E) * 8; ++i) r |= (U)(((u >> i) & 1u) << (sizeof(E) * 8 - 1 - i));
    return (E)r;
  });
}

// -------------------------------------------------------------- relational functions
template <class T> inline auto isnan(T x) { return bmap(x, [](auto v) { return std::isnan((float)v); }); }
template <class T> inline auto isinf(T x) { return bmap(x, [](auto v) { return std::isinf((float)v); }); }
template <class T> inline auto isfinite(T x) { return bmap(x, [](auto v) { return std::isfinite((float)v); }); }
template <class T> inline auto isnormal(T x) { return bmap(x, [](auto v) { return std::isnormal((float)v); }); }
template <class T> inline auto signbit(T x) { return bmap(x, [](auto v) { return std::signbit((float)v); }); }
template <class V> inline bool all(V v) {
  if constexpr (is_vec_v<V>) {
    for (int i = 0; i < vinfo<V>::N; ++i)
      if (!v[i]) return false;
    return true;
  } else {
    return (bool)v;
  }
}
template <class V> inline bool any(V v) {
  if constexpr (is_vec_v<V>) {
    for (int i = 0; i < vinfo<V>::N; ++i)
      if (v[i]) return true;
    return false;
  } else {
    return (bool)v;
  }
}
// select(a, b, c): c ? b : a, component-wise for vectors.
template <class T> inline T select(T a, T b, bool c) { return c ? b : a; }
template <class T, class C, class = std::enable_if_t<is_vec_v<T> && is_vec_v<C>>>
inline T select(T a, T b, C c) {
  static_assert(vinfo<T>::N == vinfo<C>::N, "select: condition has a different component count");
  T r;
  for (int i = 0; i < vinfo<T>::N; ++i) r[i] = c[i] ? b[i] : a[i];
  return r;
}

// -------------------------------------------------------------- geometric functions
template <class T> inline auto dot(T a, T b) {
  static_assert(is_vec_v<T>, "dot needs vectors");
  typename vinfo<T>::E s = 0;
  for (int i = 0; i < vinfo<T>::N; ++i) s += a[i] * b[i];
  return s;
}
template <class T> inline auto length(T a) { return sqrt(dot(a, a)); }
template <class T> inline auto length_squared(T a) { return dot(a, a); }
template <class T> inline auto distance(T a, T b) { return length(a - b); }
template <class T> inline T normalize(T a) { return a * rsqrt(dot(a, a)); }
template <class T> inline T cross(T a, T b) {
  static_assert(vinfo<T>::N == 3, "cross needs 3-component vectors");
  T r;
  r[0] = a[1] * b[2] - a[2] * b[1];
  r[1] = a[2] * b[0] - a[0] * b[2];
  r[2] = a[0] * b[1] - a[1] * b[0];
  return r;
}

// ---------------------------------------------------------- fast:: and precise::
#define MSL_EMU_MATH_NAMES                                                                          \
  using metal::sqrt; using metal::rsqrt; using metal::cbrt; using metal::exp; using metal::exp2;   \
  using metal::exp10; using metal::log; using metal::log2; using metal::log10; using metal::sin;   \
  using metal::cos; using metal::tan; using metal::sincos; using metal::sinpi; using metal::cospi; \
  using metal::tanpi; using metal::asin; using metal::acos; using metal::atan; using metal::atan2;  \
  using metal::sinh; using metal::cosh; using metal::tanh; using metal::asinh; using metal::acosh; \
  using metal::atanh; using metal::floor; using metal::ceil; using metal::round; using metal::rint; \
  using metal::trunc; using metal::fabs; using metal::fract; using metal::saturate;                \
  using metal::pow; using metal::powr; using metal::pown; using metal::rootn; using metal::fmod;   \
  using metal::fmax; using metal::fmin; using metal::max; using metal::min; using metal::clamp;    \
  using metal::fma; using metal::copysign; using metal::hypot; using metal::ldexp;                 \
  using metal::normalize; using metal::length; using metal::distance; using metal::divide;
template <class T> inline T divide(T a, T b) { return a / b; }
namespace fast { MSL_EMU_MATH_NAMES }
namespace precise { MSL_EMU_MATH_NAMES }
#undef MSL_EMU_MATH_NAMES

}  // namespace metal
