#pragma once
// What every host function (csrc/ops/*.cpp) shares: the device scope, the
// decision to check parameter values, parameters as the rules read them, and
// the forward of the affine, min/max and amax families. Device-generic: no
// CUDA header here; the backends are reached through the kernel table.
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>

#include <optional>
#include <tuple>

#include "fakequant/arg_checks.h"
#include "fakequant/kernel_table.h"
#include "fakequant/value_checks.h"

namespace fakequant {

// The input's device made current for the op (nothing to do for CPU tensors).
class DeviceScope {
 public:
  explicit DeviceScope(const at::Tensor& t) {
    if (!t.is_cpu()) guard_.reset_device(t.device());
  }

 private:
  c10::OptionalDeviceGuard guard_;
};

// Whether this call checks parameter values: never for parameters fakequant
// computed itself (check_values=False: a dynamic amax); else always for CPU
// tensors; for others when FAKEQUANT_CHECK_VALUES=1 and the current stream is
// not being captured into a graph. Call it inside the op's DeviceScope.
bool run_value_checks(const at::Tensor& input, bool check_values = true);

// y laid out like input and the mask (`mask_out`), and the kernel run over
// them with `family`'s constants, quantizing to `format` (`output`: fake or
// integer); `param_strides` maps input's dimensions onto the `num_params`
// parameters.
std::tuple<at::Tensor, at::Tensor> run_quantize(
    const at::Tensor& input, at::IntArrayRef param_strides, int64_t num_params,
    const std::variant<AffineFamily, MinMaxFamily, AmaxFamily>& family, Format format,
    Output output, MaskOut mask_out);

// The tensors of an operator over blocks along the last dimension (block-wise, GGML): the
// output y (in input's layout where its rows are runs of memory, else contiguous), its packed
// mask, and the input in y's layout (x; input itself when empty).
struct BlockTensors {
  at::Tensor x, y, mask;
};
BlockTensors block_tensors(const at::Tensor& input);

// fake_quantize_affine's forward with any mask kind (LSQ's forward has none).
std::tuple<at::Tensor, at::Tensor> quantize_affine_family(
    const at::Tensor& input, const at::Tensor& scale, const at::Tensor& zero_point,
    std::optional<int64_t> axis, int64_t quant_min, int64_t quant_max, MaskOut mask_out);

// The host functions, one per operator (registered in registration.cpp).
std::tuple<at::Tensor, at::Tensor> fake_quantize_affine(const at::Tensor& input,
                                                        const at::Tensor& scale,
                                                        const at::Tensor& zero_point,
                                                        std::optional<int64_t> axis,
                                                        int64_t quant_min, int64_t quant_max,
                                                        bool pack_mask);
std::tuple<at::Tensor, at::Tensor> fake_quantize_min_max(const at::Tensor& input,
                                                         const at::Tensor& min_range,
                                                         const at::Tensor& max_range,
                                                         int64_t num_bits);
std::tuple<at::Tensor, at::Tensor> fake_quantize_amax(const at::Tensor& input,
                                                      const at::Tensor& amax, int64_t num_bits,
                                                      bool is_unsigned, bool narrow_range,
                                                      bool check_values);
std::tuple<at::Tensor, at::Tensor> quantize_amax(const at::Tensor& input, const at::Tensor& amax,
                                                 int64_t num_bits, bool is_unsigned,
                                                 bool narrow_range, bool check_values);
std::tuple<at::Tensor, at::Tensor> fake_quantize_fp8(const at::Tensor& input,
                                                     const at::Tensor& amax,
                                                     int64_t exponent_bits,
                                                     int64_t mantissa_bits, bool check_values);
std::tuple<at::Tensor, at::Tensor> fake_quantize_blockwise(
    const at::Tensor& input, int64_t block_size, int64_t num_bits, bool is_unsigned,
    bool narrow_range, int64_t exponent_bits, const std::optional<at::Tensor>& scale_amax,
    bool check_values, bool e8m0_scale, bool centered);
std::tuple<at::Tensor, at::Tensor> fake_quantize_ggml(const at::Tensor& input, int64_t block_size,
                                                      int64_t num_bits);
at::Tensor fake_quantize_lsq(const at::Tensor& input, const at::Tensor& scale,
                             const at::Tensor& zero_point, std::optional<int64_t> axis,
                             int64_t quant_min, int64_t quant_max, double grad_factor);
std::tuple<at::Tensor, at::Tensor, at::Tensor> fake_quantize_lsq_backward(
    const at::Tensor& grad, const at::Tensor& input, const at::Tensor& scale,
    const at::Tensor& zero_point, std::optional<int64_t> axis, int64_t quant_min,
    int64_t quant_max, double grad_factor);
at::Tensor mask_backward(const at::Tensor& grad, const at::Tensor& mask,
                         at::OptionalIntArrayRef mask_strides);
std::tuple<at::Tensor, at::Tensor> fused_moving_avg_obs_fake_quant(
    const at::Tensor& input, const at::Tensor& observer_on, const at::Tensor& fake_quant_on,
    at::Tensor& running_min, at::Tensor& running_max, at::Tensor& scale, at::Tensor& zero_point,
    double averaging_const, int64_t quant_min, int64_t quant_max, int64_t ch_axis,
    bool per_row_fake_quant, bool symmetric_quant);

// Every operator, by its name in csrc/fakequant.cpp, which is also its host function's:
// registration.cpp registers the host functions, csrc/python_calls.cpp binds each operator
// for eager Python calls.
#define FAKEQUANT_OPERATORS(X)           \
  X(fake_quantize_affine)                \
  X(fake_quantize_min_max)               \
  X(fake_quantize_amax)                  \
  X(quantize_amax)                       \
  X(fake_quantize_fp8)                   \
  X(fake_quantize_blockwise)             \
  X(fake_quantize_ggml)                  \
  X(fake_quantize_lsq)                   \
  X(fake_quantize_lsq_backward)          \
  X(mask_backward)                       \
  X(fused_moving_avg_obs_fake_quant)

}  // namespace fakequant
