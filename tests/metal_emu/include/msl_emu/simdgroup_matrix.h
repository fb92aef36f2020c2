// msl_emu/simdgroup_matrix.h -- simdgroup_matrix<T, Cols, Rows> (8x8 tiles).
//
// Every lane keeps the whole tile. Metal requires the arguments of simdgroup_load/store to be
// the same in all lanes of the simdgroup; the emulator checks that with a collective, which
// also makes a load/store in lane-divergent code a reported error. The per-lane layout
// (thread_elements()) is undocumented, so it is deliberately absent.
#pragma once
#include <cstring>

#include "msl_emu/sync.h"

namespace metal {

template <class T, int Cols, int Rows> struct simdgroup_matrix {
  T m[Rows][Cols];  // m[row][col]
  simdgroup_matrix() = default;
  // MSL: a diagonal matrix with `diag` on the diagonal.
  explicit simdgroup_matrix(T diag) {
    for (int r = 0; r < Rows; ++r)
      for (int c = 0; c < Cols; ++c) m[r][c] = r == c ? diag : T(0);
  }
};
typedef simdgroup_matrix<float, 8, 8> simdgroup_float8x8;
typedef simdgroup_matrix<half, 8, 8> simdgroup_half8x8;

template <class T, int Cols, int Rows> inline simdgroup_matrix<T, Cols, Rows> make_filled_simdgroup_matrix(T v) {
  simdgroup_matrix<T, Cols, Rows> a;
  for (auto& row : a.m)
    for (auto& e : row) e = v;
  return a;
}

namespace detail_sgm {
struct Args {
  const void* p;
  ulong stride, ox, oy;
  bool transpose;
};
// Checks that all active lanes pass the same arguments; returns nothing, fails the kernel otherwise.
inline void check_uniform(const char* op, const Args& a, const char* file, int line) {
  Args z;
  std::memset(&z, 0, sizeof z);  // padding bytes compared too: start from zeros
  z.p = a.p; z.stride = a.stride; z.ox = a.ox; z.oy = a.oy; z.transpose = a.transpose;
  uint32_t m;
  const unsigned char* s = detail_simd::exchange(z, op, file, line, &m);
  for (int l = 0; l < 32; ++l)
    if ((m >> l & 1) && std::memcmp(s + ::msl_emu::rt::kSimdSlotBytes * l, &z, sizeof z) != 0)
      ::msl_emu::rt::fail(std::string(op) + " with arguments that differ between the lanes of a simdgroup", file, line);
  if (a.transpose && (a.ox || a.oy))
    ::msl_emu::rt::fail(std::string(op) +
                            " with both matrix_origin and transpose_matrix: that layout is not verified against "
                            "Apple GPUs, so the emulator refuses it (offset the pointer instead)",
                        file, line);
}
}  // namespace detail_sgm

// d[r][c] = src[(origin.y + r) * elements_per_row + origin.x + c]; transposed:
// d[r][c] = src[c * elements_per_row + r].
template <class T, int Cols, int Rows, class U>
inline void simdgroup_load(thread simdgroup_matrix<T, Cols, Rows>& d, const U* src, ulong elements_per_row = Cols,
                           ulong2 matrix_origin = (ulong2)0, bool transpose_matrix = false, MSL_EMU_LOC) {
  detail_sgm::check_uniform("simdgroup_load", {(const void*)src, elements_per_row, matrix_origin.x, matrix_origin.y, transpose_matrix},
                            file, line);
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) {
      ulong row = matrix_origin.y + r, col = matrix_origin.x + c;
      d.m[r][c] = transpose_matrix ? (T)src[c * elements_per_row + r] : (T)src[row * elements_per_row + col];
    }
}
template <class T, int Cols, int Rows, class U>
inline void simdgroup_store(const thread simdgroup_matrix<T, Cols, Rows>& a, U* dst, ulong elements_per_row = Cols,
                            ulong2 matrix_origin = (ulong2)0, bool transpose_matrix = false, MSL_EMU_LOC) {
  detail_sgm::check_uniform("simdgroup_store", {(const void*)dst, elements_per_row, matrix_origin.x, matrix_origin.y, transpose_matrix},
                            file, line);
  // Every lane holds the same tile, so every lane stores the same values; the lanes of one
  // simdgroup run on one OS thread, so the repeated stores don't race.
  for (int r = 0; r < Rows; ++r)
    for (int c = 0; c < Cols; ++c) {
      ulong row = matrix_origin.y + r, col = matrix_origin.x + c;
      if (transpose_matrix)
        dst[c * elements_per_row + r] = (U)a.m[r][c];
      else
        dst[row * elements_per_row + col] = (U)a.m[r][c];
    }
}
// d = a * b + c, accumulated in float.
template <class T, class TA, class TB, class TC, int N, int K, int M>
inline void simdgroup_multiply_accumulate(thread simdgroup_matrix<T, N, M>& d, const thread simdgroup_matrix<TA, K, M>& a,
                                          const thread simdgroup_matrix<TB, N, K>& b, const thread simdgroup_matrix<TC, N, M>& c) {
  simdgroup_matrix<T, N, M> r;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      float s = (float)c.m[i][j];
      for (int k = 0; k < K; ++k) s += (float)a.m[i][k] * (float)b.m[k][j];
      r.m[i][j] = (T)s;
    }
  d = r;
}
template <class T, class TA, class TB, int N, int K, int M>
inline void simdgroup_multiply(thread simdgroup_matrix<T, N, M>& d, const thread simdgroup_matrix<TA, K, M>& a,
                               const thread simdgroup_matrix<TB, N, K>& b) {
  simdgroup_multiply_accumulate(d, a, b, make_filled_simdgroup_matrix<T, N, M>(T(0)));
}

}  // namespace metal
