// Inner loops of the CPU backend. Each has a portable version and, on x86-64, an AVX2+FMA
// version chosen at run time, or on AArch64 a NEON version (simd_neon.cpp); the portable one is
// the reference the tests compare against.
#pragma once
#include <cstdint>

namespace markbase::cpu {

// sum_i a[i] * b[i]
float dot_f32(const float* a, const float* b, int64_t n);
// sum_i a[i] * half(b[i])
float dot_f16(const float* a, const uint16_t* b, int64_t n);
// y[i] += s * half(x[i]) / y[i] += s * x[i]
void axpy_f16(float s, const uint16_t* x, float* y, int64_t n);
void axpy_f32(float s, const float* x, float* y, int64_t n);

// Which implementation the dispatcher picked: "avx512" (AVX-512 F/BW/VL/VNNI: the prefill
// product on 512-bit vectors, everything else on AVX2), "avx2", "neon", "neon+dotprod" or
// "portable". MARKBASE_SIMD=portable (or =avx2 on an AVX-512 machine) forces a lower path.
const char* simd_path();
// True on the "avx2" and "avx512" paths (AVX2 + FMA + F16C kernels are in use).
bool simd_avx2();
bool simd_avx512();
// True on the "neon" and "neon+dotprod" paths.
bool simd_neon();

// sum_i x[i]^2, accumulated in double (each square is exact in double)
double sum_squares(const float* x, int64_t n);
// s[i] = exp(s[i] - mx); returns the sum of the new s[i] (softmax numerators)
float exp_sub_sum(float* s, int64_t n, float mx);

float gelu_tanh(float x);
// out[i] = gelu_tanh(a[i]) * b[i] (out may alias a)
void gelu_mul(const float* a, const float* b, float* out, int64_t n);
// out[i] = cap * tanh(a[i] / cap) (out may alias a)
void softcap(const float* a, float* out, int64_t n, float cap);

}  // namespace markbase::cpu
