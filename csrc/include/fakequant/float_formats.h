#pragma once
// Part of the element contract (contract.h): the formats an element is
// quantized to, the integers or the small floating-point formats (FP8 E4M3 and
// E5M2, FP6 E3M2 and E2M3, FP4 E2M1: the OCP 8-bit and microscaling formats,
// none with infinities; only E5M2 has NaN), and float32 bit patterns;
// round_to_format, the rounding to the small floats, is in contract.h.
#include <c10/macros/Macros.h>

#include <math.h>
#include <cstdint>
#include <cstring>

namespace fakequant {

// The format an element is quantized to: the integers (the affine, min/max and
// amax families, integer block-wise elements) or one of the small floats
// below. The element rules of contract.h take it as a template constant.
enum class Format : int { kInt, kE2M1, kE3M2, kE2M3, kE4M3, kE5M2 };

struct FloatFormat {
  Format format;     // this format's name in Format
  int exponent_bits;
  int mantissa_bits;
  int min_exponent;  // exponent of the smallest normal value
  int max_exponent;  // exponent of the largest normal value (emax of the MX specification)
  float max;         // the largest finite value
};

constexpr FloatFormat kE4M3{Format::kE4M3, 4, 3, -6, 8, 448.0f};  // float8_e4m3fn: no infinities
constexpr FloatFormat kE5M2{Format::kE5M2, 5, 2, -14, 15, 57344.0f};
constexpr FloatFormat kE3M2{Format::kE3M2, 3, 2, -2, 4, 28.0f};
constexpr FloatFormat kE2M3{Format::kE2M3, 2, 3, 0, 2, 7.5f};
constexpr FloatFormat kE2M1{Format::kE2M1, 2, 1, 0, 2, 6.0f};

// Every format, for lookups by (exponent_bits, mantissa_bits) on the host.
constexpr FloatFormat kFloatFormats[] = {kE4M3, kE5M2, kE3M2, kE2M3, kE2M1};

// The format with these field widths, or nullptr.
inline const FloatFormat* find_float_format(int64_t exponent_bits, int64_t mantissa_bits) {
  for (const FloatFormat& f : kFloatFormats) {
    if (f.exponent_bits == exponent_bits && f.mantissa_bits == mantissa_bits) return &f;
  }
  return nullptr;
}

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
