// The kernel table's slots and the helpers of host.h.
#include "host.h"

namespace fakequant {

KernelSlot<QuantizeFn> quantize_stub("quantize");
KernelSlot<BlockwiseFn> blockwise_stub("blockwise");
KernelSlot<GgmlFn> ggml_stub("ggml");
KernelSlot<LsqBackwardFn> lsq_backward_stub("lsq_backward");
KernelSlot<ObserverFn> observer_stub("observer");
KernelSlot<MaskBackwardFn> mask_backward_stub("mask_backward");
KernelSlot<CapturingFn> capturing_stub("stream capture query");

bool run_value_checks(const at::Tensor& input, bool check_values) {
  if (!check_values) return false;
  if (input.is_cpu()) return true;
  return value_checks_enabled() && !capturing_stub(input.device().type(), input.device());
}

at::Tensor param_tensor(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kFloat: case at::kDouble: case at::kHalf: case at::kBFloat16:
    case at::kByte: case at::kChar: case at::kShort: case at::kInt: case at::kLong:
      return t.contiguous();
    default:
      return t.to(at::isFloatingType(t.scalar_type()) ? at::kFloat : at::kDouble).contiguous();
  }
}

ParamPtr param_ptr(const at::Tensor& t) {
  TORCH_INTERNAL_ASSERT(t.is_contiguous());
  ParamType type = ParamType::kFloat;
  switch (t.scalar_type()) {
    case at::kFloat: type = ParamType::kFloat; break;
    case at::kDouble: type = ParamType::kDouble; break;
    case at::kHalf: type = ParamType::kHalf; break;
    case at::kBFloat16: type = ParamType::kBFloat16; break;
    case at::kByte: type = ParamType::kUInt8; break;
    case at::kChar: type = ParamType::kInt8; break;
    case at::kShort: type = ParamType::kInt16; break;
    case at::kInt: type = ParamType::kInt32; break;
    case at::kLong: type = ParamType::kInt64; break;
    default: TORCH_INTERNAL_ASSERT(false, "fakequant: no parameter read for ", t.scalar_type());
  }
  return ParamPtr{t.const_data_ptr(), type};
}

std::tuple<at::Tensor, at::Tensor> run_quantize(
    const at::Tensor& input, at::IntArrayRef param_strides, int64_t num_params,
    const std::variant<AffineFamily, MinMaxFamily, AmaxFamily>& family, Format format,
    Output output, MaskOut mask_out) {
  at::Tensor y = at::empty_like(input);
  at::Tensor mask = mask_out == MaskOut::kNone ? at::Tensor() : new_mask(y, mask_out == MaskOut::kPacked);
  if (input.numel() == 0) return {y, mask};
  QuantizeJob job;
  job.x = dense_like(input, y);
  job.y = y;
  job.mask = mask;
  job.layout = make_param_layout(y, param_strides);
  job.num_params = num_params;
  job.family = family;
  job.format = format;
  job.output = output;
  job.mask_out = mask_out;
  quantize_stub(input.device().type(), job);
  return {y, mask};
}

BlockTensors block_tensors(const at::Tensor& input) {
  const bool keep = blockwise_keeps_layout(input);
  at::Tensor y = keep ? at::empty_like(input) : at::empty(input.sizes(), input.options());
  at::Tensor mask = new_mask(y, /*packed=*/true);
  if (input.numel() == 0) return {input, y, mask};
  at::Tensor x = keep ? input : input.contiguous();
  TORCH_INTERNAL_ASSERT(x.strides() == y.strides());
  return {x, y, mask};
}

}  // namespace fakequant
