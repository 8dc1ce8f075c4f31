"""Shared test parameters: every op test runs on each device and dtype here."""
import pytest
import torch

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def assert_same(actual, expected):
    """Bit-identical values (NaN where NaN), same dtype and shape."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = actual.cpu(), expected.cpu()
    assert torch.equal(a.isnan(), e.isnan())
    ok = a.isnan() | (a == e)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:3].tolist()
        raise AssertionError(f"{int((~ok).sum())} of {a.numel()} elements differ, e.g. at {bad}: "
                             f"{[a[tuple(i)].item() for i in bad]} vs {[e[tuple(i)].item() for i in bad]}")
