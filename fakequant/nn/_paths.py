"""The numeric paths of a :class:`~fakequant.nn.TensorQuantizer`, one small object each.

The quantizer computes, the paths transform. A quantizer holds two of them, chosen from its
:class:`~fakequant.tensor_quant.QuantSpec` when it is built (and again when the spec changes):
a *path*, which turns the input and the amax the quantizer computed for it into the output,
and a *value rule*, which turns a tensor and its amax into the output with the scale of real
quantization (None otherwise), which the quantizer keeps as pytorch-quantization's ``scale``.
They hold no state, and call nothing of the quantizer's: a path says which amax it needs
(``needs``), the quantizer computes it (``TensorQuantizer._path_amax``: from its buffer, its
clip stage or the input) and calls ``path(spec, inputs, amax, values, check_values)``, which
returns ``(outputs, scale or None)``.

Paths: :data:`AMAX` (one amax per tensor or per channel: calibrated, given or
dynamic), :data:`LEARNED` (the clip stage's learned range), :data:`DYNAMIC_BLOCKS`
(block-wise amax of each input, one pass of ``fake_quantize_blockwise``),
:data:`STATIC_BLOCKS` (any block layout, amax per block calibrated or computed). Value
rules: :data:`FAKE_INTEGER` (``fake_quantize_amax``), :data:`TORCH_NATIVE` (torch's
``fake_quantize_per_*_affine``, with ``TensorQuantizer.use_fb_fake_quant``), :data:`LSQ`
(``fake_quantize_lsq``: the learned range with LSQ's gradient, ``TensorQuantizer.learn_amax_method``),
:data:`FP8` (``scaled_e4m3``), :data:`REAL` (``tensor_quant``: integers and ``scale``).
"""
import torch

from .. import _core, ops
from ..ops import _vllm
from ..composite import rules
from ..tensor_quant import inverse_scale_in_input_dtype
from ._input_amax import blocked_view

__all__ = ["AMAX", "LEARNED", "DYNAMIC_BLOCKS", "STATIC_BLOCKS", "FAKE_INTEGER", "TORCH_NATIVE", "LSQ", "FP8",
           "REAL", "VLLM_FP8", "VLLM_INPUT_BLOCKS", "VLLM_WEIGHT_BLOCKS", "choose_path", "choose_values"]


# --- value rules: (spec, inputs, amax, check_values) -> (outputs, scale or None) -------------
#
# check_values=False when the quantizer computed amax from this input (dynamic amax):
# not user input, so the operators do not check it, and NaN or inf in the input give
# NaN outputs on every device (fakequant.ops).


class _FakeInteger:
    """``fake_quantize_amax`` with the quantizer's num_bits, unsigned and narrow_range."""

    def __call__(self, spec, inputs, amax, check_values=True):
        return ops.fake_quantize_amax(inputs, amax, spec.num_bits, spec.unsigned, spec.narrow_range,
                                      check_values=check_values), None


class _TorchNative:
    """torch's native fake quantization on the full integer range (exports to ONNX QDQ;
    torch's own checks of the scale apply whatever ``check_values`` says). An amax <=
    AMAX_EPSILON (a tensor, or a channel) gives the amax operator's output there: every
    element +0 (docs/design.md, the tiny-amax rule), which no scale of torch's gives."""

    def __call__(self, spec, inputs, amax, check_values=True):
        qmin, bound = _core.amax_range(spec.num_bits, spec.unsigned, narrow_range=False)
        if amax.numel() == 1:
            if float(amax) <= _core.AMAX_EPSILON:
                return FAKE_INTEGER(spec, inputs, amax, check_values)
            return torch.fake_quantize_per_tensor_affine(inputs, float(amax) / bound, 0, qmin, bound), None
        flat = amax.detach().squeeze()
        if flat.dim() != 1:
            raise ValueError(f"torch's per-channel fake quantization takes one axis; amax has shape {tuple(amax.shape)}")
        axis = list(amax.shape).index(flat.numel())
        flat = flat.float()
        degenerate = flat <= _core.AMAX_EPSILON
        scale = torch.where(degenerate, torch.ones_like(flat), _core.divide(flat, bound)).to(inputs.device)
        zero_point = torch.zeros_like(scale, dtype=torch.int32)
        outputs = torch.fake_quantize_per_channel_affine(inputs, scale, zero_point, axis, qmin, bound)
        if bool(degenerate.any()):
            outputs = torch.where(degenerate.to(inputs.device).reshape(amax.shape),
                                  FAKE_INTEGER(spec, inputs, amax, check_values)[0], outputs)
        return outputs, None


class _LSQ:
    """``fake_quantize_lsq`` on the quantizer's integer range, the scale from the learned
    range's amax (not detached: LSQ's gradient for amax)."""

    def __call__(self, spec, inputs, amax, check_values=True):
        qmin, qmax = _core.amax_range(spec.num_bits, spec.unsigned, spec.narrow_range)
        # The tiny-amax rule (docs/design.md): an amax <= AMAX_EPSILON quantizes to +0, as
        # the amax operator does. Scale 1 does that to the clipped inputs (|x| <= amax < 1/2
        # round to 0, and their gradient passes) and leaves the range the clip stage's
        # gradient only. (Divided by a tensor: the IEEE quotient the operator computes.)
        scale = torch.where(amax <= _core.AMAX_EPSILON, torch.ones_like(amax), _core.divide(amax, qmax))
        return ops.fake_quantize_lsq(inputs, scale, 0, None, qmin, qmax), None


class _FP8:
    """``scaled_e4m3`` (``fake_quantize_fp8``) with the quantizer's (E, M) format."""

    def __call__(self, spec, inputs, amax, check_values=True):
        return ops.fake_quantize_fp8(inputs, amax, *spec.num_bits, check_values=check_values), None


class _Real:
    """``tensor_quant`` (``quantize_amax``): the integers, and their scale in the input's
    dtype (the quantizer's ``scale``)."""

    def __call__(self, spec, inputs, amax, check_values=True):
        outputs, inverse_scale = ops.quantize_amax(inputs, amax, spec.num_bits, spec.unsigned, spec.narrow_range,
                                                   check_values=check_values)
        return outputs, inverse_scale_in_input_dtype(inverse_scale, inputs, amax)


class _VLLMFP8:
    """vLLM's per-tensor FP8 activations (``target="vllm"``): the input times the rounded
    reciprocal of the scale (``vllm_round_fp8_reciprocal``)."""

    def __call__(self, spec, inputs, amax, check_values=True):
        return _vllm.round_fp8_reciprocal(inputs, amax), None


FAKE_INTEGER, TORCH_NATIVE, LSQ, FP8, REAL = _FakeInteger(), _TorchNative(), _LSQ(), _FP8(), _Real()
VLLM_FP8 = _VLLMFP8()


def choose_values(spec, weight=False):
    """The value rule of a quantizer's spec (torch's own operators and LSQ are chosen per
    call, by the class-wide ``use_fb_fake_quant`` and ``learn_amax_method`` switches);
    ``weight``: the quantizer quantizes a weight (which a checkpoint stores: the target's
    activation rules do not apply)."""
    if isinstance(spec.num_bits, tuple):
        if (spec.target == "vllm" and not weight and spec.num_bits == (4, 3) and spec.axis is None
                and spec.block_sizes is None and not spec.learn_amax):
            return VLLM_FP8
        return FP8
    return FAKE_INTEGER if spec.fake_quant else REAL


# --- paths: (spec, inputs, amax, values, check_values) -> (outputs, scale or None) ----------
#
# ``needs`` names the amax the quantizer computes for the path (TensorQuantizer._path_amax).


class _Amax:
    """One amax per tensor or per channel (``axis``): the value rule on the input."""

    needs = "axis"  # the ``_amax`` buffer or each input's, per tensor or along ``axis``, times scale_amax

    def __call__(self, spec, inputs, amax, values, check_values):
        return values(spec, inputs, amax, check_values)


class _Learned:
    """The learned range of the clip stage (``learn_amax``): the value rule (LSQ while it
    learns) on the clipped input."""

    needs = "clip"  # the input clipped to the learned range, amax the larger magnitude of its bounds

    def __call__(self, spec, inputs, amax, values, check_values):
        return values(spec, inputs, amax, check_values)


class _DynamicBlocks:
    """Dynamic blocks along one axis: ``fake_quantize_blockwise`` in one pass (integer or
    (E, M) elements; E4M3 block scales under a per-tensor one with ``BlockScales.E4M3``,
    E8M0 power-of-two ones with ``BlockScales.E8M0``); llama.cpp's Q8_0 / Q4_0 blocks,
    ``fake_quantize_ggml``, with ``BlockScales.GGML`` (the spec's ``scale_format``). The
    operators compute the block amax; ``amax`` is the per-tensor one of E4M3 block scales."""

    needs = "tensor"  # E4M3 block scales: the per-tensor amax (calibrated, or each input's); else None

    def __call__(self, spec, inputs, amax, values, check_values):
        axis, block_size = spec.kernel_block
        if block_size is None:  # the whole axis: one amax per row (per token)
            block_size = max(inputs.size(axis) if inputs.dim() else 1, 1)
        scale_format = spec.scale_format
        if scale_format is _core.BlockScales.GGML:  # llama.cpp's Q8_0 / Q4_0 blocks (the GGUF presets)
            return ops.fake_quantize_ggml(inputs, block_size, spec.num_bits, axis=axis), None
        num_bits, exponent_bits = rules.block_element(spec.num_bits)  # (E, M) elements: 1 + E + M bits
        return ops.fake_quantize_blockwise(inputs, block_size, num_bits, spec.unsigned, spec.narrow_range,
                                           exponent_bits, amax, axis=axis, check_values=check_values,
                                           e8m0_scale=scale_format is _core.BlockScales.E8M0,
                                           centered=spec.centered), None


class _StaticBlocks:
    """Any block layout (``block_sizes``): the input viewed as blocks, quantized by the value
    rule with one amax per block."""

    needs = "blocks"  # one amax per block of the blocked view (calibrated, or each input's), times scale_amax

    def __call__(self, spec, inputs, amax, values, check_values):
        blocked, _ = blocked_view(spec, inputs)
        outputs, scale = values(spec, blocked, amax, check_values)
        return outputs.reshape(inputs.shape), scale


class _VLLMDynamicBlocks:
    """Dynamic blocks along one axis with vLLM's rules where they differ (``target="vllm"``,
    docs/serving.md): NVFP4's block scales under a dividing global scale (weights and
    activations), and for activations MX block scales rounded to the nearest power of two,
    per-token int8 times the rounded reciprocal of its scale, per-token FP8 with vLLM's floor
    on the scale. Everything else is :data:`DYNAMIC_BLOCKS`."""

    needs = "tensor"

    def __init__(self, weight):
        self.weight = weight

    def __call__(self, spec, inputs, amax, values, check_values):
        axis, block_size = spec.kernel_block
        per_token = block_size is None
        if per_token:
            block_size = max(inputs.size(axis) if inputs.dim() else 1, 1)
        num_bits, exponent_bits = rules.block_element(spec.num_bits)
        scale_format = spec.scale_format
        if scale_format is _core.BlockScales.E4M3 or (scale_format is _core.BlockScales.E8M0 and not self.weight):
            return _vllm.fake_quantize_blocks(inputs, block_size, num_bits, exponent_bits, scale_format, amax,
                                              axis=axis), None
        if per_token and scale_format is None and not self.weight:
            if exponent_bits == 0:
                return _vllm.round_int8_rows(inputs, axis), None
            return _vllm.fake_quantize_blocks(inputs, block_size, num_bits, exponent_bits, axis=axis), None
        return DYNAMIC_BLOCKS(spec, inputs, amax, values, check_values)


AMAX, LEARNED, DYNAMIC_BLOCKS, STATIC_BLOCKS = _Amax(), _Learned(), _DynamicBlocks(), _StaticBlocks()
VLLM_WEIGHT_BLOCKS, VLLM_INPUT_BLOCKS = _VLLMDynamicBlocks(weight=True), _VLLMDynamicBlocks(weight=False)


def _check_vllm(spec, weight):
    """Refuses what vLLM does not compute as the target's rules would have it."""
    if spec.scale_format is _core.BlockScales.GGML:
        raise ValueError("target='vllm': llama.cpp's blocks (the GGUF presets) are served by llama.cpp; "
                         "quantize them with target='onnx'")
    if spec.centered:
        raise NotImplementedError("target='vllm': asymmetric (max_min) per-token activations are not implemented")
    if (not weight and spec.dynamic and spec.kernel_block is not None and spec.kernel_block[1] is None
            and spec.scale_format is None):
        fp8 = spec.num_bits == (4, 3)
        if not (fp8 or (spec.num_bits == 8 and not spec.unsigned)):
            raise NotImplementedError(f"target='vllm': vLLM's per-token activations are signed int8 or FP8 E4M3, "
                                      f"got num_bits={spec.num_bits!r}, unsigned={spec.unsigned}")


def choose_path(spec, weight=False):
    """The path of a quantizer's spec (``weight``: see :func:`choose_values`)."""
    if spec.learn_amax:
        return LEARNED
    if spec.target == "vllm":
        _check_vllm(spec, weight)
    if spec.block_sizes is not None:
        if spec.dynamic and spec.kernel_block is not None and spec.fake_quant:
            if spec.target == "vllm":
                return VLLM_WEIGHT_BLOCKS if weight else VLLM_INPUT_BLOCKS
            return DYNAMIC_BLOCKS
        return STATIC_BLOCKS
    return AMAX
