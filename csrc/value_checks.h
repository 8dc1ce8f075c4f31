#pragma once
// Checks on parameter *values* (scale > 0, amax >= 0, ...), with the messages
// of the CPU kernels. They read the values on the host, so for CUDA tensors
// they cost a device synchronisation: the CUDA kernels run them only when
// value checks are switched on (FAKEQUANT_CHECK_VALUES=1) and the stream is
// not being captured into a CUDA graph. With checks off, an invalid parameter
// gives NaN outputs and a zero mask where it applies (DESIGN.md, Errors).
#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <strings.h>

#include "checks.h"

namespace fakequant {

// FAKEQUANT_CHECK_VALUES=1 (or true/on/yes, any case), read once per process.
inline bool value_checks_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("FAKEQUANT_CHECK_VALUES");
    if (v == nullptr) return false;
    for (const char* on : {"1", "true", "on", "yes"}) {
      if (strcasecmp(v, on) == 0) return true;
    }
    return false;
  }();
  return enabled;
}

// The rules themselves, shared with the device code's "invalid -> NaN" path.
inline bool valid_scale(float s) { return std::isfinite(s) && s > 0.0f; }
inline bool valid_zero_point(double zp, int64_t quant_min, int64_t quant_max) {
  return zp == std::nearbyint(zp) && zp >= quant_min && zp <= quant_max;
}
inline bool valid_amax(float a) { return a >= 0.0f && std::isfinite(a); }

// scale and zero_point as float32 and float64 values (any device, any layout).
inline void check_affine_values(const at::Tensor& scale, const at::Tensor& zero_point,
                                int64_t quant_min, int64_t quant_max) {
  const at::Tensor s = scale.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor z = zero_point.to(at::kCPU, at::kDouble).contiguous();
  const float* sp = s.const_data_ptr<float>();
  const double* zp = z.const_data_ptr<double>();
  for (int64_t i = 0; i < s.numel(); ++i) {
    TORCH_CHECK_VALUE(valid_scale(sp[i]),
                      "fakequant: scale must be positive and finite (as float32), got scale[", i,
                      "] = ", sp[i]);
    TORCH_CHECK_VALUE(valid_zero_point(zp[i], quant_min, quant_max),
                      "fakequant: zero_point must hold integers in [quant_min, quant_max] = [",
                      quant_min, ", ", quant_max, "], got zero_point[", i, "] = ", zp[i]);
  }
}

inline void check_amax_values(const at::Tensor& amax) {
  const at::Tensor a = amax.to(at::kCPU, at::kFloat).contiguous();
  const float* ap = a.const_data_ptr<float>();
  for (int64_t i = 0; i < a.numel(); ++i) {
    TORCH_CHECK_VALUE(valid_amax(ap[i]),
                      "fakequant: amax must be finite and >= 0 (as float32), got amax[", i,
                      "] = ", ap[i]);
  }
}

// min_range and max_range already expanded to one shape.
inline void check_min_max_values(const at::Tensor& min_range, const at::Tensor& max_range,
                                 int64_t num_bits) {
  const at::Tensor lo = min_range.to(at::kCPU, at::kFloat).contiguous();
  const at::Tensor hi = max_range.to(at::kCPU, at::kFloat).contiguous();
  const float* mn = lo.const_data_ptr<float>();
  const float* mx = hi.const_data_ptr<float>();
  const auto levels = static_cast<float>((int64_t{1} << num_bits) - 1);
  for (int64_t i = 0; i < lo.numel(); ++i) {
    const float step = (mx[i] - mn[i]) / levels;
    TORCH_CHECK_VALUE(std::isfinite(step) && step > 0.0f,
                      "fakequant: max_range must exceed min_range and both be finite, got "
                      "min_range[", i, "] = ", mn[i], ", max_range[", i, "] = ", mx[i]);
  }
}

}  // namespace fakequant
