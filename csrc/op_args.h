#pragma once
// The argument checks of each operator that read metadata only (dtype, shape,
// device), bundled per operator so that every backend raises the same
// messages. Value checks (scale > 0, amax >= 0, ...) live in value_checks.h.
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "checks.h"

namespace fakequant {

// fake_quantize_affine: the per-dimension parameter strides (1 along `axis`,
// 0 elsewhere) and the number of parameters.
struct AffineArgs {
  std::vector<int64_t> param_strides;
  int64_t channels = 1;
};

inline AffineArgs check_affine_args(const at::Tensor& input, const at::Tensor& scale,
                                    const at::Tensor& zero_point, std::optional<int64_t> axis,
                                    int64_t quant_min, int64_t quant_max) {
  check_input(input);
  check_float_param(scale, "scale", input);
  TORCH_CHECK_TYPE(
      at::isFloatingType(zero_point.scalar_type()) ||
          at::isIntegralType(zero_point.scalar_type(), /*includeBool=*/false),
      "fakequant: zero_point must be an integer or floating-point tensor, got ",
      zero_point.scalar_type());
  TORCH_CHECK_VALUE(zero_point.device() == input.device(), "fakequant: zero_point is on ",
                    zero_point.device(), " but input is on ", input.device(),
                    "; both must be on the same device");
  check_quant_range(quant_min, quant_max);

  AffineArgs args;
  args.param_strides.assign(input.dim(), 0);
  if (axis.has_value()) {
    const int64_t dim = wrap_axis(*axis, input);
    args.channels = input.size(dim);
    args.param_strides[dim] = 1;
  }
  const char* what = axis.has_value() ? " (input's size along axis)" : " (per-tensor)";
  TORCH_CHECK_VALUE(scale.numel() == args.channels, "fakequant: scale must have ", args.channels,
                    " elements", what, ", got ", scale.numel());
  TORCH_CHECK_VALUE(zero_point.numel() == args.channels, "fakequant: zero_point must have ",
                    args.channels, " elements", what, ", got ", zero_point.numel());
  return args;
}

// fake_quantize_amax / quantize_amax: amax's broadcast strides.
inline std::vector<int64_t> check_amax_args(const at::Tensor& input, const at::Tensor& amax,
                                            int64_t num_bits) {
  check_input(input);
  check_float_param(amax, "amax", input);
  check_num_bits(num_bits);
  return broadcast_param_strides(amax, "amax", input);
}

// fake_quantize_fp8: amax's broadcast strides. The format must be E4M3
// (exponent_bits=4, mantissa_bits=3) or E5M2 (5, 2).
inline std::vector<int64_t> check_fp8_args(const at::Tensor& input, const at::Tensor& amax,
                                           int64_t exponent_bits, int64_t mantissa_bits) {
  check_input(input);
  check_float_param(amax, "amax", input);
  TORCH_CHECK_VALUE((exponent_bits == 4 && mantissa_bits == 3) ||
                        (exponent_bits == 5 && mantissa_bits == 2),
                    "fakequant: (exponent_bits, mantissa_bits) must be (4, 3) for FP8 E4M3 or "
                    "(5, 2) for FP8 E5M2, got (", exponent_bits, ", ", mantissa_bits, ")");
  return broadcast_param_strides(amax, "amax", input);
}

// fake_quantize_min_max: the shape both ranges broadcast to (they both
// broadcast to input, so to each other).
inline std::vector<int64_t> check_min_max_args(const at::Tensor& input,
                                               const at::Tensor& min_range,
                                               const at::Tensor& max_range, int64_t num_bits) {
  check_input(input);
  check_float_param(min_range, "min_range", input);
  check_float_param(max_range, "max_range", input);
  check_num_bits(num_bits);
  broadcast_param_strides(min_range, "min_range", input);
  broadcast_param_strides(max_range, "max_range", input);
  return at::infer_size(min_range.sizes(), max_range.sizes());
}

inline void check_mask_backward_args(const at::Tensor& grad, const at::Tensor& mask) {
  check_input(grad, "grad");
  TORCH_CHECK_VALUE(mask.device() == grad.device(), "fakequant: mask is on ", mask.device(),
                    " but grad is on ", grad.device(), "; both must be on the same device");
  if (mask.scalar_type() == at::kBool) {
    TORCH_CHECK_VALUE(mask.sizes() == grad.sizes(), "fakequant: a bool mask must have grad's shape ",
                      grad.sizes(), ", got ", mask.sizes());
  } else {
    TORCH_CHECK_TYPE(mask.scalar_type() == at::kByte,
                     "fakequant: mask must be uint8 (packed bits) or bool, got ",
                     mask.scalar_type());
    TORCH_CHECK_VALUE(mask.dim() == 1 && mask.numel() == (grad.numel() + 7) / 8,
                      "fakequant: a packed mask for grad of ", grad.numel(),
                      " elements must be 1-D with ", (grad.numel() + 7) / 8, " bytes, got shape ",
                      mask.sizes());
  }
}

// `input` itself when it is laid out like `out` (dense, same strides), else a
// copy of it with out's strides, so that both are walked in one memory order.
inline at::Tensor dense_like(const at::Tensor& input, const at::Tensor& out) {
  if (input.is_non_overlapping_and_dense() && input.strides() == out.strides()) return input;
  at::Tensor copy = at::empty_like(out, input.options());
  copy.copy_(input);
  return copy;
}

// The mask an operator returns with `y`: packed (uint8, one bit per element of
// y in memory order) or bool shaped and laid out like y.
inline at::Tensor new_mask(const at::Tensor& y, bool packed) {
  if (packed) return at::empty({(y.numel() + 7) / 8}, y.options().dtype(at::kByte));
  return at::empty_like(y, y.options().dtype(at::kBool));
}

}  // namespace fakequant
