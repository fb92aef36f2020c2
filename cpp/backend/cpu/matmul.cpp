#include "backend/cpu/matmul.h"

#include <algorithm>

#include "backend/cpu/kernels.h"
#include "backend/cpu/panel_gemm.h"
#include "formats/quants.h"

namespace markbase::cpu {
namespace {

// fn(n, nr, panel) for every panel of 8 weight rows (n: its first row, nr <= 8 rows), panels split
// across threads; each thread unpacks into its own buffer of nb blocks.
template <class Panel, class F>
void over_panels(ThreadPool& pool, int64_t N, int64_t nb, const F& fn) {
  pool.parallel_for((N + kPanelRows - 1) / kPanelRows, 1, [&](int64_t p0, int64_t p1) {
    thread_local std::vector<Panel> panel;
    panel.resize(nb);
    for (int64_t p = p0; p < p1; ++p) {
      const int64_t n = p * kPanelRows;
      fn(n, static_cast<int>(std::min<int64_t>(kPanelRows, N - n)), panel.data());
    }
  });
}

}  // namespace

// out[t, n] = dot(a[t], W[n]) for n in [0, N), t in [0, T). The fast path quantizes the
// activations to 8-bit blocks once and uses integer dot products: prefill (T > 1) on row panels
// (panel_gemm.h), decode on four rows (32-block types) or one row (K-quants) at a time.
// The precise path (and every other type) dequantizes one weight row at a time into floats.
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
    if (T > 1) {  // prefill: row panels against every token
      over_panels<Panel32>(pool, N, nb, [&](int64_t n, int nr, Panel32* panel) {
        pack_panel32(w.type, base + n * rb, rb, nr, nb, panel);
        gemm_panel32(w.type, panel, nb, q, nb, T, out + n, out_stride, nr);
      });
      return;
    }
    pool.parallel_for(N, 16, [&](int64_t n0, int64_t n1) {  // decode: four weight rows per pass
      float r[4];
      int64_t n = n0;
      for (; n + 4 <= n1; n += 4) {
        dot_q8_rows4(w.type, base + n * rb, rb, q, nb, r);
        for (int j = 0; j < 4; ++j) out[n + j] = r[j];
      }
      for (; n < n1; ++n) out[n] = dot_q8(w.type, base + n * rb, q, nb);
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
    if (T > 1) {
      over_panels<PanelK>(pool, N, nb, [&](int64_t n, int nr, PanelK* panel) {
        pack_panelk(w.type, base + n * rb, rb, nr, nb, panel);
        gemm_panelk(w.type, panel, nb, q, nb, T, out + n, out_stride, nr);
      });
      return;
    }
    pool.parallel_for(N, 4, [&](int64_t n0, int64_t n1) {  // decode: one row at a time
      for (int64_t n = n0; n < n1; ++n) out[n] = dot_q8k_row(w.type, base + n * rb, q, nb);
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
