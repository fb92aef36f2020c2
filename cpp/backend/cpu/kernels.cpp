#include "backend/cpu/kernels.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/simd_neon.h"
#include "formats/half.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define MARKBASE_X86 1
#endif

namespace markbase::cpu {
namespace {

// Portable versions: 8 independent partial sums, added in a fixed order.
float dot_f32_portable(const float* a, const float* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * b[i + j];
  float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

float dot_f16_portable(const float* a, const uint16_t* b, int64_t n) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int j = 0; j < 8; ++j) s[j] += a[i + j] * fp16_to_fp32(b[i + j]);
  float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
  for (; i < n; ++i) r += a[i] * fp16_to_fp32(b[i]);
  return r;
}

void axpy_f16_portable(float s, const uint16_t* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += s * fp16_to_fp32(x[i]);
}

void axpy_f32_portable(float s, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += s * x[i];
}

double sum_squares_portable(const float* x, int64_t n) {
  double ss = 0.0;
  for (int64_t i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

float exp_sub_sum_portable(float* s, int64_t n, float mx) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  return sum;
}

void gelu_mul_portable(const float* a, const float* b, float* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gelu_tanh(a[i]) * b[i];
}

void softcap_portable(const float* a, float* out, int64_t n, float cap) {
  for (int64_t i = 0; i < n; ++i) out[i] = cap * std::tanh(a[i] / cap);
}

#ifdef MARKBASE_X86
// exp(x) for 8 floats (Cephes' polynomial after a reduction by ln 2; about 1 ulp), clamped to
// the float range so that very negative or positive inputs give 0 or a large finite value.
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3f)), _mm256_set1_ps(88.3f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
  return _mm256_mul_ps(p, _mm256_castsi256_ps(e));
}

// gelu_tanh(x) = 0.5 x (1 + tanh(u)) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3):
// one exp instead of libm's tanh, which was a tenth of prefill time.
__attribute__((target("avx2,fma"))) void gelu_mul_avx2(const float* a, const float* b, float* out, int64_t n) {
  const __m256 c2 = _mm256_set1_ps(-2.0f * 0.7978845608028654f), k = _mm256_set1_ps(0.044715f);
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_loadu_ps(a + i);
    const __m256 x3 = _mm256_mul_ps(_mm256_mul_ps(x, x), x);
    const __m256 e = exp_avx2(_mm256_mul_ps(c2, _mm256_fmadd_ps(k, x3, x)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(x, _mm256_add_ps(one, e)), _mm256_loadu_ps(b + i)));
  }
  for (; i < n; ++i) out[i] = gelu_tanh(a[i]) * b[i];
}

// cap * tanh(x / cap) = cap * (1 - 2 / (exp(2x / cap) + 1)): the final logit softcap over the
// whole vocabulary, where libm's tanh cost 5% of a decode step.
__attribute__((target("avx2,fma"))) void softcap_avx2(const float* a, float* out, int64_t n, float cap) {
  const __m256 k = _mm256_set1_ps(2.0f / cap), c = _mm256_set1_ps(cap), one = _mm256_set1_ps(1.0f),
               two = _mm256_set1_ps(2.0f);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_mul_ps(k, _mm256_loadu_ps(a + i)));
    const __m256 t = _mm256_sub_ps(one, _mm256_div_ps(two, _mm256_add_ps(e, one)));
    _mm256_storeu_ps(out + i, _mm256_mul_ps(c, t));
  }
  for (; i < n; ++i) out[i] = cap * std::tanh(a[i] / cap);
}

__attribute__((target("avx2,fma"))) double sum_squares_avx2(const float* x, int64_t n) {
  __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256d a = _mm256_cvtps_pd(_mm_loadu_ps(x + i)), b = _mm256_cvtps_pd(_mm_loadu_ps(x + i + 4));
    s0 = _mm256_fmadd_pd(a, a, s0);
    s1 = _mm256_fmadd_pd(b, b, s1);
  }
  alignas(32) double l[4];
  _mm256_store_pd(l, _mm256_add_pd(s0, s1));
  double ss = (l[0] + l[1]) + (l[2] + l[3]);
  for (; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  return ss;
}

__attribute__((target("avx2,fma"))) inline float hsum(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

__attribute__((target("avx2,fma"))) float exp_sub_sum_avx2(float* s, int64_t n, float mx) {
  const __m256 m = _mm256_set1_ps(mx);
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 e = exp_avx2(_mm256_sub_ps(_mm256_loadu_ps(s + i), m));
    _mm256_storeu_ps(s + i, e);
    acc = _mm256_add_ps(acc, e);
  }
  float sum = hsum(acc);
  for (; i < n; ++i) {
    s[i] = std::exp(s[i] - mx);
    sum += s[i];
  }
  return sum;
}

__attribute__((target("avx2,fma"))) float dot_f32_avx2(const float* a, const float* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(),
         s3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
    s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
    s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
  }
  for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
  float r = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

__attribute__((target("avx2,fma,f16c"))) float dot_f16_avx2(const float* a, const uint16_t* b, int64_t n) {
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    __m256 b0 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    __m256 b1 = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i + 8)));
    s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), b0, s0);
    s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), b1, s1);
  }
  float r = hsum(_mm256_add_ps(s0, s1));
  for (; i < n; ++i) r += a[i] * fp16_to_fp32(b[i]);
  return r;
}

__attribute__((target("avx2,fma,f16c"))) void axpy_f16_avx2(float s, const uint16_t* x, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 xv = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i)));
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, xv, _mm256_loadu_ps(y + i)));
  }
  for (; i < n; ++i) y[i] += s * fp16_to_fp32(x[i]);
}

__attribute__((target("avx2,fma"))) void axpy_f32_avx2(float s, const float* x, float* y, int64_t n) {
  const __m256 vs = _mm256_set1_ps(s);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(vs, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
  for (; i < n; ++i) y[i] += s * x[i];
}
#endif

#ifdef MARKBASE_X86
// CPUID leaf 1, ECX bit 29 (clang's __builtin_cpu_supports does not know "f16c").
bool has_f16c() {
  unsigned a, b, c, d;
  return __get_cpuid(1, &a, &b, &c, &d) && (c & (1u << 29));
}
#endif

#ifdef MARKBASE_X86
// AVX-512 F, BW and VL (with the OS saving the registers: GCC's and clang's checks include it)
// and VNNI (CPUID leaf 7, ECX bit 11).
bool has_avx512_vnni() {
  unsigned a, b, c, d;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __get_cpuid_count(7, 0, &a, &b, &c, &d) && (c & (1u << 11));
}
#endif

struct Dispatch {
  float (*dot_f32)(const float*, const float*, int64_t) = dot_f32_portable;
  float (*dot_f16)(const float*, const uint16_t*, int64_t) = dot_f16_portable;
  void (*axpy_f16)(float, const uint16_t*, float*, int64_t) = axpy_f16_portable;
  void (*axpy_f32)(float, const float*, float*, int64_t) = axpy_f32_portable;
  void (*gelu_mul)(const float*, const float*, float*, int64_t) = gelu_mul_portable;
  void (*softcap)(const float*, float*, int64_t, float) = softcap_portable;
  double (*sum_squares)(const float*, int64_t) = sum_squares_portable;
  float (*exp_sub_sum)(float*, int64_t, float) = exp_sub_sum_portable;
  const char* name = "portable";
  Dispatch() {
    const char* force = std::getenv("MARKBASE_SIMD");
    if (force && std::strcmp(force, "portable") == 0) return;
#ifdef MARKBASE_X86
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && has_f16c()) {
      dot_f32 = dot_f32_avx2;
      dot_f16 = dot_f16_avx2;
      axpy_f16 = axpy_f16_avx2;
      axpy_f32 = axpy_f32_avx2;
      gelu_mul = gelu_mul_avx2;
      softcap = softcap_avx2;
      sum_squares = sum_squares_avx2;
      exp_sub_sum = exp_sub_sum_avx2;
      name = "avx2";
      if (has_avx512_vnni() && !(force && std::strcmp(force, "avx2") == 0)) name = "avx512";
    }
#elif defined(__aarch64__)
    dot_f32 = neon::dot_f32;
    dot_f16 = neon::dot_f16;
    axpy_f16 = neon::axpy_f16;
    axpy_f32 = neon::axpy_f32;
    gelu_mul = neon::gelu_mul;
    softcap = neon::softcap;
    name = neon::name();
#endif
  }
};

const Dispatch& dispatch() {
  static const Dispatch d;
  return d;
}

}  // namespace

float dot_f32(const float* a, const float* b, int64_t n) { return dispatch().dot_f32(a, b, n); }
float dot_f16(const float* a, const uint16_t* b, int64_t n) { return dispatch().dot_f16(a, b, n); }
void axpy_f16(float s, const uint16_t* x, float* y, int64_t n) { dispatch().axpy_f16(s, x, y, n); }
void axpy_f32(float s, const float* x, float* y, int64_t n) { dispatch().axpy_f32(s, x, y, n); }
void gelu_mul(const float* a, const float* b, float* out, int64_t n) { dispatch().gelu_mul(a, b, out, n); }
void softcap(const float* a, float* out, int64_t n, float cap) { dispatch().softcap(a, out, n, cap); }
double sum_squares(const float* x, int64_t n) { return dispatch().sum_squares(x, n); }
float exp_sub_sum(float* s, int64_t n, float mx) { return dispatch().exp_sub_sum(s, n, mx); }
const char* simd_path() { return dispatch().name; }
bool simd_avx2() {
  static const bool v = std::strcmp(simd_path(), "avx2") == 0 || simd_avx512();
  return v;
}
bool simd_avx512() {
  static const bool v = std::strcmp(simd_path(), "avx512") == 0;
  return v;
}
bool simd_neon() {
  static const bool v = std::strncmp(simd_path(), "neon", 4) == 0;
  return v;
}

float gelu_tanh(float x) {
  const float c = 0.7978845608028654f;  // sqrt(2 / pi)
  return 0.5f * x * (1.0f + std::tanh(c * (x + 0.044715f * x * x * x)));
}

}  // namespace markbase::cpu
