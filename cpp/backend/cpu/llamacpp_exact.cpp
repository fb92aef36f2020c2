#include "backend/cpu/llamacpp_exact.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <type_traits>
#include <vector>

#include "backend/cpu/kquant_dot.h"
#include "backend/cpu/quant_dot.h"
#include "formats/half.h"
#include "formats/tensor_types.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <cpuid.h>
#include <immintrin.h>
#define MARKBASE_LLX 1
#endif

namespace markbase::cpu::llx {

#ifdef MARKBASE_LLX
#define LX __attribute__((target("avx2,fma,f16c")))

bool available() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  const bool f16c = __get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C);
  return f16c && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool matmul_supported(TensorType t) {
  return t == TensorType::Q8_0 || t == TensorType::Q5_0 || t == TensorType::Q4_0 || t == TensorType::Q4_K ||
         t == TensorType::Q6_K || t == TensorType::F16 || t == TensorType::F32;
}

namespace {

// ggml's hsum_float_8 and tinyBLAS's hsum: (l0+l4 + l2+l6) + (l1+l5 + l3+l7).
LX inline float hsum8(__m256 x) {
  __m128 r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
  r = _mm_add_ps(r, _mm_movehl_ps(r, r));
  r = _mm_add_ss(r, _mm_movehdup_ps(r));
  return _mm_cvtss_f32(r);
}

// GGML_F32x8_REDUCE of vec_dot_f16's four accumulators (a different grouping: hadd pairs).
LX inline float reduce4(__m256 s0, __m256 s1, __m256 s2, __m256 s3) {
  s0 = _mm256_add_ps(s0, s2);
  s1 = _mm256_add_ps(s1, s3);
  s0 = _mm256_add_ps(s0, s1);
  const __m128 t0 = _mm_add_ps(_mm256_castps256_ps128(s0), _mm256_extractf128_ps(s0, 1));
  const __m128 t1 = _mm_hadd_ps(t0, t0);
  return _mm_cvtss_f32(_mm_hadd_ps(t1, t1));
}

LX inline float fmaf_(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

LX inline int hsum_i32(__m256i v) {
  __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
  s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
  return _mm_cvtsi128_si32(s);
}

// ---- 32-value blocks (Q8_0, Q5_0, Q4_0) against Q8_0 activations: per block one float scale
// product and 8 lanes of 4-value integer sums, accumulated by FMA, then hsum8 (ggml's vec_dot and
// tinyBLAS_Q0_AVX compute the same per output).

struct RowQ0 {
  std::vector<int8_t> q;  // nb * 32 signed values
  std::vector<float> d;   // nb scales
};

void unpack_q0(TensorType t, const uint8_t* row, int64_t nb, RowQ0& r) {
  r.q.resize(nb * 32);
  r.d.resize(nb);
  for (int64_t i = 0; i < nb; ++i) {
    int8_t* o = &r.q[i * 32];
    if (t == TensorType::Q8_0) {
      const auto& b = reinterpret_cast<const block_q8_0*>(row)[i];
      r.d[i] = fp16_to_fp32(b.d);
      std::memcpy(o, b.qs, 32);
    } else if (t == TensorType::Q5_0) {
      const auto& b = reinterpret_cast<const block_q5_0*>(row)[i];
      r.d[i] = fp16_to_fp32(b.d);
      uint32_t qh;
      std::memcpy(&qh, b.qh, 4);
      for (int j = 0; j < 16; ++j) {
        o[j] = static_cast<int8_t>(((b.qs[j] & 0x0F) | (((qh >> j) & 1) << 4)) - 16);
        o[j + 16] = static_cast<int8_t>(((b.qs[j] >> 4) | (((qh >> (j + 16)) & 1) << 4)) - 16);
      }
    } else {  // Q4_0
      const auto& b = reinterpret_cast<const block_q4_0*>(row)[i];
      r.d[i] = fp16_to_fp32(b.d);
      for (int j = 0; j < 16; ++j) {
        o[j] = static_cast<int8_t>((b.qs[j] & 0x0F) - 8);
        o[j + 16] = static_cast<int8_t>((b.qs[j] >> 4) - 8);
      }
    }
  }
}

LX float dot_q0(const RowQ0& w, const BlockQ8* a, int64_t nb) {
  __m256 acc = _mm256_setzero_ps();
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w.q[i * 32]));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    const __m256 q = _mm256_cvtepi32_ps(_mm256_madd_epi16(ones, p));
    acc = _mm256_fmadd_ps(_mm256_set1_ps(w.d[i] * a[i].d), q, acc);
  }
  return hsum8(acc);
}

// Q4_0 in llama.cpp's repacked layout (AVX2, weights with a multiple of 8 rows): the gemm and
// gemv kernels take each block's whole integer sum, one FMA per block on one accumulator.
LX float dot_q0_blocks(const RowQ0& w, const BlockQ8* a, int64_t nb) {
  float acc = 0.0f;
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t i = 0; i < nb; ++i) {
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(&w.q[i * 32]));
    const __m256i y = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].qs));
    const __m256i p = _mm256_maddubs_epi16(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x));
    acc = fmaf_(static_cast<float>(hsum_i32(_mm256_madd_epi16(ones, p))), w.d[i] * a[i].d, acc);
  }
  return acc;
}

// ---- K-quants against Q8_K activations (256-value super-blocks).

struct RowK {
  std::vector<uint8_t> q;  // nb * 256 unsigned values (Q4_K 0..15, Q6_K 0..63), element order
  std::vector<float> d, dmin;
  std::vector<int16_t> sc, mn;  // Q4_K: 8 scales and mins per super-block; Q6_K: 16 scales
};

void unpack_q4k(const uint8_t* row, int64_t nb, RowK& r) {
  r.q.resize(nb * 256);
  r.d.resize(nb);
  r.dmin.resize(nb);
  r.sc.resize(nb * 8);
  r.mn.resize(nb * 8);
  for (int64_t i = 0; i < nb; ++i) {
    const auto& b = reinterpret_cast<const block_q4_K*>(row)[i];
    r.d[i] = fp16_to_fp32(b.d);
    r.dmin[i] = fp16_to_fp32(b.dmin);
    const uint8_t* s = b.scales;
    for (int j = 0; j < 8; ++j) {
      int sc, m;
      if (j < 4) {
        sc = s[j] & 63;
        m = s[j + 4] & 63;
      } else {
        sc = (s[j + 4] & 0xF) | ((s[j - 4] >> 6) << 4);
        m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
      }
      r.sc[i * 8 + j] = static_cast<int16_t>(sc);
      r.mn[i * 8 + j] = static_cast<int16_t>(m);
    }
    uint8_t* o = &r.q[i * 256];
    for (int c = 0; c < 4; ++c)
      for (int l = 0; l < 32; ++l) {
        o[64 * c + l] = b.qs[32 * c + l] & 0x0F;
        o[64 * c + 32 + l] = b.qs[32 * c + l] >> 4;
      }
  }
}

void unpack_q6k(const uint8_t* row, int64_t nb, RowK& r) {
  r.q.resize(nb * 256);
  r.d.resize(nb);
  r.sc.resize(nb * 16);
  for (int64_t i = 0; i < nb; ++i) {
    const auto& b = reinterpret_cast<const block_q6_K*>(row)[i];
    r.d[i] = fp16_to_fp32(b.d);
    for (int j = 0; j < 16; ++j) r.sc[i * 16 + j] = b.scales[j];
    uint8_t* o = &r.q[i * 256];
    for (int n = 0; n < 2; ++n) {
      const uint8_t* ql = b.ql + 64 * n;
      const uint8_t* qh = b.qh + 32 * n;
      for (int l = 0; l < 32; ++l) {
        o[128 * n + l] = (ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4);
        o[128 * n + l + 32] = (ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4);
        o[128 * n + l + 64] = (ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4);
        o[128 * n + l + 96] = (ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4);
      }
    }
  }
}

// Sum over the 32 values of sub-block s of q * y (unsigned q < 64), as 8 lanes of 4 values each.
LX inline __m256i qy_lanes(const uint8_t* q, const int8_t* y, __m256i scale16) {
  const __m256i p = _mm256_maddubs_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)),
                                         _mm256_loadu_si256(reinterpret_cast<const __m256i*>(y)));
  return _mm256_madd_epi16(scale16, p);
}

// Q4_K, llama.cpp's repacked kernels: gemm (rows of a micro-batch in groups of 4) accumulates
// one FMA per 64-value pair of sub-blocks, gemv (the other rows and decode) one per super-block;
// the mins go into their own accumulator, subtracted at the end.
LX float dot_q4k(const RowK& w, const BlockQ8K* a, int64_t nb, bool gemm) {
  float acc = 0.0f, accm = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = &w.q[i * 256];
    const int8_t* y = a[i].qs;
    const int16_t* sc = &w.sc[i * 8];
    const int16_t* mn = &w.mn[i * 8];
    const int16_t* bs = a[i].bsums;
    const float dd = w.d[i] * a[i].d, dm = w.dmin[i] * a[i].d;
    int isum_all = 0, imin_all = 0;
    for (int sb = 0; sb < 4; ++sb) {
      const __m256i v = _mm256_add_epi32(qy_lanes(q + 64 * sb, y + 64 * sb, _mm256_set1_epi16(sc[2 * sb])),
                                         qy_lanes(q + 64 * sb + 32, y + 64 * sb + 32, _mm256_set1_epi16(sc[2 * sb + 1])));
      const int isum = hsum_i32(v);
      const int imin = mn[2 * sb] * (bs[4 * sb] + bs[4 * sb + 1]) + mn[2 * sb + 1] * (bs[4 * sb + 2] + bs[4 * sb + 3]);
      if (gemm) {
        acc = fmaf_(static_cast<float>(isum), dd, acc);
        accm = fmaf_(static_cast<float>(imin), dm, accm);
      } else {
        isum_all += isum;
        imin_all += imin;
      }
    }
    if (!gemm) {
      acc = fmaf_(static_cast<float>(isum_all), dd, acc);
      accm = fmaf_(static_cast<float>(imin_all), dm, accm);
    }
  }
  return acc - accm;
}

// Q6_K. vec_dot (micro-batches of fewer than 8 rows, decode): 8 lanes of scaled 4-value sums
// less 32 * (scale . bsums) per lane pair, one FMA per super-block, hsum8. The tiled kernel
// (8 rows or more): the whole super-block's integer sum, (d * sum) then one FMA with the
// activation scale.
LX float dot_q6k(const RowK& w, const BlockQ8K* a, int64_t nb, bool tiled) {
  __m256 acc = _mm256_setzero_ps();
  float acc1 = 0.0f;
  for (int64_t i = 0; i < nb; ++i) {
    const uint8_t* q = &w.q[i * 256];
    const int8_t* y = a[i].qs;
    const int16_t* sc = &w.sc[i * 16];
    __m256i sumi = _mm256_setzero_si256();
    for (int v = 0; v < 8; ++v) {
      const __m256i s16 = _mm256_setr_epi16(sc[2 * v], sc[2 * v], sc[2 * v], sc[2 * v], sc[2 * v], sc[2 * v],
                                            sc[2 * v], sc[2 * v], sc[2 * v + 1], sc[2 * v + 1], sc[2 * v + 1],
                                            sc[2 * v + 1], sc[2 * v + 1], sc[2 * v + 1], sc[2 * v + 1], sc[2 * v + 1]);
      sumi = _mm256_add_epi32(sumi, qy_lanes(q + 32 * v, y + 32 * v, s16));
    }
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a[i].bsums));
    const __m256i sc16 = _mm256_setr_epi16(sc[0], sc[1], sc[2], sc[3], sc[4], sc[5], sc[6], sc[7], sc[8], sc[9],
                                           sc[10], sc[11], sc[12], sc[13], sc[14], sc[15]);
    sumi = _mm256_sub_epi32(sumi, _mm256_slli_epi32(_mm256_madd_epi16(bsums, sc16), 5));
    if (tiled) {
      acc1 = fmaf_(w.d[i] * static_cast<float>(hsum_i32(sumi)), a[i].d, acc1);
    } else {
      const float d = a[i].d * w.d[i];
      acc = _mm256_fmadd_ps(_mm256_set1_ps(d), _mm256_cvtepi32_ps(sumi), acc);
    }
  }
  return tiled ? acc1 : hsum8(acc);
}

LX inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
LX inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}

// Float rows against float activations: F32, or F16 with the activations rounded to float16
// (ggml's vec_dot_type for F16). tinyBLAS (one accumulator of 8 lanes, hsum8) when several tokens
// and row counts allow it, else ggml's vec_dot (four accumulators, reduce4); vec_dot_f32 adds
// the leftovers by fused multiply-add into a float, vec_dot_f16 in double.
template <class T>
LX float dot_float(const T* w, const T* x, int64_t K, bool tinyblas) {
  if (tinyblas) {
    __m256 acc = _mm256_setzero_ps();
    for (int64_t i = 0; i < K; i += 8) acc = _mm256_fmadd_ps(load8(w + i), load8(x + i), acc);
    return hsum8(acc);
  }
  const int64_t np = K & ~int64_t{31};
  __m256 s[4] = {_mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t i = 0; i < np; i += 32)
    for (int j = 0; j < 4; ++j) s[j] = _mm256_fmadd_ps(load8(w + i + 8 * j), load8(x + i + 8 * j), s[j]);
  if constexpr (std::is_same_v<T, float>) {
    float sum = reduce4(s[0], s[1], s[2], s[3]);
    for (int64_t i = np; i < K; ++i) sum = fmaf_(w[i], x[i], sum);
    return sum;
  } else {
    double sum = reduce4(s[0], s[1], s[2], s[3]);
    for (int64_t i = np; i < K; ++i) sum += static_cast<double>(fp16_to_fp32(w[i]) * fp16_to_fp32(x[i]));
    return static_cast<float>(sum);
  }
}

}  // namespace

void matmul(ThreadPool& pool, const TensorView& w, const float* a, int a_stride, int T, float* out,
            int out_stride, int N) {
  const int64_t K = w.cols();
  const size_t rb = w.row_stride();
  const TensorType ty = w.type;
  if (ty == TensorType::F32) {
    const bool tinyblas = T >= 2 && N % 4 == 0 && K % 8 == 0;  // llamafile_sgemm's conditions
    pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const float* row = reinterpret_cast<const float*>(w.data + n * rb);
        for (int t = 0; t < T; ++t) out[t * out_stride + n] = dot_float(row, a + t * a_stride, K, tinyblas);
      }
    });
    return;
  }
  if (ty == TensorType::F16) {
    std::vector<uint16_t> x(static_cast<size_t>(T) * K);
    for (int t = 0; t < T; ++t)
      for (int64_t k = 0; k < K; ++k) x[t * K + k] = fp32_to_fp16(a[t * a_stride + k]);
    const bool tinyblas = T >= 2 && N % 4 == 0 && K % 8 == 0;  // llamafile_sgemm's conditions
    pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        const uint16_t* row = reinterpret_cast<const uint16_t*>(w.data + n * rb);
        for (int t = 0; t < T; ++t) out[t * out_stride + n] = dot_float(row, &x[t * K], K, tinyblas);
      }
    });
    return;
  }
  if (ty == TensorType::Q4_K || ty == TensorType::Q6_K) {
    const int64_t nb = K / 256;
    std::vector<BlockQ8K> q(static_cast<size_t>(T) * nb);
    pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quantize_act_q8k(a + t * a_stride, &q[t * nb], K);
    });
    const int gemm_rows = T > 3 ? T - T % 4 : 0;  // Q4_K: the repacked gemm's rows
    pool.parallel_for(N, 8, [&](int64_t n0, int64_t n1) {
      thread_local RowK r;
      for (int64_t n = n0; n < n1; ++n) {
        if (ty == TensorType::Q4_K) unpack_q4k(w.data + n * rb, nb, r);
        else unpack_q6k(w.data + n * rb, nb, r);
        for (int t = 0; t < T; ++t)
          out[t * out_stride + n] = ty == TensorType::Q4_K ? dot_q4k(r, &q[t * nb], nb, t < gemm_rows)
                                                           : dot_q6k(r, &q[t * nb], nb, T >= 8);
      }
    });
    return;
  }
  const int64_t nb = K / 32;
  std::vector<BlockQ8> q(static_cast<size_t>(T) * nb);
  pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) quantize_act_q8(a + t * a_stride, &q[t * nb], K);
  });
  const bool repacked = ty == TensorType::Q4_0 && N % 8 == 0;  // llama.cpp's q4_0_8x8 kernels
  pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
    thread_local RowQ0 r;
    for (int64_t n = n0; n < n1; ++n) {
      unpack_q0(ty, w.data + n * rb, nb, r);
      for (int t = 0; t < T; ++t)
        out[t * out_stride + n] = repacked ? dot_q0_blocks(r, &q[t * nb], nb) : dot_q0(r, &q[t * nb], nb);
    }
  });
}

namespace {

// ggml_v_expf (AVX2 + FMA), ggml's vectorised exp used by its softmax.
LX inline __m256 v_expf(__m256 x) {
  const __m256 r = _mm256_set1_ps(0x1.8p23f);
  const __m256 z = _mm256_fmadd_ps(x, _mm256_set1_ps(0x1.715476p+0f), r);
  const __m256 n = _mm256_sub_ps(z, r);
  const __m256 b = _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.7f7d1cp-20f),
                                    _mm256_fnmadd_ps(n, _mm256_set1_ps(0x1.62e4p-1f), x));
  const __m256i e = _mm256_slli_epi32(_mm256_castps_si256(z), 23);
  const __m256 k = _mm256_castsi256_ps(_mm256_add_epi32(e, _mm256_castps_si256(_mm256_set1_ps(1))));
  const __m256i c = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(126), _CMP_GT_OQ));
  const __m256 u = _mm256_mul_ps(b, b);
  const __m256 j = _mm256_fmadd_ps(
      _mm256_fmadd_ps(_mm256_fmadd_ps(_mm256_set1_ps(0x1.0e4020p-7f), b, _mm256_set1_ps(0x1.573e2ep-5f)), u,
                      _mm256_fmadd_ps(_mm256_set1_ps(0x1.555e66p-3f), b, _mm256_set1_ps(0x1.fffdb6p-2f))),
      u, _mm256_mul_ps(_mm256_set1_ps(0x1.ffffecp-1f), b));
  if (!_mm256_movemask_ps(_mm256_castsi256_ps(c))) return _mm256_fmadd_ps(j, k, k);
  const __m256i g = _mm256_and_si256(_mm256_castps_si256(_mm256_cmp_ps(n, _mm256_setzero_ps(), _CMP_LE_OQ)),
                                     _mm256_set1_epi32(static_cast<int>(0x82000000u)));
  const __m256 s1 = _mm256_castsi256_ps(_mm256_add_epi32(g, _mm256_set1_epi32(0x7f000000)));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_sub_epi32(e, g));
  const __m256i d = _mm256_castps_si256(
      _mm256_cmp_ps(_mm256_andnot_ps(_mm256_set1_ps(-0.f), n), _mm256_set1_ps(192), _CMP_GT_OQ));
  return _mm256_or_ps(
      _mm256_and_ps(_mm256_castsi256_ps(d), _mm256_mul_ps(s1, s1)),
      _mm256_andnot_ps(_mm256_castsi256_ps(d),
                       _mm256_or_ps(_mm256_and_ps(_mm256_castsi256_ps(c), _mm256_mul_ps(_mm256_fmadd_ps(s2, j, s2), s1)),
                                    _mm256_andnot_ps(_mm256_castsi256_ps(c), _mm256_fmadd_ps(k, j, k)))));
}


LX void attention_one(const AttentionArgs& a, int t, int h, std::vector<float>& sc, std::vector<uint16_t>& q16,
                      std::vector<uint16_t>& p16, std::vector<float>& acc) {
  const int d = a.d, G = a.heads / a.kv_heads, kvh = h / G, pos = a.pos0 + t;
  const bool vec = a.T == 1;  // llama.cpp's single-token matrix products take vec_dot_f16
  const int lo = a.window > 0 ? std::max(0, pos - a.window + 1) : 0;
  const uint16_t* K = static_cast<const uint16_t*>(a.k) + static_cast<size_t>(kvh) * a.capacity * d;
  const uint16_t* V = static_cast<const uint16_t*>(a.v) + static_cast<size_t>(kvh) * a.capacity * d;
  auto row = [&](const uint16_t* base, int p) { return base + static_cast<size_t>(a.ring ? p % a.capacity : p) * d; };
  const float* q = a.q + static_cast<size_t>(t) * a.q_stride + static_cast<size_t>(h) * d;
  q16.resize(d);
  for (int j = 0; j < d; ++j) q16[j] = fp32_to_fp16(q[j] * a.scale);
  // Scores and the softmax over positions in blocks of 8 counted from position 0 (llama.cpp's
  // cache cells are positions); positions outside [lo, pos] are -inf and weigh exactly 0.
  const int b0 = lo & ~31, n = pos + 1 - b0;
  const int nblk = (n + 7) / 8 * 8;
  sc.assign(nblk, -std::numeric_limits<float>::infinity());
  float mx = -std::numeric_limits<float>::infinity();
  for (int p = lo; p <= pos; ++p) {
    const float s = dot_float(row(K, p), q16.data(), d, !vec);  // K rows are the product's first operand
    sc[p - b0] = s;
    mx = std::max(mx, s);
  }
  double sum = 0.0;
  for (int i = 0; i < nblk; i += 8) {
    const __m256 e = v_expf(_mm256_sub_ps(_mm256_loadu_ps(&sc[i]), _mm256_set1_ps(mx)));
    _mm256_storeu_ps(&sc[i], e);
    sum += static_cast<double>(hsum8(e));
  }
  const float inv = static_cast<float>(1.0 / sum);
  p16.assign(nblk, 0);
  for (int i = 0; i < nblk; ++i) p16[i] = fp32_to_fp16(sc[i] * inv);
  // out[j] = sum_p p16[p] * V[p][j]: lane p % 8 (tinyBLAS) or accumulator (p / 8) % 4 and lane
  // p % 8 (vec_dot_f16); acc holds [accumulator][lane][j].
  const int nacc = vec ? 4 : 1;
  acc.assign(static_cast<size_t>(nacc) * 8 * d, 0.0f);
  for (int p = lo; p <= pos; ++p) {
    const int r = p - b0, l = r & 7, ai = vec ? (r >> 3) & 3 : 0;
    const __m256 w = _mm256_set1_ps(fp16_to_fp32(p16[r]));
    const uint16_t* v = row(V, p);
    float* ac = &acc[(static_cast<size_t>(ai) * 8 + l) * d];
    for (int j = 0; j < d; j += 8)
      _mm256_storeu_ps(ac + j, _mm256_fmadd_ps(load8(v + j), w, _mm256_loadu_ps(ac + j)));
  }
  float* o = a.out + static_cast<size_t>(t) * a.out_stride + static_cast<size_t>(h) * d;
  for (int j = 0; j < d; ++j) {
    if (!vec) {
      float l8[8];
      for (int l = 0; l < 8; ++l) l8[l] = acc[static_cast<size_t>(l) * d + j];
      o[j] = hsum8(_mm256_loadu_ps(l8));
    } else {
      __m256 s[4];
      for (int ai = 0; ai < 4; ++ai) {
        float l8[8];
        for (int l = 0; l < 8; ++l) l8[l] = acc[(static_cast<size_t>(ai) * 8 + l) * d + j];
        s[ai] = _mm256_loadu_ps(l8);
      }
      o[j] = reduce4(s[0], s[1], s[2], s[3]);
    }
  }
}

}  // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
  if (!a.f16 || a.d % 32) throw std::logic_error("llama.cpp-exact attention needs float16 caches and d % 32 == 0");
  pool.parallel_for(static_cast<int64_t>(a.T) * a.heads, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> sc, acc;
    thread_local std::vector<uint16_t> q16, p16;
    for (int64_t i = i0; i < i1; ++i)
      attention_one(a, static_cast<int>(i / a.heads), static_cast<int>(i % a.heads), sc, q16, p16, acc);
  });
}

namespace {
// GELU (tanh form) as ggml's table: the float formula as compiled with FMA contraction
// (1 + A x^2 as fma(A x, x, 1)), rounded to float16.
LX const std::vector<uint16_t>& gelu_table() {
  static const std::vector<uint16_t> t = [] {
    std::vector<uint16_t> v(65536);
    const float A = 0.044715f, S = 0.79788456080286535587989211986876f;
    for (int i = 0; i < 65536; ++i) {
      const float x = fp16_to_fp32(static_cast<uint16_t>(i));
      const float inner = S * x * fmaf_(A * x, x, 1.0f);
      v[i] = fp32_to_fp16(0.5f * x * (1.0f + tanhf(inner)));
    }
    return v;
  }();
  return t;
}
}  // namespace

void geglu(const float* x, const float* g, float* y, int n) {
  const std::vector<uint16_t>& tab = gelu_table();
  for (int i = 0; i < n; ++i) {
    if (x[i] <= -10.0f) y[i] = 0.0f;
    else if (x[i] >= 10.0f) y[i] = x[i] * g[i];
    else y[i] = fp16_to_fp32(tab[fp32_to_fp16(x[i])]) * g[i];
  }
}

LX void rope(const float* x, float* y, int heads, int d, int pos, float theta_scale, float freq_scale,
             const float* factors) {
  const int half = d / 2;
  float cs[512], sn[512];
  if (half > 512) throw std::logic_error("llama.cpp-exact RoPE: head dim over 1024");
  float theta = static_cast<float>(pos);
  for (int i = 0; i < half; ++i) {
    const float ang = freq_scale * (factors ? theta / factors[i] : theta);
    cs[i] = cosf(ang);
    sn[i] = sinf(ang);
    theta *= theta_scale;
  }
  for (int h = 0; h < heads; ++h) {
    const float* xs = x + h * d;
    float* ys = y + h * d;
    for (int i = 0; i < half; ++i) {
      const float x0 = xs[i], x1 = xs[i + half];
      ys[i] = fmaf_(x0, cs[i], -(x1 * sn[i]));
      ys[i + half] = fmaf_(x0, sn[i], x1 * cs[i]);
    }
  }
}

namespace {
// ggml_soft_max over one row without mask or scale: blocks of 8 from index 0 through v_expf,
// their sums added in double, then every value times (float)(1 / sum).
LX void softmax_row(const float* x, float* y, int n) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int i = 0; i < n; ++i) mx = std::max(mx, x[i]);
  double sum = 0.0;
  int i = 0;
  for (; i + 7 < n; i += 8) {
    const __m256 e = v_expf(_mm256_sub_ps(_mm256_loadu_ps(x + i), _mm256_set1_ps(mx)));
    _mm256_storeu_ps(y + i, e);
    sum += static_cast<double>(hsum8(e));
  }
  for (; i < n; ++i) {
    y[i] = expf(x[i] - mx);
    sum += static_cast<double>(y[i]);
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int j = 0; j < n; ++j) y[j] *= inv;
}
}  // namespace

void moe_route(const float* logits, int n_experts, int k, float* route) {
  std::vector<float> p(n_experts);
  softmax_row(logits, p.data(), n_experts);
  std::vector<int> idx(n_experts);
  for (int e = 0; e < n_experts; ++e) idx[e] = e;
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return p[a] > p[b]; });
  double s = 0.0;  // ggml_sum_rows
  for (int j = 0; j < k; ++j) s += static_cast<double>(p[idx[j]]);
  const float sum = std::max(static_cast<float>(s), 6.103515625e-5f);  // ggml_clamp
  for (int j = 0; j < k; ++j) {
    route[2 * j] = p[idx[j]] / sum;
    route[2 * j + 1] = static_cast<float>(idx[j]);
  }
}

bool moe_supported(TensorType gate_up, TensorType down) {
  auto ok = [](TensorType t) { return t == TensorType::Q8_0 || t == TensorType::Q5_0 || t == TensorType::Q4_0; };
  return ok(gate_up) && ok(down);
}

namespace {
// One expert matrix (rows x K of type t at base) against one quantized activation row, as
// llama.cpp's mul_mat_id: the repacked Q4_0 gemv (rows % 8 == 0), else vec_dot.
void expert_product(TensorType t, const uint8_t* base, size_t rb, int rows, int64_t K, const BlockQ8* q, float* y,
                    RowQ0& r) {
  const int64_t nb = K / 32;
  const bool repacked = t == TensorType::Q4_0 && rows % 8 == 0;
  for (int n = 0; n < rows; ++n) {
    unpack_q0(t, base + n * rb, nb, r);
    y[n] = repacked ? dot_q0_blocks(r, q, nb) : dot_q0(r, q, nb);
  }
}
}  // namespace

void moe_experts(ThreadPool& pool, const TensorView& gate_up, const TensorView& down, int ffn, const float* x,
                 int x_stride, const float* route, int route_stride, int k, const float* scale, int T,
                 float* out, int out_stride, int H) {
  const int E = static_cast<int>(gate_up.shape[0]);
  if (H % 32 || ffn % 32) throw std::logic_error("llama.cpp-exact experts need widths in whole 32-blocks");
  const size_t gu_rb = gate_up.row_stride(), dn_rb = down.row_stride();
  pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
    thread_local RowQ0 r;
    thread_local std::vector<BlockQ8> qx, qh;
    thread_local std::vector<float> gu, h, d;
    qx.resize(H / 32);
    qh.resize(ffn / 32);
    gu.resize(2 * static_cast<size_t>(ffn));
    h.resize(ffn);
    d.resize(H);
    for (int64_t t = t0; t < t1; ++t) {
      quantize_act_q8(x + t * x_stride, qx.data(), H);
      float* o = out + t * out_stride;
      for (int j = 0; j < k; ++j) {
        const float w = route[t * route_stride + 2 * j];
        const int e = static_cast<int>(route[t * route_stride + 2 * j + 1]);
        if (e < 0 || e >= E) throw std::logic_error("expert id out of range");
        expert_product(gate_up.type, gate_up.data + static_cast<size_t>(e) * 2 * ffn * gu_rb, gu_rb, 2 * ffn, H,
                       qx.data(), gu.data(), r);
        geglu(gu.data(), gu.data() + ffn, h.data(), ffn);
        quantize_act_q8(h.data(), qh.data(), ffn);
        expert_product(down.type, down.data + static_cast<size_t>(e) * H * dn_rb, dn_rb, H, ffn, qh.data(), d.data(), r);
        for (int c = 0; c < H; ++c) {
          float v = d[c];
          if (scale) v = v * scale[e];
          v = v * w;
          o[c] = j == 0 ? v : o[c] + v;
        }
      }
    }
  });
}

#else  // not x86-64

bool available() { return false; }
bool matmul_supported(TensorType) { return false; }
void matmul(ThreadPool&, const TensorView&, const float*, int, int, float*, int, int) {
  throw std::logic_error("llama.cpp-exact kernels need x86-64 with AVX2");
}
void attention(ThreadPool&, const AttentionArgs&) { throw std::logic_error("llama.cpp-exact kernels need AVX2"); }
void geglu(const float*, const float*, float*, int) { throw std::logic_error("llama.cpp-exact kernels need AVX2"); }
void moe_route(const float*, int, int, float*) { throw std::logic_error("llama.cpp-exact kernels need AVX2"); }
bool moe_supported(TensorType, TensorType) { return false; }
void moe_experts(ThreadPool&, const TensorView&, const TensorView&, int, const float*, int, const float*, int, int,
                 const float*, int, float*, int, int) {
  throw std::logic_error("llama.cpp-exact kernels need AVX2");
}
void rope(const float*, float*, int, int, int, float, float, const float*) {
  throw std::logic_error("llama.cpp-exact kernels need AVX2");
}

#endif

}  // namespace markbase::cpu::llx
