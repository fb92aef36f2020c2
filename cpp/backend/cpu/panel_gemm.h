// Prefill products on row panels: eight weight rows are unpacked from their blocks into a small
// per-thread buffer, interleaved four values at a time (row r's values k..k+3 in 32-bit lane r),
// and then multiplied with the 8-bit activations of every token of the step. One byte multiply
// instruction then covers 8 rows x 4 values of one token and the integer sums come out with one
// row per lane, so no horizontal sums are needed and the 8 results of a token are one store.
// Unpacking costs once per panel, not once per token: weights stay read from the mapped file.
#pragma once
#include <cstddef>
#include <cstdint>

#include "backend/cpu/kquant_dot.h"
#include "backend/cpu/quant_dot.h"
#include "formats/tensor_types.h"

namespace markbase::cpu {

constexpr int kPanelRows = 8;

// 8 rows x one block of 32 values of a 32-block type (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0: has_q8_dot).
// Values are Q8_0's signed bytes, else unsigned (Q4_0 / Q5_0 before their offset of 8 / 16).
struct Panel32 {
  uint8_t q[256];  // q[g * 32 + r * 4 + j] = value 4g + j of row r
  float d[kPanelRows];  // row scales
  float m[kPanelRows];  // row mins (Q4_1 / Q5_1), else 0
};

// 8 rows x one super-block of 256 values of a K-quant (Q4_K, Q5_K, Q6_K), every type written as
// x = d * sc[s] * q - dmin * mn[s] with unsigned q (Q6_K: q + 32, mn = 32 * sc, dmin = d).
struct PanelK {
  uint8_t q[2048];  // q[g * 32 + r * 4 + j] = value 4g + j of row r
  int16_t sc[16][kPanelRows][2];  // scale of the 16 values of sub-group s, row r (twice: one pair)
  int16_t mn[8][kPanelRows][2];   // mins of sub-groups 2p and 2p + 1, row r
  float d[kPanelRows], dmin[kPanelRows];
};

// Unpacks rows [0, nrows) (nrows <= 8; missing rows are zero) of nb blocks each, row_bytes apart.
void pack_panel32(TensorType t, const uint8_t* rows, size_t row_bytes, int nrows, int64_t nb, Panel32* out);
void pack_panelk(TensorType t, const uint8_t* rows, size_t row_bytes, int nrows, int64_t nb, PanelK* out);

// out[t * out_stride + r] = dot(row r, activation row t) for t < T, r < nrows; activation row t
// starts at a + t * a_stride (in blocks).
void gemm_panel32(TensorType t, const Panel32* p, int64_t nb, const BlockQ8* a, int64_t a_stride, int T,
                  float* out, int64_t out_stride, int nrows);
void gemm_panelk(TensorType t, const PanelK* p, int64_t nb, const BlockQ8K* a, int64_t a_stride, int T,
                 float* out, int64_t out_stride, int nrows);

}  // namespace markbase::cpu
