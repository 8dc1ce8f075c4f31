#pragma once
// What the C++ checks beside the tests share (tests/divisor_check.cpp, tests/fp8_check.cpp):
// float32 bit patterns, and bit-for-bit equality (any NaN equal to any NaN).
#include <cstdint>
#include <cstring>

inline uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  return b;
}
inline float float_of(uint32_t b) {
  float v;
  std::memcpy(&v, &b, 4);
  return v;
}
inline bool same_bits(float a, float b) { return bits_of(a) == bits_of(b) || (a != a && b != b); }
