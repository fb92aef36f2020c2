// Dequantization of every MarkBase tensor type and quantization of float32 to Q8_0 / Q4_0.
// The arithmetic follows GGML's reference code operation by operation, so results equal the
// gguf package's numpy dequantizers and quantizers bit for bit.
#pragma once
#include <cstddef>
#include <cstdint>

#include "formats/tensor_types.h"

namespace markbase {

// Dequantizes n elements (a whole number of blocks) starting at block-aligned src.
void dequantize_row(TensorType t, const void* src, float* dst, int64_t n);

// Quantizes n floats (n a multiple of 32) into blocks. Throws std::invalid_argument otherwise.
void quantize_row_q8_0(const float* src, void* dst, int64_t n);
void quantize_row_q4_0(const float* src, void* dst, int64_t n);

// The 6-bit scale and min of sub-block j of a Q4_K / Q5_K block.
inline void k_scale_min(int j, const uint8_t* q, uint8_t* d, uint8_t* m) {
  if (j < 4) {
    *d = q[j] & 63;
    *m = q[j + 4] & 63;
  } else {
    *d = (q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4);
    *m = (q[j + 4] >> 4) | ((q[j - 0] >> 6) << 4);
  }
}

}  // namespace markbase
