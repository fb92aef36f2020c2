// msl_emu/atomic.h -- MSL atomics (memory_order_relaxed, as Metal supports).
//
// atomic<T> has T's size and layout, so a `device atomic_uint*` can point at a plain uint32
// array written by the host, and a kernel-scope `threadgroup atomic_int` is one int. The
// operations are real hardware atomics, because threadgroups of one dispatch run on several
// OS threads at once and may hit the same device word.
#pragma once
#include <type_traits>

#include "msl_emu/addrspace.h"
#include "msl_emu/types.h"

namespace metal {

enum memory_order {
  memory_order_relaxed = __ATOMIC_RELAXED,
  memory_order_acquire = __ATOMIC_ACQUIRE,
  memory_order_release = __ATOMIC_RELEASE,
  memory_order_acq_rel = __ATOMIC_ACQ_REL,
  memory_order_seq_cst = __ATOMIC_SEQ_CST,
};
enum class thread_scope { thread_scope_thread, thread_scope_simdgroup, thread_scope_threadgroup, thread_scope_device };

template <class T> struct atomic {
  T v;
};
typedef atomic<int> atomic_int;
typedef atomic<uint> atomic_uint;
typedef atomic<bool> atomic_bool;
typedef atomic<float> atomic_float;
typedef atomic<ulong> atomic_ulong;
typedef atomic<long> atomic_long;

namespace detail_atomic {
// The plain T inside an atomic<T>, whatever the pointer's qualifiers (the C-style cast also
// drops a clang address space in the -fsyntax-only address-space check).
template <class A> inline auto* raw(A* a) {
  using T = decltype(std::declval<std::remove_cv_t<A>&>().v);
  return (std::remove_cv_t<T>*)(&a->v);
}
template <class P> using val_t = std::remove_pointer_t<P>;
// Compare-and-swap loop for operations the hardware has no single instruction for here.
// The generic __atomic builtins work for float as well as integers.
template <class T, class F> inline T rmw(T* p, F f) {
  T old;
  __atomic_load(p, &old, __ATOMIC_RELAXED);
  T desired = f(old);
  while (!__atomic_compare_exchange(p, &old, &desired, true, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) desired = f(old);
  return old;
}
}  // namespace detail_atomic

template <class A, class V> inline void atomic_store_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  detail_atomic::val_t<decltype(p)> x = (detail_atomic::val_t<decltype(p)>)v;
  __atomic_store(p, &x, __ATOMIC_RELAXED);
}
template <class A> inline auto atomic_load_explicit(A* a, memory_order) {
  auto* p = detail_atomic::raw(a);
  detail_atomic::val_t<decltype(p)> x;
  __atomic_load(p, &x, __ATOMIC_RELAXED);
  return x;
}
template <class A, class V> inline auto atomic_exchange_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  detail_atomic::val_t<decltype(p)> x = (detail_atomic::val_t<decltype(p)>)v, old;
  __atomic_exchange(p, &x, &old, __ATOMIC_RELAXED);
  return old;
}
template <class A, class V> inline auto atomic_fetch_add_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  using T = detail_atomic::val_t<decltype(p)>;
  if constexpr (std::is_floating_point_v<T>) return detail_atomic::rmw(p, [&](T o) { return o + (T)v; });
  else return __atomic_fetch_add(p, (T)v, __ATOMIC_RELAXED);
}
template <class A, class V> inline auto atomic_fetch_sub_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  using T = detail_atomic::val_t<decltype(p)>;
  if constexpr (std::is_floating_point_v<T>) return detail_atomic::rmw(p, [&](T o) { return o - (T)v; });
  else return __atomic_fetch_sub(p, (T)v, __ATOMIC_RELAXED);
}
template <class A, class V> inline auto atomic_fetch_max_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  using T = detail_atomic::val_t<decltype(p)>;
  return detail_atomic::rmw(p, [&](T o) { return o < (T)v ? (T)v : o; });
}
template <class A, class V> inline auto atomic_fetch_min_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  using T = detail_atomic::val_t<decltype(p)>;
  return detail_atomic::rmw(p, [&](T o) { return (T)v < o ? (T)v : o; });
}
template <class A, class V> inline auto atomic_fetch_or_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  return __atomic_fetch_or(p, (detail_atomic::val_t<decltype(p)>)v, __ATOMIC_RELAXED);
}
template <class A, class V> inline auto atomic_fetch_and_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  return __atomic_fetch_and(p, (detail_atomic::val_t<decltype(p)>)v, __ATOMIC_RELAXED);
}
template <class A, class V> inline auto atomic_fetch_xor_explicit(A* a, V v, memory_order) {
  auto* p = detail_atomic::raw(a);
  return __atomic_fetch_xor(p, (detail_atomic::val_t<decltype(p)>)v, __ATOMIC_RELAXED);
}
// On failure *expected receives the current value, as in C++ and MSL.
template <class A, class E, class V>
inline bool atomic_compare_exchange_weak_explicit(A* a, E* expected, V desired, memory_order, memory_order) {
  auto* p = detail_atomic::raw(a);
  using T = detail_atomic::val_t<decltype(p)>;
  T d = (T)desired;
  return __atomic_compare_exchange(p, (T*)expected, &d, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED);
}
template <class A, class E, class V>
inline bool atomic_compare_exchange_strong_explicit(A* a, E* expected, V desired, memory_order s, memory_order f) {
  return atomic_compare_exchange_weak_explicit(a, expected, desired, s, f);
}

}  // namespace metal
