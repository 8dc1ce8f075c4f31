"""Fingerprints of every operator configuration: outputs and gradients, bit for bit.

A restructuring that promises the same numbers proves it with two runs of this script, one
on the commit before and one after, and a comparison:

    python tools/op_fingerprint.py --out before.json        # on the old commit
    python tools/op_fingerprint.py --out after.json --compare before.json

and the CUDA kernels against the CPU kernels (make gpu-check):

    python tools/op_fingerprint.py --out cpu.json
    python tools/op_fingerprint.py --device cuda --out cuda.json --compare cpu.json

Each configuration (operator, dtype, layout, parameters; every preset's quantizers, calibrated,
forward and backward) runs on fixed inputs holding ties, zeros of both signs, values
beyond the range, NaN and +-inf where the operator takes them; the fingerprint is the
SHA-256 of the output's and the gradients' bytes, with every NaN hashed as one canonical NaN
(x86 and GPUs write different NaN payloads, and the contract promises NaN, not a payload; the
sign of zero and every other bit still count). Every random value (inputs, the presets' model
weights) comes from the CPU generator on the CPU and is then moved to the device, so that the
fingerprints of two devices describe the same computation. Only fakequant's public API is
called, so the script runs unchanged on older commits.
"""
import argparse
import hashlib
import itertools
import json
import sys

import torch

import fakequant
from fakequant import ops

DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16, "float64": torch.float64}


def _inputs(shape, dtype, special=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(shape, generator=g, dtype=torch.float64, device="cpu") * 3
    flat = x.view(-1)
    flat[::7] = torch.round(flat[::7] * 2) / 2  # halves: ties of scale-1 grids
    flat[1], flat[2] = 0.0, -0.0
    if special:
        flat[3], flat[4], flat[5] = float("nan"), float("inf"), -float("inf")
    return x.to(torch.get_default_device(), dtype)


def _layouts(x):
    yield "contiguous", x
    yield "transposed", x.t().contiguous().t()
    yield "sliced", torch.cat([x, x], dim=-1)[..., ::2]


# The one NaN each floating dtype is hashed as (the quiet NaN with a zero payload and sign).
CANONICAL_NAN = {torch.float16: (torch.int16, 0x7E00), torch.bfloat16: (torch.int16, 0x7FC0),
                 torch.float32: (torch.int32, 0x7FC00000), torch.float64: (torch.int64, 0x7FF8000000000000)}


def _canonical_bytes(t):
    """The bytes of ``t`` (on the CPU, contiguous), every NaN replaced by its dtype's canonical NaN."""
    t = t.detach().cpu().contiguous().reshape(-1)
    if t.dtype in CANONICAL_NAN:
        int_dtype, nan = CANONICAL_NAN[t.dtype]
        t = torch.where(t.isnan(), torch.tensor(nan, dtype=int_dtype, device=t.device), t.view(int_dtype))
    return t.view(torch.uint8).numpy().tobytes() if t.numel() else b""


def _digest(*tensors):
    h = hashlib.sha256()
    for t in tensors:
        if t is None:
            h.update(b"none")
            continue
        h.update(str((t.dtype, tuple(t.shape))).encode())
        h.update(_canonical_bytes(t))
    return h.hexdigest()[:24]


def _run(fn, x, *params):
    """Output, input gradient and parameter gradients of fn(x, *params)."""
    x = x.detach().clone().requires_grad_(x.is_floating_point())
    params = [p.detach().clone().requires_grad_() if isinstance(p, torch.Tensor) and p.is_floating_point()
              and getattr(p, "_learn", False) else p for p in params]
    y = fn(x, *params)
    grad = torch.arange(y.numel(), dtype=torch.float64).reshape(y.shape).remainder(5).sub(2).to(y.dtype)
    y.backward(grad)
    return _digest(y, x.grad, *[p.grad for p in params if isinstance(p, torch.Tensor) and p.requires_grad])


def _learn(t):
    t._learn = True
    return t


def _preset_model(preset):
    """A quantized two-layer MLP of ``preset``, on the CPU, its weights from the CPU generator
    (whatever the default device: CUDA's generator draws other numbers from the same seed)."""
    with torch.device("cpu"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(64, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))
        fakequant.quantize_model(model, preset=preset)
    return model


def cases():
    """(name, thunk) for every configuration."""
    shapes = {"2d": (8, 48)}
    for dtype_name, dtype in DTYPES.items():
        for layout, x in _layouts(_inputs(shapes["2d"], dtype)):
            key = f"{dtype_name}/{layout}"
            for bits, unsigned, narrow in itertools.product((2, 4, 8, 16), (False, True), (False, True)):
                xx = x.abs() if unsigned else x
                for per, amax in (("tensor", torch.tensor(2.5)), ("channel", torch.linspace(0.0, 4.0, 8).reshape(8, 1))):
                    name = f"fake_quantize_amax/{key}/{bits}b/u{int(unsigned)}/n{int(narrow)}/{per}"
                    yield name, lambda xx=xx, a=amax, b=bits, u=unsigned, n=narrow: _run(
                        lambda t: ops.fake_quantize_amax(t, a, b, u, n), xx)
                    yield "quantize_amax" + name[18:], lambda xx=xx, a=amax, b=bits, u=unsigned, n=narrow: _digest(
                        *ops.quantize_amax(xx.detach(), a, b, u, n))
            finite = torch.where(x.isfinite(), x, torch.zeros_like(x))
            for qmin, qmax, per in ((-128, 127, "tensor"), (0, 255, "channel"), (-8, 7, "channel"), (0, 65535, "tensor")):
                if per == "tensor":
                    scale, zp, axis = torch.tensor(0.1), torch.tensor(qmin // 2 + qmax // 4, dtype=torch.int32), None
                else:
                    scale = torch.linspace(0.05, 0.5, 8)
                    zp = torch.arange(8, dtype=torch.int32) % 3 + (qmin + qmax) // 2
                    axis = 0
                name = f"fake_quantize_affine/{key}/{qmin}..{qmax}/{per}"
                yield name, lambda x=x, s=scale, z=zp, a=axis, lo=qmin, hi=qmax: _run(
                    lambda t: ops.fake_quantize_affine(t, s, z, a, lo, hi), x)
                yield "lsq" + name[20:], lambda f=finite, s=scale, z=zp, a=axis, lo=qmin, hi=qmax: _run(
                    lambda t, s_: ops.fake_quantize_lsq(t, s_, z, a, lo, hi), f, _learn(s.clone()))
            for bits in (4, 8):
                name = f"fake_quantize_min_max/{key}/{bits}b"
                yield name, lambda x=x, b=bits: _run(
                    lambda t: ops.fake_quantize_min_max(t, torch.tensor(-2.0), torch.tensor(3.0), b), x)
            for e, m in ((4, 3), (5, 2), (3, 2), (2, 3)):
                for per, amax in (("tensor", torch.tensor(2.5)), ("channel", torch.linspace(0.0, 4.0, 8).reshape(8, 1))):
                    yield f"fake_quantize_fp8/{key}/E{e}M{m}/{per}", lambda x=x, a=amax, e=e, m=m: _run(
                        lambda t: ops.fake_quantize_fp8(t, a, e, m), x)
            if dtype == torch.float64:
                continue
            block_configs = [
                ("int8", dict(num_bits=8)), ("int4", dict(num_bits=4)), ("uint4", dict(num_bits=4, unsigned=True)),
                ("e2m1", dict(num_bits=4, exponent_bits=2)), ("e4m3", dict(num_bits=8, exponent_bits=4)),
                ("e5m2", dict(num_bits=8, exponent_bits=5)), ("e3m2", dict(num_bits=6, exponent_bits=3)),
                ("nvfp4", dict(num_bits=4, exponent_bits=2, scale_amax=torch.tensor(5.0))),
                ("mxfp4", dict(num_bits=4, exponent_bits=2, e8m0_scale=True)),
                ("mxfp8", dict(num_bits=8, exponent_bits=4, e8m0_scale=True)),
                ("mxint8", dict(num_bits=8, e8m0_scale=True)),
                ("centered8", dict(num_bits=8, centered=True)),
            ]
            for (label, kw), block, axis in itertools.product(block_configs, (16, 32, 7), (-1, 0)):
                xx = finite if label == "centered8" else x
                yield f"fake_quantize_blockwise/{key}/{label}/b{block}/axis{axis}", lambda xx=xx, kw=kw, b=block, a=axis: _run(
                    lambda t: ops.fake_quantize_blockwise(t, b, axis=a, **kw), xx)
            # llama.cpp's blocks (GGUF: blocks of 32; 16 and a ragged 7 as well)
            if hasattr(ops, "fake_quantize_ggml"):
                for bits, block, axis in itertools.product((8, 4), (32, 16, 7), (-1, 0)):
                    yield f"fake_quantize_ggml/{key}/q{bits}/b{block}/axis{axis}", lambda b=block, n=bits, a=axis, x=x: _run(
                        lambda t: ops.fake_quantize_ggml(t, b, n, a), x)
    # torch's drop-ins and the fused observer
    x = _inputs((8, 48), torch.float32, special=False)
    yield "fake_quantize_per_tensor_affine", lambda: _run(
        lambda t: ops.fake_quantize_per_tensor_affine(t, 0.1, 3, -128, 127), x)
    yield "fake_quantize_per_channel_affine", lambda: _run(
        lambda t: ops.fake_quantize_per_channel_affine(t, torch.linspace(0.05, 0.5, 8), torch.arange(8, dtype=torch.int32),
                                                       0, 0, 255), x)
    for per_row, symmetric in itertools.product((False, True), (False, True)):
        def observed(per_row=per_row, symmetric=symmetric):
            channels = 8 if per_row else 1
            state = [torch.tensor([1], dtype=torch.long), torch.tensor([1], dtype=torch.long),
                     torch.full((channels,), float("inf")), torch.full((channels,), -float("inf")),
                     torch.ones(channels), torch.zeros(channels, dtype=torch.int32)]
            outs = []
            for step in range(3):
                xi = _inputs((8, 48), torch.float32, special=False, seed=step)
                outs.append(ops.fused_moving_avg_obs_fake_quant(xi, *state, 0.01, -128, 127, 0, per_row, symmetric))
            return _digest(*outs, *state[2:])
        yield f"fused_moving_avg_obs_fake_quant/row{int(per_row)}/sym{int(symmetric)}", observed
    # a learned range (LSQ's and PACT's gradients) and torch's native fake quantization,
    # at ordinary and at tiny amax (the tiny-amax rule: docs/numerics.md)
    from fakequant.nn import TensorQuantizer
    from fakequant.tensor_quant import QuantDescriptor

    for method, amax in itertools.product(("lsq", "pact"), (1.5, 2.0**-30)):
        def learned(method=method, amax=amax):
            previous, TensorQuantizer.learn_amax_method = TensorQuantizer.learn_amax_method, method
            try:
                q = TensorQuantizer(QuantDescriptor(num_bits=8, learn_amax=True, amax=1.0))
                q.enable_clip()
                with torch.no_grad():
                    q.clip.clip_value_min.fill_(-amax)
                    q.clip.clip_value_max.fill_(amax)
                xi = (x * amax).requires_grad_()
                y = q(xi)
                y.backward(torch.ones_like(y))
                return _digest(y, xi.grad, q.clip.clip_value_min.grad, q.clip.clip_value_max.grad)
            finally:
                TensorQuantizer.learn_amax_method = previous
        yield f"learned_amax/{method}/{amax}", learned
    for amax in (torch.tensor(2.5), torch.tensor([0.0, 1.0, 2.0, 0.5, 1.0, 2.0, 3.0, 4.0]).reshape(8, 1)):
        def native(amax=amax):
            q = TensorQuantizer(QuantDescriptor(num_bits=8, axis=0 if amax.numel() > 1 else None, amax=amax))
            previous, TensorQuantizer.use_fb_fake_quant = TensorQuantizer.use_fb_fake_quant, True
            try:
                return _run(q, x)
            finally:
                TensorQuantizer.use_fb_fake_quant = previous
        yield f"use_fb_fake_quant/{amax.numel()}", native
    # every preset's quantizers, as its quantized Linear layers hold them: calibrated on fixed
    # inputs, then forward and backward of each quantizer alone. Not the layers' outputs: a
    # matrix product sums in another order on each device (cuBLAS against the CPU's BLAS), so
    # that it and every quantizer after it would differ for reasons that are not fakequant's.
    # (fakequant.presets before it moved: this script runs on older commits too)
    presets = fakequant.models.presets if hasattr(fakequant, "models") else fakequant.presets
    for preset in sorted(presets.PRESETS):
        yield f"preset/{preset}", lambda preset=preset: _preset_quantizers(preset, "max")
    # the histogram calibrators (collected on the device, searched on the CPU), per tensor
    for method in ("entropy", "mse", "percentile"):
        yield f"calibrate/{method}/INT8", lambda method=method: _preset_quantizers("INT8", method)


def _preset_quantizers(preset, method):
    model = _preset_model(preset).to(torch.get_default_device())
    layers = [m for m in model.modules() if hasattr(m, "input_quantizer") and hasattr(m, "weight_quantizer")]
    tensors = []
    for i, layer in enumerate(layers):
        data = [_inputs((16, layer.in_features), torch.float32, special=False, seed=10 * i + s) for s in range(2)]
        # each layer alone: its input quantizer sees these inputs, not the product of the layer before
        fakequant.calibrate(layer, data, method=method, progress=False)
        x = _inputs((4, layer.in_features), torch.float32, special=False, seed=10 * i + 9).requires_grad_()
        qx, qw = layer.input_quantizer(x), layer.weight_quantizer(layer.weight)
        gx = _inputs(tuple(qx.shape), torch.float32, special=False, seed=10 * i + 7)
        gw = _inputs(tuple(qw.shape), torch.float32, special=False, seed=10 * i + 8)
        torch.autograd.backward([qx, qw], [gx, gw])
        tensors += [qx, qw, x.grad, layer.weight.grad]
        tensors += [t.grad for t in layer.parameters() if t is not layer.weight and t.grad is not None]
        tensors += [t for name, t in layer.named_buffers() if "amax" in name]
    return _digest(*tensors)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="where to write the fingerprints (JSON)")
    parser.add_argument("--compare", help="fingerprints of another commit: exit 1 on any difference")
    parser.add_argument("--device", default="cpu", help="where the operators run (cpu, cuda); the fingerprints "
                        "are of the values, so that two devices compare")
    args = parser.parse_args()
    torch.set_default_device(args.device)
    prints = {}
    for name, thunk in cases():
        try:
            prints[name] = thunk()
        except Exception as e:  # an operator that refuses a configuration: its message is the fingerprint
            prints[name] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
    with open(args.out, "w") as f:
        json.dump(prints, f, indent=0, sort_keys=True)
    print(f"{len(prints)} configurations of {fakequant.__file__} on {args.device} -> {args.out}")
    if args.compare:
        with open(args.compare) as f:
            other = json.load(f)
        differ = sorted(k for k in prints.keys() & other.keys() if prints[k] != other[k])
        only = sorted(prints.keys() ^ other.keys())
        for k in differ:
            print(f"DIFFERS {k}: {other[k]} -> {prints[k]}")
        for k in only:
            print(f"ONLY IN ONE {k}")
        print(f"{len(prints.keys() & other.keys()) - len(differ)} identical, {len(differ)} differ, {len(only)} in one run only")
        return 1 if differ or only else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
