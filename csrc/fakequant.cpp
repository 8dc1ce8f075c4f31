// Every fakequant operator schema lives here; kernels register per backend in
// csrc/cpu and csrc/cuda. The numerics contract is in shared/DESIGN.md.
#include <Python.h>
#include <torch/library.h>

extern "C" {
// `import fakequant._C` only has to load this library so that the
// TORCH_LIBRARY blocks below run; the module itself is empty.
PyObject* PyInit__C(void) {
  static struct PyModuleDef module_def = {PyModuleDef_HEAD_INIT, "_C", nullptr, -1, nullptr};
  return PyModule_Create(&module_def);
}
}

TORCH_LIBRARY(fakequant, m) {
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
  m.def(
      "fake_quantize_amax(Tensor input, Tensor amax, int num_bits=8, bool unsigned=False, "
      "bool narrow_range=True) -> (Tensor output, Tensor mask)");

  // Same as fake_quantize_amax but returns the integer values rint(x / scale),
  // clamped, in input's dtype (what tensor_quant returns).
  m.def(
      "quantize_amax(Tensor input, Tensor amax, int num_bits=8, bool unsigned=False, "
      "bool narrow_range=True) -> (Tensor output, Tensor mask)");

  // pytorch-quantization's FakeAffineTensorQuantFunction: scale =
  // (max_range - min_range) / (2^num_bits - 1), zero point from min_range.
  // The mask (packed) marks min_range <= x <= max_range.
  m.def(
      "fake_quantize_min_max(Tensor input, Tensor min_range, Tensor max_range, int num_bits=8) "
      "-> (Tensor output, Tensor mask)");

  // grad where mask else 0. `mask` is either packed (uint8, one bit per element
  // of grad in memory order) or a bool tensor shaped like grad.
  m.def("mask_backward(Tensor grad, Tensor mask) -> Tensor");
}
