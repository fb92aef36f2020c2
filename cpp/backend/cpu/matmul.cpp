#include "backend/cpu/matmul.h"

#include "backend/cpu/kernels.h"
#include "formats/quants.h"

namespace markbase::cpu {

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
      for (int64_t n = n0; n < n1; ++n) {
        int t = 0;
        for (; t + 4 <= T; t += 4) {
          dot_q8_x4(w.type, base + n * rb, q + t * nb, nb, nb, r);
          for (int j = 0; j < 4; ++j) out[(t + j) * out_stride + n] = r[j];
        }
        for (; t < T; ++t) out[t * out_stride + n] = dot_q8(w.type, base + n * rb, q + t * nb, nb);
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
      thread_local std::vector<UnpackedK> row;
      if (static_cast<int64_t>(row.size()) < nb) row.resize(nb);
      for (int64_t n = n0; n < n1; ++n) {
        unpack_k_row(w.type, base + n * rb, row.data(), nb);
        int t = 0;
        float r[4];
        for (; t + 4 <= T; t += 4) {
          dot_q8k_x4(row.data(), q + t * nb, nb, nb, r);
          for (int j = 0; j < 4; ++j) out[(t + j) * out_stride + n] = r[j];
        }
        for (; t < T; ++t) out[t * out_stride + n] = dot_q8k(row.data(), q + t * nb, nb);
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
