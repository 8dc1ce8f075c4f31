// CPU kernel of FP8 fake quantization (E4M3, E5M2): scale = amax / max of the
// format, y = fp8(clamp(x / scale, -max, max)) * scale, amax broadcast to the
// input as in the amax family.
#include <torch/library.h>

#include "../float_formats.h"
#include "../op_args.h"
#include "../value_checks.h"
#include "quantize_kernel.h"

namespace fakequant {
namespace cpu {
namespace {

template <Output O>
std::tuple<at::Tensor, at::Tensor> fp8_quantize(const at::Tensor& input,
                                                at::IntArrayRef param_strides,
                                                const at::Tensor& a, float max) {
  const int64_t n = a.numel();
  return run_quantize<O, Window::kInput>(
      input, param_strides, /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        const float* ap = a.const_data_ptr<float>();
        QuantParams<C> p(n);
        for (int64_t i = 0; i < n; ++i) {
          // amax ~ 0 quantizes everything to 0: scale 1 and the range [0, 0].
          const bool zero = ap[i] <= kAmaxEpsilon;
          p.scale[i] = zero ? C(1) : static_cast<C>(ap[i] / max);
          p.lo[i] = zero ? C(0) : -static_cast<C>(max);
          p.hi[i] = zero ? C(0) : static_cast<C>(max);
          p.window_lo[i] = -static_cast<C>(ap[i]);
          p.window_hi[i] = static_cast<C>(ap[i]);
        }
        return p;
      });
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_fp8(const at::Tensor& input,
                                                     const at::Tensor& amax,
                                                     int64_t exponent_bits,
                                                     int64_t mantissa_bits) {
  const auto param_strides = check_fp8_args(input, amax, exponent_bits, mantissa_bits);
  check_amax_values(amax);
  const at::Tensor a = amax.to(at::kFloat).contiguous();
  if (exponent_bits == 4) return fp8_quantize<Output::kFp8E4M3>(input, param_strides, a, kE4M3.max);
  return fp8_quantize<Output::kFp8E5M2>(input, param_strides, a, kE5M2.max);
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CPU, m) { m.impl("fake_quantize_fp8", &fake_quantize_fp8); }

}  // namespace cpu
}  // namespace fakequant
