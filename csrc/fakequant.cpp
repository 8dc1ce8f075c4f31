// Every fakequant operator schema lives here; kernels register per backend in
// csrc/cpu and csrc/cuda; the Python module itself is csrc/python_module.cpp.
// The numerics contract is in docs/design.md.
#include "fakequant/library.h"

FAKEQUANT_LIBRARY(m) {
  // y = (clamp(rint(x / scale) + zp, quant_min, quant_max) - zp) * scale.
  // Per-tensor when axis is None (scale and zero_point hold one element),
  // per-channel along `axis` otherwise. The mask marks elements whose
  // rint(x / scale) + zp lies in [quant_min, quant_max]; it is packed at one bit
  // per element in the memory order of y (pack_mask=True), or a bool tensor
  // shaped like y.
  m.def(
      "fake_quantize_affine(Tensor input, Tensor scale, Tensor zero_point, int? axis, "
      "int quant_min, int quant_max, bool pack_mask=True) -> (Tensor output, Tensor mask)");

  // pytorch-quantization semantics: scale = amax / bound with
  // bound = 2^(num_bits - 1 + unsigned) - 1; amax broadcasts to input.
  // The mask (packed) marks |x| <= amax, the STE-with-clipping window.
  // check_values=False (here and below) is for an amax (scale_amax) that fakequant
  // computed itself from the input, not given by the user: its values are not
  // checked on any device, and a NaN or infinite one gives NaN outputs and a zero
  // mask where it applies, the same everywhere (as CUDA without value checks).
  m.def(
      "fake_quantize_amax(Tensor input, Tensor amax, int num_bits=8, bool unsigned=False, "
      "bool narrow_range=True, bool check_values=True) -> (Tensor output, Tensor mask)");

  // Same as fake_quantize_amax but returns the integer values rint(x / scale),
  // clamped, in input's dtype (what tensor_quant returns).
  m.def(
      "quantize_amax(Tensor input, Tensor amax, int num_bits=8, bool unsigned=False, "
      "bool narrow_range=True, bool check_values=True) -> (Tensor output, Tensor mask)");

  // pytorch-quantization's FakeAffineTensorQuantFunction: scale =
  // (max_range - min_range) / (2^num_bits - 1), zero point from min_range.
  // The mask (packed) marks min_range <= x <= max_range.
  m.def(
      "fake_quantize_min_max(Tensor input, Tensor min_range, Tensor max_range, int num_bits=8) "
      "-> (Tensor output, Tensor mask)");

  // grad where mask else 0. `mask` is either packed (uint8, one bit per element
  // of the output in memory order) or a bool tensor shaped like grad. The output
  // is laid out with mask_strides (the forward output's strides, so that a packed
  // mask's bits meet their elements whatever layout grad arrives in), or like grad.
  m.def("mask_backward(Tensor grad, Tensor mask, SymInt[]? mask_strides=None) -> Tensor");

  // FP8 (E4M3 with exponent_bits=4, mantissa_bits=3; E5M2 with 5, 2) and FP6 (E3M2:
  // 3, 2; E2M3: 2, 3): y = fmt(clamp(x / scale, -max, max)) * scale with scale = amax
  // / max (max 448, 57344, 28, 7.5), fmt() rounding to nearest even as torch's float8 casts do;
  // amax broadcasts to input as in fake_quantize_amax, amax <= 2^-24 gives 0. The
  // mask (packed) marks |x| <= amax.
  m.def(
      "fake_quantize_fp8(Tensor input, Tensor amax, int exponent_bits=4, int mantissa_bits=3, "
      "bool check_values=True) -> (Tensor output, Tensor mask)");

  // Block-wise dynamic quantization: blocks of block_size consecutive elements
  // along the last dimension (the last block of each row may be shorter), each
  // quantized with its own amax = max |x| over the block, computed in the same pass.
  // Elements are integers (exponent_bits=0: num_bits, unsigned, narrow_range as in
  // fake_quantize_amax) or floats with 1 + exponent_bits + mantissa bits = num_bits
  // (E2M1: num_bits=4, exponent_bits=2; E3M2: 6, 3; E2M3: 6, 2; E4M3: 8, 4; E5M2: 8, 5).
  // With scale_amax (one element) the block scales are themselves quantized to E4M3
  // against the per-tensor scale scale_amax / (max_element * 448) (NVFP4's two-level
  // scales). With e8m0_scale the block scales are powers of two, 2^(floor(log2(amax))
  // - emax) as the OCP microscaling (MX) specification derives them (emax: the
  // element format's largest exponent; num_bits - 2 for integers, MXINT8's 2^-6 grid).
  // With centered each block is quantized about its centre b = max / 2 + min / 2:
  // y = q(x - b) + b, the block's amax that of x - b (per-token asymmetric activations).
  // The mask (packed) marks elements that rounding did not saturate: rint(x / scale)
  // in the integer range, or |x / scale| <= max + half the top step for floats.
  m.def(
      "fake_quantize_blockwise(Tensor input, int block_size, int num_bits=8, "
      "bool unsigned=False, bool narrow_range=True, int exponent_bits=0, "
      "Tensor? scale_amax=None, bool check_values=True, bool e8m0_scale=False, "
      "bool centered=False) -> "
      "(Tensor output, Tensor mask)");

  // llama.cpp's Q8_0 (num_bits=8) and Q4_0 (num_bits=4) blocks: block_size consecutive
  // elements along the last dimension (the last block of each row may be shorter), quantized
  // and dequantized by ggml's reference rule (csrc/include/fakequant/ggml.h), not the
  // contract of the ops above. The mask (packed) marks elements whose output is finite and,
  // for Q4_0, whose code did not saturate.
  m.def("fake_quantize_ggml(Tensor input, int block_size=32, int num_bits=8) -> (Tensor output, Tensor mask)");

  // Learned step size (LSQ, and LSQ+ with a learned zero point): the forward is
  // fake_quantize_affine's output; the backward (fake_quantize_lsq_backward, with
  // grad_factor) needs the input, not a mask.
  m.def(
      "fake_quantize_lsq(Tensor input, Tensor scale, Tensor zero_point, int? axis, "
      "int quant_min, int quant_max, float grad_factor=1.0) -> Tensor");

  // The LSQ/LSQ+ gradients, with r = rint(x / scale) and q = r + zp:
  //   grad_input  = grad where quant_min <= q <= quant_max, else 0;
  //   grad_scale  = grad_factor * sum(grad * (r - x / scale) inside,
  //                                   (quant_min - zp) below, (quant_max - zp) above);
  //   grad_zero_point = grad_factor * sum(grad * -scale outside, 0 inside);
  // summed per tensor (axis None) or per channel of `axis`, inside the kernel.
  // grad_scale is float32 shaped like scale, grad_zero_point float32 shaped like
  // zero_point.
  m.def(
      "fake_quantize_lsq_backward(Tensor grad, Tensor input, Tensor scale, Tensor zero_point, "
      "int? axis, int quant_min, int quant_max, float grad_factor) "
      "-> (Tensor grad_input, Tensor grad_scale, Tensor grad_zero_point)");

  // torch.fused_moving_avg_obs_fake_quant: where observer_on, the running min/max
  // (per tensor, or per channel of ch_axis with per_row_fake_quant) move toward
  // this batch's by averaging_const; where fake_quant_on, scale and zero_point are
  // chosen from them and input is fake-quantized with them (else output = input,
  // mask all set). The buffers are updated in place; the flags are read on the
  // device. The mask is packed as fake_quantize_affine's.
  m.def(
      "fused_moving_avg_obs_fake_quant(Tensor input, Tensor observer_on, Tensor fake_quant_on, "
      "Tensor(a!) running_min, Tensor(b!) running_max, Tensor(c!) scale, Tensor(d!) zero_point, "
      "float averaging_const, int quant_min, int quant_max, int ch_axis, "
      "bool per_row_fake_quant=False, bool symmetric_quant=False) -> (Tensor output, Tensor mask)");
}
