// IEEE half and bfloat16 conversions (exact for every input, NaN and subnormals included).
#pragma once
#include <cstdint>
#include <cstring>

namespace markbase {

inline float fp32_from_bits(uint32_t w) { float f; std::memcpy(&f, &w, 4); return f; }
inline uint32_t fp32_to_bits(float f) { uint32_t w; std::memcpy(&w, &f, 4); return w; }

inline float fp16_to_fp32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1F, man = h & 0x3FF;
  if (exp == 0x1F) return fp32_from_bits(sign | 0x7F800000 | (man << 13));  // inf / nan
  if (exp == 0) {
    if (man == 0) return fp32_from_bits(sign);
    // subnormal: normalise
    int e = -1;
    do { man <<= 1; ++e; } while ((man & 0x400) == 0);
    return fp32_from_bits(sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (man & 0x3FF) << 13);
  }
  return fp32_from_bits(sign | (exp + 112) << 23 | man << 13);
}

// Round to nearest even, as numpy's float32 -> float16 cast.
inline uint16_t fp32_to_fp16(float f) {
  uint32_t x = fp32_to_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000);
  x &= 0x7FFFFFFF;
  if (x >= 0x7F800000) return sign | (x > 0x7F800000 ? 0x7E00 : 0x7C00);
  if (x >= 0x477FF000) return sign | 0x7C00;  // rounds to >= 65520: inf
  if (x < 0x38800000) {                       // result is subnormal or zero
    if (x < 0x33000000) return sign;          // < 2^-25: rounds to 0
    const uint32_t e = x >> 23, m = (x & 0x7FFFFF) | 0x800000;
    const uint32_t shift = 126 - e;           // 14 + (113 - e) - 1 ... gives the subnormal mantissa
    uint32_t r = m >> shift;
    const uint32_t rem = m & ((1u << shift) - 1), half = 1u << (shift - 1);
    if (rem > half || (rem == half && (r & 1))) ++r;
    return sign | static_cast<uint16_t>(r);
  }
  uint32_t r = ((x >> 13) - (112u << 10));
  const uint32_t rem = x & 0x1FFF;
  if (rem > 0x1000 || (rem == 0x1000 && (r & 1))) ++r;
  return sign | static_cast<uint16_t>(r);
}

inline float bf16_to_fp32(uint16_t h) { return fp32_from_bits(static_cast<uint32_t>(h) << 16); }

}  // namespace markbase
