#pragma once
// The bounds of r = rint(x / scale) for the affine ops, shared by the CPU and CUDA
// kernels: quant_min - zero_point and quant_max - zero_point, which the kernels
// clamp r to (so (q - zp) is never formed and rounded) and test for the mask.
//
// Both are integers; with ranges of more than 2^24 levels (float32 inputs) they need
// not be representable in the compute type. Rounding them inward (lo up, hi down)
// keeps the mask exact: for any r of the compute type, r >= lo_c exactly when
// r >= lo, and a clamped output stays inside the quantization range.
#include <c10/macros/Macros.h>

#include <math.h>
#include <cstdint>

namespace fakequant {

C10_HOST_DEVICE inline float next_toward(float v, float to) { return nextafterf(v, to); }
C10_HOST_DEVICE inline double next_toward(double v, double to) { return nextafter(v, to); }

// The smallest value of C >= v (up) or the largest <= v (down); v is exact in double
// (|v| < 2^33 for int32 ranges and zero points).
template <typename C>
C10_HOST_DEVICE inline C integer_bound(int64_t v, bool up) {
  const double exact = static_cast<double>(v);
  const C c = static_cast<C>(v);
  if (up && static_cast<double>(c) < exact) return next_toward(c, C(INFINITY));
  if (!up && static_cast<double>(c) > exact) return next_toward(c, C(-INFINITY));
  return c;
}

}  // namespace fakequant
