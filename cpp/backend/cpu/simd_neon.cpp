#include "backend/cpu/simd_neon.h"

#if defined(__aarch64__)
#include <arm_neon.h>

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "formats/half.h"
#include "formats/tensor_types.h"

namespace markbase::cpu::neon {
namespace {

// acc + the dot products of four groups of 4 int8 pairs (one int32 lane per group).
inline int32x4_t idot(int32x4_t acc, int8x16_t a, int8x16_t b) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, a, b);
#else
  // |a * b| <= 128 * 127 fits int16; pairwise widening keeps the int32 lanes exact.
  acc = vpadalq_s16(acc, vmull_s8(vget_low_s8(a), vget_low_s8(b)));
  return vpadalq_s16(acc, vmull_high_s8(a, b));
#endif
}

// Integer dot of one 32-value weight block (two halves of 16) with an activation block.
inline int32_t block_dot(int8x16_t w0, int8x16_t w1, const BlockQ8& a) {
  return vaddvq_s32(idot(idot(vdupq_n_s32(0), w0, vld1q_s8(a.qs)), w1, vld1q_s8(a.qs + 16)));
}

// Q4 nibbles: low nibbles are values 0..15 of the block, high nibbles 16..31.
inline void nibbles(const uint8_t* qs, int8x16_t& lo, int8x16_t& hi) {
  const uint8x16_t v = vld1q_u8(qs);
  lo = vreinterpretq_s8_u8(vandq_u8(v, vdupq_n_u8(15)));
  hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
}

// Q5's fifth bits: bit j of qh belongs to value j; returns 16 where set, else 0.
inline int8x16_t high_bits(uint32_t h) {
  static const uint8_t kBit[16] = {1, 2, 4, 8, 16, 32, 64, 128, 1, 2, 4, 8, 16, 32, 64, 128};
  const uint8x16_t bytes = vcombine_u8(vdup_n_u8(static_cast<uint8_t>(h)), vdup_n_u8(static_cast<uint8_t>(h >> 8)));
  return vreinterpretq_s8_u8(vandq_u8(vtstq_u8(bytes, vld1q_u8(kBit)), vdupq_n_u8(16)));
}

inline void q5_values(const uint8_t* qs, const uint8_t* qh, int8x16_t& lo, int8x16_t& hi) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  nibbles(qs, lo, hi);
  lo = vorrq_s8(lo, high_bits(h));
  hi = vorrq_s8(hi, high_bits(h >> 16));
}

// exp(x) for 4 floats: the same reduction by ln 2 and Cephes polynomial as the AVX2 version.
inline float32x4_t exp4(float32x4_t x) {
  x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3f)), vdupq_n_f32(88.3f));
  const float32x4_t n = vrndnq_f32(vmulq_n_f32(x, 1.44269504088896341f));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
  r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
  float32x4_t p = vdupq_n_f32(1.9875691500e-4f);
  p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
  p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
  p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
  p = vfmaq_f32(vaddq_f32(r, vdupq_n_f32(1.0f)), p, vmulq_f32(r, r));
  const int32x4_t e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
  return vmulq_f32(p, vreinterpretq_f32_s32(e));
}

// acc + for each of 4 panel rows (16 bytes: row r's 4 values at 4r), the dot of its 4 values
// with the same 4 activations y4 (broadcast to every lane).
inline int32x4_t dot_rows4(int32x4_t acc, int8x16_t w, int8x16_t y4) {
#if defined(__ARM_FEATURE_DOTPROD)
  return vdotq_s32(acc, w, y4);
#else
  const int32x4_t lo = vpaddlq_s16(vmull_s8(vget_low_s8(w), vget_low_s8(y4)));
  const int32x4_t hi = vpaddlq_s16(vmull_high_s8(w, y4));
  return vaddq_s32(acc, vpaddq_s32(lo, hi));
#endif
}

inline int8x16_t bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return vreinterpretq_s8_s32(vdupq_n_s32(v));
}

// Integer sums of 8 panel rows (lo: rows 0-3, hi: 4-7) over values [4 g0, 4 g1) of one token.
inline void panel_sums(const uint8_t* q, const int8_t* y, int g0, int g1, int32x4_t& lo, int32x4_t& hi) {
  for (int g = g0; g < g1; ++g) {
    const int8x16_t y4 = bcast4(y + 4 * g);
    lo = dot_rows4(lo, vreinterpretq_s8_u8(vld1q_u8(q + g * 32)), y4);
    hi = dot_rows4(hi, vreinterpretq_s8_u8(vld1q_u8(q + g * 32 + 16)), y4);
  }
}

inline void store_rows(float* out, float32x4_t lo, float32x4_t hi, int nrows) {
  float tmp[kPanelRows];
  vst1q_f32(tmp, lo);
  vst1q_f32(tmp + 4, hi);
  std::memcpy(out, tmp, nrows * sizeof(float));
}

inline float32x4_t load_f16x4(const uint16_t* p) { return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16(p))); }

}  // namespace

const char* name() {
#if defined(__ARM_FEATURE_DOTPROD)
  return "neon+dotprod";
#else
  return "neon";
#endif
}

float dot_f32(const float* a, const float* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0, s2 = s0, s3 = s0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), vld1q_f32(b + i + 4));
    s2 = vfmaq_f32(s2, vld1q_f32(a + i + 8), vld1q_f32(b + i + 8));
    s3 = vfmaq_f32(s3, vld1q_f32(a + i + 12), vld1q_f32(b + i + 12));
  }
  for (; i + 4 <= n; i += 4) s0 = vfmaq_f32(s0, vld1q_f32(a + i), vld1q_f32(b + i));
  float r = vaddvq_f32(vaddq_f32(vaddq_f32(s0, s1), vaddq_f32(s2, s3)));
  for (; i < n; ++i) r += a[i] * b[i];
  return r;
}

float dot_f16(const float* a, const uint16_t* b, int64_t n) {
  float32x4_t s0 = vdupq_n_f32(0), s1 = s0;
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    s0 = vfmaq_f32(s0, vld1q_f32(a + i), load_f16x4(b + i));
    s1 = vfmaq_f32(s1, vld1q_f32(a + i + 4), load_f16x4(b + i + 4));
  }
  float r = vaddvq_f32(vaddq_f32(s0, s1));
  for (; i < n; ++i) r += a[i] * fp16_to_fp32(b[i]);
  return r;
}

void axpy_f16(float s, const uint16_t* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), load_f16x4(x + i), s));
  for (; i < n; ++i) y[i] += s * fp16_to_fp32(x[i]);
}

void axpy_f32(float s, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) vst1q_f32(y + i, vfmaq_n_f32(vld1q_f32(y + i), vld1q_f32(x + i), s));
  for (; i < n; ++i) y[i] += s * x[i];
}

// gelu_tanh(x) = x / (1 + exp(-2u)), u = sqrt(2/pi) (x + 0.044715 x^3), as the AVX2 version.
void gelu_mul(const float* a, const float* b, float* out, int64_t n) {
  const float32x4_t one = vdupq_n_f32(1.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t x = vld1q_f32(a + i);
    const float32x4_t x3 = vmulq_f32(vmulq_f32(x, x), x);
    const float32x4_t e = exp4(vmulq_n_f32(vfmaq_n_f32(x, x3, 0.044715f), -2.0f * 0.7978845608028654f));
    vst1q_f32(out + i, vmulq_f32(vdivq_f32(x, vaddq_f32(one, e)), vld1q_f32(b + i)));
  }
  for (; i < n; ++i) out[i] = gelu_tanh(a[i]) * b[i];
}

// cap * tanh(x / cap) = cap * (1 - 2 / (exp(2x / cap) + 1))
void softcap(const float* a, float* out, int64_t n, float cap) {
  const float32x4_t one = vdupq_n_f32(1.0f), two = vdupq_n_f32(2.0f);
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    const float32x4_t e = exp4(vmulq_n_f32(vld1q_f32(a + i), 2.0f / cap));
    vst1q_f32(out + i, vmulq_n_f32(vsubq_f32(one, vdivq_f32(two, vaddq_f32(e, one))), cap));
  }
  for (; i < n; ++i) out[i] = cap * std::tanh(a[i] / cap);
}

// The block-scale products are accumulated in four float lanes and summed once per row.
float dot_q8_0(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q8_0* w = static_cast<const block_q8_0*>(wv);
  float32x4_t acc = vdupq_n_f32(0);
  for (int64_t i = 0; i < nb; ++i) {
    const int32x4_t s = idot(idot(vdupq_n_s32(0), vld1q_s8(w[i].qs), vld1q_s8(a[i].qs)),
                             vld1q_s8(w[i].qs + 16), vld1q_s8(a[i].qs + 16));
    acc = vfmaq_n_f32(acc, vcvtq_f32_s32(s), fp16_to_fp32(w[i].d) * a[i].d);
  }
  return vaddvq_f32(acc);
}

namespace {

// The 32 values of a block as two halves of 16 (unsigned, before the type's offset).
inline void block_values(const block_q4_0& b, int8x16_t& lo, int8x16_t& hi) { nibbles(b.qs, lo, hi); }
inline void block_values(const block_q4_1& b, int8x16_t& lo, int8x16_t& hi) { nibbles(b.qs, lo, hi); }
inline void block_values(const block_q5_0& b, int8x16_t& lo, int8x16_t& hi) { q5_values(b.qs, b.qh, lo, hi); }
inline void block_values(const block_q5_1& b, int8x16_t& lo, int8x16_t& hi) { q5_values(b.qs, b.qh, lo, hi); }

// x = d * (q - OFFSET) (+ m for the types with a min), dotted block by block.
template <class B, int OFFSET, bool MIN>
float dot_blocks(const void* wv, const BlockQ8* a, int64_t nb) {
  const B* w = static_cast<const B*>(wv);
  const int8x16_t off = vdupq_n_s8(OFFSET);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int8x16_t lo, hi;
    block_values(w[i], lo, hi);
    if (OFFSET) {
      lo = vsubq_s8(lo, off);
      hi = vsubq_s8(hi, off);
    }
    float r = fp16_to_fp32(w[i].d) * a[i].d * static_cast<float>(block_dot(lo, hi, a[i]));
    if constexpr (MIN) r += fp16_to_fp32(w[i].m) * a[i].d * static_cast<float>(a[i].sum);
    acc += r;
  }
  return acc;
}

}  // namespace

float dot_q4_0(const void* w, const BlockQ8* a, int64_t nb) { return dot_blocks<block_q4_0, 8, false>(w, a, nb); }
float dot_q4_1(const void* w, const BlockQ8* a, int64_t nb) { return dot_blocks<block_q4_1, 0, true>(w, a, nb); }
float dot_q5_0(const void* w, const BlockQ8* a, int64_t nb) { return dot_blocks<block_q5_0, 16, false>(w, a, nb); }
float dot_q5_1(const void* w, const BlockQ8* a, int64_t nb) { return dot_blocks<block_q5_1, 0, true>(w, a, nb); }

// Per super-block: sum_g scale[g] * (q_g . y_g) in int32 lanes, and min . bsums for the offset.
float dot_q8k(const UnpackedK* w, const BlockQ8K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32x4_t sum = vdupq_n_s32(0);
    for (int g = 0; g < 16; ++g) {
      const int32x4_t p = idot(vdupq_n_s32(0), vld1q_s8(w[i].q + g * 16), vld1q_s8(a[i].qs + g * 16));
      sum = vmlaq_n_s32(sum, p, w[i].scale[g]);
    }
    int32_t summ = 0;
    if (w[i].dmin != 0.0f) {
      const int16x8_t m0 = vld1q_s16(w[i].min), m1 = vld1q_s16(w[i].min + 8);
      const int16x8_t b0 = vld1q_s16(a[i].bsums), b1 = vld1q_s16(a[i].bsums + 8);
      int32x4_t mp = vmull_s16(vget_low_s16(m0), vget_low_s16(b0));
      mp = vmlal_high_s16(mp, m0, b0);
      mp = vmlal_s16(mp, vget_low_s16(m1), vget_low_s16(b1));
      mp = vmlal_high_s16(mp, m1, b1);
      summ = vaddvq_s32(mp);
    }
    acc += w[i].d * a[i].d * static_cast<float>(vaddvq_s32(sum)) -
           w[i].dmin * a[i].d * static_cast<float>(summ);
  }
  return acc;
}

// Panel values are unsigned (< 64) or Q8_0's signed bytes: both are int8 for the dot products.
void gemm_panel32(const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int T, int bias, bool mins,
                  float* out, int64_t os, int nrows) {
  for (int t = 0; t < T; ++t) {
    float32x4_t acc_lo = vdupq_n_f32(0), acc_hi = acc_lo;
    for (int64_t i = 0; i < nb; ++i) {
      const BlockQ8& y = a[t * as + i];
      int32x4_t lo = vdupq_n_s32(0), hi = lo;
      panel_sums(p[i].q, y.qs, 0, 8, lo, hi);
      const int32x4_t off = vdupq_n_s32(bias * y.sum);
      acc_lo = vfmaq_f32(acc_lo, vmulq_n_f32(vld1q_f32(p[i].d), y.d), vcvtq_f32_s32(vsubq_s32(lo, off)));
      acc_hi = vfmaq_f32(acc_hi, vmulq_n_f32(vld1q_f32(p[i].d + 4), y.d), vcvtq_f32_s32(vsubq_s32(hi, off)));
      if (mins) {
        const float ms = y.d * static_cast<float>(y.sum);
        acc_lo = vfmaq_n_f32(acc_lo, vld1q_f32(p[i].m), ms);
        acc_hi = vfmaq_n_f32(acc_hi, vld1q_f32(p[i].m + 4), ms);
      }
    }
    store_rows(out + t * os, acc_lo, acc_hi, nrows);
  }
}

void gemm_panelk(bool q6, const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t as, int T, float* out,
                 int64_t os, int nrows) {
  for (int t = 0; t < T; ++t) {
    float32x4_t acc_lo = vdupq_n_f32(0), acc_hi = acc_lo;
    for (int64_t i = 0; i < nb; ++i) {
      const BlockQ8K& y = a[t * as + i];
      int32x4_t sumi_lo = vdupq_n_s32(0), sumi_hi = sumi_lo, summ_lo = sumi_lo, summ_hi = sumi_lo;
      for (int s = 0; s < 16; ++s) {
        int32x4_t lo = vdupq_n_s32(0), hi = lo;
        panel_sums(p[i].q, y.qs, 4 * s, 4 * s + 4, lo, hi);
        const int16x8_t sc = vld2q_s16(&p[i].sc[s][0][0]).val[0];  // sub-group s, rows 0..7
        sumi_lo = vmlaq_s32(sumi_lo, lo, vmovl_s16(vget_low_s16(sc)));
        sumi_hi = vmlaq_s32(sumi_hi, hi, vmovl_high_s16(sc));
        const int16x8_t mn = vld2q_s16(&p[i].mn[s / 2][0][0]).val[s % 2];
        summ_lo = vmlal_n_s16(summ_lo, vget_low_s16(mn), y.bsums[s]);
        summ_hi = vmlal_high_n_s16(summ_hi, mn, y.bsums[s]);
      }
      const float32x4_t d_lo = vmulq_n_f32(vld1q_f32(p[i].d), y.d), d_hi = vmulq_n_f32(vld1q_f32(p[i].d + 4), y.d);
      if (q6) {
        acc_lo = vfmaq_f32(acc_lo, d_lo, vcvtq_f32_s32(vsubq_s32(sumi_lo, summ_lo)));
        acc_hi = vfmaq_f32(acc_hi, d_hi, vcvtq_f32_s32(vsubq_s32(sumi_hi, summ_hi)));
      } else {
        acc_lo = vfmaq_f32(acc_lo, d_lo, vcvtq_f32_s32(sumi_lo));
        acc_hi = vfmaq_f32(acc_hi, d_hi, vcvtq_f32_s32(sumi_hi));
        acc_lo = vfmsq_f32(acc_lo, vmulq_n_f32(vld1q_f32(p[i].dmin), y.d), vcvtq_f32_s32(summ_lo));
        acc_hi = vfmsq_f32(acc_hi, vmulq_n_f32(vld1q_f32(p[i].dmin + 4), y.d), vcvtq_f32_s32(summ_hi));
      }
    }
    store_rows(out + t * os, acc_lo, acc_hi, nrows);
  }
}

}  // namespace markbase::cpu::neon
#endif
