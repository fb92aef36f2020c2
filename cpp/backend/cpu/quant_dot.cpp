#include "backend/cpu/quant_dot.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "backend/cpu/avx2_blocks.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/simd_neon.h"
#include "formats/half.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MARKBASE_X86 1
#endif

namespace markbase::cpu {
namespace {

// ---- portable: unpack a block to 32 integers, integer dot, one float multiply per block.
inline int32_t idot32(const int8_t* w, const int8_t* a) {
  int32_t s = 0;
  for (int j = 0; j < 32; ++j) s += static_cast<int32_t>(w[j]) * a[j];
  return s;
}

float dot_q8_0_portable(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q8_0* w = static_cast<const block_q8_0*>(wv);
  float acc = 0.0f;
  for (int64_t i = 0; i < nb; ++i) acc += fp16_to_fp32(w[i].d) * a[i].d * static_cast<float>(idot32(w[i].qs, a[i].qs));
  return acc;
}

float dot_q4_0_portable(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q4_0* w = static_cast<const block_q4_0*>(wv);
  float acc = 0.0f;
  int8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    for (int j = 0; j < 16; ++j) { q[j] = (w[i].qs[j] & 15) - 8; q[j + 16] = (w[i].qs[j] >> 4) - 8; }
    acc += fp16_to_fp32(w[i].d) * a[i].d * static_cast<float>(idot32(q, a[i].qs));
  }
  return acc;
}

float dot_q4_1_portable(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q4_1* w = static_cast<const block_q4_1*>(wv);
  float acc = 0.0f;
  int8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    for (int j = 0; j < 16; ++j) { q[j] = w[i].qs[j] & 15; q[j + 16] = w[i].qs[j] >> 4; }
    acc += fp16_to_fp32(w[i].d) * a[i].d * static_cast<float>(idot32(q, a[i].qs)) +
           fp16_to_fp32(w[i].m) * a[i].d * static_cast<float>(a[i].sum);
  }
  return acc;
}

inline void unpack_q5(const uint8_t* qs, const uint8_t* qh, int8_t* q, int offset) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  for (int j = 0; j < 16; ++j) {
    q[j] = static_cast<int8_t>(((qs[j] & 15) | (((h >> j) & 1) << 4)) - offset);
    q[j + 16] = static_cast<int8_t>(((qs[j] >> 4) | (((h >> (j + 16)) & 1) << 4)) - offset);
  }
}

float dot_q5_0_portable(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q5_0* w = static_cast<const block_q5_0*>(wv);
  float acc = 0.0f;
  int8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q5(w[i].qs, w[i].qh, q, 16);
    acc += fp16_to_fp32(w[i].d) * a[i].d * static_cast<float>(idot32(q, a[i].qs));
  }
  return acc;
}

float dot_q5_1_portable(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q5_1* w = static_cast<const block_q5_1*>(wv);
  float acc = 0.0f;
  int8_t q[32];
  for (int64_t i = 0; i < nb; ++i) {
    unpack_q5(w[i].qs, w[i].qh, q, 0);
    acc += fp16_to_fp32(w[i].d) * a[i].d * static_cast<float>(idot32(q, a[i].qs)) +
           fp16_to_fp32(w[i].m) * a[i].d * static_cast<float>(a[i].sum);
  }
  return acc;
}

#ifdef MARKBASE_X86
#define AVX2 __attribute__((target("avx2,fma,f16c")))

AVX2 inline float hsum8(__m256 v) {
  __m128 lo = _mm256_castps256_ps128(v), hi = _mm256_extractf128_ps(v, 1);
  lo = _mm_add_ps(lo, hi);
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// 8 int32 partial sums of signed x signed bytes.
AVX2 inline __m256 dot_ss(__m256i x, __m256i y) {
  const __m256i ax = _mm256_sign_epi8(x, x);
  const __m256i sy = _mm256_sign_epi8(y, x);
  const __m256i p16 = _mm256_maddubs_epi16(ax, sy);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

// unsigned x signed bytes.
AVX2 inline __m256 dot_us(__m256i x, __m256i y) {
  const __m256i p16 = _mm256_maddubs_epi16(x, y);
  return _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)));
}

using avx2::bits_to_bytes;
using avx2::nibbles;

AVX2 inline __m256i load_a(const BlockQ8& a) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.qs));
}

AVX2 float dot_q8_0_avx2(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q8_0* w = static_cast<const block_q8_0*>(wv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(w[i].qs));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[i].d) * a[i].d), dot_ss(x, load_a(a[i])), acc);
  }
  return hsum8(acc);
}

AVX2 float dot_q4_0_avx2(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q4_0* w = static_cast<const block_q4_0*>(wv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i x = _mm256_sub_epi8(nibbles(w[i].qs), _mm256_set1_epi8(8));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[i].d) * a[i].d), dot_ss(x, load_a(a[i])), acc);
  }
  return hsum8(acc);
}

AVX2 float dot_q4_1_avx2(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q4_1* w = static_cast<const block_q4_1*>(wv);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[i].d) * a[i].d), dot_us(nibbles(w[i].qs), load_a(a[i])), acc);
    mins += _cvtsh_ss(w[i].m) * a[i].d * static_cast<float>(a[i].sum);
  }
  return hsum8(acc) + mins;
}

AVX2 float dot_q5_0_avx2(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q5_0* w = static_cast<const block_q5_0*>(wv);
  __m256 acc = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    __m256i x = nibbles(w[i].qs);
    const __m256i hi = _mm256_andnot_si256(bits_to_bytes(w[i].qh), _mm256_set1_epi8(static_cast<char>(0xF0)));
    x = _mm256_or_si256(x, hi);  // (q | bit << 4) - 16 as a signed byte
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[i].d) * a[i].d), dot_ss(x, load_a(a[i])), acc);
  }
  return hsum8(acc);
}

AVX2 float dot_q5_1_avx2(const void* wv, const BlockQ8* a, int64_t nb) {
  const block_q5_1* w = static_cast<const block_q5_1*>(wv);
  __m256 acc = _mm256_setzero_ps();
  float mins = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i x = avx2::q5_values(w[i].qs, w[i].qh);
    acc = _mm256_fmadd_ps(_mm256_set1_ps(_cvtsh_ss(w[i].d) * a[i].d), dot_us(x, load_a(a[i])), acc);
    mins += _cvtsh_ss(w[i].m) * a[i].d * static_cast<float>(a[i].sum);
  }
  return hsum8(acc) + mins;
}

// Q4_0 (KIND 1) values 0..15 or Q5_0 (KIND 2) values 0..31, before the offset of 8 or 16.
template <int KIND>
AVX2 inline __m256i unsigned_values(const void* wv, int64_t i) {
  if constexpr (KIND == 1) {
    return nibbles(static_cast<const block_q4_0*>(wv)[i].qs);
  } else {
    const block_q5_0& b = static_cast<const block_q5_0*>(wv)[i];
    return avx2::q5_values(b.qs, b.qh);
  }
}

// The float16 scale of block i of a Q8_0 (KIND 0), Q4_0 (1) or Q5_0 (2) row.
template <int KIND>
AVX2 inline float scale_of(const void* wv, int64_t i) {
  if constexpr (KIND == 0) return _cvtsh_ss(static_cast<const block_q8_0*>(wv)[i].d);
  else if constexpr (KIND == 1) return _cvtsh_ss(static_cast<const block_q4_0*>(wv)[i].d);
  else return _cvtsh_ss(static_cast<const block_q5_0*>(wv)[i].d);
}

// Four weight rows at once against one activation row (decode): the activation block is loaded
// once for four rows. out[r] equals the single-row kernel's result exactly.
template <int KIND>
AVX2 void rows4_avx2(const void* w, size_t row_bytes, const BlockQ8* a, int64_t nb, float* out) {
  const uint8_t* base = static_cast<const uint8_t*>(w);
  const void* w0 = base;
  const void* w1 = base + row_bytes;
  const void* w2 = base + 2 * row_bytes;
  const void* w3 = base + 3 * row_bytes;
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  // The four rows span 4 * row_bytes contiguous bytes; prefetch the group two groups ahead at the
  // rate this loop consumes it (the hardware prefetcher alone leaves decode short of bandwidth).
  const size_t step = 4 * row_bytes / static_cast<size_t>(nb > 0 ? nb : 1);
  const char* ahead = reinterpret_cast<const char*>(base) + 8 * row_bytes;
  for (int64_t i = 0; i < nb; ++i) {
    _mm_prefetch(ahead + i * step, _MM_HINT_T0);
    _mm_prefetch(ahead + i * step + 64, _MM_HINT_T0);
    const __m256i y = load_a(a[i]);
    const float da = a[i].d;
    if constexpr (KIND == 1 || KIND == 2) {
      // Q4_0 / Q5_0: multiply the unsigned values q by y directly and take 8 (16) * y away per
      // lane (y's lane sums, shared by the four rows): each lane is the same integer as
      // sum (q - 8) y (or (q - 16) y), without the two sign operations per row.
      const __m256i yb = _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_set1_epi8(KIND == 1 ? 8 : 16), y), ones);
#define MB_ROW_U(W, ACC)                                                                        \
      {                                                                                         \
        const __m256i q = unsigned_values<KIND>(W, i);                                          \
        const __m256i p32 = _mm256_sub_epi32(_mm256_madd_epi16(_mm256_maddubs_epi16(q, y), ones), yb); \
        ACC = _mm256_fmadd_ps(_mm256_set1_ps(scale_of<KIND>(W, i) * da), _mm256_cvtepi32_ps(p32), ACC); \
      }
      MB_ROW_U(w0, acc0) MB_ROW_U(w1, acc1) MB_ROW_U(w2, acc2) MB_ROW_U(w3, acc3)
#undef MB_ROW_U
      continue;
    }
#define MB_ROW(W, ACC)                                                                          \
    {                                                                                           \
      const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(static_cast<const block_q8_0*>(W)[i].qs)); \
      const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x)); \
      const __m256 p = _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, ones));                        \
      ACC = _mm256_fmadd_ps(_mm256_set1_ps(scale_of<KIND>(W, i) * da), p, ACC);                 \
    }
    MB_ROW(w0, acc0) MB_ROW(w1, acc1) MB_ROW(w2, acc2) MB_ROW(w3, acc3)
#undef MB_ROW
  }
  out[0] = hsum8(acc0);
  out[1] = hsum8(acc1);
  out[2] = hsum8(acc2);
  out[3] = hsum8(acc3);
}

// quantize_act_q8 with 8 lanes: the same float products and round-half-to-even, so the same bytes.
AVX2 void quantize_act_q8_avx2(const float* x, BlockQ8* out, int64_t n) {
  const __m256 sign = _mm256_set1_ps(-0.0f);
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    __m256 v[4];
    __m256 mx = _mm256_setzero_ps();
    for (int j = 0; j < 4; ++j) {
      v[j] = _mm256_loadu_ps(x + 8 * j);
      mx = _mm256_max_ps(mx, _mm256_andnot_ps(sign, v[j]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(mx), _mm256_extractf128_ps(mx, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    m4 = _mm_max_ss(m4, _mm_movehdup_ps(m4));
    const float amax = _mm_cvtss_f32(m4);
    BlockQ8& o = out[b];
    o.d = fp16_to_fp32(fp32_to_fp16(amax / 127.0f));
    const __m256 id = _mm256_set1_ps(amax != 0.0f ? 127.0f / amax : 0.0f);
    __m256i q[4];
    for (int j = 0; j < 4; ++j)
      q[j] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[j], id), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    const __m256i s32 = _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(s32), _mm256_extracti128_si256(s32, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    o.sum = _mm_cvtsi128_si32(s4);
    // packs interleave the 128-bit halves; the permutation restores element order.
    const __m256i p16 = _mm256_packs_epi32(q[0], q[1]), p16b = _mm256_packs_epi32(q[2], q[3]);
    const __m256i p8 = _mm256_packs_epi16(p16, p16b);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(o.qs),
                        _mm256_permutevar8x32_epi32(p8, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  }
}
#endif

using DotFn = float (*)(const void*, const BlockQ8*, int64_t);
struct Table {
  DotFn q8_0 = dot_q8_0_portable, q4_0 = dot_q4_0_portable, q4_1 = dot_q4_1_portable,
        q5_0 = dot_q5_0_portable, q5_1 = dot_q5_1_portable;
  Table() {
#ifdef MARKBASE_X86
    if (simd_avx2()) {
      q8_0 = dot_q8_0_avx2; q4_0 = dot_q4_0_avx2; q4_1 = dot_q4_1_avx2;
      q5_0 = dot_q5_0_avx2; q5_1 = dot_q5_1_avx2;
    }
#elif defined(__aarch64__)
    if (simd_neon()) {
      q8_0 = neon::dot_q8_0; q4_0 = neon::dot_q4_0; q4_1 = neon::dot_q4_1;
      q5_0 = neon::dot_q5_0; q5_1 = neon::dot_q5_1;
    }
#endif
  }
};

const Table& table() {
  static const Table t;
  return t;
}

}  // namespace

// Rounds exactly as llama.cpp's x86 quantize_row_q8_0 (scale 127 / amax, round half to even),
// so that both engines see the same quantized activations.
void quantize_act_q8(const float* x, BlockQ8* out, int64_t n) {
#ifdef MARKBASE_X86
  if (table().q8_0 == dot_q8_0_avx2) return quantize_act_q8_avx2(x, out, n);
#endif
  for (int64_t b = 0; b < n / 32; ++b, x += 32) {
    float amax = 0.0f;
    for (int j = 0; j < 32; ++j) {
      const float v = std::fabs(x[j]);
      amax = v > amax ? v : amax;
    }
    const float d = amax / 127.0f;
    const float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    BlockQ8& o = out[b];
    o.d = fp16_to_fp32(fp32_to_fp16(d));  // stored as float16, as llama.cpp's Q8_0 blocks
    int32_t s = 0;
    for (int j = 0; j < 32; ++j) {
      o.qs[j] = static_cast<int8_t>(std::nearbyint(x[j] * id));
      s += o.qs[j];
    }
    o.sum = s;
  }
}

bool has_q8_dot(TensorType t) {
  return t == TensorType::Q8_0 || t == TensorType::Q4_0 || t == TensorType::Q4_1 ||
         t == TensorType::Q5_0 || t == TensorType::Q5_1;
}

void dot_q8_rows4(TensorType t, const void* w, size_t row_bytes, const BlockQ8* a, int64_t nb, float* out) {
#ifdef MARKBASE_X86
  if (table().q8_0 == dot_q8_0_avx2) {
    switch (t) {
      case TensorType::Q8_0: return rows4_avx2<0>(w, row_bytes, a, nb, out);
      case TensorType::Q4_0: return rows4_avx2<1>(w, row_bytes, a, nb, out);
      case TensorType::Q5_0: return rows4_avx2<2>(w, row_bytes, a, nb, out);
      default: break;
    }
  }
#endif
  for (int r = 0; r < 4; ++r) out[r] = dot_q8(t, static_cast<const uint8_t*>(w) + r * row_bytes, a, nb);
}

float dot_q8(TensorType t, const void* w, const BlockQ8* a, int64_t nb) {
  const Table& tb = table();
  switch (t) {
    case TensorType::Q8_0: return tb.q8_0(w, a, nb);
    case TensorType::Q4_0: return tb.q4_0(w, a, nb);
    case TensorType::Q4_1: return tb.q4_1(w, a, nb);
    case TensorType::Q5_0: return tb.q5_0(w, a, nb);
    case TensorType::Q5_1: return tb.q5_1(w, a, nb);
    default: std::abort();
  }
}

}  // namespace markbase::cpu
