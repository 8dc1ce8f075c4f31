// CPU kernels of the affine family: scale and zero point given
// (fake_quantize_affine), or derived from a [min_range, max_range] interval
// (fake_quantize_min_max).
#include <torch/library.h>

#include "../checks.h"
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
  check_input(input);
  check_float_param(scale, "scale", input);
  TORCH_CHECK_TYPE(
      at::isFloatingType(zero_point.scalar_type()) ||
          at::isIntegralType(zero_point.scalar_type(), /*includeBool=*/false),
      "fakequant: zero_point must be an integer or floating-point tensor, got ",
      zero_point.scalar_type());
  TORCH_CHECK_VALUE(zero_point.device() == input.device(), "fakequant: zero_point is on ",
                    zero_point.device(), " but input is on ", input.device(),
                    "; both must be on the same device");
  check_quant_range(quant_min, quant_max);

  std::vector<int64_t> param_strides(input.dim(), 0);
  int64_t channels = 1;
  if (axis.has_value()) {
    const int64_t dim = wrap_axis(*axis, input);
    channels = input.size(dim);
    param_strides[dim] = 1;
  }
  const char* what = axis.has_value() ? " (input's size along axis)" : " (per-tensor)";
  TORCH_CHECK_VALUE(scale.numel() == channels, "fakequant: scale must have ", channels,
                    " elements", what, ", got ", scale.numel());
  TORCH_CHECK_VALUE(zero_point.numel() == channels, "fakequant: zero_point must have ", channels,
                    " elements", what, ", got ", zero_point.numel());

  const at::Tensor s = scale.to(at::kFloat).contiguous();
  const at::Tensor z = zero_point.to(at::kDouble).contiguous();  // exact for int32 values
  return run_quantize<Output::kFake, Window::kQuantRange>(
      input, param_strides, pack_mask, [&](auto type_tag) {
        using C = decltype(type_tag);
        const float* sp = s.const_data_ptr<float>();
        const double* zp = z.const_data_ptr<double>();
        QuantParams<C> p(channels);
        for (int64_t i = 0; i < channels; ++i) {
          TORCH_CHECK_VALUE(std::isfinite(sp[i]) && sp[i] > 0.0f,
                            "fakequant: scale must be positive and finite (as float32), got scale[",
                            i, "] = ", sp[i]);
          TORCH_CHECK_VALUE(zp[i] == std::nearbyint(zp[i]) && zp[i] >= quant_min &&
                                zp[i] <= quant_max,
                            "fakequant: zero_point must hold integers in [quant_min, quant_max] = [",
                            quant_min, ", ", quant_max, "], got zero_point[", i, "] = ", zp[i]);
          const auto zpi = static_cast<int64_t>(zp[i]);
          p.scale[i] = static_cast<C>(sp[i]);
          p.lo[i] = static_cast<C>(quant_min - zpi);
          p.hi[i] = static_cast<C>(quant_max - zpi);
          p.zero_point[i] = static_cast<C>(zpi);
        }
        return p;
      });
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_min_max(const at::Tensor& input,
                                                         const at::Tensor& min_range,
                                                         const at::Tensor& max_range,
                                                         int64_t num_bits) {
  check_input(input);
  check_float_param(min_range, "min_range", input);
  check_float_param(max_range, "max_range", input);
  check_num_bits(num_bits);
  broadcast_param_strides(min_range, "min_range", input);
  broadcast_param_strides(max_range, "max_range", input);
  // Both broadcast to input, so they broadcast to each other.
  const auto shape = at::infer_size(min_range.sizes(), max_range.sizes());
  const at::Tensor lo_range = min_range.expand(shape).to(at::kFloat).contiguous();
  const at::Tensor hi_range = max_range.expand(shape).to(at::kFloat).contiguous();
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
          TORCH_CHECK_VALUE(std::isfinite(step) && step > 0.0f,
                            "fakequant: max_range must exceed min_range and both be finite, got "
                            "min_range[", i, "] = ", mn[i], ", max_range[", i, "] = ", mx[i]);
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
