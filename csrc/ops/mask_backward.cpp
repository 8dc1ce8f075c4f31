// Host function of the backward of every fake-quant op: grad where mask, else
// +0 (select_bits of contract.h); the loops are mask_backward_stub's.
#include "host.h"

namespace fakequant {

at::Tensor mask_backward(const at::Tensor& grad, const at::Tensor& mask) {
  check_mask_backward_args(grad, mask);
  const DeviceScope scope(grad);
  // Bit i of a packed mask belongs to element i of the output in memory order;
  // the autograd formulas pass grad with the forward output's strides, so
  // neither copy below happens in training.
  at::Tensor out = at::empty_like(grad);
  if (grad.numel() == 0) return out;
  const at::Tensor g = dense_like(grad, out);
  const at::Tensor m = mask.scalar_type() == at::kBool ? dense_like(mask, out) : mask.contiguous();
  mask_backward_stub(grad.device().type(), g, m, out);
  return out;
}

}  // namespace fakequant
