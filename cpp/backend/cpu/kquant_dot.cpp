#include "backend/cpu/kquant_dot.h"

#include <cmath>
#include <cstring>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_neon.h"
#include "formats/half.h"
#include "formats/quants.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MARKBASE_X86 1
#endif

namespace markbase::cpu {

bool has_q8k_dot(TensorType t) {
  return t == TensorType::Q4_K || t == TensorType::Q5_K || t == TensorType::Q6_K;
}

// As llama.cpp's quantize_row_q8_K: the scale comes from the signed value of largest magnitude,
// values round half to even and clip at 127.
namespace {
#ifdef MARKBASE_X86
// quantize_act_q8k with 8 lanes: the same element picked for the scale (the first of largest
// magnitude), the same float products and rounding, so the same bytes.
__attribute__((target("avx2,fma"))) void quantize_act_q8k_avx2(const float* x, BlockQ8K* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / 256; ++b, x += 256) {
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < 256; j += 8) mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)));
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    BlockQ8K& o = out[b];
    if (amax == 0.0f) {
      std::memset(&o, 0, sizeof(o));
      continue;
    }
    float max = 0.0f;
    const __m256 va = _mm256_set1_ps(amax);
    for (int j = 0; j < 256; j += 8) {
      const int m = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(x + j)), va, _CMP_EQ_OQ));
      if (m) { max = x[j + __builtin_ctz(static_cast<unsigned>(m))]; break; }
    }
    const float iscale = -127.0f / max;
    const __m256 vs = _mm256_set1_ps(iscale);
    const __m256i lim = _mm256_set1_epi32(127);
    for (int j = 0; j < 256; j += 32) {
      __m256i q[4];
      for (int k = 0; k < 4; ++k)
        q[k] = _mm256_min_epi32(lim, _mm256_cvtps_epi32(_mm256_round_ps(
                   _mm256_mul_ps(vs, _mm256_loadu_ps(x + j + 8 * k)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC)));
      // bsums of the two 16-value groups: lanes of q[0] + q[1] and of q[2] + q[3]
      for (int h = 0; h < 2; ++h) {
        const __m256i s = _mm256_add_epi32(q[2 * h], q[2 * h + 1]);
        __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
        s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
        o.bsums[j / 16 + h] = static_cast<int16_t>(_mm_cvtsi128_si32(s4));
      }
      const __m256i p8 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]), _mm256_packs_epi32(q[2], q[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs + j),
                          _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
    }
    o.d = 1.0f / iscale;
  }
}
#endif
}  // namespace

void quantize_act_q8k(const float* x, BlockQ8K* out, int64_t n) {
#ifdef MARKBASE_X86
  if (simd_avx2()) return quantize_act_q8k_avx2(x, out, n);
#endif
  for (int64_t b = 0; b < n / 256; ++b, x += 256) {
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < 256; ++j)
      if (std::fabs(x[j]) > amax) { amax = std::fabs(x[j]); max = x[j]; }
    BlockQ8K& o = out[b];
    if (amax == 0.0f) {
      std::memset(&o, 0, sizeof(o));
      continue;
    }
    const float iscale = -127.0f / max;
    for (int j = 0; j < 256; ++j) {
      const int v = static_cast<int>(std::nearbyint(iscale * x[j]));
      o.qs[j] = static_cast<int8_t>(v > 127 ? 127 : v);
    }
    for (int g = 0; g < 16; ++g) {
      int s = 0;
      for (int l = 0; l < 16; ++l) s += o.qs[g * 16 + l];
      o.bsums[g] = static_cast<int16_t>(s);
    }
    o.d = 1.0f / iscale;
  }
}

namespace {
void unpack_k_row_portable(TensorType t, const void* row, UnpackedK* out, int64_t nb);
#ifdef MARKBASE_X86
void unpack_k_row_avx2(TensorType t, const void* row, UnpackedK* out, int64_t nb);
#endif
}  // namespace

void unpack_k_row(TensorType t, const void* row, UnpackedK* out, int64_t nb) {
#ifdef MARKBASE_X86
  if (simd_avx2()) return unpack_k_row_avx2(t, row, out, nb);
#endif
  unpack_k_row_portable(t, row, out, nb);
}

namespace {

// Scales, mins and d of a Q4_K / Q5_K block (shared by both unpackers).
template <class B>
void k_header(const B& b, UnpackedK& u) {
  u.d = fp16_to_fp32(b.d);
  u.dmin = fp16_to_fp32(b.dmin);
  for (int j = 0; j < 8; ++j) {
    uint8_t sc, m;
    k_scale_min(j, b.scales, &sc, &m);
    u.scale[2 * j] = u.scale[2 * j + 1] = sc;
    u.min[2 * j] = u.min[2 * j + 1] = m;
  }
}

#ifdef MARKBASE_X86
// The super-block decoders shared by the row unpacker and the decode row dot (values unsigned:
// Q4_K 0..15, Q5_K 0..31, Q6_K q + 32 in 0..63).

// Q6_K values 128n + 32k for k = 0..3.
__attribute__((target("avx2"))) inline void q6k_values(const block_q6_K& b, int n, __m256i v[4]) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), m3 = _mm256_set1_epi8(3);
  const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n));
  const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.ql + 64 * n + 32));
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh + 32 * n));
  v[0] = _mm256_or_si256(_mm256_and_si256(l0, m4), _mm256_slli_epi16(_mm256_and_si256(h, m3), 4));
  v[1] = _mm256_or_si256(_mm256_and_si256(l1, m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), m3), 4));
  v[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), m3), 4));
  v[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m4), _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), m3), 4));
}

// Q4_K / Q5_K values 64p .. 64p + 31 (lo) and 64p + 32 .. 64p + 63 (hi); qh: Q5_K's high bits.
__attribute__((target("avx2"))) inline void q45k_values(const uint8_t* qs, __m256i qh, bool five, int p, __m256i& lo,
                                                        __m256i& hi) {
  const __m256i m4 = _mm256_set1_epi8(0x0F), one = _mm256_set1_epi8(1);
  const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 32 * p));
  lo = _mm256_and_si256(v, m4);
  hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), m4);
  if (five) {
    lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p), one), 4));
    hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * p + 1), one), 4));
  }
}

__attribute__((target("avx2"))) void unpack_k_row_avx2(TensorType t, const void* row, UnpackedK* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    UnpackedK& u = out[i];
#define store(off, v) _mm256_storeu_si256(reinterpret_cast<__m256i*>(u.q + (off)), (v))
    if (t == TensorType::Q6_K) {
      const block_q6_K& b = static_cast<const block_q6_K*>(row)[i];
      u.d = fp16_to_fp32(b.d);
      u.dmin = 0.0f;
      for (int g = 0; g < 16; ++g) { u.scale[g] = b.scales[g]; u.min[g] = 0; }
      const __m256i k32 = _mm256_set1_epi8(32);
      for (int n = 0; n < 2; ++n) {
        __m256i v[4];
        q6k_values(b, n, v);
        for (int k = 0; k < 4; ++k) store(128 * n + 32 * k, _mm256_sub_epi8(v[k], k32));
      }
      continue;
    }
    const bool five = t == TensorType::Q5_K;
    const uint8_t* qs;
    __m256i qh = _mm256_setzero_si256();
    if (five) {
      const block_q5_K& b = static_cast<const block_q5_K*>(row)[i];
      k_header(b, u);
      qs = b.qs;
      qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
    } else {
      const block_q4_K& b = static_cast<const block_q4_K*>(row)[i];
      k_header(b, u);
      qs = b.qs;
    }
    for (int p = 0; p < 4; ++p) {
      __m256i lo, hi;
      q45k_values(qs, qh, five, p, lo, hi);
      store(64 * p, lo);
      store(64 * p + 32, hi);
    }
#undef store
  }
}
#endif

void unpack_k_row_portable(TensorType t, const void* row, UnpackedK* out, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    UnpackedK& u = out[i];
    if (t == TensorType::Q6_K) {
      const block_q6_K& b = static_cast<const block_q6_K*>(row)[i];
      u.d = fp16_to_fp32(b.d);
      u.dmin = 0.0f;
      for (int g = 0; g < 16; ++g) { u.scale[g] = b.scales[g]; u.min[g] = 0; }
      for (int n = 0; n < 2; ++n) {
        const uint8_t* ql = b.ql + 64 * n;
        const uint8_t* qh = b.qh + 32 * n;
        int8_t* q = u.q + 128 * n;
        for (int l = 0; l < 32; ++l) {
          q[l] = static_cast<int8_t>(((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32);
          q[l + 32] = static_cast<int8_t>(((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32);
          q[l + 64] = static_cast<int8_t>(((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32);
          q[l + 96] = static_cast<int8_t>(((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32);
        }
      }
      continue;
    }
    // Q4_K / Q5_K: 8 sub-blocks of 32 with 6-bit scales and mins.
    const bool five = t == TensorType::Q5_K;
    const uint8_t* scales;
    const uint8_t* qs;
    const uint8_t* qh = nullptr;
    if (five) {
      const block_q5_K& b = static_cast<const block_q5_K*>(row)[i];
      u.d = fp16_to_fp32(b.d); u.dmin = fp16_to_fp32(b.dmin);
      scales = b.scales; qs = b.qs; qh = b.qh;
    } else {
      const block_q4_K& b = static_cast<const block_q4_K*>(row)[i];
      u.d = fp16_to_fp32(b.d); u.dmin = fp16_to_fp32(b.dmin);
      scales = b.scales; qs = b.qs;
    }
    for (int j = 0; j < 8; ++j) {
      uint8_t sc, m;
      k_scale_min(j, scales, &sc, &m);
      u.scale[2 * j] = u.scale[2 * j + 1] = sc;
      u.min[2 * j] = u.min[2 * j + 1] = m;
      const uint8_t* src = qs + (j / 2) * 32;
      for (int l = 0; l < 32; ++l) {
        int v = (j % 2 == 0) ? (src[l] & 0xF) : (src[l] >> 4);
        if (five && (qh[l] >> j) & 1) v += 16;
        u.q[j * 32 + l] = static_cast<int8_t>(v);
      }
    }
  }
}

}  // namespace

namespace {

float dot_q8k_portable(const UnpackedK* w, const BlockQ8K* a, int64_t nb) {
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    int32_t sumi = 0, summ = 0;
    for (int g = 0; g < 16; ++g) {
      int32_t s = 0;
      for (int l = 0; l < 16; ++l) s += static_cast<int32_t>(w[i].q[g * 16 + l]) * a[i].qs[g * 16 + l];
      sumi += s * w[i].scale[g];
      summ += static_cast<int32_t>(w[i].min[g]) * a[i].bsums[g];
    }
    acc += w[i].d * a[i].d * static_cast<float>(sumi) - w[i].dmin * a[i].d * static_cast<float>(summ);
  }
  return acc;
}

#ifdef MARKBASE_X86
#define KAVX2 __attribute__((target("avx2,fma,f16c")))

KAVX2 inline float hsum8k(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// Scales and mins of the 8 sub-blocks of a Q4_K / Q5_K block as bytes (k_scale_min on 32-bit
// words): sc[0..3] = w0 & 63, sc[4..7] = low nibbles of w2 with w0's top bits, mins likewise
// from w1 and w2's high nibbles.
inline void k_scales_mins(const uint8_t* q, uint8_t* sc, uint8_t* mn) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  const uint32_t s[2] = {w[0] & 0x3f3f3f3fu, (w[2] & 0x0f0f0f0fu) | (((w[0] >> 6) & 0x03030303u) << 4)};
  const uint32_t m[2] = {w[1] & 0x3f3f3f3fu, ((w[2] >> 4) & 0x0f0f0f0fu) | (((w[1] >> 6) & 0x03030303u) << 4)};
  std::memcpy(sc, s, 8);
  std::memcpy(mn, m, 8);
}

// One weight row of Q4_K / Q5_K / Q6_K against Q8_K activations, straight from the blocks
// (decode): per super-block the integer sums scale . (q . y) and min . bsums are those of
// dot_q8k_portable on the unpacked row, so the result is the same up to float rounding.
template <TensorType T>
KAVX2 float dot_k_row_avx2(const void* row, const BlockQ8K* a, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const int8_t* y = a[i].qs;
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].bsums));
    __m256i sum = _mm256_setzero_si256();
    float d, dmin = 0.0f;
    __m256i msum;  // min . bsums (Q4_K / Q5_K) or the offset 32 * scale . bsums (Q6_K)
    if constexpr (T == TensorType::Q6_K) {
      const block_q6_K& b = static_cast<const block_q6_K*>(row)[i];
      d = _cvtsh_ss(b.d);
      const __m256i sc16 = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.scales)));
      msum = _mm256_slli_epi32(_mm256_madd_epi16(sc16, bsums), 5);
      for (int n = 0; n < 2; ++n) {
        __m256i v[4];
        q6k_values(b, n, v);
        for (int k = 0; k < 4; ++k) {  // values 128n + 32k: sub-groups 8n + 2k and 8n + 2k + 1
          const int g = 8 * n + 2 * k;
          const __m256i yv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 16 * g));
          const __m256i sc = _mm256_set_m128i(_mm_set1_epi16(b.scales[g + 1]), _mm_set1_epi16(b.scales[g]));
          sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(v[k], yv), sc));
        }
      }
      sum = _mm256_sub_epi32(sum, msum);
    } else {
      const bool five = T == TensorType::Q5_K;
      const uint8_t* qs;
      const uint8_t* scales;
      __m256i qh = _mm256_setzero_si256();
      if constexpr (T == TensorType::Q5_K) {
        const block_q5_K& b = static_cast<const block_q5_K*>(row)[i];
        d = _cvtsh_ss(b.d);
        dmin = _cvtsh_ss(b.dmin);
        qs = b.qs;
        scales = b.scales;
        qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qh));
      } else {
        const block_q4_K& b = static_cast<const block_q4_K*>(row)[i];
        d = _cvtsh_ss(b.d);
        dmin = _cvtsh_ss(b.dmin);
        qs = b.qs;
        scales = b.scales;
      }
      alignas(8) uint8_t sc[8], mn[8];
      k_scales_mins(scales, sc, mn);
      // bsums of sub-block j (32 values) = bsums[2j] + bsums[2j + 1]
      const __m256i ones = _mm256_set1_epi16(1);
      const __m256i bs32 = _mm256_madd_epi16(bsums, ones);
      const __m256i mn32 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mn)));
      msum = _mm256_mullo_epi32(mn32, bs32);
      for (int p = 0; p < 4; ++p) {
        __m256i lo, hi;
        q45k_values(qs, qh, five, p, lo, hi);
        const __m256i ylo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 64 * p));
        const __m256i yhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y + 64 * p + 32));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(lo, ylo), _mm256_set1_epi16(sc[2 * p])));
        sum = _mm256_add_epi32(sum, _mm256_madd_epi16(_mm256_maddubs_epi16(hi, yhi), _mm256_set1_epi16(sc[2 * p + 1])));
      }
    }
    acc = _mm256_fmadd_ps(_mm256_set1_ps(d * a[i].d), _mm256_cvtepi32_ps(sum), acc);
    if constexpr (T != TensorType::Q6_K)
      acc = _mm256_fnmadd_ps(_mm256_set1_ps(dmin * a[i].d), _mm256_cvtepi32_ps(msum), acc);
  }
  return hsum8k(acc);
}

#endif

}  // namespace

float dot_q8k_row(TensorType t, const void* row, const BlockQ8K* a, int64_t nb) {
#ifdef MARKBASE_X86
  if (simd_avx2()) {
    switch (t) {
      case TensorType::Q4_K: return dot_k_row_avx2<TensorType::Q4_K>(row, a, nb);
      case TensorType::Q5_K: return dot_k_row_avx2<TensorType::Q5_K>(row, a, nb);
      default: return dot_k_row_avx2<TensorType::Q6_K>(row, a, nb);
    }
  }
#endif
  thread_local std::vector<UnpackedK> u;
  if (static_cast<int64_t>(u.size()) < nb) u.resize(nb);
  unpack_k_row(t, row, u.data(), nb);
#if defined(__aarch64__)
  if (simd_neon()) return neon::dot_q8k(u.data(), a, nb);
#endif
  return dot_q8k_portable(u.data(), a, nb);
}

}  // namespace markbase::cpu
