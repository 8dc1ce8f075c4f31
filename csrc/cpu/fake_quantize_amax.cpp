// CPU kernels of the amax family (pytorch-quantization's tensor_quant and
// fake_tensor_quant, and FP8): scale = amax / bound, amax broadcast to the input.
// For FP8 the bound is the format's max and the grid its values.
#include <torch/library.h>

#include "../float_formats.h"
#include "../op_args.h"
#include "../value_checks.h"
#include "quantize_kernel.h"

namespace fakequant {
namespace cpu {
namespace {

// The loop with per-amax constants: range [quant_min, bound] (of rint(x / scale),
// or of x / scale for FP8), mask |x| <= amax; amax ~ 0 quantizes everything to 0.
template <Output O>
std::tuple<at::Tensor, at::Tensor> quantize_by_amax(const at::Tensor& input,
                                                    at::IntArrayRef param_strides,
                                                    const at::Tensor& amax, float bound,
                                                    float quant_min) {
  check_amax_values(amax);
  const at::Tensor a = amax.to(at::kFloat).contiguous();
  const int64_t n = a.numel();
  return run_quantize<O, Window::kInput>(
      input, param_strides, /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        const float* ap = a.const_data_ptr<float>();
        QuantParams<C> p(n);
        for (int64_t i = 0; i < n; ++i) {
          const bool zero = ap[i] <= kAmaxEpsilon;  // scale 1 and the range [0, 0]
          p.scale[i] = zero ? C(1) : static_cast<C>(ap[i] / bound);
          p.lo[i] = zero ? C(0) : static_cast<C>(quant_min);
          p.hi[i] = zero ? C(0) : static_cast<C>(bound);
          p.window_lo[i] = -static_cast<C>(ap[i]);
          p.window_hi[i] = static_cast<C>(ap[i]);
        }
        return p;
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

TORCH_LIBRARY_IMPL(fakequant, CPU, m) {
  m.impl("fake_quantize_amax", &amax_family<Output::kFake>);
  m.impl("quantize_amax", &amax_family<Output::kInteger>);
  m.impl("fake_quantize_fp8", &fake_quantize_fp8);
}

}  // namespace cpu
}  // namespace fakequant
