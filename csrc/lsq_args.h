#pragma once
// Shared by the CPU and CUDA kernels of fake_quantize_lsq and
// fake_quantize_lsq_backward: the argument checks, the forward (which is
// fake_quantize_affine's output) and the (outer, channels, inner) view of a
// parameter layout that the backward's per-channel sums walk.
#include <ATen/ATen.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <c10/core/impl/LocalDispatchKeySet.h>

#include <cmath>
#include <optional>

#include "op_args.h"
#include "param_layout.h"

namespace fakequant {

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

// The forward is fake_quantize_affine's output, computed by its kernel for the
// same backend (so bit-identical by construction); its mask is dropped. Called
// below autograd so that the inner call adds nothing to a graph.
inline at::Tensor lsq_forward(const at::Tensor& input, const at::Tensor& scale,
                              const at::Tensor& zero_point, std::optional<int64_t> axis,
                              int64_t quant_min, int64_t quant_max, double grad_factor) {
  check_grad_factor(grad_factor);
  static const auto affine =
      c10::Dispatcher::singleton()
          .findSchemaOrThrow("fakequant::fake_quantize_affine", "")
          .typed<std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, const at::Tensor&,
                                                    const at::Tensor&, std::optional<int64_t>,
                                                    int64_t, int64_t, bool)>();
  const at::AutoDispatchBelowADInplaceOrView guard;
  return std::get<0>(
      affine.call(input, scale, zero_point, axis, quant_min, quant_max, /*pack_mask=*/true));
}

// A dense tensor walked in memory order as [outer][channels][inner]: the
// elements of channel c are the runs of `inner` consecutive elements at
// (o * channels + c) * inner. Per-tensor is outer = channels = 1.
struct ChannelShape {
  int64_t outer = 1, channels = 1, inner = 1;
};

// `layout` from make_param_layout with the affine parameter strides (1 along
// the axis, 0 elsewhere): at most one of its dimensions steps through the
// parameters, the ones on either side are merged.
inline ChannelShape channel_shape(const ParamLayout& layout) {
  ChannelShape shape;
  int64_t axis = -1;
  const auto nd = static_cast<int64_t>(layout.sizes.size());
  for (int64_t d = 0; d < nd; ++d) {
    if (layout.param_strides[d] != 0) {
      TORCH_INTERNAL_ASSERT(axis < 0 && layout.param_strides[d] == 1);
      axis = d;
    }
  }
  for (int64_t d = 0; d < nd; ++d) {
    if (axis < 0 || d > axis) {
      shape.inner *= layout.sizes[d];
    } else if (d == axis) {
      shape.channels = layout.sizes[d];
    } else {
      shape.outer *= layout.sizes[d];
    }
  }
  return shape;
}

}  // namespace fakequant
