// CPU kernels of the affine family: scale and zero point given
// (fake_quantize_affine), or derived from a [min_range, max_range] interval
// (fake_quantize_min_max).
#include <torch/library.h>

#include "../op_args.h"
#include "../quant_bounds.h"
#include "../value_checks.h"
#include "quantize_kernel.h"

namespace fakequant {
namespace cpu {
namespace {

std::tuple<at::Tensor, at::Tensor> fake_quantize_affine(const at::Tensor& input,
                                                        const at::Tensor& scale,
                                                        const at::Tensor& zero_point,
                                                        std::optional<int64_t> axis,
                                                        int64_t quant_min, int64_t quant_max,
                                                        bool pack_mask) {
  const AffineArgs args = check_affine_args(input, scale, zero_point, axis, quant_min, quant_max);
  check_affine_values(scale, zero_point, quant_min, quant_max);
  const int64_t channels = args.channels;
  const at::Tensor s = scale.to(at::kFloat).contiguous();
  const at::Tensor z = zero_point.to(at::kDouble).contiguous();  // exact for int32 values
  return run_quantize<Output::kFake, Window::kQuantRange>(
      input, args.param_strides, pack_mask, [&](auto type_tag) {
        using C = decltype(type_tag);
        const float* sp = s.const_data_ptr<float>();
        const double* zp = z.const_data_ptr<double>();
        QuantParams<C> p(channels);
        for (int64_t i = 0; i < channels; ++i) {
          const auto zpi = static_cast<int64_t>(zp[i]);
          p.scale[i] = static_cast<C>(sp[i]);
          p.lo[i] = integer_bound<C>(quant_min - zpi, /*up=*/true);
          p.hi[i] = integer_bound<C>(quant_max - zpi, /*up=*/false);
          p.zero_point[i] = static_cast<C>(zpi);
        }
        return p;
      });
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_min_max(const at::Tensor& input,
                                                         const at::Tensor& min_range,
                                                         const at::Tensor& max_range,
                                                         int64_t num_bits) {
  const auto shape = check_min_max_args(input, min_range, max_range, num_bits);
  const at::Tensor lo_range = min_range.expand(shape).to(at::kFloat).contiguous();
  const at::Tensor hi_range = max_range.expand(shape).to(at::kFloat).contiguous();
  check_min_max_values(lo_range, hi_range, num_bits);
  const auto param_strides = broadcast_param_strides(lo_range, "min_range", input);
  const int64_t n = lo_range.numel();
  const auto levels = static_cast<float>((int64_t{1} << num_bits) - 1);

  return run_quantize<Output::kFake, Window::kInput>(
      input, param_strides, /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        const float* mn = lo_range.const_data_ptr<float>();
        const float* mx = hi_range.const_data_ptr<float>();
        QuantParams<C> p(n);
        for (int64_t i = 0; i < n; ++i) {
          const float step = (mx[i] - mn[i]) / levels;
          const float first = std::nearbyint(mn[i] / step);  // the integer min_range maps to
          p.scale[i] = static_cast<C>(step);
          p.lo[i] = static_cast<C>(first);
          p.hi[i] = static_cast<C>(first + levels);
          p.window_lo[i] = static_cast<C>(mn[i]);
          p.window_hi[i] = static_cast<C>(mx[i]);
        }
        return p;
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CPU, m) {
  m.impl("fake_quantize_affine", &fake_quantize_affine);
  m.impl("fake_quantize_min_max", &fake_quantize_min_max);
}

}  // namespace cpu
}  // namespace fakequant
