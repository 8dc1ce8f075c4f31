#pragma once
// n / d for 0 <= n < 2^31 by a multiply-high, an add and a shift, for a divisor
// 1 <= d < 2^31 known before the loop that divides by it (the CUDA kernels' parameter
// lookup: an element's row and channel): s = ceil(log2 d), m = floor(2^32 (2^s - d) / d) + 1
// (T. Granlund and P. Montgomery, "Division by invariant integers using multiplication",
// PLDI 1994). t = (n * m) >> 32 <= n, so t + n < 2^32. tests/divisor_check.cpp compares it
// with the division for every n below 2^31 of some divisors (`make slow`), sampled in `make test`.
#include <c10/macros/Macros.h>

#include <cstdint>

namespace fakequant {

struct Divider32 {
  uint32_t d, m, s;

  C10_HOST_DEVICE uint32_t div(uint32_t n) const {
#if defined(__CUDA_ARCH__)
    const uint32_t t = __umulhi(n, m);
#else
    const auto t = static_cast<uint32_t>((static_cast<uint64_t>(n) * m) >> 32);
#endif
    return (t + n) >> s;
  }
};

// The Divider32 of d, 1 <= d < 2^31.
inline Divider32 make_divider32(int64_t d) {
  uint32_t s = 0;
  while ((int64_t{1} << s) < d) ++s;
  const uint64_t m = (uint64_t{1} << 32) * ((uint64_t{1} << s) - static_cast<uint64_t>(d)) / static_cast<uint64_t>(d) + 1;
  return Divider32{static_cast<uint32_t>(d), static_cast<uint32_t>(m), s};
}

}  // namespace fakequant
