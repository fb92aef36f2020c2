// msl_emu/sync.h -- barriers and the simd_* / quad_* collectives.
//
// Every collective is one rt::simd_exchange: each lane deposits its value, waits until every
// live lane of its simdgroup reached the same call site, then computes its own result from the
// 32 slots over the mask of lanes that took part. Lanes that already returned drop out of that
// mask, as on a GPU. The call site (file, line) comes from default arguments, so lanes at
// different simd_* calls are reported instead of silently mixing values.
#pragma once
#include <cstring>

#include "msl_emu/math.h"
#include "msl_emu/rt.h"

namespace metal {

enum class mem_flags : int {
  mem_none = 0,
  mem_device = 1,
  mem_threadgroup = 2,
  mem_texture = 4,
  mem_threadgroup_imageblock = 8,
  mem_object_data = 16,
};
inline constexpr mem_flags operator|(mem_flags a, mem_flags b) { return mem_flags(int(a) | int(b)); }

#define MSL_EMU_LOC const char *file = __builtin_FILE(), int line = __builtin_LINE()

// The memory flags don't matter here: a threadgroup's threads share one address space and run
// one at a time, so every write is visible after the barrier whatever the flags say.
inline void threadgroup_barrier(mem_flags, MSL_EMU_LOC) { ::msl_emu::rt::threadgroup_barrier(file, line); }
inline void simdgroup_barrier(mem_flags, MSL_EMU_LOC) { ::msl_emu::rt::simdgroup_barrier(file, line); }

namespace detail_simd {
using ::msl_emu::rt::kSimdSlotBytes;
template <class T> inline T at(const unsigned char* slots, int lane) {
  T t;
  std::memcpy(&t, slots + kSimdSlotBytes * lane, sizeof(T));
  return t;
}
template <class T> inline const unsigned char* exchange(const T& x, const char* op, const char* file, int line, uint32_t* m) {
  static_assert(sizeof(T) <= kSimdSlotBytes, "simd collective on a type larger than 64 bytes");
  return ::msl_emu::rt::simd_exchange(&x, sizeof(T), op, file, line, m);
}
// Reduction over the active lanes in lane order.
template <class T, class F> inline T reduce(const T& x, const char* op, const char* file, int line, F f) {
  uint32_t m;
  const unsigned char* s = exchange(x, op, file, line, &m);
  bool first = true;
  T r{};
  for (int l = 0; l < 32; ++l)
    if (m >> l & 1) {
      T v = at<T>(s, l);
      r = first ? v : f(r, v);
      first = false;
    }
  return r;
}
// Prefix over the active lanes below (exclusive) or up to (inclusive) this lane.
template <class T, class F> inline T scan(const T& x, const char* op, const char* file, int line, bool inclusive, T ident, F f) {
  uint32_t m;
  const unsigned char* s = exchange(x, op, file, line, &m);
  int me = (int)::msl_emu::rt::lane();
  T r = ident;
  for (int l = 0; l < (inclusive ? me + 1 : me); ++l)
    if (m >> l & 1) r = f(r, at<T>(s, l));
  return r;
}
// The value of lane `src`; a lane that reads outside the simdgroup or from an inactive lane
// keeps its own value (Metal leaves it undefined; keeping x is what shuffle_down loops expect).
template <class T> inline T from_lane(const T& x, int src, const char* op, const char* file, int line) {
  uint32_t m;
  const unsigned char* s = exchange(x, op, file, line, &m);
  if (src < 0 || src >= 32 || !(m >> src & 1)) return x;
  return at<T>(s, src);
}
inline int lane() { return (int)::msl_emu::rt::lane(); }
template <class T> inline T add(T a, T b) { return a + b; }
}  // namespace detail_simd

// ------------------------------------------------------------------ reductions
template <class T> inline T simd_sum(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_sum", file, line, [](T a, T b) { return a + b; }); }
template <class T> inline T simd_product(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_product", file, line, [](T a, T b) { return a * b; }); }
template <class T> inline T simd_max(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_max", file, line, [](T a, T b) { return max(a, b); }); }
template <class T> inline T simd_min(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_min", file, line, [](T a, T b) { return min(a, b); }); }
template <class T> inline T simd_and(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_and", file, line, [](T a, T b) { return a & b; }); }
template <class T> inline T simd_or(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_or", file, line, [](T a, T b) { return a | b; }); }
template <class T> inline T simd_xor(T x, MSL_EMU_LOC) { return detail_simd::reduce(x, "simd_xor", file, line, [](T a, T b) { return a ^ b; }); }

// ------------------------------------------------------------------ prefix scans
template <class T> inline T simd_prefix_exclusive_sum(T x, MSL_EMU_LOC) {
  return detail_simd::scan(x, "simd_prefix_exclusive_sum", file, line, false, T(0), [](T a, T b) { return a + b; });
}
template <class T> inline T simd_prefix_inclusive_sum(T x, MSL_EMU_LOC) {
  return detail_simd::scan(x, "simd_prefix_inclusive_sum", file, line, true, T(0), [](T a, T b) { return a + b; });
}
template <class T> inline T simd_prefix_exclusive_product(T x, MSL_EMU_LOC) {
  return detail_simd::scan(x, "simd_prefix_exclusive_product", file, line, false, T(1), [](T a, T b) { return a * b; });
}
template <class T> inline T simd_prefix_inclusive_product(T x, MSL_EMU_LOC) {
  return detail_simd::scan(x, "simd_prefix_inclusive_product", file, line, true, T(1), [](T a, T b) { return a * b; });
}

// ------------------------------------------------------------------ shuffles
template <class T> inline T simd_shuffle(T x, ushort src, MSL_EMU_LOC) { return detail_simd::from_lane(x, src, "simd_shuffle", file, line); }
template <class T> inline T simd_broadcast(T x, ushort src, MSL_EMU_LOC) { return detail_simd::from_lane(x, src, "simd_broadcast", file, line); }
template <class T> inline T simd_shuffle_down(T x, ushort d, MSL_EMU_LOC) {
  return detail_simd::from_lane(x, detail_simd::lane() + d, "simd_shuffle_down", file, line);
}
template <class T> inline T simd_shuffle_up(T x, ushort d, MSL_EMU_LOC) {
  return detail_simd::from_lane(x, detail_simd::lane() - d, "simd_shuffle_up", file, line);
}
template <class T> inline T simd_shuffle_xor(T x, ushort mask, MSL_EMU_LOC) {
  return detail_simd::from_lane(x, detail_simd::lane() ^ mask, "simd_shuffle_xor", file, line);
}
template <class T> inline T simd_shuffle_rotate_down(T x, ushort d, MSL_EMU_LOC) {
  return detail_simd::from_lane(x, (detail_simd::lane() + d) & 31, "simd_shuffle_rotate_down", file, line);
}
template <class T> inline T simd_shuffle_rotate_up(T x, ushort d, MSL_EMU_LOC) {
  return detail_simd::from_lane(x, (detail_simd::lane() - d) & 31, "simd_shuffle_rotate_up", file, line);
}
// shuffle_and_fill: lanes shifted past the edge take `filling`'s value from the wrapped lane.
template <class T> inline T simd_shuffle_and_fill_down(T data, T filling, ushort d, MSL_EMU_LOC) {
  struct P { T a, b; } p{data, filling};
  uint32_t m;
  const unsigned char* s = detail_simd::exchange(p, "simd_shuffle_and_fill_down", file, line, &m);
  int src = detail_simd::lane() + d;
  P q = detail_simd::at<P>(s, src & 31);
  return src < 32 ? q.a : q.b;
}
template <class T> inline T simd_shuffle_and_fill_up(T data, T filling, ushort d, MSL_EMU_LOC) {
  struct P { T a, b; } p{data, filling};
  uint32_t m;
  const unsigned char* s = detail_simd::exchange(p, "simd_shuffle_and_fill_up", file, line, &m);
  int src = detail_simd::lane() - d;
  P q = detail_simd::at<P>(s, src & 31);
  return src >= 0 ? q.a : q.b;
}
template <class T> inline T simd_broadcast_first(T x, MSL_EMU_LOC) {
  uint32_t m;
  const unsigned char* s = detail_simd::exchange(x, "simd_broadcast_first", file, line, &m);
  return detail_simd::at<T>(s, __builtin_ctz(m));
}

// ------------------------------------------------------------------ votes
struct simd_vote {
  typedef ulong vote_t;
  vote_t v = 0;
  simd_vote() = default;
  explicit simd_vote(vote_t x) : v(x) {}
  explicit operator vote_t() const { return v; }
  bool all() const { return v == 0xffffffffu; }
  bool any() const { return v != 0; }
};
inline simd_vote simd_ballot(bool p, MSL_EMU_LOC) {
  uint32_t m;
  const unsigned char* s = detail_simd::exchange(p, "simd_ballot", file, line, &m);
  ulong r = 0;
  for (int l = 0; l < 32; ++l)
    if ((m >> l & 1) && detail_simd::at<bool>(s, l)) r |= 1ul << l;
  return simd_vote(r);
}
inline simd_vote simd_active_threads_mask(MSL_EMU_LOC) {
  char z = 0;
  uint32_t m;
  detail_simd::exchange(z, "simd_active_threads_mask", file, line, &m);
  return simd_vote(m);
}
inline bool simd_all(bool p, MSL_EMU_LOC) { return detail_simd::reduce(p, "simd_all", file, line, [](bool a, bool b) { return a && b; }); }
inline bool simd_any(bool p, MSL_EMU_LOC) { return detail_simd::reduce(p, "simd_any", file, line, [](bool a, bool b) { return a || b; }); }
inline bool simd_is_first(MSL_EMU_LOC) {
  char z = 0;
  uint32_t m;
  detail_simd::exchange(z, "simd_is_first", file, line, &m);
  return __builtin_ctz(m) == detail_simd::lane();
}
inline bool simd_is_helper_thread() { return false; }

// ------------------------------------------------------------------ quad (4-lane) collectives
namespace detail_simd {
template <class T, class F> inline T quad_reduce(const T& x, const char* op, const char* file, int line, F f) {
  uint32_t m;
  const unsigned char* s = exchange(x, op, file, line, &m);
  int base = lane() & ~3;
  bool first = true;
  T r{};
  for (int l = base; l < base + 4; ++l)
    if (m >> l & 1) {
      T v = at<T>(s, l);
      r = first ? v : f(r, v);
      first = false;
    }
  return r;
}
inline int quad_src(int q) { return (lane() & ~3) | (q & 3); }
}  // namespace detail_simd
template <class T> inline T quad_sum(T x, MSL_EMU_LOC) { return detail_simd::quad_reduce(x, "quad_sum", file, line, [](T a, T b) { return a + b; }); }
template <class T> inline T quad_product(T x, MSL_EMU_LOC) { return detail_simd::quad_reduce(x, "quad_product", file, line, [](T a, T b) { return a * b; }); }
template <class T> inline T quad_max(T x, MSL_EMU_LOC) { return detail_simd::quad_reduce(x, "quad_max", file, line, [](T a, T b) { return max(a, b); }); }
template <class T> inline T quad_min(T x, MSL_EMU_LOC) { return detail_simd::quad_reduce(x, "quad_min", file, line, [](T a, T b) { return min(a, b); }); }
template <class T> inline T quad_shuffle(T x, ushort q, MSL_EMU_LOC) { return detail_simd::from_lane(x, detail_simd::quad_src(q), "quad_shuffle", file, line); }
template <class T> inline T quad_broadcast(T x, ushort q, MSL_EMU_LOC) { return detail_simd::from_lane(x, detail_simd::quad_src(q), "quad_broadcast", file, line); }
template <class T> inline T quad_shuffle_xor(T x, ushort mask, MSL_EMU_LOC) {
  return detail_simd::from_lane(x, detail_simd::quad_src((detail_simd::lane() & 3) ^ mask), "quad_shuffle_xor", file, line);
}
template <class T> inline T quad_shuffle_down(T x, ushort d, MSL_EMU_LOC) {
  int q = (detail_simd::lane() & 3) + d;
  return detail_simd::from_lane(x, q < 4 ? detail_simd::quad_src(q) : -1, "quad_shuffle_down", file, line);
}
template <class T> inline T quad_shuffle_up(T x, ushort d, MSL_EMU_LOC) {
  int q = (detail_simd::lane() & 3) - d;
  return detail_simd::from_lane(x, q >= 0 ? detail_simd::quad_src(q) : -1, "quad_shuffle_up", file, line);
}

}  // namespace metal
