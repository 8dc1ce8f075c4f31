#pragma once
// Checks on parameter *values* (scale > 0, amax >= 0, ...), raising with the
// validity rules of contract.h. They read the values on the host, so for CUDA
// tensors they cost a device synchronisation: the host functions (csrc/ops) run
// them always for CPU tensors, and for CUDA tensors only when value checks are
// switched on (FAKEQUANT_CHECK_VALUES=1) and the stream is not being captured
// into a CUDA graph (run_value_checks in csrc/ops/common.cpp). With checks
// off, an invalid parameter gives NaN outputs and a zero mask where it applies
// (DESIGN.md, Errors).
#include <ATen/ATen.h>

#include <cmath>
#include <cstdlib>
#include <strings.h>

#include "contract.h"

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
  const float levels = min_max_levels(num_bits);
  for (int64_t i = 0; i < lo.numel(); ++i) {
    TORCH_CHECK_VALUE(valid_min_max_step(min_max_step(mn[i], mx[i], levels)),
                      "fakequant: max_range must exceed min_range and both be finite, got "
                      "min_range[", i, "] = ", mn[i], ", max_range[", i, "] = ", mx[i]);
  }
}

// scale_amax's value (read on the host: a synchronisation for CUDA tensors).
inline void check_scale_amax_value(const at::Tensor& scale_amax) {
  const float v = scale_amax.detach().to(at::kCPU, at::kFloat).reshape({-1})[0].item<float>();
  TORCH_CHECK_VALUE(valid_amax(v),
                    "fakequant: scale_amax must be finite and >= 0 (as float32), got ", v);
}

}  // namespace fakequant
