// Host function of fake_quantize_ggml: llama.cpp's Q8_0/Q4_0 blocks of block_size
// consecutive elements along the last dimension. The geometry is the block-wise ops'
// (contract.h), the rule csrc/include/fakequant/ggml.h's; the loops are ggml_stub's
// (csrc/cpu/ggml.cpp, csrc/cuda/ggml.cu).
#include "host.h"

namespace fakequant {

std::tuple<at::Tensor, at::Tensor> fake_quantize_ggml(const at::Tensor& input, int64_t block_size,
                                                      int64_t num_bits) {
  const GgmlType type = check_ggml_args(input, block_size, num_bits);
  const DeviceScope scope(input);
  const BlockTensors t = block_tensors(input);
  if (input.numel() == 0) return {t.y, t.mask};

  GgmlJob job;
  job.x = t.x;
  job.y = t.y;
  job.mask = t.mask;
  job.geometry = block_geometry(input.dim() == 0 ? 1 : input.size(-1), block_size);
  job.type = type;
  ggml_stub(input.device().type(), job);
  return {t.y, t.mask};
}

}  // namespace fakequant
