// The fast path for K-quants (Q4_K, Q5_K, Q6_K): activations quantized in blocks of 256 with
// sums of every 16 (llama.cpp's Q8_K), weights unpacked per row to small integers with one scale
// (and min) per 16 values, then dotted in integer arithmetic.
#pragma once
#include <cstdint>
#include <vector>

#include "formats/tensor_types.h"

namespace markbase::cpu {

struct BlockQ8K {
  float d;
  int16_t bsums[16];
  int8_t qs[256];
};

// One super-block of 256 weights as x = d * scale[g] * q - dmin * min[g] for group g = i / 16.
struct UnpackedK {
  float d, dmin;
  int16_t scale[16], min[16];
  int8_t q[256];
};

bool has_q8k_dot(TensorType t);
void quantize_act_q8k(const float* x, BlockQ8K* out, int64_t n);  // n % 256 == 0
void unpack_k_row(TensorType t, const void* row, UnpackedK* out, int64_t nb);
// One weight row (nb super-blocks of type t) against nb activation blocks.
float dot_q8k_row(TensorType t, const void* row, const BlockQ8K* a, int64_t nb);

}  // namespace markbase::cpu
