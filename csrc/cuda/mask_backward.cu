// CUDA kernel of the backward of every fake-quant op: grad where mask, else +0
// (mask_backward_kernel in kernels.cuh).
#include <torch/library.h>

#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

template <typename bits_t>
void launch_mask_backward(const at::Tensor& grad, const at::Tensor& mask, at::Tensor& out) {
  constexpr int V = 16 / static_cast<int>(sizeof(bits_t));
  const int64_t n = grad.numel();
  const auto* gp = static_cast<const bits_t*>(grad.const_data_ptr());
  auto* op = static_cast<bits_t*>(out.mutable_data_ptr());
  const auto* mp = static_cast<const uint8_t*>(mask.const_data_ptr());
  const bool packed = mask.scalar_type() == at::kByte;
  const bool vectorised = aligned16(gp) && aligned16(op) &&
                          (packed || reinterpret_cast<uintptr_t>(mp) % V == 0);
  const int64_t n_vec = vectorised ? n / V * V : 0;
  const int64_t threads = std::max(n_vec / V, n - n_vec);
  const unsigned blocks = grid_for((threads + kWarpSize - 1) / kWarpSize, grad.get_device());
  const auto stream = at::cuda::getCurrentCUDAStream();
  if (packed) {
    mask_backward_kernel<bits_t, true><<<blocks, kThreads, 0, stream>>>(gp, mp, op, n, n_vec);
  } else {
    mask_backward_kernel<bits_t, false><<<blocks, kThreads, 0, stream>>>(gp, mp, op, n, n_vec);
  }
  C10_CUDA_KERNEL_LAUNCH_CHECK();
}

at::Tensor mask_backward(const at::Tensor& grad, const at::Tensor& mask) {
  check_mask_backward_args(grad, mask);
  const c10::cuda::CUDAGuard guard(grad.device());
  // Bit i of a packed mask belongs to element i of the output in memory order;
  // the autograd formulas pass grad with the forward output's strides, so
  // neither copy below happens in training.
  at::Tensor out = at::empty_like(grad);
  if (grad.numel() == 0) return out;
  const at::Tensor g = dense_like(grad, out);
  const at::Tensor m = mask.scalar_type() == at::kBool ? dense_like(mask, out) : mask.contiguous();
  switch (g.element_size()) {
    case 2: launch_mask_backward<uint16_t>(g, m, out); break;
    case 4: launch_mask_backward<uint32_t>(g, m, out); break;
    default: launch_mask_backward<uint64_t>(g, m, out); break;
  }
  return out;
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CUDA, m) { m.impl("mask_backward", &mask_backward); }

}  // namespace gpu
}  // namespace fakequant
