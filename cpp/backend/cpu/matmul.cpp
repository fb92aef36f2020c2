#include "backend/cpu/matmul.h"

#include <algorithm>

#include "backend/cpu/kernels.h"
#include "formats/quants.h"

namespace markbase::cpu {
namespace {

constexpr int64_t kRowTile = 16;  // weight rows of a prefill tile

// Tokens per prefill tile: as many (in fours) as keep ~16 KiB of quantized activations in L1.
int token_tile(int64_t bytes_per_token) {
  const int64_t t = 16384 / std::max<int64_t>(bytes_per_token, 1);
  return static_cast<int>(std::max<int64_t>(4, t / 4 * 4));
}

}  // namespace

// out[t, n] = dot(a[t], W[n]) for n in [0, N), t in [0, T). The fast path quantizes the
// activations to 8-bit blocks once and uses integer dot products for the 32-block types; the
// precise path (and every other type) dequantizes one weight row at a time into floats.
void matmul(ThreadPool& pool, MatmulScratch& scratch, const TensorView& w, const float* a,
          int a_stride, int T, float* out, int out_stride, int N, bool precise) {
  const int64_t K = w.cols();
  const size_t rb = w.row_stride();
  const uint8_t* base = w.data;
  if (!precise && has_q8_dot(w.type)) {
    const int64_t nb = K / 32;
    scratch.q8.resize(static_cast<size_t>(T) * nb);
    pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quantize_act_q8(a + t * a_stride, &scratch.q8[t * nb], K);
    });
    const BlockQ8* q = scratch.q8.data();
    pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1) {
      float r[4];
      if (T == 1) {  // decode: four weight rows per pass over the activation row
        int64_t n = n0;
        for (; n + 4 <= n1; n += 4) {
          dot_q8_rows4(w.type, base + n * rb, rb, q, nb, r);
          for (int j = 0; j < 4; ++j) out[n + j] = r[j];
        }
        for (; n < n1; ++n) out[n] = dot_q8(w.type, base + n * rb, q, nb);
        return;
      }
      // Prefill: tiles of kRowTile weight rows x tt tokens, so that the tile's activations stay
      // in L1 while the rows pass over them (row by row over all T tokens, every row streamed the
      // whole activation matrix from L2/L3: about a byte per multiply-add).
      const int tt = token_tile(nb * static_cast<int64_t>(sizeof(BlockQ8)));
      for (int64_t r0 = n0; r0 < n1; r0 += kRowTile) {
        const int64_t r1 = std::min(n1, r0 + kRowTile);
        for (int t0 = 0; t0 < T; t0 += tt) {
          const int t1 = std::min(T, t0 + tt);
          for (int64_t n = r0; n < r1; ++n) {
            int t = t0;
            for (; t + 4 <= t1; t += 4) {
              dot_q8_x4(w.type, base + n * rb, q + t * nb, nb, nb, r);
              for (int j = 0; j < 4; ++j) out[(t + j) * out_stride + n] = r[j];
            }
            for (; t < t1; ++t) out[t * out_stride + n] = dot_q8(w.type, base + n * rb, q + t * nb, nb);
          }
        }
      }
    });
    return;
  }
  if (!precise && has_q8k_dot(w.type)) {
    const int64_t nb = K / 256;
    scratch.q8k.resize(static_cast<size_t>(T) * nb);
    pool.parallel_for(T, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) quantize_act_q8k(a + t * a_stride, &scratch.q8k[t * nb], K);
    });
    const BlockQ8K* q = scratch.q8k.data();
    pool.parallel_for(N, 4, [&](int64_t n0, int64_t n1) {
      // As above: a few unpacked rows against token tiles that stay in L1.
      thread_local std::vector<UnpackedK> rows;
      const int tt = token_tile(nb * static_cast<int64_t>(sizeof(BlockQ8K)));
      float r[4];
      for (int64_t r0 = n0; r0 < n1; r0 += kRowTile) {
        const int64_t r1 = std::min(n1, r0 + kRowTile);
        if (static_cast<int64_t>(rows.size()) < (r1 - r0) * nb) rows.resize((r1 - r0) * nb);
        for (int64_t n = r0; n < r1; ++n) unpack_k_row(w.type, base + n * rb, &rows[(n - r0) * nb], nb);
        for (int t0 = 0; t0 < T; t0 += tt) {
          const int t1 = std::min(T, t0 + tt);
          for (int64_t n = r0; n < r1; ++n) {
            const UnpackedK* row = &rows[(n - r0) * nb];
            int t = t0;
            for (; t + 4 <= t1; t += 4) {
              dot_q8k_x4(row, q + t * nb, nb, nb, r);
              for (int j = 0; j < 4; ++j) out[(t + j) * out_stride + n] = r[j];
            }
            for (; t < t1; ++t) out[t * out_stride + n] = dot_q8k(row, q + t * nb, nb);
          }
        }
      }
    });
    return;
  }
  pool.parallel_for(N, 4, [&](int64_t n0, int64_t n1) {
    thread_local std::vector<float> row;
    if (static_cast<int64_t>(row.size()) < K) row.resize(K);
    for (int64_t n = n0; n < n1; ++n) {
      const float* wr;
      if (w.type == TensorType::F32) {
        wr = reinterpret_cast<const float*>(base + n * rb);
      } else {
        dequantize_row(w.type, base + n * rb, row.data(), K);
        wr = row.data();
      }
      for (int t = 0; t < T; ++t) out[t * out_stride + n] = dot_f32(a + t * a_stride, wr, K);
    }
  });
}

}  // namespace markbase::cpu
