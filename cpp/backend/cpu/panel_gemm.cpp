#include "backend/cpu/panel_gemm.h"

#include <cstdlib>
#include <cstring>
#include <vector>

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

// How a 32-block type's values are kept in a panel: unsigned with a bias that the integer sum
// takes away (bias * sum of the activations), or signed (Q8_0, whose values fill the byte).
struct Kind32 {
  bool is_signed;
  int bias;
};

Kind32 kind32(TensorType t) {
  switch (t) {
    case TensorType::Q8_0: return {true, 0};
    case TensorType::Q4_0: return {false, 8};
    case TensorType::Q5_0: return {false, 16};
    default: return {false, 0};  // Q4_1, Q5_1: unsigned values, float mins
  }
}

// Scale and min (0 unless Q4_1 / Q5_1) of block i of a row.
void unpack32_scales(TensorType t, const uint8_t* row, int64_t i, float* d, float* m) {
  *m = 0.0f;
  switch (t) {
    case TensorType::Q8_0: *d = fp16_to_fp32(reinterpret_cast<const block_q8_0*>(row)[i].d); return;
    case TensorType::Q4_0: *d = fp16_to_fp32(reinterpret_cast<const block_q4_0*>(row)[i].d); return;
    case TensorType::Q5_0: *d = fp16_to_fp32(reinterpret_cast<const block_q5_0*>(row)[i].d); return;
    case TensorType::Q4_1: {
      const block_q4_1& b = reinterpret_cast<const block_q4_1*>(row)[i];
      *d = fp16_to_fp32(b.d);
      *m = fp16_to_fp32(b.m);
      return;
    }
    case TensorType::Q5_1: {
      const block_q5_1& b = reinterpret_cast<const block_q5_1*>(row)[i];
      *d = fp16_to_fp32(b.d);
      *m = fp16_to_fp32(b.m);
      return;
    }
    default: std::abort();
  }
}

// Block i of a row as the panel stores its 32 values: Q8_0's bytes, the others' unsigned values.
void unpack32_values(TensorType t, const uint8_t* row, int64_t i, uint8_t* v) {
  auto q4 = [&](const uint8_t* qs) {
    for (int j = 0; j < 16; ++j) { v[j] = qs[j] & 15; v[j + 16] = qs[j] >> 4; }
  };
  auto q5 = [&](const uint8_t* qs, const uint8_t* qhb) {
    uint32_t qh;
    std::memcpy(&qh, qhb, 4);
    for (int j = 0; j < 16; ++j) {
      v[j] = static_cast<uint8_t>((qs[j] & 15) | (((qh >> j) & 1) << 4));
      v[j + 16] = static_cast<uint8_t>((qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4));
    }
  };
  switch (t) {
    case TensorType::Q8_0: std::memcpy(v, reinterpret_cast<const block_q8_0*>(row)[i].qs, 32); return;
    case TensorType::Q4_0: return q4(reinterpret_cast<const block_q4_0*>(row)[i].qs);
    case TensorType::Q4_1: return q4(reinterpret_cast<const block_q4_1*>(row)[i].qs);
    case TensorType::Q5_0: return q5(reinterpret_cast<const block_q5_0*>(row)[i].qs, reinterpret_cast<const block_q5_0*>(row)[i].qh);
    case TensorType::Q5_1: return q5(reinterpret_cast<const block_q5_1*>(row)[i].qs, reinterpret_cast<const block_q5_1*>(row)[i].qh);
    default: std::abort();
  }
}

// ---- portable kernels: the reference for the SIMD ones (same integers, same float formula).

void gemm32_portable(TensorType ty, const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int T,
                     float* out, int64_t os, int nrows) {
  const Kind32 k = kind32(ty);
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < nrows; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        const BlockQ8& y = a[t * as + i];
        int32_t s = 0;
        for (int c = 0; c < 32; ++c) {
          const uint8_t q = p[i].q[(c / 4) * 32 + r * 4 + c % 4];
          s += (k.is_signed ? static_cast<int32_t>(static_cast<int8_t>(q)) : static_cast<int32_t>(q)) * y.qs[c];
        }
        s -= k.bias * y.sum;
        acc += p[i].d[r] * y.d * static_cast<float>(s) + p[i].m[r] * y.d * static_cast<float>(y.sum);
      }
      out[t * os + r] = acc;
    }
}

void gemmk_portable(TensorType ty, const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t as, int T,
                    float* out, int64_t os, int nrows) {
  const bool q6 = ty == TensorType::Q6_K;
  for (int t = 0; t < T; ++t)
    for (int r = 0; r < nrows; ++r) {
      float acc = 0.0f;
      for (int64_t i = 0; i < nb; ++i) {
        const BlockQ8K& y = a[t * as + i];
        int32_t sumi = 0, summ = 0;
        for (int s = 0; s < 16; ++s) {
          int32_t g = 0;
          for (int c = 16 * s; c < 16 * s + 16; ++c)
            g += static_cast<int32_t>(p[i].q[(c / 4) * 32 + r * 4 + c % 4]) * y.qs[c];
          sumi += g * p[i].sc[s][r][0];
          summ += static_cast<int32_t>(p[i].mn[s / 2][r][s % 2]) * y.bsums[s];
        }
        // Q6_K's offset (mn = 32 sc, dmin = d) is taken away in integers, exactly.
        if (q6) acc += p[i].d[r] * y.d * static_cast<float>(sumi - summ);
        else acc += p[i].d[r] * y.d * static_cast<float>(sumi) - p[i].dmin[r] * y.d * static_cast<float>(summ);
      }
      out[t * os + r] = acc;
    }
}

#ifdef MARKBASE_X86
#define PAVX2 __attribute__((target("avx2,fma,f16c")))

PAVX2 inline __m256i bcast4(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

PAVX2 inline void store_rows(float* out, __m256 v, int nrows) {
  if (nrows == kPanelRows) {
    _mm256_storeu_ps(out, v);
  } else {
    alignas(32) float tmp[kPanelRows];
    _mm256_store_ps(tmp, v);
    std::memcpy(out, tmp, nrows * sizeof(float));
  }
}

// NT tokens (1..4) x 8 rows. Unsigned values: the four value groups of a half block are summed
// in 16 bits (31 * 127 * 2 * 4 < 32767) before one widening multiply-add; signed (Q8_0) values
// use |w| and sign-adjusted activations and widen every product (|w| * |y| * 2 fills 16 bits).
template <int NT, bool SIGNED>
PAVX2 void gemm32_avx2_nt(const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int bias, bool mins,
                          float* out, int64_t os, int nrows) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const Panel32& b = p[i];
    __m256i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    for (int h = 0; h < 2; ++h) {
      __m256i w[4];
      for (int j = 0; j < 4; ++j) w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.q + (4 * h + j) * 32));
      for (int t = 0; t < NT; ++t) {
        const int8_t* y = a[t * as + i].qs + 16 * h;
        __m256i s32;
        if constexpr (SIGNED) {
          s32 = _mm256_setzero_si256();
          for (int j = 0; j < 4; ++j) {
            const __m256i p16 = _mm256_maddubs_epi16(_mm256_sign_epi8(w[j], w[j]), _mm256_sign_epi8(bcast4(y + 4 * j), w[j]));
            s32 = _mm256_add_epi32(s32, _mm256_madd_epi16(p16, ones));
          }
        } else {
          const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast4(y)), _mm256_maddubs_epi16(w[1], bcast4(y + 4)));
          const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], bcast4(y + 8)), _mm256_maddubs_epi16(w[3], bcast4(y + 12)));
          s32 = _mm256_madd_epi16(_mm256_add_epi16(p01, p23), ones);
        }
        isum[t] = _mm256_add_epi32(isum[t], s32);
      }
    }
    const __m256 d = _mm256_loadu_ps(b.d);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8& y = a[t * as + i];
      if (bias) isum[t] = _mm256_sub_epi32(isum[t], _mm256_set1_epi32(bias * y.sum));
      acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, _mm256_set1_ps(y.d)), _mm256_cvtepi32_ps(isum[t]), acc[t]);
      if (mins) acc[t] = _mm256_fmadd_ps(_mm256_loadu_ps(b.m), _mm256_set1_ps(y.d * static_cast<float>(y.sum)), acc[t]);
    }
  }
  for (int t = 0; t < NT; ++t) store_rows(out + t * os, acc[t], nrows);
}

// Stores r[0..7] (32 bytes of row r each) as 8 registers whose 32-bit lane r is row r's 4 bytes
// of group g: an 8 x 8 transpose of 32-bit elements.
PAVX2 void store_interleaved(const __m256i* r, uint8_t* dst) {
  __m256i t[8], u[8];
  for (int k = 0; k < 4; ++k) {
    t[2 * k] = _mm256_unpacklo_epi32(r[2 * k], r[2 * k + 1]);      // groups 0,1 | 4,5 of rows 2k, 2k+1
    t[2 * k + 1] = _mm256_unpackhi_epi32(r[2 * k], r[2 * k + 1]);  // groups 2,3 | 6,7
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h..4h+3
    u[4 * h + 0] = _mm256_unpacklo_epi64(t[4 * h], t[4 * h + 2]);      // group 0 | 4
    u[4 * h + 1] = _mm256_unpackhi_epi64(t[4 * h], t[4 * h + 2]);      // group 1 | 5
    u[4 * h + 2] = _mm256_unpacklo_epi64(t[4 * h + 1], t[4 * h + 3]);  // group 2 | 6
    u[4 * h + 3] = _mm256_unpackhi_epi64(t[4 * h + 1], t[4 * h + 3]);  // group 3 | 7
  }
  for (int g = 0; g < 4; ++g) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + g * 32), _mm256_permute2x128_si256(u[g], u[4 + g], 0x20));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + (g + 4) * 32), _mm256_permute2x128_si256(u[g], u[4 + g], 0x31));
  }
}

// Block i of a row as the panel's 32 bytes (as unpack32_values).
template <TensorType T>
PAVX2 __m256i values32(const uint8_t* row, int64_t i) {
  if constexpr (T == TensorType::Q8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(reinterpret_cast<const block_q8_0*>(row)[i].qs));
  } else if constexpr (T == TensorType::Q4_0) {
    return avx2::nibbles(reinterpret_cast<const block_q4_0*>(row)[i].qs);
  } else if constexpr (T == TensorType::Q4_1) {
    return avx2::nibbles(reinterpret_cast<const block_q4_1*>(row)[i].qs);
  } else if constexpr (T == TensorType::Q5_0) {
    const block_q5_0& b = reinterpret_cast<const block_q5_0*>(row)[i];
    return avx2::q5_values(b.qs, b.qh);
  } else {
    const block_q5_1& b = reinterpret_cast<const block_q5_1*>(row)[i];
    return avx2::q5_values(b.qs, b.qh);
  }
}

// Every 32-block type starts with its float16 scale; Q4_1 and Q5_1 follow it with the min.
template <TensorType T>
PAVX2 void pack32_avx2(const uint8_t* rows, size_t row_bytes, int nrows, int64_t nb, Panel32* out) {
  constexpr bool mins = T == TensorType::Q4_1 || T == TensorType::Q5_1;
  const size_t bb = static_cast<size_t>(traits(T).block_bytes);
  for (int64_t i = 0; i < nb; ++i) {
    Panel32& p = out[i];
    __m256i r[kPanelRows];
    alignas(16) uint16_t dh[kPanelRows] = {0}, mh[kPanelRows] = {0};
    for (int k = 0; k < kPanelRows; ++k) {
      if (k < nrows) {
        const uint8_t* row = rows + k * row_bytes;
        std::memcpy(&dh[k], row + i * bb, 2);
        if (mins) std::memcpy(&mh[k], row + i * bb + 2, 2);
        r[k] = values32<T>(row, i);
      } else {
        r[k] = _mm256_setzero_si256();
      }
    }
    _mm256_storeu_ps(p.d, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(dh))));
    _mm256_storeu_ps(p.m, _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(mh))));
    store_interleaved(r, p.q);
  }
}

PAVX2 void pack32_avx2(TensorType t, const uint8_t* rows, size_t row_bytes, int nrows, int64_t nb, Panel32* out) {
  switch (t) {
    case TensorType::Q8_0: return pack32_avx2<TensorType::Q8_0>(rows, row_bytes, nrows, nb, out);
    case TensorType::Q4_0: return pack32_avx2<TensorType::Q4_0>(rows, row_bytes, nrows, nb, out);
    case TensorType::Q4_1: return pack32_avx2<TensorType::Q4_1>(rows, row_bytes, nrows, nb, out);
    case TensorType::Q5_0: return pack32_avx2<TensorType::Q5_0>(rows, row_bytes, nrows, nb, out);
    default: return pack32_avx2<TensorType::Q5_1>(rows, row_bytes, nrows, nb, out);
  }
}

// The 8 rows' super-blocks (row r at k[r * stride]) into the panel's interleaved values.
PAVX2 void interleave_k_avx2(const UnpackedK* k, int64_t stride, uint8_t* dst) {
  for (int c = 0; c < 8; ++c) {
    __m256i r[kPanelRows];
    for (int j = 0; j < kPanelRows; ++j)
      r[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(k[j * stride].q + 32 * c));
    store_interleaved(r, dst + 256 * c);
  }
}

template <bool SIGNED>
PAVX2 void gemm32_avx2(const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int T, int bias, bool mins,
                       float* out, int64_t os, int nrows) {
  int t = 0;
  for (; t + 4 <= T; t += 4) gemm32_avx2_nt<4, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows);
  switch (T - t) {
    case 3: gemm32_avx2_nt<3, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows); break;
    case 2: gemm32_avx2_nt<2, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows); break;
    case 1: gemm32_avx2_nt<1, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows); break;
    default: break;
  }
}

// AVX-512 (F/BW/VL/VNNI): two tokens per 512-bit vector, the panel's 32 bytes of a value group in
// both halves and each token's 4 activations broadcast to its half; VNNI's dpbusd does a byte
// multiply, the sum of 4 and the accumulation in one instruction (AVX2 needs three). Q8_0's
// signed values go in as |w| with the activations' signs flipped where w < 0. The integer sums
// and the float formula are those of gemm32_avx2_nt, so the results are the same bits.
#define PAVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma,f16c")))
// GCC 12's AVX-512 intrinsics self-initialise their "undefined" operands (__Y = __Y), which its own
// uninitialized-use warnings then report once inlined; the values are never read.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

PAVX512 inline __m512i pair4(const int8_t* y0, const int8_t* y1) {
  int32_t v0, v1;
  std::memcpy(&v0, y0, 4);
  std::memcpy(&v1, y1, 4);
  return _mm512_mask_set1_epi32(_mm512_set1_epi32(v0), 0xFF00, v1);
}

PAVX512 inline __m512 pair_ps(float v0, float v1) {
  return _mm512_mask_mov_ps(_mm512_set1_ps(v0), 0xFF00, _mm512_set1_ps(v1));
}

PAVX512 inline __m512 bcast8_ps(const float* p) {
  return _mm512_castsi512_ps(_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
}

// NP pairs of tokens x 8 rows.
template <int NP, bool SIGNED>
PAVX512 void gemm32_avx512_np(const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int bias, bool mins,
                              float* out, int64_t os, int nrows) {
  __m512 acc[NP];
  for (int k = 0; k < NP; ++k) acc[k] = _mm512_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const Panel32& b = p[i];
    __m512i isum[NP];
    for (int k = 0; k < NP; ++k) isum[k] = _mm512_setzero_si512();
    for (int g = 0; g < 8; ++g) {
      const __m512i w = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.q + g * 32)));
      const __m512i wu = SIGNED ? _mm512_abs_epi8(w) : w;
      const __mmask64 neg = SIGNED ? _mm512_movepi8_mask(w) : 0;
      for (int k = 0; k < NP; ++k) {
        __m512i y = pair4(a[2 * k * as + i].qs + 4 * g, a[(2 * k + 1) * as + i].qs + 4 * g);
        if (SIGNED) y = _mm512_mask_sub_epi8(y, neg, _mm512_setzero_si512(), y);
        isum[k] = _mm512_dpbusd_epi32(isum[k], wu, y);
      }
    }
    const __m512 d = bcast8_ps(b.d);
    for (int k = 0; k < NP; ++k) {
      const BlockQ8& y0 = a[2 * k * as + i];
      const BlockQ8& y1 = a[(2 * k + 1) * as + i];
      if (bias)
        isum[k] = _mm512_sub_epi32(isum[k], _mm512_mask_set1_epi32(_mm512_set1_epi32(bias * y0.sum), 0xFF00, bias * y1.sum));
      acc[k] = _mm512_fmadd_ps(_mm512_mul_ps(d, pair_ps(y0.d, y1.d)), _mm512_cvtepi32_ps(isum[k]), acc[k]);
      if (mins)
        acc[k] = _mm512_fmadd_ps(bcast8_ps(b.m),
                                 pair_ps(y0.d * static_cast<float>(y0.sum), y1.d * static_cast<float>(y1.sum)), acc[k]);
    }
  }
  for (int k = 0; k < NP; ++k) {
    store_rows(out + 2 * k * os, _mm512_castps512_ps256(acc[k]), nrows);
    store_rows(out + (2 * k + 1) * os, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc[k]), 1)), nrows);
  }
}

template <bool SIGNED>
PAVX512 void gemm32_avx512(const Panel32* p, int64_t nb, const BlockQ8* a, int64_t as, int T, int bias, bool mins,
                           float* out, int64_t os, int nrows) {
  int t = 0;
  for (; t + 4 <= T; t += 4) gemm32_avx512_np<2, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows);
  if (t + 2 <= T) {
    gemm32_avx512_np<1, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows);
    t += 2;
  }
  if (t < T) gemm32_avx2_nt<1, SIGNED>(p, nb, a + t * as, as, bias, mins, out + t * os, os, nrows);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

// NT tokens x 8 rows of a K-quant super-block. Sub-group s (16 values) is four value groups,
// summed in 16 bits and widened by a multiply-add with the rows' scales; Q6_K's values reach 63,
// so only two of its products share 16 bits.
template <int NT, bool Q6>
PAVX2 void gemmk_avx2_nt(const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t as, float* out, int64_t os,
                         int nrows) {
  __m256 acc[NT];
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t i = 0; i < nb; ++i) {
    const PanelK& b = p[i];
    __m256i isum[NT];
    for (int t = 0; t < NT; ++t) isum[t] = _mm256_setzero_si256();
    for (int s = 0; s < 16; ++s) {
      __m256i w[4];
      for (int j = 0; j < 4; ++j) w[j] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.q + (4 * s + j) * 32));
      const __m256i sc = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.sc[s]));
      for (int t = 0; t < NT; ++t) {
        const int8_t* y = a[t * as + i].qs + 16 * s;
        const __m256i p01 = _mm256_add_epi16(_mm256_maddubs_epi16(w[0], bcast4(y)), _mm256_maddubs_epi16(w[1], bcast4(y + 4)));
        const __m256i p23 = _mm256_add_epi16(_mm256_maddubs_epi16(w[2], bcast4(y + 8)), _mm256_maddubs_epi16(w[3], bcast4(y + 12)));
        if constexpr (Q6) {
          isum[t] = _mm256_add_epi32(isum[t], _mm256_add_epi32(_mm256_madd_epi16(p01, sc), _mm256_madd_epi16(p23, sc)));
        } else {
          isum[t] = _mm256_add_epi32(isum[t], _mm256_madd_epi16(_mm256_add_epi16(p01, p23), sc));
        }
      }
    }
    const __m256 d = _mm256_loadu_ps(b.d), dmin = _mm256_loadu_ps(b.dmin);
    for (int t = 0; t < NT; ++t) {
      const BlockQ8K& y = a[t * as + i];
      __m256i msum = _mm256_setzero_si256();
      for (int q = 0; q < 8; ++q) {
        int32_t pair;
        std::memcpy(&pair, &y.bsums[2 * q], 4);
        msum = _mm256_add_epi32(msum, _mm256_madd_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.mn[q])),
                                                        _mm256_set1_epi32(pair)));
      }
      const __m256 da = _mm256_set1_ps(y.d);
      if constexpr (Q6) {
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(_mm256_sub_epi32(isum[t], msum)), acc[t]);
      } else {
        acc[t] = _mm256_fmadd_ps(_mm256_mul_ps(d, da), _mm256_cvtepi32_ps(isum[t]), acc[t]);
        acc[t] = _mm256_fnmadd_ps(_mm256_mul_ps(dmin, da), _mm256_cvtepi32_ps(msum), acc[t]);
      }
    }
  }
  for (int t = 0; t < NT; ++t) store_rows(out + t * os, acc[t], nrows);
}

template <bool Q6>
PAVX2 void gemmk_avx2(const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t as, int T, float* out, int64_t os,
                      int nrows) {
  int t = 0;
  for (; t + 4 <= T; t += 4) gemmk_avx2_nt<4, Q6>(p, nb, a + t * as, as, out + t * os, os, nrows);
  switch (T - t) {
    case 3: gemmk_avx2_nt<3, Q6>(p, nb, a + t * as, as, out + t * os, os, nrows); break;
    case 2: gemmk_avx2_nt<2, Q6>(p, nb, a + t * as, as, out + t * os, os, nrows); break;
    case 1: gemmk_avx2_nt<1, Q6>(p, nb, a + t * as, as, out + t * os, os, nrows); break;
    default: break;
  }
}
#endif


}  // namespace

void pack_panel32(TensorType t, const uint8_t* rows, size_t row_bytes, int nrows, int64_t nb, Panel32* out) {
#ifdef MARKBASE_X86
  if (simd_avx2()) return pack32_avx2(t, rows, row_bytes, nrows, nb, out);
#endif
  for (int64_t i = 0; i < nb; ++i) {
    Panel32& p = out[i];
    for (int r = 0; r < kPanelRows; ++r) {
      uint8_t v[32];
      if (r < nrows) {
        unpack32_scales(t, rows + r * row_bytes, i, &p.d[r], &p.m[r]);
        unpack32_values(t, rows + r * row_bytes, i, v);
      } else {
        std::memset(v, 0, sizeof(v));
        p.d[r] = p.m[r] = 0.0f;
      }
      for (int g = 0; g < 8; ++g) std::memcpy(&p.q[g * 32 + r * 4], v + 4 * g, 4);
    }
  }
}

void pack_panelk(TensorType t, const uint8_t* rows, size_t row_bytes, int nrows, int64_t nb, PanelK* out) {
  thread_local std::vector<UnpackedK> u;
  if (static_cast<int64_t>(u.size()) < kPanelRows * nb) u.resize(kPanelRows * nb);
  const bool q6 = t == TensorType::Q6_K;
  for (int r = 0; r < kPanelRows; ++r) {
    UnpackedK* ur = &u[r * nb];
    if (r < nrows) {
      unpack_k_row(t, rows + r * row_bytes, ur, nb);
      if (q6)  // unsigned values: q + 32, and the offset as a min of 32 * scale
        for (int64_t i = 0; i < nb; ++i) {
          for (int c = 0; c < 256; ++c) ur[i].q[c] = static_cast<int8_t>(ur[i].q[c] + 32);
          for (int s = 0; s < 16; ++s) ur[i].min[s] = static_cast<int16_t>(32 * ur[i].scale[s]);
          ur[i].dmin = ur[i].d;
        }
    } else {
      std::memset(static_cast<void*>(ur), 0, nb * sizeof(UnpackedK));
    }
  }
  for (int64_t i = 0; i < nb; ++i) {
    PanelK& p = out[i];
    for (int r = 0; r < kPanelRows; ++r) {
      const UnpackedK& k = u[r * nb + i];
      for (int s = 0; s < 16; ++s) {
        p.sc[s][r][0] = p.sc[s][r][1] = k.scale[s];
        p.mn[s / 2][r][s % 2] = k.min[s];
      }
      p.d[r] = k.d;
      p.dmin[r] = k.dmin;
    }
#ifdef MARKBASE_X86
    if (simd_avx2()) {
      interleave_k_avx2(&u[i], nb, p.q);
      continue;
    }
#endif
    for (int r = 0; r < kPanelRows; ++r)
      for (int g = 0; g < 64; ++g) std::memcpy(&p.q[g * 32 + r * 4], u[r * nb + i].q + 4 * g, 4);
  }
}

void gemm_panel32(TensorType t, const Panel32* p, int64_t nb, const BlockQ8* a, int64_t a_stride, int T,
                  float* out, int64_t out_stride, int nrows) {
#ifdef MARKBASE_X86
  if (simd_avx2()) {
    const Kind32 k = kind32(t);
    const bool mins = t == TensorType::Q4_1 || t == TensorType::Q5_1;
    if (simd_avx512()) {
      if (k.is_signed) gemm32_avx512<true>(p, nb, a, a_stride, T, 0, false, out, out_stride, nrows);
      else gemm32_avx512<false>(p, nb, a, a_stride, T, k.bias, mins, out, out_stride, nrows);
    } else if (k.is_signed) {
      gemm32_avx2<true>(p, nb, a, a_stride, T, 0, false, out, out_stride, nrows);
    } else {
      gemm32_avx2<false>(p, nb, a, a_stride, T, k.bias, mins, out, out_stride, nrows);
    }
    return;
  }
#elif defined(__aarch64__)
  if (simd_neon()) {
    const bool mins = t == TensorType::Q4_1 || t == TensorType::Q5_1;
    return neon::gemm_panel32(p, nb, a, a_stride, T, kind32(t).bias, mins, out, out_stride, nrows);
  }
#endif
  gemm32_portable(t, p, nb, a, a_stride, T, out, out_stride, nrows);
}

void gemm_panelk(TensorType t, const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t a_stride, int T,
                 float* out, int64_t out_stride, int nrows) {
#ifdef MARKBASE_X86
  if (simd_avx2()) {
    if (t == TensorType::Q6_K) gemmk_avx2<true>(p, nb, a, a_stride, T, out, out_stride, nrows);
    else gemmk_avx2<false>(p, nb, a, a_stride, T, out, out_stride, nrows);
    return;
  }
#elif defined(__aarch64__)
  if (simd_neon()) return neon::gemm_panelk(t == TensorType::Q6_K, p, nb, a, a_stride, T, out, out_stride, nrows);
#endif
  gemmk_portable(t, p, nb, a, a_stride, T, out, out_stride, nrows);
}

}  // namespace markbase::cpu
