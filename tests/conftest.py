"""Shared test parameters: every op test runs on each device and dtype here; the slow
marker (tests skipped unless FAKEQUANT_SLOW_TESTS=1: `make slow`, `make check`)."""
import os
import platform

import pytest
import torch

SLOW = os.environ.get("FAKEQUANT_SLOW_TESTS") == "1"


def pytest_collection_modifyitems(config, items):
    """Tests marked slow (minutes of inductor compilation, ONNX exports of whole models,
    several processes importing transformers) run only with FAKEQUANT_SLOW_TESTS=1."""
    if SLOW:
        return
    skip = pytest.mark.skip(reason="slow: FAKEQUANT_SLOW_TESTS=1 (make slow)")
    for item in items:
        if "slow" in item.keywords:
            item.add_marker(skip)

DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


# FAKEQUANT_CUDA_ARITHMETIC=1 (make cuda-arithmetic): every test under CUDA's arithmetic on the
# CPU (tests/cuda_arithmetic.py), so that an expected value or a library path that would come
# out differently on a GPU fails here.
CUDA_ARITHMETIC = os.environ.get("FAKEQUANT_CUDA_ARITHMETIC") == "1"


@pytest.fixture(autouse=True)
def _cuda_arithmetic():
    if not CUDA_ARITHMETIC:
        yield
        return
    from cuda_arithmetic import CudaArithmetic

    with CudaArithmetic():
        yield


_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t, nan):
    """t's bit patterns as integers, NaN replaced by 0 (NaN payloads are not compared)."""
    return t.masked_fill(nan, 0).view(_BITS[t.element_size()])


def assert_same(actual, expected):
    """Bit-identical values (the sign of zero included; NaN where NaN, any payload),
    same dtype and shape."""
    assert actual.dtype == expected.dtype, (actual.dtype, expected.dtype)
    assert actual.shape == expected.shape, (actual.shape, expected.shape)
    a, e = actual.detach().cpu(), expected.detach().cpu()
    if not a.is_floating_point():
        assert torch.equal(a, e)
        return
    nan = a.isnan()
    assert torch.equal(nan, e.isnan())
    ok = _bits(a, nan) == _bits(e, nan)
    if not bool(ok.all()):
        bad = (~ok).nonzero()[:3].tolist()
        raise AssertionError(f"{int((~ok).sum())} of {a.numel()} elements differ, e.g. at {bad}: "
                             f"{[a[tuple(i)].item() for i in bad]} vs {[e[tuple(i)].item() for i in bad]}")


def bits_equal(a, b):
    """torch.equal that tells -0.0 from +0.0 (and takes NaN as equal to NaN): same
    shape, and equal values with equal signs (tensors, or arrays such as ONNX Runtime's)."""
    a, b = torch.as_tensor(a).detach().cpu(), torch.as_tensor(b).detach().cpu()
    if a.shape != b.shape:
        return False
    if not (a.is_floating_point() or b.is_floating_point()):
        return torch.equal(a, b)
    nan = a.isnan()
    if not torch.equal(nan, b.isnan()):
        return False
    a, b = a.masked_fill(nan, 0), b.masked_fill(nan, 0)
    return torch.equal(a, b) and torch.equal(a.signbit(), b.signbit())


def assert_compiled_step_matches_eager(qat_step, device):
    """qat_step(x, w) -> scalar, compiled with fullgraph=True: the same value and gradients
    as eager (a small QAT step through several operators)."""
    x = torch.randn(8, 5, device=device, requires_grad=True)
    w = torch.randn(3, 5, device=device, requires_grad=True)
    compiled = torch.compile(qat_step, fullgraph=True, dynamic=False)
    out_c = compiled(x, w)
    gx_c, gw_c = torch.autograd.grad(out_c, (x, w))
    out_e = qat_step(x, w)
    gx_e, gw_e = torch.autograd.grad(out_e, (x, w))
    assert torch.allclose(out_c, out_e) and torch.allclose(gx_c, gx_e) and torch.allclose(gw_c, gw_e)


# --- ONNX Runtime sessions ----------------------------------------------------------------------

ORT_SESSIONS = ("graph", "basic", "default", "int8")


def ort_session(path, kind="graph", options=None):
    """An ONNX Runtime CPU session of the model at ``path``. ``kind`` says what it runs
    (docs/export.md, "ONNX Runtime on x86 CPUs without VNNI"):

    - "graph": ``ORT_DISABLE_ALL``, the exported graph's own nodes: what the numerics contract
      is about (every QDQ pair bit for bit), the same on every CPU;
    - "basic": ``ORT_ENABLE_BASIC`` (constant folding and the like, no QDQ fusion);
    - "default": ONNX Runtime's defaults (``ORT_ENABLE_ALL``), which fuse the QDQ pairs around a
      MatMul/Gemm/Conv into int8 kernels: on x86 CPUs without VNNI their u8s8 arithmetic adds
      pairs of products in 16 bits and saturates. Compare its numbers only where no such kernel
      runs (single quantizers, embeddings) or under ``needs_exact_u8s8``;
    - "int8": the defaults with ``session.qdqisint8allowed=1``: the int8 kernels keep signed
      activations (s8s8 kernels, exact 32-bit sums on every CPU). Unsigned activations still take
      the u8s8 kernels: use it for models whose activation quantizers are signed.

    ``options``: a ``SessionOptions`` to start from (its optimization level is replaced)."""
    import onnxruntime as ort

    if kind not in ORT_SESSIONS:
        raise ValueError(f"kind must be one of {ORT_SESSIONS}, got {kind!r}")
    options = options or ort.SessionOptions()
    levels = {"graph": ort.GraphOptimizationLevel.ORT_DISABLE_ALL,
              "basic": ort.GraphOptimizationLevel.ORT_ENABLE_BASIC}
    options.graph_optimization_level = levels.get(kind, ort.GraphOptimizationLevel.ORT_ENABLE_ALL)
    if kind == "int8":
        options.add_session_config_entry("session.qdqisint8allowed", "1")
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def _u8s8_saturates():
    """Whether ONNX Runtime's u8s8 int8 kernels (MLAS) may saturate on this CPU: x86 without
    AVX512_VNNI or AVX_VNNI (AVX2 and AVX-512 cores add pairs of u8 x s8 products in 16 bits)."""
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686"):
        return False
    try:
        with open("/proc/cpuinfo") as f:
            flags = next((line.split(":", 1)[1].split() for line in f if line.startswith("flags")), [])
    except OSError:
        return True  # (not Linux: unknown, taken as affected)
    return not {"avx512_vnni", "avx_vnni"} & set(flags)


needs_exact_u8s8 = pytest.mark.skipif(
    _u8s8_saturates(), reason="ONNX Runtime's u8s8 int8 kernels saturate on x86 CPUs without AVX512_VNNI/AVX_VNNI "
                              "(this CPU): its default session is compared only where they are exact")


def benchmark_module(name):
    """benchmarks/<name>.py imported as a module (benchmarks/ is a folder of scripts, not a package)."""
    import importlib
    import sys

    folder = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks")
    sys.path.insert(0, folder)
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(folder)
