// msl_emu/bind.h -- used by the entry trampolines that gen.py writes for each kernel.
//
// gen.py reads each kernel parameter's [[...]] attribute and passes one role tag per
// parameter (Buf<n>, Tg<n>, Bi<builtin>); invoke() deduces the parameter types from the
// kernel's function type and converts each role to its parameter.
#pragma once
#include <string>
#include <type_traits>

#include "msl_emu/rt.h"
#include "msl_emu/runtime.h"
#include "msl_emu/types.h"

namespace msl_emu {
namespace bind {

template <int N> struct Buf {};
template <int N> struct Tg {};
enum B { tpig, tpitg, tgpig, ntptg, dtptg, ntgpg, ntpg, tiitg, tiisg, sgitg, nsgptg, tpsg, tiiqg, qgitg, nqgptg };
template <B K> struct Bi {};

// [[buffer(n)]]: a pointer, or a reference (`constant Args& a`), or a by-value struct.
template <class P, int N> inline P get(Buf<N>, const Launch& L) {
  void* p = L.bindings->buffer(N);
  if (!p)
    rt::fail("kernel argument [[buffer(" + std::to_string(N) + ")]] of " + L.kernel->name + " is not bound",
             L.kernel->file, L.kernel->line);
  if constexpr (std::is_pointer_v<P>) return (P)p;  // C cast: may add a clang address space
  else if constexpr (std::is_reference_v<P>) return *(std::remove_reference_t<P>*)p;
  else return *(const std::remove_cv_t<P>*)p;
}

// [[threadgroup(n)]]: the memory sized by setThreadgroupMemoryLength.
template <class P, int N> inline P get(Tg<N>, const Launch& L) {
  static_assert(std::is_pointer_v<P>, "a [[threadgroup(n)]] kernel argument must be a pointer");
  void* p = L.tg_mem[N];
  if (!p)
    rt::fail("kernel argument [[threadgroup(" + std::to_string(N) + ")]] of " + L.kernel->name +
                 " has no setThreadgroupMemoryLength",
             L.kernel->file, L.kernel->line);
  return (P)p;
}

// Builtins may be declared uint, ushort, int, uint2, ushort3, ... as in MSL.
template <class T> inline T from_dim(Dim3 d) {
  if constexpr (std::is_arithmetic_v<T>) {
    return (T)d.x;
  } else {
    T v{};
    constexpr int n = ::msl_emu::detail::vinfo<T>::N;
    v[0] = d.x;
    v[1] = d.y;
    if constexpr (n > 2) v[2] = d.z;
    return v;
  }
}
template <class P, B K> inline P get(Bi<K>, const Launch& L) {
  const ThreadBuiltins& b = *L.builtins;
  using T = std::remove_cv_t<std::remove_reference_t<P>>;
  if constexpr (K == tpig) return from_dim<T>(b.tpig);
  else if constexpr (K == tpitg) return from_dim<T>(b.tpitg);
  else if constexpr (K == tgpig) return from_dim<T>(b.tgpig);
  else if constexpr (K == ntptg) return from_dim<T>(b.ntptg);
  else if constexpr (K == dtptg) return from_dim<T>(b.dtptg);
  else if constexpr (K == ntgpg) return from_dim<T>(b.ntgpg);
  else if constexpr (K == ntpg) return from_dim<T>(b.ntpg);
  else if constexpr (K == tiitg) return (T)b.tiitg;
  else if constexpr (K == tiisg) return (T)b.tiisg;
  else if constexpr (K == sgitg) return (T)b.sgitg;
  else if constexpr (K == nsgptg) return (T)b.nsgptg;
  else if constexpr (K == tpsg) return (T)b.tpsg;
  else if constexpr (K == tiiqg) return (T)b.tiiqg;
  else if constexpr (K == qgitg) return (T)b.qgitg;
  else return (T)b.nqgptg;
}

template <class... P, class... R> inline void invoke(void (*fn)(P...), const Launch& L, R... r) {
  static_assert(sizeof...(P) == sizeof...(R), "kernel parameter / attribute count mismatch");
  fn(get<P>(r, L)...);
}

}  // namespace bind
}  // namespace msl_emu
