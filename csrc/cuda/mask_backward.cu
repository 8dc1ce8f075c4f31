// The CUDA launch of the backward of every fake-quant op (mask_backward_kernel
// of the kernel table): grad where mask, else +0 (the kernel in kernels.cuh).
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
  launch_kernel(packed ? &mask_backward_kernel<bits_t, true> : &mask_backward_kernel<bits_t, false>, blocks,
                stream, gp, mp, op, n, n_vec);
}

void mask_backward_cuda(const at::Tensor& grad, const at::Tensor& mask, at::Tensor& out) {
  with_bits_type(grad.element_size(), [&](auto bits) {
    launch_mask_backward<decltype(bits)>(grad, mask, out);
  });
}

}  // namespace

FAKEQUANT_REGISTER_KERNEL(mask_backward_stub, FAKEQUANT_CUDA_SLOT, &mask_backward_cuda);

}  // namespace gpu
}  // namespace fakequant
