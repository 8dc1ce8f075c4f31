// CUDA kernels of the amax family (pytorch-quantization's tensor_quant and
// fake_tensor_quant): scale = amax / bound, amax broadcast to the input. The
// constants are AmaxFamily in kernels.cuh, the same as
// csrc/cpu/fake_quantize_amax.cpp makes.
#include <torch/library.h>

#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

template <Output O>
std::tuple<at::Tensor, at::Tensor> amax_family(const at::Tensor& input, const at::Tensor& amax,
                                               int64_t num_bits, bool is_unsigned,
                                               bool narrow_range) {
  const auto param_strides = check_amax_args(input, amax, num_bits);
  const c10::cuda::CUDAGuard guard(input.device());
  if (run_value_checks()) check_amax_values(amax);
  const at::Tensor a = device_param(amax);
  const int64_t bound = amax_bound(num_bits, is_unsigned);
  const int64_t quant_min = amax_quant_min(bound, is_unsigned, narrow_range);
  return run_quantize<O, Window::kInput, /*kBoolMaskAllowed=*/false>(
      input, param_strides, a.numel(), /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        return AmaxFamily<C>{param_ptr(a), bound, quant_min};
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CUDA, m) {
  m.impl("fake_quantize_amax", &amax_family<Output::kFake>);
  m.impl("quantize_amax", &amax_family<Output::kInteger>);
}

}  // namespace gpu
}  // namespace fakequant
