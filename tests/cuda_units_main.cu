// Host build of the CUDA decode units (cpp/backend/cuda/q8.cuh: the loads, the decoding and the
// 8-bit dot of every block type, as the matrix-vector, expert and LM-head kernels run them), for
// tests/test_cuda_backend.py to check against the gguf package's dequantizers without a GPU.
//
// stdin: int32 type, K, rows, row_bytes, offset, mode; then the rows (rows * row_bytes bytes,
// GGML blocks); then the activations as q8.cuh's Q8Vec: K int8 codes and K / 32 float32 scales.
// The rows are placed `offset` bytes past a 16-byte boundary (the alignments a weight's rows take
// in memory, or a staged row's copy in shared memory). mode: 0, the global loads; 1, the loads of
// the staged LM head (load_w_unit<TYPE, true>); 2, the MoE down kernel's whole-block loads (Q5_0:
// load_w_block_q5_0 and block_half). stdout: each row's dot, one per line.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "backend/cuda/q8.cuh"

using namespace markbase::cuda;

namespace {

template <int TYPE, bool SHARED>
float row_dot(const mb_u8* row, int K, const signed char* q, const float* d) {
  float acc = 0.0f;
  for (int u = 0; u < K / q8_unit_weights(TYPE); ++u)
    acc += unit_dot<TYPE>(load_w_unit<TYPE, SHARED>(row, u), load_x_unit<TYPE>(q, d, u));
  return acc;
}

template <int TYPE>
float row_dot_blocks(const mb_u8* row, int K, const signed char* q, const float* d) {
  float acc = 0.0f;
  if constexpr (q8_word_block(TYPE)) {
    for (int b = 0; b < K / 32; ++b) {
      const WBlockQ5 blk = load_w_block_q5_0(row, b);
      acc += unit_dot<TYPE>(block_half(blk, 0), load_x_half<TYPE>(q, d, 2 * b));
      acc += unit_dot<TYPE>(block_half(blk, 1), load_x_half<TYPE>(q, d, 2 * b + 1));
    }
  }
  return acc;
}

}  // namespace

int main() {
  int32_t hdr[6];
  if (std::fread(hdr, sizeof(int32_t), 6, stdin) != 6) return 2;
  const int type = hdr[0], K = hdr[1], rows = hdr[2], offset = hdr[4];
  const size_t rb = hdr[3];
  const int mode = hdr[5];
  if (mode < 0 || mode > 2 || (mode == 2 && !q8_word_block(type))) return 3;
  if (rows < 1 || K % 32 != 0 || K % q8_unit_weights(type) != 0 || offset < 0 || offset > 15) return 3;
  // 64 bytes of slack on both sides: the Q6_K windows read a few bytes around the codes
  std::vector<uint4> buf((rows * rb + 160) / 16);
  mb_u8* w = reinterpret_cast<mb_u8*>(buf.data()) + 64 + offset;
  std::vector<signed char> q(K);
  std::vector<float> d(K / 32);
  if (std::fread(w, 1, rows * rb, stdin) != rows * rb || std::fread(q.data(), 1, K, stdin) != static_cast<size_t>(K) ||
      std::fread(d.data(), sizeof(float), K / 32, stdin) != static_cast<size_t>(K / 32))
    return 4;
  const bool known = with_q8_type(type, [&](auto t) {
    constexpr int T = decltype(t)::value;
    for (int r = 0; r < rows; ++r) {
      const mb_u8* row = w + r * rb;
      const float v = mode == 2   ? row_dot_blocks<T>(row, K, q.data(), d.data())
                      : mode == 1 ? row_dot<T, true>(row, K, q.data(), d.data())
                                  : row_dot<T, false>(row, K, q.data(), d.data());
      std::printf("%.9g\n", v);
    }
  });
  return known ? 0 : 5;
}
