"""The operators as the PyTorch stack sees them, from the op table (tests/op_table.py):
every registered operator has an entry; torch.library.opcheck (schema, fake kernels,
autograd registration, AOT dispatch) and the plain-PyTorch reference of each entry's
sample calls; gradcheck in float64; and torch.compile(fullgraph=True)."""
import pytest
import torch

import fakequant
import op_table
import reference as ref
from conftest import DEVICES, DTYPES, assert_compiled_step_matches_eager, assert_same, bits_equal

ops = torch.ops.fakequant

OPCHECK_LAYOUTS = ("contiguous", "channels_last", "transposed")
WITH_REFERENCE = op_table.variants(lambda e, v: e.reference is not None)


def test_the_table_has_every_registered_op():
    """Every operator of the library has its entry in tests/op_table.py, and nothing else does."""
    registered = {s.name.split("::")[1] for s in torch._C._jit_get_all_schemas() if s.name.startswith("fakequant::")}
    assert registered == set(op_table.OPS), (registered ^ set(op_table.OPS))
    for entry in op_table.TABLE:
        assert entry.variants, f"{entry.name}: no sample calls"
        assert entry.reference is not None or entry.no_reference, f"{entry.name}: no reference and no reason"


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,variant", op_table.variants(), ids=op_table.variant_ids(op_table.variants()))
def test_opcheck(device, entry, variant):
    """torch.library.opcheck of each sample call, on contiguous, channels_last and transposed
    float32 inputs that require grad."""
    for layout in OPCHECK_LAYOUTS:
        x = op_table.sample_input(layout, torch.float32, device, special=False).requires_grad_()
        torch.library.opcheck(entry.op, variant.args(x))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,variant", WITH_REFERENCE, ids=op_table.variant_ids(WITH_REFERENCE))
def test_matches_reference(device, entry, variant):
    """Each sample call, on every layout and dtype (NaN, +-inf, +-0, ties and values beyond
    the range among the inputs), equals the plain-PyTorch reference bit for bit, the
    mask too; a dense input keeps its layout."""
    for dtype in DTYPES:
        for layout, x in op_table.samples(dtype, device):
            args = variant.args(x)
            out = entry.op(*args)
            op_table.check_against_reference(entry, args, out, assert_same, bits_equal, f"{layout} {dtype}")
            y = out if isinstance(out, torch.Tensor) else out[0]
            if entry.keeps_layout and layout != "sliced" and y.shape == x.shape:  # a dense input: its layout kept
                assert y.stride() in (args[0].stride(), x.stride()), (layout, y.stride())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("entry,case", op_table.gradcheck_cases(),
                         ids=op_table.gradcheck_ids(op_table.gradcheck_cases()))
def test_gradcheck(device, entry, case):
    fn, inputs = case.make(device)
    assert torch.autograd.gradcheck(fn, inputs, eps=case.eps, atol=case.atol)
    if case.twice:
        assert torch.autograd.gradgradcheck(fn, inputs, eps=case.eps, atol=case.atol)


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    scale = torch.tensor([0.05, 0.1, 0.2], device=device)
    zp = torch.tensor([0, 1, -1], dtype=torch.int32, device=device)
    amax = torch.tensor([[1.0], [2.0], [3.0]], device=device)

    def qat_step(x, w):
        xq = fakequant.fake_quantize_amax(x, 2.0, narrow_range=False)
        wq = fakequant.fake_quantize_amax(w, amax)
        h = xq @ wq.t()
        h = fakequant.fake_quantize_per_channel_affine(h, scale, zp, 1, -128, 127)
        return fakequant.fake_quantize_min_max(h, -1.0, 4.0).relu().sum()

    assert_compiled_step_matches_eager(qat_step, device)


def test_version_mismatch_names_both_versions(monkeypatch):
    from fakequant import _build, _extension

    monkeypatch.setattr(_build, "TORCH_VERSION", "1.0.0+fake")
    with pytest.raises(ImportError, match=r"1\.0\.0\+fake.*" + torch.__version__.replace("+", r"\+")):
        _extension.check_build()


def test_build_info():
    assert fakequant.BUILT_FOR_TORCH == torch.__version__
    assert ref.AMAX_EPSILON == 2.0**-24
