#include "formats/quants.h"

#include <cmath>
#include <cstring>
#include <stdexcept>
#include <string>

#include "formats/half.h"

namespace markbase {
namespace {

void deq_q4_0(const block_q4_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      y[j] = static_cast<float>((b[i].qs[j] & 0xF) - 8) * d;
      y[j + QK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void deq_q4_1(const block_q4_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK4_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    for (int j = 0; j < QK4_1 / 2; ++j) {
      y[j] = static_cast<float>(b[i].qs[j] & 0xF) * d + m;
      y[j + QK4_1 / 2] = static_cast<float>(b[i].qs[j] >> 4) * d + m;
    }
  }
}

void deq_q5_0(const block_q5_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_0) {
    const float d = fp16_to_fp32(b[i].d);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < QK5_0 / 2; ++j) {
      const int x0 = (b[i].qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
      const int x1 = (b[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(x0 - 16) * d;
      y[j + QK5_0 / 2] = static_cast<float>(x1 - 16) * d;
    }
  }
}

void deq_q5_1(const block_q5_1* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK5_1) {
    const float d = fp16_to_fp32(b[i].d), m = fp16_to_fp32(b[i].m);
    uint32_t qh;
    std::memcpy(&qh, b[i].qh, 4);
    for (int j = 0; j < QK5_1 / 2; ++j) {
      const int x0 = (b[i].qs[j] & 0xF) | (((qh >> j) << 4) & 0x10);
      const int x1 = (b[i].qs[j] >> 4) | ((qh >> (j + 12)) & 0x10);
      y[j] = static_cast<float>(x0) * d + m;
      y[j + QK5_1 / 2] = static_cast<float>(x1) * d + m;
    }
  }
}

void deq_q8_0(const block_q8_0* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i, y += QK8_0) {
    const float d = fp16_to_fp32(b[i].d);
    for (int j = 0; j < QK8_0; ++j) y[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

void deq_q4_K(const block_q4_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int j = 0; j < QK_K; j += 64, q += 32) {
      uint8_t sc, m;
      k_scale_min(j / 32, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      k_scale_min(j / 32 + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * (q[l] & 0xF) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * (q[l] >> 4) - m2;
    }
  }
}

void deq_q5_K(const block_q5_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d), dmin = fp16_to_fp32(b[i].dmin);
    const uint8_t* ql = b[i].qs;
    const uint8_t* qh = b[i].qh;
    uint8_t u1 = 1, u2 = 2;
    for (int j = 0; j < QK_K; j += 64, ql += 32, u1 <<= 2, u2 <<= 2) {
      uint8_t sc, m;
      k_scale_min(j / 32, b[i].scales, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      k_scale_min(j / 32 + 1, b[i].scales, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *y++ = d1 * ((ql[l] & 0xF) + (qh[l] & u1 ? 16 : 0)) - m1;
      for (int l = 0; l < 32; ++l) *y++ = d2 * ((ql[l] >> 4) + (qh[l] & u2 ? 16 : 0)) - m2;
    }
  }
}

void deq_q6_K(const block_q6_K* b, float* y, int64_t nb) {
  for (int64_t i = 0; i < nb; ++i) {
    const float d = fp16_to_fp32(b[i].d);
    const uint8_t* ql = b[i].ql;
    const uint8_t* qh = b[i].qh;
    const int8_t* sc = b[i].scales;
    for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = static_cast<int>((ql[l] & 0xF) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = static_cast<int>((ql[l + 32] & 0xF) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = static_cast<int>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = static_cast<int>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        y[l + 0] = (d * sc[is + 0]) * q1;
        y[l + 32] = (d * sc[is + 2]) * q2;
        y[l + 64] = (d * sc[is + 4]) * q3;
        y[l + 96] = (d * sc[is + 6]) * q4;
      }
    }
  }
}

}  // namespace

void dequantize_row(TensorType t, const void* src, float* y, int64_t n) {
  const int64_t nb = n / traits(t).block_elems;
  switch (t) {
    case TensorType::F32: std::memcpy(y, src, n * sizeof(float)); break;
    case TensorType::F16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = fp16_to_fp32(s[i]);
      break;
    }
    case TensorType::BF16: {
      const uint16_t* s = static_cast<const uint16_t*>(src);
      for (int64_t i = 0; i < n; ++i) y[i] = bf16_to_fp32(s[i]);
      break;
    }
    case TensorType::Q4_0: deq_q4_0(static_cast<const block_q4_0*>(src), y, nb); break;
    case TensorType::Q4_1: deq_q4_1(static_cast<const block_q4_1*>(src), y, nb); break;
    case TensorType::Q5_0: deq_q5_0(static_cast<const block_q5_0*>(src), y, nb); break;
    case TensorType::Q5_1: deq_q5_1(static_cast<const block_q5_1*>(src), y, nb); break;
    case TensorType::Q8_0: deq_q8_0(static_cast<const block_q8_0*>(src), y, nb); break;
    case TensorType::Q4_K: deq_q4_K(static_cast<const block_q4_K*>(src), y, nb); break;
    case TensorType::Q5_K: deq_q5_K(static_cast<const block_q5_K*>(src), y, nb); break;
    case TensorType::Q6_K: deq_q6_K(static_cast<const block_q6_K*>(src), y, nb); break;
  }
}

static void check_blocks(const char* what, int64_t n) {
  if (n <= 0 || n % 32 != 0)
    throw std::invalid_argument(std::string("cannot quantize to ") + what + ": a row of " +
                                std::to_string(n) +
                                " values is not a whole number of 32-value blocks; keep this "
                                "tensor in float");
}

// round half away from zero, as GGML's roundf and gguf's np_roundf.
void quantize_row_q8_0(const float* x, void* dst, int64_t n) {
  check_blocks("Q8_0", n);
  block_q8_0* b = static_cast<block_q8_0*>(dst);
  for (int64_t i = 0; i < n / QK8_0; ++i, x += QK8_0) {
    float amax = 0.0f;
    for (int j = 0; j < QK8_0; ++j) amax = std::fmax(amax, std::fabs(x[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK8_0; ++j) b[i].qs[j] = static_cast<int8_t>(std::round(x[j] * id));
  }
}

void quantize_row_q4_0(const float* x, void* dst, int64_t n) {
  check_blocks("Q4_0", n);
  block_q4_0* b = static_cast<block_q4_0*>(dst);
  for (int64_t i = 0; i < n / QK4_0; ++i, x += QK4_0) {
    float amax = 0.0f, max = 0.0f;  // max keeps the sign of the largest magnitude (first one)
    for (int j = 0; j < QK4_0; ++j)
      if (amax < std::fabs(x[j])) { amax = std::fabs(x[j]); max = x[j]; }
    const float d = max / -8.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    b[i].d = fp32_to_fp16(d);
    for (int j = 0; j < QK4_0 / 2; ++j) {
      const float a = std::trunc(x[j] * id + 8.5f), c = std::trunc(x[j + QK4_0 / 2] * id + 8.5f);
      const uint8_t q0 = static_cast<uint8_t>(std::fmin(15.0f, std::fmax(0.0f, a)));
      const uint8_t q1 = static_cast<uint8_t>(std::fmin(15.0f, std::fmax(0.0f, c)));
      b[i].qs[j] = q0 | (q1 << 4);
    }
  }
}

}  // namespace markbase
