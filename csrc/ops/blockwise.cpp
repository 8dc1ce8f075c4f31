// Host function of fake_quantize_blockwise: blocks of block_size consecutive
// elements along the last dimension, each with its own amax = max |x|. The
// geometry and the rules are in contract.h; the loops are blockwise_stub's
// (csrc/cpu/blockwise.cpp, csrc/cuda/blockwise.cu).
#include "host.h"

namespace fakequant {

std::tuple<at::Tensor, at::Tensor> fake_quantize_blockwise(
    const at::Tensor& input, int64_t block_size, int64_t num_bits, bool is_unsigned,
    bool narrow_range, int64_t exponent_bits, const std::optional<at::Tensor>& scale_amax,
    bool check_values, bool e8m0_scale, bool centered) {
  const BlockwiseArgs args = check_blockwise_args(input, block_size, num_bits, is_unsigned,
                                                  narrow_range, exponent_bits, scale_amax, e8m0_scale);
  const bool two_level = args.scale.kind == BlockScale::kE4M3;
  const DeviceScope scope(input);
  if (two_level && run_value_checks(input, check_values)) check_scale_amax_value(*scale_amax);

  const BlockTensors t = block_tensors(input);
  if (input.numel() == 0) return {t.y, t.mask};

  at::Tensor sa;
  BlockwiseJob job;
  job.x = t.x;
  job.y = t.y;
  job.mask = t.mask;
  job.geometry = block_geometry(input.dim() == 0 ? 1 : input.size(-1), block_size);
  job.format = args.format;
  job.rule = args.rule;
  job.scale = args.scale;
  job.centered = centered;
  if (two_level) {
    sa = param_tensor(*scale_amax);
    job.scale_amax = param_ptr(sa);
  }
  blockwise_stub(input.device().type(), job);
  return {t.y, t.mask};
}

}  // namespace fakequant
