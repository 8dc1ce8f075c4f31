// CUDA kernels of the amax family (pytorch-quantization's tensor_quant and
// fake_tensor_quant, and FP8): scale = amax / bound, amax broadcast to the input;
// for FP8 the bound is the format's max. The constants are AmaxFamily in
// kernels.cuh, the same as csrc/cpu/fake_quantize_amax.cpp makes.
#include <torch/library.h>

#include "../float_formats.h"
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

template <Output O>
std::tuple<at::Tensor, at::Tensor> quantize_by_amax(const at::Tensor& input,
                                                    at::IntArrayRef param_strides,
                                                    const at::Tensor& amax, float bound,
                                                    float quant_min) {
  const c10::cuda::CUDAGuard guard(input.device());
  if (run_value_checks()) check_amax_values(amax);
  const at::Tensor a = device_param(amax);
  return run_quantize<O, Window::kInput, /*kBoolMaskAllowed=*/false>(
      input, param_strides, a.numel(), /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        return AmaxFamily<C>{param_ptr(a), bound, quant_min};
      });
}

template <Output O>
std::tuple<at::Tensor, at::Tensor> amax_family(const at::Tensor& input, const at::Tensor& amax,
                                               int64_t num_bits, bool is_unsigned,
                                               bool narrow_range) {
  const auto param_strides = check_amax_args(input, amax, num_bits);
  const int64_t bound = amax_bound(num_bits, is_unsigned);
  const int64_t quant_min = amax_quant_min(bound, is_unsigned, narrow_range);
  return quantize_by_amax<O>(input, param_strides, amax, static_cast<float>(bound),
                             static_cast<float>(quant_min));
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_fp8(const at::Tensor& input,
                                                     const at::Tensor& amax,
                                                     int64_t exponent_bits,
                                                     int64_t mantissa_bits) {
  const auto param_strides = check_fp8_args(input, amax, exponent_bits, mantissa_bits);
  if (exponent_bits == 4) {
    return quantize_by_amax<Output::kFp8E4M3>(input, param_strides, amax, kE4M3.max, -kE4M3.max);
  }
  return quantize_by_amax<Output::kFp8E5M2>(input, param_strides, amax, kE5M2.max, -kE5M2.max);
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CUDA, m) {
  m.impl("fake_quantize_amax", &amax_family<Output::kFake>);
  m.impl("quantize_amax", &amax_family<Output::kInteger>);
  m.impl("fake_quantize_fp8", &fake_quantize_fp8);
}

}  // namespace gpu
}  // namespace fakequant
