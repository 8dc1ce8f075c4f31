// Host functions of the affine family: scale and zero point given
// (fake_quantize_affine), or derived from a [min_range, max_range] interval
// (fake_quantize_min_max); LSQ's forward (lsq.cpp) is the affine one without a mask. The constants are AffineFamily and MinMaxFamily of
// contract.h; the loops are quantize_stub's (csrc/cpu/quantize.cpp,
// csrc/cuda/quantize.cu).
#include "host.h"

namespace fakequant {

std::tuple<at::Tensor, at::Tensor> quantize_affine_family(const at::Tensor& input, const at::Tensor& scale,
                                          const at::Tensor& zero_point,
                                          std::optional<int64_t> axis, int64_t quant_min,
                                          int64_t quant_max, MaskOut mask_out) {
  const AffineArgs args = check_affine_args(input, scale, zero_point, axis, quant_min, quant_max);
  const DeviceScope scope(input);
  const at::Tensor s = param_tensor(scale);
  const at::Tensor z = param_tensor(zero_point);
  if (run_value_checks(input)) check_affine_values(s, z, quant_min, quant_max);
  return run_quantize(input, args.param_strides, args.channels,
                      AffineFamily{param_ptr(s), param_ptr(z), quant_min, quant_max},
                      Format::kInt, Output::kFake, mask_out);
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_affine(const at::Tensor& input,
                                                        const at::Tensor& scale,
                                                        const at::Tensor& zero_point,
                                                        std::optional<int64_t> axis,
                                                        int64_t quant_min, int64_t quant_max,
                                                        bool pack_mask) {
  return quantize_affine_family(input, scale, zero_point, axis, quant_min, quant_max,
                                pack_mask ? MaskOut::kPacked : MaskOut::kBool);
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_min_max(const at::Tensor& input,
                                                         const at::Tensor& min_range,
                                                         const at::Tensor& max_range,
                                                         int64_t num_bits) {
  const auto shape = check_min_max_args(input, min_range, max_range, num_bits);
  const DeviceScope scope(input);
  const at::Tensor lo = param_tensor(min_range.expand(shape));
  const at::Tensor hi = param_tensor(max_range.expand(shape));
  if (run_value_checks(input)) check_min_max_values(lo, hi, num_bits);
  const auto param_strides = broadcast_param_strides(lo, "min_range", input);
  return run_quantize(input, param_strides, lo.numel(),
                      MinMaxFamily{param_ptr(lo), param_ptr(hi), min_max_levels(num_bits)},
                      Format::kInt, Output::kFake, MaskOut::kPacked);
}

}  // namespace fakequant
