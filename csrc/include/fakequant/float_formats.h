#pragma once
// Part of the element contract (contract.h): the small floating-point formats
// (FP8 E4M3 and E5M2, FP4 E2M1) and float32 bit patterns; round_to_format,
// the rounding to them, is in contract.h.
#include <c10/macros/Macros.h>

#include <math.h>
#include <cstdint>
#include <cstring>

namespace fakequant {

struct FloatFormat {
  int mantissa_bits;
  int min_exponent;  // exponent of the smallest normal value
  float max;         // the largest finite value
};

constexpr FloatFormat kE4M3{3, -6, 448.0f};  // float8_e4m3fn: no infinities
constexpr FloatFormat kE5M2{2, -14, 57344.0f};
constexpr FloatFormat kE2M1{1, 0, 6.0f};

C10_HOST_DEVICE inline uint32_t float_to_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
#endif
}

C10_HOST_DEVICE inline float bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float v;
  std::memcpy(&v, &b, sizeof v);
  return v;
#endif
}

}  // namespace fakequant
