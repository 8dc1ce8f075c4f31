#pragma once
// Argument checks shared by every backend. They read metadata only (dtype,
// shape, device), never tensor values, so they cost no device synchronisation.
// Each message names the argument, the value and what is allowed.
#include <ATen/ATen.h>

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

// The integer widths every integer op accepts.
constexpr int64_t kMinNumBits = 2;
constexpr int64_t kMaxNumBits = 16;

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

// The bound of the amax family: 2^(num_bits - 1 + unsigned) - 1, and the
// smallest integer of its range.
inline int64_t amax_bound(int64_t num_bits, bool is_unsigned) {
  return (int64_t{1} << (num_bits - 1 + (is_unsigned ? 1 : 0))) - 1;
}
inline int64_t amax_quant_min(int64_t bound, bool is_unsigned, bool narrow_range) {
  return is_unsigned ? 0 : (narrow_range ? -bound : -bound - 1);
}

// Below this, amax is treated as 0 and the output is 0 (pytorch-quantization's
// epsilon, the smallest float16 subnormal).
constexpr float kAmaxEpsilon = 1.0f / (1 << 24);

}  // namespace fakequant
