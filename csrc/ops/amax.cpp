// Host functions of the amax family (pytorch-quantization's tensor_quant and
// fake_tensor_quant, and FP8): scale = amax / bound, amax broadcast to the
// input; for FP8 the bound is the format's max and the grid its values. The
// constants are AmaxFamily of contract.h; the loops are quantize_stub's.
#include "host.h"

namespace fakequant {

namespace {

std::tuple<at::Tensor, at::Tensor> quantize_by_amax(const at::Tensor& input,
                                                    at::IntArrayRef param_strides,
                                                    const at::Tensor& amax, float bound,
                                                    float quant_min, Format format,
                                                    Output output, bool check_values) {
  const DeviceScope scope(input);
  const at::Tensor a = param_tensor(amax);
  if (run_value_checks(input, check_values)) check_amax_values(a);
  return run_quantize(input, param_strides, a.numel(), AmaxFamily{param_ptr(a), bound, quant_min},
                      format, output, MaskOut::kPacked);
}

std::tuple<at::Tensor, at::Tensor> integer_amax(const at::Tensor& input, const at::Tensor& amax,
                                                int64_t num_bits, bool is_unsigned,
                                                bool narrow_range, Output output,
                                                bool check_values) {
  const auto param_strides = check_amax_args(input, amax, num_bits);
  const int64_t bound = amax_bound(num_bits, is_unsigned);
  const int64_t quant_min = amax_quant_min(bound, is_unsigned, narrow_range);
  return quantize_by_amax(input, param_strides, amax, static_cast<float>(bound),
                          static_cast<float>(quant_min), Format::kInt, output, check_values);
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fake_quantize_amax(const at::Tensor& input,
                                                      const at::Tensor& amax, int64_t num_bits,
                                                      bool is_unsigned, bool narrow_range,
                                                      bool check_values) {
  return integer_amax(input, amax, num_bits, is_unsigned, narrow_range, Output::kFake,
                      check_values);
}

std::tuple<at::Tensor, at::Tensor> quantize_amax(const at::Tensor& input, const at::Tensor& amax,
                                                 int64_t num_bits, bool is_unsigned,
                                                 bool narrow_range, bool check_values) {
  return integer_amax(input, amax, num_bits, is_unsigned, narrow_range, Output::kInteger,
                      check_values);
}

std::tuple<at::Tensor, at::Tensor> fake_quantize_fp8(const at::Tensor& input,
                                                     const at::Tensor& amax,
                                                     int64_t exponent_bits,
                                                     int64_t mantissa_bits, bool check_values) {
  std::vector<int64_t> param_strides;
  const FloatFormat& f = check_fp8_args(input, amax, exponent_bits, mantissa_bits, param_strides);
  return quantize_by_amax(input, param_strides, amax, f.max, -f.max, f.format, Output::kFake,
                          check_values);
}

}  // namespace fakequant
