// msl_emu/addrspace.h -- MSL's address-space and function qualifiers.
//
// Normal (run) mode: `device`, `threadgroup` and `thread` vanish; `constant` becomes `const`,
// which is what MSL's constant address space is to the code that reads it (read-only), and
// what makes file-scope `constant float k = 1;` an internal-linkage constant as in MSL.
//
// -DMSL_EMU_ADDRSPACE_CHECK (for `clang++-16 -fsyntax-only` only): the qualifiers become clang
// address spaces, so mixing device / threadgroup / constant / thread pointers is a compile
// error, as in MSL. Threadgroup variables become mere declarations there: never link that build.
#pragma once

#define kernel
#ifdef MSL_EMU_ADDRSPACE_CHECK
#define device __attribute__((address_space(1)))
#define constant const __attribute__((address_space(2)))
#define threadgroup __attribute__((address_space(3)))
// `extern`: a declaration needs no constructor, which clang can't call on an object in a
// non-default address space (e.g. a kernel-scope `threadgroup atomic_uint`).
#define MSL_TG_STATIC extern __attribute__((address_space(3)))
#else
#define device
#define constant const
#define threadgroup
// A threadgroup runs entirely on one OS thread (its threads are fibers), so a thread_local
// static is shared by exactly the threads of one threadgroup.
#define MSL_TG_STATIC static thread_local
#endif
#define thread
#define ray_data
#define object_data
#define threadgroup_imageblock
