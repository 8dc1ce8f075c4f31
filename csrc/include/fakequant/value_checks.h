#pragma once
// Checks on parameter *values* (scale > 0, amax >= 0, ...), raising with the
// validity rules of contract.h. They read the values on the host, so for CUDA
// tensors they cost a device synchronisation: the host functions (csrc/ops) run
// them always for CPU tensors, and for CUDA tensors only when value checks are
// switched on (FAKEQUANT_CHECK_VALUES=1) and the stream is not being captured
// into a CUDA graph (run_value_checks in csrc/ops/common.cpp). With checks
// off, an invalid parameter gives NaN outputs and a zero mask where it applies
// (docs/design.md, Errors).
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

// A parameter as the rules read it: a contiguous tensor of a dtype ParamPtr
// reads (`t` itself when it is one already, else a converted copy: float32
// for other floating types such as float8, float64 for other integer types;
// both exact). Keep it alive while the job runs. (csrc/ops/common.cpp)
at::Tensor param_tensor(const at::Tensor& t);
ParamPtr param_ptr(const at::Tensor& contiguous);

// The values of a param_tensor, readable on the host: the tensor itself on the
// CPU (no copy), else a copy (a synchronisation).
inline at::Tensor on_host(const at::Tensor& param) { return param.is_cpu() ? param : param.cpu(); }

// The checks below take param_tensor()s, so that a CPU call reads them in place.
inline void check_affine_values(const at::Tensor& scale, const at::Tensor& zero_point,
                                int64_t quant_min, int64_t quant_max) {
  const at::Tensor s = on_host(scale);
  const at::Tensor z = on_host(zero_point);
  const ParamPtr sp = param_ptr(s);
  const ParamPtr zp = param_ptr(z);
  for (int64_t i = 0; i < s.numel(); ++i) {
    TORCH_CHECK_VALUE(valid_scale(sp.as_float(i)),
                      "fakequant: scale must be positive and finite (as float32), got scale[", i,
                      "] = ", sp.as_float(i));
    TORCH_CHECK_VALUE(valid_zero_point(zp.as_double(i), quant_min, quant_max),
                      "fakequant: zero_point must hold integers in [quant_min, quant_max] = [",
                      quant_min, ", ", quant_max, "], got zero_point[", i, "] = ", zp.as_double(i));
  }
}

inline void check_amax_values(const at::Tensor& amax) {
  const at::Tensor a = on_host(amax);
  const ParamPtr ap = param_ptr(a);
  for (int64_t i = 0; i < a.numel(); ++i) {
    TORCH_CHECK_VALUE(valid_amax(ap.as_float(i)),
                      "fakequant: amax must be finite and >= 0 (as float32), got amax[", i,
                      "] = ", ap.as_float(i));
  }
}

// min_range and max_range already expanded to one shape.
inline void check_min_max_values(const at::Tensor& min_range, const at::Tensor& max_range,
                                 int64_t num_bits) {
  const at::Tensor lo = on_host(min_range);
  const at::Tensor hi = on_host(max_range);
  const ParamPtr mn = param_ptr(lo);
  const ParamPtr mx = param_ptr(hi);
  const float levels = min_max_levels(num_bits);
  for (int64_t i = 0; i < lo.numel(); ++i) {
    TORCH_CHECK_VALUE(valid_min_max_step(min_max_step(mn.as_float(i), mx.as_float(i), levels)),
                      "fakequant: max_range must exceed min_range and both be finite, got "
                      "min_range[", i, "] = ", mn.as_float(i), ", max_range[", i, "] = ",
                      mx.as_float(i));
  }
}

// scale_amax's value (read on the host: a synchronisation for CUDA tensors).
inline void check_scale_amax_value(const at::Tensor& scale_amax) {
  const float v = scale_amax.detach().to(at::kCPU, at::kFloat).reshape({-1})[0].item<float>();
  TORCH_CHECK_VALUE(valid_amax(v),
                    "fakequant: scale_amax must be finite and >= 0 (as float32), got ", v);
}

}  // namespace fakequant
