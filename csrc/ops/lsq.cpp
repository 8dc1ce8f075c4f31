// Host functions of the learned step size ops (LSQ, LSQ+): the forward, and
// the backward with the LSQ/LSQ+ gradients, per tensor or per channel, the per-element rule
// lsq_terms of contract.h; the loops are lsq_backward_stub's
// (csrc/cpu/lsq_backward.cpp, csrc/cuda/lsq_backward.cu).
#include "host.h"

namespace fakequant {

// LSQ's forward is fake_quantize_affine's output, in the same pass and
// without a mask (its backward reads the input instead).
at::Tensor fake_quantize_lsq(const at::Tensor& input, const at::Tensor& scale,
                             const at::Tensor& zero_point, std::optional<int64_t> axis,
                             int64_t quant_min, int64_t quant_max, double grad_factor) {
  check_grad_factor(grad_factor);
  return std::get<0>(
      quantize_affine_family(input, scale, zero_point, axis, quant_min, quant_max, MaskOut::kNone));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quantize_lsq_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale,
    const at::Tensor& zero_point, std::optional<int64_t> axis, int64_t quant_min,
    int64_t quant_max, double grad_factor) {
  const AffineArgs args = check_lsq_backward_args(grad, input, scale, zero_point, axis, quant_min,
                                                  quant_max, grad_factor);
  const DeviceScope scope(input);
  const at::Tensor s = param_tensor(scale);
  const at::Tensor z = param_tensor(zero_point);
  if (run_value_checks(input)) check_affine_values(s, z, quant_min, quant_max);
  // grad_input is laid out like input (as the forward's output), so that in
  // training neither input nor grad is copied.
  at::Tensor grad_input = at::empty_like(input);
  at::Tensor grad_scale = at::empty(scale.sizes(), scale.options().dtype(at::kFloat));
  at::Tensor grad_zero_point = at::empty(zero_point.sizes(), zero_point.options().dtype(at::kFloat));
  if (input.numel() == 0) {
    grad_scale.zero_();
    grad_zero_point.zero_();
    return {grad_input, grad_scale, grad_zero_point};
  }
  LsqBackwardJob job;
  job.x = dense_like(input, grad_input);
  job.grad = dense_like(grad, grad_input);
  job.grad_input = grad_input;
  job.grad_scale = grad_scale;
  job.grad_zero_point = grad_zero_point;
  // A channel dimension of size 1 drops out of the layout: one parameter,
  // the per-tensor case.
  job.shape = channel_shape(make_param_layout(grad_input, args.param_strides));
  TORCH_INTERNAL_ASSERT(job.shape.channels == args.channels);
  job.family = AffineFamily{param_ptr(s), param_ptr(z), quant_min, quant_max};
  job.grad_factor = grad_factor;
  lsq_backward_stub(input.device().type(), job);
  return {grad_input, grad_scale, grad_zero_point};
}

}  // namespace fakequant
