// Every operator's host function, registered for CPU and, in CUDA builds
// (setup.py defines FAKEQUANT_WITH_CUDA), for CUDA: the same function, which
// reaches the device's loop through the kernel table.
#include "fakequant/library.h"

#include "host.h"

namespace fakequant {
namespace {

void register_host_functions(torch::Library& m) {
  m.impl("fake_quantize_affine", &fake_quantize_affine);
  m.impl("fake_quantize_min_max", &fake_quantize_min_max);
  m.impl("fake_quantize_amax", &fake_quantize_amax);
  m.impl("quantize_amax", &quantize_amax);
  m.impl("fake_quantize_fp8", &fake_quantize_fp8);
  m.impl("fake_quantize_blockwise", &fake_quantize_blockwise);
  m.impl("fake_quantize_ggml", &fake_quantize_ggml);
  m.impl("fake_quantize_lsq", &fake_quantize_lsq);
  m.impl("fake_quantize_lsq_backward", &fake_quantize_lsq_backward);
  m.impl("mask_backward", &mask_backward);
  m.impl("fused_moving_avg_obs_fake_quant", &fused_moving_avg_obs_fake_quant);
}

}  // namespace

FAKEQUANT_LIBRARY_IMPL(CPU, m) { register_host_functions(m); }

#if defined(FAKEQUANT_WITH_CUDA)
FAKEQUANT_LIBRARY_IMPL(CUDA, m) { register_host_functions(m); }
#endif

#if defined(FAKEQUANT_EMULATION_LIBRARY)
// The emulation library's device (tests/emulator/simt_device.cpp): tensors that are
// not CPU tensors, so the host functions take their device branches.
FAKEQUANT_LIBRARY_IMPL(PrivateUse1, m) { register_host_functions(m); }
#endif

}  // namespace fakequant
