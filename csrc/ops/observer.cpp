// Host function of fused_moving_avg_obs_fake_quant (torch's fused observer and
// fake quantization, as a drop-in): the batch's min/max (ATen's aminmax, one read
// of the input), the running statistics and the qparams updated in place by
// observer_stub (csrc/cpu/observer.cpp, csrc/cuda/observer.cu; the rules are
// moving_average and min_max_qparams of contract.h), then one quantize_stub pass
// with those qparams. The flags are read on the device, so nothing synchronises;
// for CPU tensors they are read here to skip what is switched off.
//
// Why two reads of the input and not one: the output of every element needs the
// scale chosen from the running range after this batch, i.e. from the min/max of
// the whole tensor (or of the whole channel), which is only known once every
// element of it has been read.
#include <numeric>

#include "host.h"

namespace fakequant {
namespace {

// The batch's min and max as float32 vectors of `channels` elements.
std::pair<at::Tensor, at::Tensor> batch_min_max(const at::Tensor& input, std::optional<int64_t> axis,
                                                int64_t channels) {
  at::Tensor lo, hi;
  if (!axis.has_value()) {
    std::tie(lo, hi) = at::aminmax(input);
  } else if (input.dim() == 1) {
    lo = hi = input;
  } else {
    // amin and amax: two reads, yet several times faster on CPU than aminmax along a
    // dimension (100 against 26 ms for (64, 2^18) float32 on one thread).
    std::vector<int64_t> dims(input.dim());
    std::iota(dims.begin(), dims.end(), 0);
    dims.erase(dims.begin() + *axis);
    lo = at::amin(input, dims);
    hi = at::amax(input, dims);
  }
  return {lo.to(at::kFloat).reshape({channels}).contiguous(),
          hi.to(at::kFloat).reshape({channels}).contiguous()};
}

void check_buffer(const at::Tensor& t, const char* name, int64_t channels) {
  TORCH_CHECK_VALUE(t.numel() == channels, "fakequant: ", name, " must have ", channels,
                    channels == 1 ? " element (per tensor)" : " elements (input's size along ch_axis)",
                    ", got ", t.numel());
  TORCH_CHECK_VALUE(t.is_contiguous(), "fakequant: ", name, " must be contiguous (it is updated in place)");
}

}  // namespace

std::tuple<at::Tensor, at::Tensor> fused_moving_avg_obs_fake_quant(
    const at::Tensor& input, const at::Tensor& observer_on, const at::Tensor& fake_quant_on,
    at::Tensor& running_min, at::Tensor& running_max, at::Tensor& scale, at::Tensor& zero_point,
    double averaging_const, int64_t quant_min, int64_t quant_max, int64_t ch_axis,
    bool per_row_fake_quant, bool symmetric_quant) {
  const std::optional<int64_t> axis =
      check_fused_obs_args(input, observer_on, fake_quant_on, running_min, running_max, scale,
                           zero_point, averaging_const, quant_min, quant_max, ch_axis,
                           per_row_fake_quant);
  const DeviceScope scope(input);
  const int64_t channels = axis.has_value() ? input.size(*axis) : 1;
  if (axis.has_value() && running_min.numel() == 0) {
    // torch's buffers start empty for a per-channel observer: sized at the first call.
    running_min.resize_({channels}).fill_(std::numeric_limits<float>::infinity());
    running_max.resize_({channels}).fill_(-std::numeric_limits<float>::infinity());
    scale.resize_({channels}).fill_(1.0f);
    zero_point.resize_({channels}).zero_();
  }
  check_buffer(running_min, "running_min", channels);
  check_buffer(running_max, "running_max", channels);
  check_buffer(scale, "scale", channels);
  check_buffer(zero_point, "zero_point", channels);

  const at::Tensor observe_flag = param_tensor(observer_on);
  const at::Tensor quantize_flag = param_tensor(fake_quant_on);
  const bool on_host = input.is_cpu();
  const bool observe = !on_host || param_ptr(observe_flag).as_double(0) != 0.0;
  const bool quantize = !on_host || param_ptr(quantize_flag).as_double(0) != 0.0;

  if (input.numel() > 0 && (observe || quantize)) {
    ObserverJob job;
    if (observe) std::tie(job.x_min, job.x_max) = batch_min_max(input, axis, channels);
    job.running_min = running_min;
    job.running_max = running_max;
    job.scale = scale;
    job.zero_point = zero_point;
    job.observer_on = param_ptr(observe_flag);
    job.fake_quant_on = param_ptr(quantize_flag);
    job.num_channels = channels;
    job.averaging_const = static_cast<float>(averaging_const);
    job.quant_min = quant_min;
    job.quant_max = quant_max;
    job.symmetric = symmetric_quant;
    observer_stub(input.device().type(), job);
  }

  if (on_host && !quantize) {
    at::Tensor y = input.clone(at::MemoryFormat::Preserve);
    return {y, new_mask(y, /*packed=*/true).fill_(0xff)};
  }
  std::vector<int64_t> param_strides(input.dim(), 0);
  if (axis.has_value()) param_strides[*axis] = 1;
  auto [y, mask] = run_quantize(input, param_strides, channels,
                                AffineFamily{param_ptr(scale), param_ptr(zero_point), quant_min, quant_max},
                                Format::kInt, Output::kFake, MaskOut::kPacked);
  if (!on_host && input.numel() > 0) {
    // fake_quant_on read on the device: the input itself and a full mask where it is 0.
    const at::Tensor on = quantize_flag.reshape({}).ne(0);
    y.copy_(at::where(on, y, input));
    mask.copy_(at::where(on, mask, at::full({}, 0xff, mask.options())));
  }
  return {y, mask};
}

}  // namespace fakequant
