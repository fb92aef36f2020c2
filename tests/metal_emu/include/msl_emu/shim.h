// msl_emu/shim.h -- the Metal Shading Language subset that kernels may use, for clang C++17.
//
// Generated kernel files (gen.py) include this first; <metal_stdlib> and the other MSL headers
// forward here. Layers, in include order:
//   types.h             half, bfloat, vectors, packed_ types, make<V>, as_type
//   addrspace.h         device / constant / threadgroup / thread / kernel qualifiers
//   math.h              math, integer, relational, geometric functions; fast::, precise::
//   sync.h              threadgroup_barrier, simdgroup_barrier, simd_*, quad_*
//   atomic.h            relaxed atomics on device and threadgroup memory
//   simdgroup_matrix.h  8x8 simdgroup matrices
//   ctor_macros.h       float4(a, b, ...) constructors (must stay last)
#pragma once
#define __METAL_VERSION__ 310
#define __METAL_MACOS__ 1
#define MSL_EMU 1

#include "msl_emu/types.h"
#include "msl_emu/addrspace.h"
#include "msl_emu/math.h"
#include "msl_emu/sync.h"
#include "msl_emu/atomic.h"
#include "msl_emu/simdgroup_matrix.h"
#include "msl_emu/rt.h"

namespace metal {
template <class T, int N> using vec = ::msl_emu::detail::vec<T, N>;
}  // namespace metal

// A kernel-scope `threadgroup T x[N];` becomes `MSL_TG_STATIC T x[N]; MSL_TG_INIT(x);` (gen.py).
// The first thread of each threadgroup to reach the declaration poisons the storage; that is
// before any thread can write it, because every writer has passed the declaration.
#define MSL_TG_INIT(name)                                    \
  static thread_local uint64_t msl_emu_tg_epoch_##name = 0;  \
  ::msl_emu::rt::tg_var_init((void*)&(name), sizeof(name), &msl_emu_tg_epoch_##name, __builtin_FILE(), __builtin_LINE())

#undef MSL_EMU_LOC
#include "msl_emu/ctor_macros.h"
