#pragma once
// Rounding to the values of small floating-point formats (FP8 E4M3 and E5M2, FP4
// E2M1), computed in float32 on CPU and CUDA alike: saturate to +-max, then round
// to the nearest value of the format, ties to even, as torch's float8 casts round.
// Branch-free bit arithmetic, so the CPU loops vectorise.
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

// v saturated to [-f.max, f.max] and rounded to the format; NaN stays NaN.
// The spacing of the format's values around v is 2^(e - M) where 2^e <= |v| <
// 2^(e+1), and 2^(min_exponent - M) among the subnormals; scaling by its inverse (a
// power of two: exact) puts the values on the integers, where rint rounds ties to
// even. A carry into the next binade lands on a value of the format too.
C10_HOST_DEVICE inline float round_to_format(float v, FloatFormat f) {
  v = v < -f.max ? -f.max : (v > f.max ? f.max : v);
  const int32_t exponent = static_cast<int32_t>(float_to_bits(v) & 0x7f800000u);
  const int32_t smallest = (f.min_exponent - f.mantissa_bits + 127) << 23;
  int32_t quantum = exponent - (f.mantissa_bits << 23);
  quantum = quantum < smallest ? smallest : quantum;
  const float step = bits_to_float(static_cast<uint32_t>(quantum));
  const float inverse = bits_to_float(static_cast<uint32_t>((254 << 23) - quantum));
#if defined(__CUDA_ARCH__)
  return rintf(v * inverse) * step;
#else
  return nearbyintf(v * inverse) * step;
#endif
}

}  // namespace fakequant
