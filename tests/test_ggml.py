"""fake_quantize_ggml's CPU operator (csrc/cpu/ggml.cpp, the rule of csrc/include/fakequant/ggml.h)
against the plain-PyTorch rule (fakequant.composite.rules.fake_quantize_ggml), bit for bit:
outputs (the sign of zero included; NaN where NaN) and masks, every dtype, block sizes and
row lengths of every kind, the corner cases of the rule, strided inputs and the gradient.
(llama.cpp's own numpy rule against the plain-PyTorch one: tests/test_serve_gguf.py. The table's
cross-cutting tests take the operator too: tests/op_table.py.)"""
import pytest
import torch

import fakequant
import reference as ref
from conftest import DTYPES, assert_same

ops = torch.ops.fakequant
TYPES = {"Q8_0": 8, "Q4_0": 4}


def hard_blocks(block_size=32):
    """Rows of one block each where the rule's details show: halves of x / d (Q8_0 rounds them
    away from zero), x / d + 8.5 rounding in float32 (Q4_0), equal magnitudes of both signs at
    different places (Q4_0 takes the first: in one lane of a vector or in two), zeros of both
    signs, NaN and +-inf, float32-subnormal blocks (1 / d overflows), blocks whose d underflows
    in float16 or rounds to a float16 subnormal or overflows it, and Q4_0 saturation."""
    B = block_size

    def row(head, fill=0.0):
        t = torch.full((B,), fill, dtype=torch.float64)
        head = torch.tensor(head, dtype=torch.float64)[:B]
        t[: len(head)] = head
        return t

    g = torch.Generator().manual_seed(3)
    rows = [
        row([127.0] + [k - 15.5 for k in range(31)]),  # d = 1: ties
        row([-8.0, 0.49999997, -0.49999997, 0.5, -0.5, 1.5, 7.4999995, 7.5, -7.5]),
        row([3.0, -3.0, 1.0, -1.0]),  # ties of |x|, the positive first
        row([-3.0, 3.0, -2.9]),  # the negative first
        row([1.0, 2.0, 0.5, 0.25, 1.0, 2.0, -2.0, -2.0] * 4),  # a tie in a later vector
        row([0.0] * B),
        row([-0.0] * B),
        row([-0.0, 0.0] * (B // 2 + 1)),
        row([1.0, -1.0], fill=-0.0),
        row([float("nan"), 1.0, 2.0]),
        row([1.0, float("inf"), 2.0]),
        row([-float("inf"), 1.0, -2.0]),
        row([1e-40, -3e-41, 2e-45]),  # float32 subnormals: 1 / d overflows
        row([1e-38, -5e-39]),
        row([3e-6, -1e-6, 2e-6]),  # d underflows to 0 in float16 (Q4_0: 3e-6 / 8)
        row([1e-3, -4e-4, 5e-4]),  # d a float16 subnormal
        row([8.4e6, -1e6]),  # d above float16's max: +-inf
        row([-1.0, 0.93, 0.9375, 0.95, 1.0]),  # Q4_0: the positive ones saturate
        row([2.0, -1.876, -1.874]),
        row([]) + torch.randn(B, generator=g, dtype=torch.float64) * 1e4,
        torch.randn(B, generator=g, dtype=torch.float64),
    ]
    return torch.stack(rows)


def check(x, block_size, num_bits):
    """The operator against the rule: output and mask, bit for bit."""
    y, packed = ops.fake_quantize_ggml(x, block_size, num_bits)
    ey, emask = ref.fake_quantize_ggml(x, block_size, num_bits)
    assert_same(y, ey)
    assert_same(fakequant.unpack_mask(packed, y), emask)
    assert packed.numel() == (x.numel() + 7) // 8
    return y, packed


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("block_size", [32, 16, 8, 7, 33])
def test_corner_cases(block_size, kind, dtype):
    x = hard_blocks(block_size).to(dtype)
    check(x, block_size, TYPES[kind])
    check(x.reshape(-1), block_size, TYPES[kind])  # one row of many blocks


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", TYPES)
@pytest.mark.parametrize("block_size", [1, 2, 3, 5, 16, 31, 32, 33, 64, 100, 256, 1000])
@pytest.mark.parametrize("row", [1, 7, 32, 37, 64, 200, 1001])
def test_block_sizes_and_rows(row, block_size, kind, dtype):
    # whole blocks or a short last one per row, blocks longer than the row (one short block)
    g = torch.Generator().manual_seed(row * 1000 + block_size)
    x = (torch.randn(5, row, generator=g, dtype=torch.float64) * 3).to(dtype)
    check(x, block_size, TYPES[kind])


@pytest.mark.parametrize("kind", TYPES)
def test_long_blocks_and_rows(kind):
    # tiles of whole rows above the CPU loop's limit: the blocks' constants first, then tiles
    g = torch.Generator().manual_seed(5)
    x = torch.randn(3, 70001, generator=g) * 2
    x[1, 40000] = 50.0
    x[2, 69999] = -50.0
    for block_size in (70001, 30000, 32, 4099):
        check(x, block_size, TYPES[kind])
    check(torch.randn(4099, 33, generator=g), 32, TYPES[kind])  # many ragged rows, several tasks


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", TYPES)
def test_layouts(kind, dtype):
    g = torch.Generator().manual_seed(7)
    base = (torch.randn(6, 8, 40, generator=g, dtype=torch.float64) * 2).to(dtype)
    for x in (base, base.transpose(0, 1), base[:, :, 3:], base[::2], base.transpose(1, 2), base[..., ::3],
              base.reshape(-1)[5:], torch.tensor(1.5, dtype=dtype), base[:0]):
        y, _ = check(x, 32, TYPES[kind])
        assert y.shape == x.shape


@pytest.mark.parametrize("kind", TYPES)
def test_wrapper_axis_and_gradient(kind):
    g = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 64, 3, generator=g) * 2).requires_grad_()
    y = fakequant.ops.fake_quantize_ggml(x, 32, TYPES[kind], axis=1)
    moved = x.detach().movedim(1, -1)
    ey, emask = ref.fake_quantize_ggml(moved, 32, TYPES[kind])
    assert_same(y, ey.movedim(-1, 1))
    grad = torch.randn(x.shape, generator=g)
    y.backward(grad)
    assert_same(x.grad, torch.where(emask.movedim(-1, 1), grad, torch.zeros(())))


def test_other_float_dtypes_take_the_rule():
    # float8 (no kernel of the operator): the plain-PyTorch rule, as before the operator
    x = (torch.randn(4, 32) * 2).to(torch.float8_e4m3fn)
    y = fakequant.ops.fake_quantize_ggml(x, 32, 4)
    assert y.dtype == x.dtype
    assert torch.equal(y.view(torch.uint8), ref.fake_quantize_ggml(x, 32, 4)[0].view(torch.uint8))


def test_errors_name_the_argument():
    x = torch.randn(32)
    with pytest.raises(ValueError, match="block_size"):
        ops.fake_quantize_ggml(x, 0, 8)
    with pytest.raises(ValueError, match="num_bits"):
        ops.fake_quantize_ggml(x, 32, 6)
    with pytest.raises(TypeError, match="input"):
        ops.fake_quantize_ggml(torch.arange(32), 32, 8)
    with pytest.raises(ValueError, match="num_bits"):
        fakequant.ops.fake_quantize_ggml(x, 32, 5)
    with pytest.raises(TypeError, match="floating-point"):
        fakequant.ops.fake_quantize_ggml(torch.arange(32), 32, 8)
