#pragma once
// The argument checks of every operator, shared by every backend: they read
// metadata only (dtype, shape, device), never tensor values, so they cost no
// device synchronisation. Each message names the argument, the value and what
// is allowed. Value checks (scale > 0, amax >= 0, ...) are in value_checks.h.
// Also the layout helpers of the host functions (csrc/ops).
#include <ATen/ATen.h>

#include <cmath>
#include <optional>
#include <vector>

#include "contract.h"
#include "ggml.h"
#include "param_layout.h"

namespace fakequant {


inline bool is_supported_float(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16 || t == at::kDouble;
}

inline void check_input(const at::Tensor& input, const char* name = "input") {
  TORCH_CHECK_TYPE(is_supported_float(input.scalar_type()), "fakequant: ", name,
                   " must be float32, float16, bfloat16 or float64, got ", input.scalar_type());
}

inline void check_float_param(const at::Tensor& t, const char* name, const at::Tensor& input) {
  TORCH_CHECK_TYPE(at::isFloatingType(t.scalar_type()), "fakequant: ", name,
                   " must be a floating-point tensor, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.device() == input.device(), "fakequant: ", name, " is on ", t.device(),
                    " but input is on ", input.device(), "; both must be on the same device");
}

inline void check_num_bits(int64_t num_bits) {
  TORCH_CHECK_VALUE(num_bits >= kMinNumBits && num_bits <= kMaxNumBits,
                    "fakequant: num_bits must be in [", kMinNumBits, ", ", kMaxNumBits, "], got ",
                    num_bits);
}

inline void check_quant_range(int64_t quant_min, int64_t quant_max) {
  TORCH_CHECK_VALUE(quant_min <= quant_max, "fakequant: quant_min (", quant_min,
                    ") must be <= quant_max (", quant_max, ")");
  // Integers beyond 2^31 are not exact in the float32 arithmetic of the contract.
  constexpr int64_t lim = int64_t{1} << 31;
  TORCH_CHECK_VALUE(quant_min >= -lim && quant_max <= lim - 1,
                    "fakequant: quant_min and quant_max must lie in the int32 range, got [",
                    quant_min, ", ", quant_max, "]");
}

// Per-dimension strides of a contiguous parameter tensor broadcast to `input`'s
// shape (0 along broadcast dimensions). Raises unless `param` broadcasts to
// exactly input's shape.
inline std::vector<int64_t> broadcast_param_strides(const at::Tensor& param, const char* name,
                                                    const at::Tensor& input) {
  const int64_t nd = input.dim(), pd = param.dim();
  bool ok = pd <= nd;
  std::vector<int64_t> strides(nd, 0);
  int64_t stride = 1;
  for (int64_t i = 1; ok && i <= pd; ++i) {
    const int64_t ps = param.size(pd - i), xs = input.size(nd - i);
    if (ps == xs) {
      strides[nd - i] = ps == 1 ? 0 : stride;
    } else if (ps != 1) {
      ok = false;
    }
    stride *= ps;
  }
  TORCH_CHECK_VALUE(ok, "fakequant: ", name, " of shape ", param.sizes(),
                    " does not broadcast to input of shape ", input.sizes());
  return strides;
}

// Wraps a possibly negative axis; raises if it is out of range.
inline int64_t wrap_axis(int64_t axis, const at::Tensor& input) {
  const int64_t nd = input.dim();
  TORCH_CHECK_INDEX(axis >= -nd && axis < nd, "fakequant: axis ", axis,
                    " is out of range for input with ", nd, " dimensions");
  return axis < 0 ? axis + nd : axis;
}


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

// fake_quantize_fp8: amax's broadcast strides and the float format, which must be
// FP8 E4M3 (exponent_bits=4, mantissa_bits=3), E5M2 (5, 2), or FP6 E3M2 (3, 2), E2M3 (2, 3).
inline const FloatFormat& check_fp8_args(const at::Tensor& input, const at::Tensor& amax,
                                         int64_t exponent_bits, int64_t mantissa_bits,
                                         std::vector<int64_t>& param_strides) {
  check_input(input);
  check_float_param(amax, "amax", input);
  const FloatFormat* f = find_float_format(exponent_bits, mantissa_bits);
  TORCH_CHECK_VALUE(f != nullptr && exponent_bits + mantissa_bits >= 5,
                    "fakequant: (exponent_bits, mantissa_bits) must be (4, 3) for FP8 E4M3, "
                    "(5, 2) for FP8 E5M2, (3, 2) for FP6 E3M2 or (2, 3) for FP6 E2M3, got (",
                    exponent_bits, ", ", mantissa_bits, ")");
  param_strides = broadcast_param_strides(amax, "amax", input);
  return *f;
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

inline void check_mask_backward_args(const at::Tensor& grad, const at::Tensor& mask,
                                     at::OptionalIntArrayRef mask_strides = std::nullopt) {
  check_input(grad, "grad");
  if (mask_strides.has_value()) {
    // (that they lay grad's shape out densely without overlap: mask_backward, on the
    // tensor it makes with them)
    const at::IntArrayRef strides = *mask_strides;
    TORCH_CHECK_VALUE(strides.size() == grad.sizes().size(), "fakequant: mask_strides must have ",
                      grad.dim(), " entries (grad's dimensions), got ", strides.size());
    for (const int64_t stride : strides) {
      TORCH_CHECK_VALUE(stride >= 0, "fakequant: mask_strides must not be negative, got ", strides);
    }
  }
  TORCH_CHECK_VALUE(mask.device() == grad.device(), "fakequant: mask is on ", mask.device(),
                    " but grad is on ", grad.device(), "; both must be on the same device");
  if (mask.scalar_type() == at::kBool) {
    TORCH_CHECK_VALUE(mask.sizes() == grad.sizes(), "fakequant: a bool mask must have grad's shape ",
                      grad.sizes(), ", got ", mask.sizes());
  } else {
    TORCH_CHECK_TYPE(mask.scalar_type() == at::kByte,
                     "fakequant: mask must be uint8 (packed bits) or bool, got ",
                     mask.scalar_type());
    TORCH_CHECK_VALUE(mask.dim() == 1 && mask.numel() == packed_mask_bytes(grad.numel()),
                      "fakequant: a packed mask for grad of ", grad.numel(),
                      " elements must be 1-D with ", packed_mask_bytes(grad.numel()), " bytes, got shape ",
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
  if (packed) return at::empty({packed_mask_bytes(y.numel())}, y.options().dtype(at::kByte));
  return at::empty_like(y, y.options().dtype(at::kBool));
}


// --- LSQ ---

inline void check_grad_factor(double grad_factor) {
  TORCH_CHECK_VALUE(std::isfinite(grad_factor), "fakequant: grad_factor must be finite, got ",
                    grad_factor);
}

inline AffineArgs check_lsq_backward_args(const at::Tensor& grad, const at::Tensor& input,
                                          const at::Tensor& scale, const at::Tensor& zero_point,
                                          std::optional<int64_t> axis, int64_t quant_min,
                                          int64_t quant_max, double grad_factor) {
  AffineArgs args = check_affine_args(input, scale, zero_point, axis, quant_min, quant_max);
  check_input(grad, "grad");
  TORCH_CHECK_VALUE(grad.device() == input.device(), "fakequant: grad is on ", grad.device(),
                    " but input is on ", input.device(), "; both must be on the same device");
  TORCH_CHECK_TYPE(grad.scalar_type() == input.scalar_type(), "fakequant: grad must have input's dtype ",
                   input.scalar_type(), ", got ", grad.scalar_type());
  TORCH_CHECK_VALUE(grad.sizes() == input.sizes(), "fakequant: grad must have input's shape ",
                    input.sizes(), ", got ", grad.sizes());
  check_grad_factor(grad_factor);
  return args;
}

// --- fused_moving_avg_obs_fake_quant ---
// The buffers' dtypes and devices, the flags, the range; returns the channel axis
// (per_row_fake_quant) wrapped into input's dimensions, or nullopt (per tensor).
inline std::optional<int64_t> check_fused_obs_args(
    const at::Tensor& input, const at::Tensor& observer_on, const at::Tensor& fake_quant_on,
    const at::Tensor& running_min, const at::Tensor& running_max, const at::Tensor& scale,
    const at::Tensor& zero_point, double averaging_const, int64_t quant_min, int64_t quant_max,
    int64_t ch_axis, bool per_row_fake_quant) {
  check_input(input);
  const std::pair<const at::Tensor*, const char*> buffers[] = {
      {&observer_on, "observer_on"}, {&fake_quant_on, "fake_quant_on"},
      {&running_min, "running_min"}, {&running_max, "running_max"},
      {&scale, "scale"},             {&zero_point, "zero_point"}};
  for (const auto& [t, name] : buffers) {
    TORCH_CHECK_VALUE(t->device() == input.device(), "fakequant: ", name, " is on ", t->device(),
                      " but input is on ", input.device(), "; both must be on the same device");
  }
  for (const auto& [t, name] : {buffers[0], buffers[1]}) {
    TORCH_CHECK_VALUE(t->numel() == 1, "fakequant: ", name, " must have one element, got ",
                      t->numel());
    TORCH_CHECK_TYPE(t->scalar_type() != at::kComplexFloat && t->scalar_type() != at::kComplexDouble,
                     "fakequant: ", name, " must be a real or bool tensor, got ", t->scalar_type());
  }
  for (const auto& [t, name] : {buffers[2], buffers[3], buffers[4]}) {
    TORCH_CHECK_TYPE(t->scalar_type() == at::kFloat, "fakequant: ", name,
                     " must be a float32 tensor, got ", t->scalar_type());
  }
  TORCH_CHECK_TYPE(zero_point.scalar_type() == at::kInt,
                   "fakequant: zero_point must be an int32 tensor, got ", zero_point.scalar_type());
  TORCH_CHECK_VALUE(quant_min < quant_max, "fakequant: quant_min (", quant_min,
                    ") must be < quant_max (", quant_max, ")");
  check_quant_range(quant_min, quant_max);
  TORCH_CHECK_VALUE(averaging_const >= 0.0 && averaging_const <= 1.0,
                    "fakequant: averaging_const must be in [0, 1], got ", averaging_const);
  if (!per_row_fake_quant) return std::nullopt;
  TORCH_CHECK_VALUE(input.dim() > 0, "fakequant: per_row_fake_quant needs an input with at least "
                    "one dimension, got a 0-dimensional one");
  return wrap_axis(ch_axis, input);
}

// --- block-wise ---


struct BlockwiseArgs {
  Format format = Format::kInt;  // of the elements
  BlockRule<float> rule{};  // integers: the clamp range of rint(x / s); floats: the saturation limit
  BlockScaleRule scale{BlockScale::kFloat32, 0.0f, 0};
};

// Elements: integers (exponent_bits 0) or floats with 1 + exponent_bits + mantissa
// bits = num_bits. Scales: one level, E4M3 under scale_amax (two levels), or E8M0
// (e8m0_scale; signed elements, no scale_amax).
inline BlockwiseArgs check_blockwise_args(const at::Tensor& input, int64_t block_size,
                                          int64_t num_bits, bool is_unsigned, bool narrow_range,
                                          int64_t exponent_bits,
                                          const std::optional<at::Tensor>& scale_amax,
                                          bool e8m0_scale) {
  check_input(input);
  TORCH_CHECK_VALUE(block_size >= 1, "fakequant: block_size must be >= 1, got ", block_size);
  BlockwiseArgs args;
  if (exponent_bits == 0) {
    check_num_bits(num_bits);
    const int64_t bound = amax_bound(num_bits, is_unsigned);
    args.format = Format::kInt;
    args.scale.elem_max = static_cast<float>(bound);
    // E8M0: the integers are num_bits - 2 fraction bits of a value below 2
    // (MXINT8: k * 2^-6), so amax / scale lies in [2^(num_bits-2), 2^(num_bits-1)).
    args.scale.scale_emax = static_cast<int32_t>(num_bits - 2);
    args.rule.quant_min = static_cast<float>(amax_quant_min(bound, is_unsigned, narrow_range));
    args.rule.quant_max = static_cast<float>(bound);
  } else {
    const FloatFormat* f =
        exponent_bits > 0 ? find_float_format(exponent_bits, num_bits - 1 - exponent_bits) : nullptr;
    TORCH_CHECK_VALUE(f != nullptr,
                      "fakequant: (num_bits, exponent_bits) must be (4, 2) for E2M1, (6, 3) for "
                      "E3M2, (6, 2) for E2M3, (8, 4) for E4M3 or (8, 5) for E5M2 (or exponent_bits "
                      "0 for integers), got (", num_bits, ", ", exponent_bits, ")");
    TORCH_CHECK_VALUE(!is_unsigned, "fakequant: unsigned must be False for floating-point elements "
                      "(exponent_bits ", exponent_bits, ")");
    args.format = f->format;
    args.scale.elem_max = f->max;
    args.scale.scale_emax = f->max_exponent;
    args.rule.float_limit = saturation_limit(*f);
  }
  if (scale_amax.has_value()) {
    TORCH_CHECK_VALUE(!e8m0_scale, "fakequant: scale_amax (E4M3 block scales) cannot be combined "
                      "with e8m0_scale=True");
    check_float_param(*scale_amax, "scale_amax", input);
    TORCH_CHECK_VALUE(scale_amax->numel() == 1, "fakequant: scale_amax must have one element, got ",
                      scale_amax->numel(), " (shape ", scale_amax->sizes(), ")");
    args.scale.kind = BlockScale::kE4M3;
  } else if (e8m0_scale) {
    TORCH_CHECK_VALUE(!is_unsigned, "fakequant: unsigned must be False with e8m0_scale=True "
                      "(microscaling elements are signed)");
    args.scale.kind = BlockScale::kE8M0;
  }
  return args;
}

// --- GGML blocks ---

// llama.cpp's block types: num_bits 8 (Q8_0) or 4 (Q4_0), blocks of block_size >= 1.
inline GgmlType check_ggml_args(const at::Tensor& input, int64_t block_size, int64_t num_bits) {
  check_input(input);
  TORCH_CHECK_VALUE(block_size >= 1, "fakequant: block_size must be >= 1, got ", block_size);
  TORCH_CHECK_VALUE(num_bits == 8 || num_bits == 4,
                    "fakequant: num_bits must be 8 (Q8_0) or 4 (Q4_0), got ", num_bits);
  return num_bits == 8 ? GgmlType::kQ8_0 : GgmlType::kQ4_0;
}

// The output keeps input's strides when rows (the last dimension) are runs of
// memory and the tensor is dense; otherwise the kernels work on a contiguous
// copy and the output is contiguous.
inline bool blockwise_keeps_layout(const at::Tensor& input) {
  return input.is_non_overlapping_and_dense() &&
         (input.dim() == 0 || input.size(-1) <= 1 || input.stride(-1) == 1);
}

}  // namespace fakequant
