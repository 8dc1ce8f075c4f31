// Host function of the backward of every fake-quant op: grad where mask, else
// +0 (select_bits of contract.h); the loops are mask_backward_stub's.
#include "host.h"

namespace fakequant {

at::Tensor mask_backward(const at::Tensor& grad, const at::Tensor& mask,
                         at::OptionalIntArrayRef mask_strides) {
  check_mask_backward_args(grad, mask, mask_strides);
  const DeviceScope scope(grad);
  // Bit i of a packed mask belongs to element i of the output in memory order.
  // The autograd formulas (autograd.cpp) pass the forward output's strides, so
  // the output has the forward's layout and, in training, neither copy below
  // happens unless grad arrives laid out otherwise (expanded from a sum, say).
  at::Tensor out = mask_strides.has_value()
                       ? at::empty_strided(grad.sizes(), *mask_strides, grad.options())
                       : at::empty_like(grad);
  TORCH_CHECK_VALUE(out.is_non_overlapping_and_dense(), "fakequant: mask_strides ", out.strides(),
                    " do not lay out grad's shape ", grad.sizes(), " densely without overlap");
  if (grad.numel() == 0) return out;
  const at::Tensor g = dense_like(grad, out);
  const at::Tensor m = mask.scalar_type() == at::kBool ? dense_like(mask, out) : mask.contiguous();
  mask_backward_stub(grad.device().type(), g, m, out);
  return out;
}

}  // namespace fakequant
