// The CPU backend's inner loops for 64-bit Arm (NEON, part of every AArch64 core). Integer dot
// products use the SDOT instruction when the compiler targets it (__ARM_FEATURE_DOTPROD: Apple
// M-series by default, or -march=armv8.2-a+dotprod), else widening multiplies. Each function
// computes what the portable version of the same name does; the dispatchers in kernels.cpp,
// quant_dot.cpp and kquant_dot.cpp pick these on AArch64 unless MARKBASE_SIMD=portable.
#pragma once
#if defined(__aarch64__)
#include <cstdint>

#include "backend/cpu/kquant_dot.h"
#include "backend/cpu/panel_gemm.h"
#include "backend/cpu/quant_dot.h"

namespace markbase::cpu::neon {

// "neon+dotprod" or "neon": what simd_path() reports.
const char* name();

float dot_f32(const float* a, const float* b, int64_t n);
float dot_f16(const float* a, const uint16_t* b, int64_t n);
void axpy_f16(float s, const uint16_t* x, float* y, int64_t n);
void axpy_f32(float s, const float* x, float* y, int64_t n);
void gelu_mul(const float* a, const float* b, float* out, int64_t n);
void softcap(const float* a, float* out, int64_t n, float cap);

// One weight row of nb blocks against nb blocks of 8-bit activations.
float dot_q8_0(const void* w, const BlockQ8* a, int64_t nb);
float dot_q4_0(const void* w, const BlockQ8* a, int64_t nb);
float dot_q4_1(const void* w, const BlockQ8* a, int64_t nb);
float dot_q5_0(const void* w, const BlockQ8* a, int64_t nb);
float dot_q5_1(const void* w, const BlockQ8* a, int64_t nb);
float dot_q8k(const UnpackedK* w, const BlockQ8K* a, int64_t nb);

// Prefill on row panels (panel_gemm.h): out[t * os + r] for T tokens and nrows rows. 32-blocks:
// the integer sum less bias * the activations' sum, plus the row mins when `mins`.
void gemm_panel32(const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int T, int bias, bool mins,
                  float* out, int64_t os, int nrows);
// K-quants; q6: Q6_K, whose offset (mn = 32 sc, dmin = d) is taken away in integers.
void gemm_panelk(bool q6, const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t as, int T, float* out,
                 int64_t os, int nrows);

}  // namespace markbase::cpu::neon
#endif
