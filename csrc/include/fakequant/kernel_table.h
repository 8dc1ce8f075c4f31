#pragma once
// The per-device kernel table: what a host function (csrc/ops) hands to a
// backend, and one function-pointer slot per op family that each backend fills
// by static registration (csrc/cpu/*.cpp, csrc/cuda/*.cu):
//
//   FAKEQUANT_REGISTER_KERNEL(quantize_stub, CPU, &quantize_cpu);
//
// The host function has done the checks, the parameter handling, the
// allocation and the layout; the job holds dense tensors and the rule's
// parameters, and the slot runs the loop or launches the kernel. A slot is
// constant-initialised (null pointers), so registration from another
// translation unit's static initialisers needs no ordering.
#include <ATen/core/Tensor.h>

#include <variant>

#include "contract.h"
#include "ggml.h"
#include "param_layout.h"

namespace fakequant {

// --- the jobs ---------------------------------------------------------------------------------------

// The forward of the affine, min/max and amax families: y = rule(x), x dense with
// y's strides; the mask packed (uint8), bool (shaped like y) or undefined (none).
// The family (with pointers to its contiguous parameters, on x's device) makes
// the constants of parameter j; layout maps element e in memory order to j.
struct QuantizeJob {
  at::Tensor x, y, mask;
  ParamLayout layout;
  int64_t num_params = 1;
  std::variant<AffineFamily, MinMaxFamily, AmaxFamily> family;
  Format format = Format::kInt;
  Output output = Output::kFake;
  MaskOut mask_out = MaskOut::kPacked;
};

// fake_quantize_blockwise: x dense with y's strides and rows of the last
// dimension runs of memory; mask packed (ceil(n / 8) bytes, a fresh allocation).
struct BlockwiseJob {
  at::Tensor x, y, mask;
  BlockGeometry geometry;
  Format format = Format::kInt;  // of the elements
  BlockRule<float> rule{};   // in float32; the loops convert to the compute type
  BlockScaleRule scale{BlockScale::kFloat32, 0.0f, 0};
  ParamPtr scale_amax{nullptr, ParamType::kFloat};  // kE4M3 scales: its one value
  bool centered = false;  // blocks quantized about their centre (contract.h)
};

// fake_quantize_ggml: x dense with y's strides and rows of the last dimension runs of
// memory (as BlockwiseJob's); mask packed (ceil(n / 8) bytes, a fresh allocation).
struct GgmlJob {
  at::Tensor x, y, mask;
  BlockGeometry geometry;
  GgmlType type = GgmlType::kQ8_0;
};

// fake_quantize_lsq_backward: x, grad and grad_input dense with one layout,
// walked as [outer][channels][inner]; grad_scale and grad_zero_point float32,
// one element per channel.
struct LsqBackwardJob {
  at::Tensor x, grad, grad_input, grad_scale, grad_zero_point;
  ChannelShape shape;
  AffineFamily family;
  double grad_factor = 1.0;
};

// fused_moving_avg_obs_fake_quant's observer, per channel i < num_channels (1 per
// tensor): where *observer_on, running_min/max[i] move toward the batch's
// x_min/x_max[i]; then where *fake_quant_on, scale[i] and zero_point[i] are chosen
// from the running range. running_min/max, x_min/x_max, scale float32 and
// zero_point int32, all contiguous; the flags are read on the device.
struct ObserverJob {
  at::Tensor x_min, x_max, running_min, running_max, scale, zero_point;
  ParamPtr observer_on{nullptr, ParamType::kFloat};
  ParamPtr fake_quant_on{nullptr, ParamType::kFloat};
  int64_t num_channels = 1;
  float averaging_const = 0.01f;
  int64_t quant_min = 0, quant_max = 255;
  bool symmetric = false;
};

// --- the slots ---------------------------------------------------------------------------------------

using QuantizeFn = void(const QuantizeJob&);
using BlockwiseFn = void(const BlockwiseJob&);
using GgmlFn = void(const GgmlJob&);
using LsqBackwardFn = void(const LsqBackwardJob&);
using ObserverFn = void(const ObserverJob&);
// out = grad where mask else +0; grad and out dense with one layout, mask packed
// (contiguous) or bool (with grad's strides).
using MaskBackwardFn = void(const at::Tensor& grad, const at::Tensor& mask, at::Tensor& out);
// Whether the current stream of `device` is being captured into a graph (then
// nothing may synchronise, so value checks are skipped). CUDA only.
using CapturingFn = bool(const c10::Device& device);

template <typename Fn>
class KernelSlot {
 public:
  constexpr explicit KernelSlot(const char* name) : name_(name) {}

  void set(c10::DeviceType type, Fn* fn) {
    TORCH_INTERNAL_ASSERT(type == c10::DeviceType::CPU || type == c10::DeviceType::CUDA);
    (type == c10::DeviceType::CPU ? cpu_ : cuda_) = fn;
  }

  Fn* get(c10::DeviceType type) const {
#if defined(FAKEQUANT_EMULATION_LIBRARY)
    // The emulation library (tools/emulate.py) has no CPU loops: its CPU tensors and
    // its emulated device's (PrivateUse1, tests/emulator/simt_device.cpp) run the
    // CUDA slots, the CUDA kernels on the SIMT emulator.
    Fn* fn = type == c10::DeviceType::CPU || type == c10::DeviceType::PrivateUse1 ? cuda_ : nullptr;
#else
    Fn* fn = type == c10::DeviceType::CPU ? cpu_ : (type == c10::DeviceType::CUDA ? cuda_ : nullptr);
#endif
    TORCH_CHECK(fn != nullptr, "fakequant: no ", name_, " kernel for ", type,
                " tensors in this build");
    return fn;
  }

  template <typename... Args>
  decltype(auto) operator()(c10::DeviceType type, Args&&... args) const {
    return get(type)(std::forward<Args>(args)...);
  }

 private:
  const char* name_;
  Fn* cpu_ = nullptr;
  Fn* cuda_ = nullptr;
};

// Defined in csrc/ops/common.cpp.
extern KernelSlot<QuantizeFn> quantize_stub;
extern KernelSlot<BlockwiseFn> blockwise_stub;
extern KernelSlot<GgmlFn> ggml_stub;
extern KernelSlot<LsqBackwardFn> lsq_backward_stub;
extern KernelSlot<ObserverFn> observer_stub;
extern KernelSlot<MaskBackwardFn> mask_backward_stub;
extern KernelSlot<CapturingFn> capturing_stub;

template <typename Fn>
struct KernelRegistration {
  KernelRegistration(KernelSlot<Fn>& slot, c10::DeviceType type, Fn* fn) { slot.set(type, fn); }
};

#define FAKEQUANT_REGISTER_KERNEL(slot, device, fn)                                 \
  static const ::fakequant::KernelRegistration C10_ANONYMOUS_VARIABLE(registration_)( \
      ::fakequant::slot, c10::DeviceType::device, fn)

}  // namespace fakequant
