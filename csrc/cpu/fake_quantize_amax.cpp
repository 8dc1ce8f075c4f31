// CPU kernels of the amax family (pytorch-quantization's tensor_quant and
// fake_tensor_quant): scale = amax / bound, amax broadcast to the input.
#include <torch/library.h>

#include "../op_args.h"
#include "../value_checks.h"
#include "quantize_kernel.h"

namespace fakequant {
namespace cpu {
namespace {

template <Output O>
std::tuple<at::Tensor, at::Tensor> amax_family(const at::Tensor& input, const at::Tensor& amax,
                                               int64_t num_bits, bool is_unsigned,
                                               bool narrow_range) {
  const auto param_strides = check_amax_args(input, amax, num_bits);
  check_amax_values(amax);
  const at::Tensor a = amax.to(at::kFloat).contiguous();
  const int64_t n = a.numel();
  const int64_t bound = amax_bound(num_bits, is_unsigned);
  const int64_t quant_min = amax_quant_min(bound, is_unsigned, narrow_range);

  return run_quantize<O, Window::kInput>(
      input, param_strides, /*pack_mask=*/true, [&](auto type_tag) {
        using C = decltype(type_tag);
        const float* ap = a.const_data_ptr<float>();
        QuantParams<C> p(n);
        for (int64_t i = 0; i < n; ++i) {
          const bool zero = ap[i] <= kAmaxEpsilon;  // quantizes everything to 0
          p.scale[i] = zero ? C(1) : static_cast<C>(ap[i] / static_cast<float>(bound));
          p.lo[i] = zero ? C(0) : static_cast<C>(quant_min);
          p.hi[i] = zero ? C(0) : static_cast<C>(bound);
          p.window_lo[i] = -static_cast<C>(ap[i]);
          p.window_hi[i] = static_cast<C>(ap[i]);
        }
        return p;
      });
}

}  // namespace

TORCH_LIBRARY_IMPL(fakequant, CPU, m) {
  m.impl("fake_quantize_amax", &amax_family<Output::kFake>);
  m.impl("quantize_amax", &amax_family<Output::kInteger>);
}

}  // namespace cpu
}  // namespace fakequant
