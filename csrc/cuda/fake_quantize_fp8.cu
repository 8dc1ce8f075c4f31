// CUDA kernel of FP8 fake quantization (E4M3, E5M2): scale = amax / max of the
// format, amax broadcast to the input. The constants are Fp8Family in
// kernels.cuh, the same as csrc/cpu/fake_quantize_fp8.cpp makes.
#include <torch/library.h>

#include "../float_formats.h"
#include "launch.cuh"

namespace fakequant {
namespace gpu {
namespace {

template <Output O>
std::tuple<at::Tensor, at::Tensor> fp8_quantize(const at::Tensor& input,
                                                at::IntArrayRef param_strides,
                                                const at::Tensor& a, float max) {
  return run_quantize<O, Window::kInput, /*kBoolMaskAllowed=*/false>(
      input, param_strides, a.numel(), /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        return Fp8Family<C>{param_ptr(a), max};
      });
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_fp8(const at::Tensor& input,
                                                     const at::Tensor& amax,
                                                     int64_t exponent_bits,
                                                     int64_t mantissa_bits) {
  const auto param_strides = check_fp8_args(input, amax, exponent_bits, mantissa_bits);
  const c10::cuda::CUDAGuard guard(input.device());
  if (run_value_checks()) check_amax_values(amax);
  const at::Tensor a = device_param(amax);
  if (exponent_bits == 4) return fp8_quantize<Output::kFp8E4M3>(input, param_strides, a, kE4M3.max);
  return fp8_quantize<Output::kFp8E5M2>(input, param_strides, a, kE5M2.max);
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CUDA, m) { m.impl("fake_quantize_fp8", &fake_quantize_fp8); }

}  // namespace gpu
}  // namespace fakequant
