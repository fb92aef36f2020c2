#include "backend/cpu/attention.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "formats/half.h"

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define MARKBASE_X86 1
#endif

namespace markbase::cpu {
namespace {

constexpr int kTileTokens = 8;  // consecutive query tokens of a tile
constexpr int kQ = 4;           // queries that share every key and value load

inline float to_f32(uint16_t h) { return fp16_to_fp32(h); }
inline float to_f32(float f) { return f; }

// s[i * ss + j] = q[i] . k[j] for i < mq, j < n.
template <class KT>
void qk_portable(const float* const* q, int mq, const KT* const* k, int n, int d, float* s, int ss) {
  for (int i = 0; i < mq; ++i)
    for (int j = 0; j < n; ++j) {
      float acc = 0.0f;
      for (int c = 0; c < d; ++c) acc += q[i][c] * to_f32(k[j][c]);
      s[i * ss + j] = acc;
    }
}

// y[i] = sum_j p[i * ps + j] * v[j] for i < mq.
template <class KT>
void pv_portable(const float* p, int ps, int mq, const KT* const* v, int n, int d, float* const* y) {
  for (int i = 0; i < mq; ++i) {
    std::fill(y[i], y[i] + d, 0.0f);
    for (int j = 0; j < n; ++j) {
      const float w = p[i * ps + j];
      if (w == 0.0f) continue;
      for (int c = 0; c < d; ++c) y[i][c] += w * to_f32(v[j][c]);
    }
  }
}

#ifdef MARKBASE_X86
#define AAVX2 __attribute__((target("avx2,fma,f16c")))

AAVX2 inline __m256 load8(const uint16_t* p) {
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
}
AAVX2 inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

AAVX2 inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  lo = _mm_add_ps(lo, _mm_movehl_ps(lo, lo));
  lo = _mm_add_ss(lo, _mm_movehdup_ps(lo));
  return _mm_cvtss_f32(lo);
}

// MQ queries x NK keys, d a multiple of 8: each key chunk is loaded (and widened) once for MQ
// queries.
template <int MQ, int NK, class KT>
AAVX2 void qk_block(const float* const* q, const KT* const* k, int d, float* s, int ss) {
  __m256 acc[MQ][NK];
  for (int i = 0; i < MQ; ++i)
    for (int j = 0; j < NK; ++j) acc[i][j] = _mm256_setzero_ps();
  for (int c = 0; c < d; c += 8) {
    __m256 kv[NK];
    for (int j = 0; j < NK; ++j) kv[j] = load8(k[j] + c);
    for (int i = 0; i < MQ; ++i) {
      const __m256 qv = _mm256_loadu_ps(q[i] + c);
      for (int j = 0; j < NK; ++j) acc[i][j] = _mm256_fmadd_ps(qv, kv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MQ; ++i)
    for (int j = 0; j < NK; ++j) s[i * ss + j] = hsum(acc[i][j]);
}

template <int MQ, class KT>
AAVX2 void qk_rows(const float* const* q, const KT* const* k, int n, int d, float* s, int ss) {
  int j = 0;
  for (; j + 2 <= n; j += 2) qk_block<MQ, 2>(q, k + j, d, s + j, ss);
  if (j < n) qk_block<MQ, 1>(q, k + j, d, s + j, ss);
}

template <class KT>
AAVX2 void qk_avx2(const float* const* q, int mq, const KT* const* k, int n, int d, float* s, int ss) {
  switch (mq) {
    case 4: return qk_rows<4>(q, k, n, d, s, ss);
    case 3: return qk_rows<3>(q, k, n, d, s, ss);
    case 2: return qk_rows<2>(q, k, n, d, s, ss);
    default: return qk_rows<1>(q, k, n, d, s, ss);
  }
}

// MQ queries x 16 output values per pass over the keys, d a multiple of 16: each value chunk is
// loaded once for MQ queries and the outputs stay in registers across all keys.
template <int MQ, class KT>
AAVX2 void pv_rows(const float* p, int ps, const KT* const* v, int n, int d, float* const* y) {
  for (int c = 0; c < d; c += 16) {
    __m256 acc[MQ][2];
    for (int i = 0; i < MQ; ++i) acc[i][0] = acc[i][1] = _mm256_setzero_ps();
    for (int j = 0; j < n; ++j) {
      const __m256 v0 = load8(v[j] + c), v1 = load8(v[j] + c + 8);
      for (int i = 0; i < MQ; ++i) {
        const __m256 w = _mm256_broadcast_ss(p + i * ps + j);
        acc[i][0] = _mm256_fmadd_ps(w, v0, acc[i][0]);
        acc[i][1] = _mm256_fmadd_ps(w, v1, acc[i][1]);
      }
    }
    for (int i = 0; i < MQ; ++i) {
      _mm256_storeu_ps(y[i] + c, acc[i][0]);
      _mm256_storeu_ps(y[i] + c + 8, acc[i][1]);
    }
  }
}

template <class KT>
AAVX2 void pv_avx2(const float* p, int ps, int mq, const KT* const* v, int n, int d, float* const* y) {
  switch (mq) {
    case 4: return pv_rows<4>(p, ps, v, n, d, y);
    case 3: return pv_rows<3>(p, ps, v, n, d, y);
    case 2: return pv_rows<2>(p, ps, v, n, d, y);
    default: return pv_rows<1>(p, ps, v, n, d, y);
  }
}
#endif

template <class KT>
struct Kernels {
  void (*qk)(const float* const*, int, const KT* const*, int, int, float*, int) = qk_portable<KT>;
  void (*pv)(const float*, int, int, const KT* const*, int, int, float* const*) = pv_portable<KT>;
  explicit Kernels(int d) {
#ifdef MARKBASE_X86
    if (d % 16 == 0 && simd_avx2()) {
      qk = qk_avx2<KT>;
      pv = pv_avx2<KT>;
    }
#else
    (void)d;
#endif
  }
};

template <class KT>
void run(ThreadPool& pool, const AttentionArgs& a) {
  const Kernels<KT> kern(a.d);
  const int group = a.heads / a.kv_heads, tiles = (a.T + kTileTokens - 1) / kTileTokens;
  // Heads of a group per task: the whole group, unless that leaves threads idle (decode).
  int hb = group;
  while (hb > 1 && static_cast<int64_t>(a.kv_heads) * tiles * ((group + hb - 1) / hb) < 2 * pool.size()) hb = (hb + 1) / 2;
  const int hblocks = (group + hb - 1) / hb;
  const KT* kc = static_cast<const KT*>(a.k);
  const KT* vc = static_cast<const KT*>(a.v);
  auto first = [&](int pos) { return a.window > 0 ? std::max(0, pos - a.window + 1) : 0; };
  pool.parallel_for(static_cast<int64_t>(a.kv_heads) * hblocks * tiles, 1, [&](int64_t i0, int64_t i1) {
    thread_local std::vector<float> sc;
    thread_local std::vector<const KT*> kp, vp;
    for (int64_t task = i0; task < i1; ++task) {
      const int tile = static_cast<int>(task % tiles);
      const int hbi = static_cast<int>(task / tiles % hblocks);
      const int kvh = static_cast<int>(task / tiles / hblocks);
      const int t0 = tile * kTileTokens, t1 = std::min(a.T, t0 + kTileTokens);
      const int h0 = kvh * group + hbi * hb, h1 = std::min(kvh * group + group, h0 + hb);
      const int nh = h1 - h0, m = (t1 - t0) * nh;
      const int lo = first(a.pos0 + t0), hi = a.pos0 + t1 - 1, n = hi - lo + 1;
      kp.resize(n);
      vp.resize(n);
      const size_t head_off = static_cast<size_t>(kvh) * a.capacity * a.d;
      for (int j = 0; j < n; ++j) {
        const int slot = a.ring ? (lo + j) % a.capacity : lo + j;
        kp[j] = kc + head_off + static_cast<size_t>(slot) * a.d;
        vp[j] = vc + head_off + static_cast<size_t>(slot) * a.d;
      }
      sc.resize(static_cast<size_t>(m) * n);
      // Query i of the tile is token t0 + i / nh, head h0 + i % nh.
      for (int i = 0; i < m; i += kQ) {
        const int mq = std::min(kQ, m - i);
        const float* qr[kQ];
        for (int r = 0; r < mq; ++r)
          qr[r] = a.q + static_cast<size_t>(t0 + (i + r) / nh) * a.q_stride + (h0 + (i + r) % nh) * a.d;
        kern.qk(qr, mq, kp.data(), n, a.d, &sc[static_cast<size_t>(i) * n], n);
      }
      // Softmax over each query's own keys [first(pos), pos]; the tile's other keys weigh 0.
      for (int i = 0; i < m; ++i) {
        const int pos = a.pos0 + t0 + i / nh;
        const int j0 = first(pos) - lo, j1 = pos - lo + 1;
        float* s = &sc[static_cast<size_t>(i) * n];
        float mx = -std::numeric_limits<float>::infinity();
        for (int j = j0; j < j1; ++j) {
          s[j] *= a.scale;
          mx = std::max(mx, s[j]);
        }
        const float inv = 1.0f / exp_sub_sum(s + j0, j1 - j0, mx);
        std::fill(s, s + j0, 0.0f);
        for (int j = j0; j < j1; ++j) s[j] *= inv;
        std::fill(s + j1, s + n, 0.0f);
      }
      for (int i = 0; i < m; i += kQ) {
        const int mq = std::min(kQ, m - i);
        float* yr[kQ];
        for (int r = 0; r < mq; ++r)
          yr[r] = a.out + static_cast<size_t>(t0 + (i + r) / nh) * a.out_stride + (h0 + (i + r) % nh) * a.d;
        kern.pv(&sc[static_cast<size_t>(i) * n], n, mq, vp.data(), n, a.d, yr);
      }
    }
  });
}

}  // namespace

void attention(ThreadPool& pool, const AttentionArgs& a) {
  if (a.f16) run<uint16_t>(pool, a);
  else run<float>(pool, a);
}

}  // namespace markbase::cpu
