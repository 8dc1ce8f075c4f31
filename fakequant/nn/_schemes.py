"""The numeric paths of a :class:`~fakequant.nn.TensorQuantizer`, one small object each.

A quantizer holds two of them, chosen from its :class:`~fakequant.tensor_quant.QuantSpec`
when it is built (and again when the spec changes): a *path*, which says where amax
comes from and which operator runs, and a *value rule*, which turns a tensor and its
amax into the output. They hold no state of their own. A value rule reads the spec
only, and returns the output with the scale of real quantization (None otherwise),
which the quantizer keeps as pytorch-quantization's ``scale``; a path reads the
quantizer's spec (``q.spec``), its ``amax`` and ``clip``, and calls its methods that
compute amax.

Paths: :data:`AMAX` (one amax per tensor or per channel: calibrated, given or
dynamic), :data:`LEARNED` (the clip stage's learned range, LSQ gradient),
:data:`DYNAMIC_BLOCKS` (block-wise amax of each input, one pass of
``fake_quantize_blockwise``), :data:`STATIC_BLOCKS` (any block layout, amax per
block calibrated or computed). Value rules: :data:`FAKE_INTEGER`
(``fake_quantize_amax``), :data:`TORCH_NATIVE` (torch's
``fake_quantize_per_*_affine``, with ``TensorQuantizer.use_fb_fake_quant``),
:data:`FP8` (``scaled_e4m3``), :data:`REAL` (``tensor_quant``: integers and
``scale``).
"""
import torch

from .. import _core, ops
from ..tensor_quant import scale_in_input_dtype

__all__ = ["AMAX", "LEARNED", "DYNAMIC_BLOCKS", "STATIC_BLOCKS", "FAKE_INTEGER", "TORCH_NATIVE", "FP8", "REAL",
           "choose_path", "choose_values"]


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


class _FP8:
    """``scaled_e4m3`` (``fake_quantize_fp8``) with the quantizer's (E, M) format."""

    def __call__(self, spec, inputs, amax, check_values=True):
        return ops.fake_quantize_fp8(inputs, amax, *spec.num_bits, check_values=check_values), None


class _Real:
    """``tensor_quant`` (``quantize_amax``): the integers, and their scale in the input's
    dtype (the quantizer's ``scale``)."""

    def __call__(self, spec, inputs, amax, check_values=True):
        outputs, scale = ops.quantize_amax(inputs, amax, spec.num_bits, spec.unsigned, spec.narrow_range,
                                           check_values=check_values)
        return outputs, scale_in_input_dtype(scale, inputs, amax)


FAKE_INTEGER, TORCH_NATIVE, FP8, REAL = _FakeInteger(), _TorchNative(), _FP8(), _Real()


def choose_values(spec):
    """The value rule of a quantizer's spec (torch's own operators are chosen per
    call, by the class-wide ``use_fb_fake_quant`` switch)."""
    if isinstance(spec.num_bits, tuple):
        return FP8
    return FAKE_INTEGER if spec.fake_quant else REAL


# --- paths: (quantizer, inputs) -> outputs --------------------------------------------------


class _Amax:
    """One amax per tensor or per channel (``axis``): the ``_amax`` buffer, or each input's."""

    def __call__(self, q, inputs):
        return q._quantize(inputs, q._get_amax(inputs), check_values=not q._computes_amax())


class _Learned:
    """The learned range of the clip stage (``learn_amax``), with LSQ's gradient for amax
    (``TensorQuantizer.learn_amax_method``)."""

    def __call__(self, q, inputs):
        inputs = q.clip(inputs)
        clip_min, clip_max = q.clip.bounds()
        neg_min = -clip_min
        # (where, not maximum: the TorchScript ONNX exporter folds it into a constant scale)
        amax = torch.where(neg_min > clip_max, neg_min, clip_max)
        spec = q.spec
        if (type(q).learn_amax_method != "lsq" or choose_values(spec) is not FAKE_INTEGER
                or not torch.is_grad_enabled() or torch.onnx.is_in_onnx_export()):
            # (no gradient to compute: the amax operator, which exports with a constant scale)
            return q._quantize(inputs, amax.detach())
        qmin, qmax = _core.amax_range(spec.num_bits, spec.unsigned, spec.narrow_range)
        # The tiny-amax rule (docs/design.md): an amax <= AMAX_EPSILON quantizes to +0, as
        # the amax operator does. Scale 1 does that to the clipped inputs (|x| <= amax < 1/2
        # round to 0, and their gradient passes) and leaves the range the clip stage's
        # gradient only. (Divided by a tensor: the IEEE quotient the operator computes.)
        scale = torch.where(amax <= _core.AMAX_EPSILON, torch.ones_like(amax), _core.divide(amax, qmax))
        return ops.fake_quantize_lsq(inputs, scale, 0, None, qmin, qmax)


class _DynamicBlocks:
    """Dynamic blocks along one axis: ``fake_quantize_blockwise`` in one pass (integer or
    (E, M) elements; E4M3 block scales under a per-tensor one with ``BlockScales.E4M3``,
    E8M0 power-of-two ones with ``BlockScales.E8M0``); llama.cpp's Q8_0 / Q4_0 blocks,
    ``fake_quantize_ggml``, with ``BlockScales.GGML`` (the spec's ``scale_format``)."""

    def __call__(self, q, inputs):
        spec = q.spec
        axis, block_size = spec.kernel_block
        if block_size is None:  # the whole axis: one amax per row (per token)
            block_size = max(inputs.size(axis) if inputs.dim() else 1, 1)
        scale_format = spec.scale_format
        if scale_format is _core.BlockScales.GGML:  # llama.cpp's Q8_0 / Q4_0 blocks (the GGUF presets)
            return ops.fake_quantize_ggml(inputs, block_size, spec.num_bits, axis=axis)
        if isinstance(spec.num_bits, tuple):  # (E, M) elements: 1 + E + M bits
            e, m = spec.num_bits
            num_bits, exponent_bits = 1 + e + m, e
        else:
            num_bits, exponent_bits = spec.num_bits, 0
        scale_amax, computed = None, False
        e8m0 = scale_format is _core.BlockScales.E8M0  # the MX formats: power-of-two block scales, nothing calibrated
        if spec.scales_need_amax:
            # The per-tensor amax the E4M3 block scales are relative to: calibrated, or this input's.
            amax = q.amax
            if amax is not None and amax.numel() == 1:
                scale_amax = amax.detach().reshape(()).to(inputs.device)
            else:
                scale_amax, computed = q._tensor_amax(inputs), True
        return ops.fake_quantize_blockwise(inputs, block_size, num_bits, spec.unsigned, spec.narrow_range,
                                           exponent_bits, scale_amax, axis=axis, check_values=not computed,
                                           e8m0_scale=e8m0, centered=spec.centered)


class _StaticBlocks:
    """Any block layout (``block_sizes``): the input viewed as blocks, one amax per block
    (calibrated, or each input's when dynamic), quantized by the value rule."""

    def __call__(self, q, inputs):
        blocked, inner = q._blocked_view(inputs)
        amax = q._block_amax(blocked, inner)
        scale_amax = q.spec.scale_amax
        if scale_amax is not None:
            amax = amax * scale_amax
        return q._quantize(blocked, amax, check_values=not q._computes_amax()).reshape(inputs.shape)


AMAX, LEARNED, DYNAMIC_BLOCKS, STATIC_BLOCKS = _Amax(), _Learned(), _DynamicBlocks(), _StaticBlocks()


def choose_path(spec):
    """The path of a quantizer's spec."""
    if spec.learn_amax:
        return LEARNED
    if spec.block_sizes is not None:
        if spec.dynamic and spec.kernel_block is not None and spec.fake_quant:
            return DYNAMIC_BLOCKS
        return STATIC_BLOCKS
    return AMAX
