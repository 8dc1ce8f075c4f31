// The autograd formulas of the differentiable operators, in C++ under the
// Autograd key, so that a call costs the dispatcher and one autograd node and no
// Python: every fake-quant op's gradient is grad where its mask is set
// (mask_backward, with the forward output's strides, so that a packed mask's
// bits meet their elements), mask_backward's own is the same with its mask
// (double backward), and LSQ's is fake_quantize_lsq_backward's.
//
// Each forward calls the op below autograd (AutoDispatchBelowADInplaceOrView),
// which reaches the CPU or CUDA host function, or, under torch.compile/export
// tracing, the fake kernels of fakequant/ops/: the nodes' saved strides are
// SymInts for that reason.
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>

#include <string>

#include "fakequant/library.h"

namespace fakequant {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#define FAKEQUANT_STRINGIFY_IN(x) #x
#define FAKEQUANT_STRINGIFY(x) FAKEQUANT_STRINGIFY_IN(x)

// The operator `name` of this library (fakequant, or the emulation build's).
template <typename Signature>
c10::TypedOperatorHandle<Signature> op(const char* name) {
  const std::string qualified = std::string(FAKEQUANT_STRINGIFY(FAKEQUANT_NAMESPACE)) + "::" + name;
  return c10::Dispatcher::singleton().findSchemaOrThrow(qualified.c_str(), "").typed<Signature>();
}

using MaskBackwardSig = at::Tensor(const at::Tensor&, const at::Tensor&, at::OptionalSymIntArrayRef);

// The output `y` of a forward and its mask, kept for the backward.
void save_mask(AutogradContext* ctx, const at::Tensor& y, const at::Tensor& mask) {
  // No zeros are made for an output without a gradient (the backward takes an
  // undefined gradient). The mask (uint8 or bool) is not differentiable by its
  // dtype; marking it so as well would keep compiled autograd from taking the
  // node (CppNode::compiled_args asserts there is no such mark).
  ctx->set_materialize_grads(false);
  ctx->save_for_backward({mask});
  ctx->saved_data["strides"] = y.sym_strides();  // the memory order of the mask's bits
}

// grad where the saved mask is set, laid out with the forward output's strides,
// through the dispatcher with autograd, so that it is differentiable again.
variable_list backward_through_mask(AutogradContext* ctx, const at::Tensor& grad, size_t num_inputs) {
  static const auto mask_backward = op<MaskBackwardSig>("mask_backward");
  variable_list grads(num_inputs);
  if (!grad.defined()) return grads;
  const std::vector<c10::SymInt> strides = ctx->saved_data["strides"].toSymIntVector();
  grads[0] = mask_backward.call(grad, ctx->get_saved_variables()[0], at::OptionalSymIntArrayRef(strides));
  return grads;
}

// Whether a call records a node: grad mode on and a tensor argument requiring
// grad. Otherwise the Autograd kernels call the op directly, without building
// the node that torch::autograd::Function::apply would build (and drop).
inline bool requires_grad(const at::Tensor& t) { return t.defined() && t.requires_grad(); }
inline bool requires_grad(const std::optional<at::Tensor>& t) { return t.has_value() && requires_grad(*t); }
template <typename T>
inline bool requires_grad(const T&) { return false; }
template <typename... T>
bool records_node(const T&... args) {
  return at::GradMode::is_enabled() && (requires_grad(args) || ...);
}

// An operator returning (output, mask) whose gradient passes where the mask is
// set; `Op::name` names it, `Args` are its arguments after the input.
template <typename Op, typename... Args>
struct MaskedFunction : torch::autograd::Function<MaskedFunction<Op, Args...>> {
  using Signature = std::tuple<at::Tensor, at::Tensor>(const at::Tensor&, Args...);

  static std::tuple<at::Tensor, at::Tensor> call_below_autograd(const at::Tensor& input, Args... args) {
    static const auto handle = op<Signature>(Op::name);
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return handle.call(input, args...);
  }

  static variable_list forward(AutogradContext* ctx, const at::Tensor& input, Args... args) {
    auto [y, mask] = call_below_autograd(input, args...);
    save_mask(ctx, y, mask);
    return {y, mask};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return backward_through_mask(ctx, grads[0], 1 + sizeof...(Args));
  }

  // The Autograd kernel.
  static std::tuple<at::Tensor, at::Tensor> apply_op(const at::Tensor& input, Args... args) {
    if (!records_node(input, args...)) return call_below_autograd(input, args...);
    variable_list out = MaskedFunction::apply(input, args...);
    return {out[0], out[1]};
  }
};

struct Affine { static constexpr const char* name = "fake_quantize_affine"; };
struct Amax { static constexpr const char* name = "fake_quantize_amax"; };
struct QuantizeAmax { static constexpr const char* name = "quantize_amax"; };
struct MinMax { static constexpr const char* name = "fake_quantize_min_max"; };
struct Fp8 { static constexpr const char* name = "fake_quantize_fp8"; };
struct Blockwise { static constexpr const char* name = "fake_quantize_blockwise"; };
struct Ggml { static constexpr const char* name = "fake_quantize_ggml"; };

using AffineFunction = MaskedFunction<Affine, const at::Tensor&, const at::Tensor&,
                                      std::optional<int64_t>, int64_t, int64_t, bool>;
using AmaxFunction = MaskedFunction<Amax, const at::Tensor&, int64_t, bool, bool, bool>;
using QuantizeAmaxFunction = MaskedFunction<QuantizeAmax, const at::Tensor&, int64_t, bool, bool, bool>;
using MinMaxFunction = MaskedFunction<MinMax, const at::Tensor&, const at::Tensor&, int64_t>;
using Fp8Function = MaskedFunction<Fp8, const at::Tensor&, int64_t, int64_t, bool>;
using BlockwiseFunction = MaskedFunction<Blockwise, int64_t, int64_t, bool, bool, int64_t,
                                         const std::optional<at::Tensor>&, bool, bool, bool>;
using GgmlFunction = MaskedFunction<Ggml, int64_t, int64_t>;

// mask_backward: linear in grad, so its gradient is itself with the same mask.
struct MaskBackwardFunction : torch::autograd::Function<MaskBackwardFunction> {
  static at::Tensor call_below_autograd(const at::Tensor& grad, const at::Tensor& mask,
                                        at::OptionalSymIntArrayRef mask_strides) {
    static const auto handle = op<MaskBackwardSig>("mask_backward");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return handle.call(grad, mask, mask_strides);
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& grad, const at::Tensor& mask,
                            at::OptionalSymIntArrayRef mask_strides) {
    at::Tensor out = call_below_autograd(grad, mask, mask_strides);
    save_mask(ctx, out, mask);  // the output's layout is the one the mask's bits follow
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return backward_through_mask(ctx, grads[0], 3);
  }

  static at::Tensor apply_op(const at::Tensor& grad, const at::Tensor& mask,
                             at::OptionalSymIntArrayRef mask_strides) {
    if (!records_node(grad, mask)) return call_below_autograd(grad, mask, mask_strides);
    return apply(grad, mask, mask_strides);
  }
};

// LSQ/LSQ+: the backward reads the input, scale and zero point.
struct LsqFunction : torch::autograd::Function<LsqFunction> {
  static at::Tensor call_below_autograd(const at::Tensor& input, const at::Tensor& scale,
                                        const at::Tensor& zero_point, std::optional<int64_t> axis,
                                        int64_t quant_min, int64_t quant_max, double grad_factor) {
    static const auto handle =
        op<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, std::optional<int64_t>,
                      int64_t, int64_t, double)>("fake_quantize_lsq");
    at::AutoDispatchBelowADInplaceOrView below_autograd;
    return handle.call(input, scale, zero_point, axis, quant_min, quant_max, grad_factor);
  }

  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& input, const at::Tensor& scale,
                            const at::Tensor& zero_point, std::optional<int64_t> axis,
                            int64_t quant_min, int64_t quant_max, double grad_factor) {
    at::Tensor y = call_below_autograd(input, scale, zero_point, axis, quant_min, quant_max, grad_factor);
    ctx->set_materialize_grads(false);
    ctx->save_for_backward({input, scale, zero_point});
    ctx->saved_data["axis"] = axis;
    ctx->saved_data["quant_min"] = quant_min;
    ctx->saved_data["quant_max"] = quant_max;
    ctx->saved_data["grad_factor"] = grad_factor;
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    static const auto lsq_backward =
        op<std::tuple<at::Tensor, at::Tensor, at::Tensor>(
            const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
            std::optional<int64_t>, int64_t, int64_t, double)>("fake_quantize_lsq_backward");
    variable_list out(7);
    if (!grads[0].defined()) return out;
    const variable_list saved = ctx->get_saved_variables();
    const at::Tensor &input = saved[0], &scale = saved[1], &zero_point = saved[2];
    auto [grad_input, grad_scale, grad_zero_point] = lsq_backward.call(
        grads[0], input, scale, zero_point, ctx->saved_data["axis"].toOptional<int64_t>(),
        ctx->saved_data["quant_min"].toInt(), ctx->saved_data["quant_max"].toInt(),
        ctx->saved_data["grad_factor"].toDouble());
    if (ctx->needs_input_grad(0)) out[0] = grad_input;
    if (ctx->needs_input_grad(1)) out[1] = grad_scale.to(scale.scalar_type());
    // An integer zero point is fixed; a floating one is learned (LSQ+).
    if (ctx->needs_input_grad(2) && zero_point.is_floating_point()) {
      out[2] = grad_zero_point.to(zero_point.scalar_type());
    }
    return out;
  }

  static at::Tensor apply_op(const at::Tensor& input, const at::Tensor& scale,
                             const at::Tensor& zero_point, std::optional<int64_t> axis,
                             int64_t quant_min, int64_t quant_max, double grad_factor) {
    if (!records_node(input, scale, zero_point)) {
      return call_below_autograd(input, scale, zero_point, axis, quant_min, quant_max, grad_factor);
    }
    return apply(input, scale, zero_point, axis, quant_min, quant_max, grad_factor);
  }
};

}  // namespace

FAKEQUANT_LIBRARY_IMPL(Autograd, m) {
  m.impl("fake_quantize_affine", &AffineFunction::apply_op);
  m.impl("fake_quantize_amax", &AmaxFunction::apply_op);
  m.impl("quantize_amax", &QuantizeAmaxFunction::apply_op);
  m.impl("fake_quantize_min_max", &MinMaxFunction::apply_op);
  m.impl("fake_quantize_fp8", &Fp8Function::apply_op);
  m.impl("fake_quantize_blockwise", &BlockwiseFunction::apply_op);
  m.impl("fake_quantize_ggml", &GgmlFunction::apply_op);
  m.impl("fake_quantize_lsq", &LsqFunction::apply_op);
  m.impl("mask_backward", &MaskBackwardFunction::apply_op);
}

}  // namespace fakequant
