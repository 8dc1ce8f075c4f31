// Host function of fake_quantize_blockwise: blocks of block_size consecutive
// elements along the last dimension, each with its own amax = max |x|. The
// geometry and the rules are in contract.h; the loops are blockwise_stub's
// (csrc/cpu/blockwise.cpp, csrc/cuda/blockwise.cu).
#include "host.h"

namespace fakequant {

std::tuple<at::Tensor, at::Tensor> fake_quantize_blockwise(
    const at::Tensor& input, int64_t block_size, int64_t num_bits, bool is_unsigned,
    bool narrow_range, int64_t exponent_bits, const std::optional<at::Tensor>& scale_amax,
    bool check_values) {
  const BlockwiseArgs args = check_blockwise_args(input, block_size, num_bits, is_unsigned,
                                                  narrow_range, exponent_bits, scale_amax);
  const DeviceScope scope(input);
  if (args.two_level && run_value_checks(input, check_values)) check_scale_amax_value(*scale_amax);

  const bool keep = blockwise_keeps_layout(input);
  at::Tensor y = keep ? at::empty_like(input) : at::empty(input.sizes(), input.options());
  const int64_t n = input.numel();
  if (n == 0) return {y, new_mask(y, /*packed=*/true)};
  // The mask: the first ceil(n / 8) bytes of a buffer of whole 32-bit words (a
  // kernel may store it by words), as a tensor of its own (not a view, as the
  // fake kernel's).
  const auto byte_options = y.options().dtype(at::kByte);
  const at::Tensor buffer = at::empty({(n + 31) / 32 * 4}, byte_options);
  at::Tensor mask = at::empty({0}, byte_options);
  mask.set_(buffer.storage(), 0, {packed_mask_bytes(n)}, {1});

  at::Tensor sa;
  BlockwiseJob job;
  job.x = keep ? input : input.contiguous();
  TORCH_INTERNAL_ASSERT(job.x.strides() == y.strides());
  job.y = y;
  job.mask = mask;
  job.geometry = block_geometry(input.dim() == 0 ? 1 : input.size(-1), block_size);
  job.elem = args.elem;
  job.elem_max = args.elem_max;
  job.rule = BlockRule<float>{args.quant_min, args.quant_max, args.float_limit};
  job.two_level = args.two_level;
  if (args.two_level) {
    sa = param_tensor(*scale_amax);
    job.scale_amax = param_ptr(sa);
  }
  blockwise_stub(input.device().type(), job);
  return {y, mask};
}

}  // namespace fakequant
