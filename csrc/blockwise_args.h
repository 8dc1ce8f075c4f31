#pragma once
// fake_quantize_blockwise, shared by the CPU and CUDA kernels: the argument
// checks (the same messages on every backend), the output layout, and the
// per-block scale, computed in float32 the same way on the host and the device.
#include <ATen/ATen.h>
#include <c10/macros/Macros.h>

#include <cmath>
#include <optional>

#include "checks.h"
#include "float_formats.h"

namespace fakequant {

// The element format: integers (exponent_bits == 0) or one of the small floats.
enum class Elem : int { kInt, kE2M1, kE4M3, kE5M2 };

// (Device code may not refer to namespace-scope objects such as kE4M3 at run
// time, so the formats are copied into constexpr locals first.)
template <Elem E>
C10_HOST_DEVICE constexpr FloatFormat float_format_of() {
  return E == Elem::kE2M1 ? kE2M1 : (E == Elem::kE4M3 ? kE4M3 : kE5M2);
}

// The mask of a float element: |x / s| at most this, i.e. x / s rounds to the format
// without saturating (max + half the top step; at the tie itself E4M3 rounds down
// to max, E5M2/E2M1 up, which the mask ignores).
C10_HOST_DEVICE constexpr float saturation_limit(FloatFormat f) {
  return f.max == kE2M1.max ? 7.0f : (f.max == kE4M3.max ? 464.0f : 61440.0f);
}

struct BlockwiseArgs {
  Elem elem = Elem::kInt;
  float elem_max = 0.0f;  // the largest element magnitude: the integer bound or the format's max
  float quant_min = 0.0f, quant_max = 0.0f;  // integers only: the clamp range of rint(x / s)
  float float_limit = 0.0f;  // floats only: the largest |x / s| not saturated
  bool two_level = false;  // scale_amax given
};

inline BlockwiseArgs check_blockwise_args(const at::Tensor& input, int64_t block_size,
                                          int64_t num_bits, bool is_unsigned, bool narrow_range,
                                          int64_t exponent_bits,
                                          const std::optional<at::Tensor>& scale_amax) {
  check_input(input);
  TORCH_CHECK_VALUE(block_size >= 1, "fakequant: block_size must be >= 1, got ", block_size);
  TORCH_CHECK_VALUE(exponent_bits >= 0,
                    "fakequant: exponent_bits must be 0 (integers), 2, 4 or 5, got ",
                    exponent_bits);
  BlockwiseArgs args;
  if (exponent_bits == 0) {
    check_num_bits(num_bits);
    const int64_t bound = amax_bound(num_bits, is_unsigned);
    args.elem = Elem::kInt;
    args.elem_max = static_cast<float>(bound);
    args.quant_min = static_cast<float>(amax_quant_min(bound, is_unsigned, narrow_range));
    args.quant_max = static_cast<float>(bound);
  } else {
    if (num_bits == 4 && exponent_bits == 2) {
      args.elem = Elem::kE2M1;
    } else if (num_bits == 8 && exponent_bits == 4) {
      args.elem = Elem::kE4M3;
    } else if (num_bits == 8 && exponent_bits == 5) {
      args.elem = Elem::kE5M2;
    } else {
      TORCH_CHECK_VALUE(false,
                        "fakequant: (num_bits, exponent_bits) must be (4, 2) for E2M1, (8, 4) for "
                        "E4M3 or (8, 5) for E5M2 (or exponent_bits 0 for integers), got (",
                        num_bits, ", ", exponent_bits, ")");
    }
    TORCH_CHECK_VALUE(!is_unsigned, "fakequant: unsigned must be False for floating-point elements "
                      "(exponent_bits ", exponent_bits, ")");
    const FloatFormat f = args.elem == Elem::kE2M1 ? kE2M1 : (args.elem == Elem::kE4M3 ? kE4M3 : kE5M2);
    args.elem_max = f.max;
    args.float_limit = saturation_limit(f);
  }
  if (scale_amax.has_value()) {
    check_float_param(*scale_amax, "scale_amax", input);
    TORCH_CHECK_VALUE(scale_amax->numel() == 1, "fakequant: scale_amax must have one element, got ",
                      scale_amax->numel(), " (shape ", scale_amax->sizes(), ")");
    args.two_level = true;
  }
  return args;
}

// scale_amax's value (read on the host: a synchronisation for CUDA tensors).
inline void check_scale_amax_value(const at::Tensor& scale_amax) {
  const float v = scale_amax.detach().to(at::kCPU, at::kFloat).reshape({-1})[0].item<float>();
  TORCH_CHECK_VALUE(v >= 0.0f && std::isfinite(v),
                    "fakequant: scale_amax must be finite and >= 0 (as float32), got ", v);
}

// The output keeps input's strides when rows (the last dimension) are runs of
// memory and the tensor is dense; otherwise the kernels work on a contiguous
// copy and the output is contiguous.
inline bool blockwise_keeps_layout(const at::Tensor& input) {
  return input.is_non_overlapping_and_dense() &&
         (input.dim() == 0 || input.size(-1) <= 1 || input.stride(-1) == 1);
}

// The per-tensor scale of the block scales (two-level, NVFP4): scale_amax /
// (elem_max * 448), elem_max * 448 exact in float32.
C10_HOST_DEVICE inline float blockwise_global_scale(float scale_amax, float elem_max) {
  constexpr float kScaleMax = kE4M3.max;
  return scale_amax / (elem_max * kScaleMax);
}

// The scale of a block with amax `amax` (float32). One level: amax / elem_max.
// Two levels: that scale rounded to E4M3 against the per-tensor scale g.
template <bool kTwoLevel>
C10_HOST_DEVICE inline float blockwise_scale(float amax, float elem_max, float g) {
  constexpr FloatFormat kScaleFormat = kE4M3;
  const float s = amax / elem_max;
  return kTwoLevel ? round_to_format(s / g, kScaleFormat) * g : s;
}

// Whether a block is degenerate: its outputs are 0 (NaN staying NaN). g is 1
// for one-level scales; a NaN g (an invalid scale_amax on CUDA with value
// checks off) makes no block degenerate, so every output is NaN.
C10_HOST_DEVICE inline bool blockwise_degenerate(float amax, float s, float g) {
  return (g == g) & ((amax <= kAmaxEpsilon) | (s == 0.0f) | (g <= 0.0f));
}

}  // namespace fakequant
