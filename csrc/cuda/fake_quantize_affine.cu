// CUDA kernels of the affine family: scale and zero point given
// (fake_quantize_affine), or derived from a [min_range, max_range] interval
// (fake_quantize_min_max). The constants are AffineFamily and MinMaxFamily in
// kernels.cuh, the same as csrc/cpu/fake_quantize_affine.cpp makes.
#include <torch/library.h>

#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

std::tuple<at::Tensor, at::Tensor> fake_quantize_affine(const at::Tensor& input,
                                                        const at::Tensor& scale,
                                                        const at::Tensor& zero_point,
                                                        std::optional<int64_t> axis,
                                                        int64_t quant_min, int64_t quant_max,
                                                        bool pack_mask) {
  const AffineArgs args = check_affine_args(input, scale, zero_point, axis, quant_min, quant_max);
  const c10::cuda::CUDAGuard guard(input.device());
  if (run_value_checks()) check_affine_values(scale, zero_point, quant_min, quant_max);
  const at::Tensor s = device_param(scale);
  const at::Tensor z = device_param(zero_point);
  return run_quantize<Output::kFake, Window::kQuantRange, /*kBoolMaskAllowed=*/true>(
      input, args.param_strides, args.channels, pack_mask, [&](auto type_tag) {
        using C = decltype(type_tag);
        return AffineFamily<C>{param_ptr(s), param_ptr(z), quant_min, quant_max};
      });
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_min_max(const at::Tensor& input,
                                                         const at::Tensor& min_range,
                                                         const at::Tensor& max_range,
                                                         int64_t num_bits) {
  const auto shape = check_min_max_args(input, min_range, max_range, num_bits);
  const c10::cuda::CUDAGuard guard(input.device());
  // One range for the whole tensor needs no expanded copies.
  const bool single = c10::multiply_integers(shape) == 1;
  const at::Tensor lo = device_param(single ? min_range : min_range.expand(shape));
  const at::Tensor hi = device_param(single ? max_range : max_range.expand(shape));
  if (run_value_checks()) check_min_max_values(lo, hi, num_bits);
  const auto param_strides = single ? std::vector<int64_t>(input.dim(), 0)
                                    : broadcast_param_strides(lo, "min_range", input);
  const auto levels = static_cast<float>((int64_t{1} << num_bits) - 1);
  return run_quantize<Output::kFake, Window::kInput, /*kBoolMaskAllowed=*/false>(
      input, param_strides, lo.numel(), /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        return MinMaxFamily<C>{param_ptr(lo), param_ptr(hi), levels};
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CUDA, m) {
  m.impl("fake_quantize_affine", &fake_quantize_affine);
  m.impl("fake_quantize_min_max", &fake_quantize_min_max);
}

}  // namespace gpu
}  // namespace fakequant
