"""Calibrators against brute-force references."""
import numpy as np
import pytest
import torch

from fakequant import calib, ops

import reference
from fakequant import nn as quant_nn
from fakequant.tensor_quant import QuantDescriptor

from conftest import DEVICES, bits_equal


# --- max -----------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("axis, keep", [(None, ()), (0, (0,)), (-1, (2,)), ((0, 2), (0, 2))])
def test_max_calibrator(device, axis, keep):
    c = calib.MaxCalibrator(8, axis, False, track_amax=True)
    assert c.compute_amax() is None
    xs = [torch.randn(3, 4, 5, device=device) * s for s in (1.0, 3.0, 0.5)]
    for x in xs:
        c.collect(x)
    stacked = torch.stack(xs).abs().amax(0)
    dims = [d for d in range(3) if d not in keep]
    expected = stacked.amax(dim=dims, keepdim=True) if dims else stacked
    if expected.numel() == 1:
        expected = expected.reshape(())
    amax = c.compute_amax()
    assert bits_equal(amax, expected) and amax.device.type == device and amax.dtype == torch.float32
    assert len(c.amaxs) == 3 and c.amaxs[0].device.type == "cpu"
    c.reset()
    assert c.compute_amax() is None and c.amaxs == []


def test_max_calibrator_errors_and_dtypes():
    c = calib.MaxCalibrator(8, 0, False)
    c.collect(torch.randn(3, 4, dtype=torch.float16))
    c.collect(torch.randn(3, 4, dtype=torch.bfloat16))
    assert c.compute_amax().dtype == torch.float32
    with pytest.raises(ValueError, match="shape changed"):
        c.collect(torch.randn(4, 4))
    with pytest.raises(ValueError, match="out of range"):
        calib.MaxCalibrator(8, 3, False).collect(torch.randn(2, 2))
    with pytest.raises(TypeError):
        c.collect([1.0, 2.0])
    with pytest.raises(ValueError, match="num_bits"):
        calib.MaxCalibrator(1, None, False)


# --- histogram collection ------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
def test_histogram_counts_match_numpy(device):
    c = calib.HistogramCalibrator(8, None, False, num_bins=100)
    x = torch.randn(10000, device=device)
    c.collect(x)
    counts = c._calib_hist.cpu().numpy()
    ref, _ = np.histogram(x.abs().cpu().numpy(), bins=100, range=(0, float(x.abs().max())))
    assert counts.dtype == np.int64 and counts.sum() == 10000
    assert np.abs(counts - ref).sum() <= 4  # values a rounding error from an edge may switch bins
    assert c._calib_hist.device.type == device
    # Bit for bit the rule of every device: bin floor(|x| * float32(1 / width)), the last
    # bin taking the rest, whatever the device and torch's deterministic setting.
    a = x.abs().cpu().numpy()
    width = np.float32(float(x.abs().max()) / 100)
    idx = np.minimum(np.floor(a * (np.float32(1) / width)).astype(np.int64), 99)
    assert counts.tolist() == np.bincount(idx, minlength=100).tolist()
    edges = c._calib_bin_edges
    assert edges.shape == (101,) and edges[0] == 0 and edges[-1] == pytest.approx(float(x.abs().max()))


def test_histogram_grows_with_same_width():
    c = calib.HistogramCalibrator(8, None, False, num_bins=10)
    c.collect(torch.tensor([0.05, 0.5, 1.0]))
    c.collect(torch.tensor([0.55, 2.45]))
    hist, edges = c._calib_hist, c._calib_bin_edges
    assert hist.numel() == 25 and edges[-1].item() == pytest.approx(2.5)
    assert torch.allclose(edges[1:] - edges[:-1], torch.full((25,), 0.1), atol=1e-6)
    assert hist.tolist() == [1, 0, 0, 0, 0, 2, 0, 0, 0, 1] + [0] * 14 + [1]


def test_histogram_counts_are_exact_beyond_float32():
    # pytorch-quantization accumulates float32 counts, which stop at 2^24.
    c = calib.HistogramCalibrator(8, None, False, num_bins=4)
    ones = torch.ones(1 << 20)
    for _ in range(17):
        c.collect(ones)
    c.collect(torch.tensor([0.1]))
    assert int(c._calib_hist[-1]) == 17 << 20 and c._calib_hist.dtype == torch.int64
    assert int(c._calib_hist[0]) == 1


def test_histogram_skip_zeros_and_all_zero_batches():
    c = calib.HistogramCalibrator(8, None, False, num_bins=4, skip_zeros=True)
    c.collect(torch.zeros(10))
    c.collect(torch.tensor([0.0, 1.0, 4.0]))
    assert c._calib_hist.tolist() == [0, 1, 0, 1]  # width 1: 1.0 in bin 1, 4.0 in the last
    z = calib.HistogramCalibrator(8, None, False, num_bins=4)
    z.collect(torch.zeros(5))
    assert z.compute_amax("entropy").item() == 0.0
    z.collect(torch.tensor([2.0]))
    assert z._calib_hist.tolist() == [5, 0, 0, 1]


@pytest.mark.parametrize("device", DEVICES)
def test_per_channel_histograms_equal_separate_ones(device):
    x = torch.randn(6, 3, 50, device=device) * torch.tensor([0.5, 1.0, 4.0], device=device).reshape(1, 3, 1)
    y = torch.randn(6, 3, 50, device=device) * 2
    per_channel = calib.HistogramCalibrator(8, 1, False, num_bins=64)
    per_channel.collect(x)
    per_channel.collect(y)
    amax = per_channel.compute_amax("percentile", percentile=99.0)
    assert amax.shape == (1, 3, 1) and amax.device.type == device
    for ch in range(3):
        single = calib.HistogramCalibrator(8, None, False, num_bins=64)
        single.collect(x[:, ch])
        single.collect(y[:, ch])
        assert bits_equal(per_channel._calib_hist[ch, : single._calib_hist.numel()].cpu(), single._calib_hist.cpu())
        assert amax[0, ch, 0] == single.compute_amax("percentile", percentile=99.0)
        for method in ("entropy", "mse", "max"):
            assert per_channel.compute_amax(method, start_bin=16)[0, ch, 0] == single.compute_amax(method,
                                                                                                     start_bin=16)


@pytest.mark.parametrize("axis", [None, 0])
def test_histogram_under_another_default_device(axis):
    # The bin layout and the amax searches live on the CPU whatever default device the caller
    # set (torch.set_default_device("cuda") put them on the GPU beside the CPU maxima: every
    # histogram method raised there, make gpu-check's fingerprints on an H200). "meta" stands
    # in for the GPU: factory calls without a device land there.
    xs = [torch.randn(3, 500, generator=torch.Generator().manual_seed(s)) * (s + 1) for s in range(3)]
    plain, other = (calib.HistogramCalibrator(8, axis, False, num_bins=300) for _ in range(2))
    for x in xs:
        plain.collect(x)
    with torch.device("meta"):
        for x in xs:
            other.collect(x)
        got = {m: other.compute_amax(m, start_bin=16) for m in ("entropy", "mse", "percentile", "max")}
        edges = other._calib_bin_edges
    for method, amax in got.items():
        assert amax.device.type == "cpu"
        assert bits_equal(amax, plain.compute_amax(method, start_bin=16)), method
    want = plain._calib_bin_edges
    for e, w in zip(edges if isinstance(edges, list) else [edges], want if isinstance(want, list) else [want]):
        assert bits_equal(e, w)


def test_histogram_rejects_bad_input():
    c = calib.HistogramCalibrator(8, None, False)
    with pytest.raises(ValueError, match="inf or NaN"):
        c.collect(torch.tensor([1.0, float("inf")]))
    with pytest.raises(ValueError, match="method"):
        c.compute_amax("kl")
    with pytest.raises(ValueError, match="percentile"):
        c.compute_amax("percentile", percentile=101)
    with pytest.raises(ValueError, match="stride"):
        c.compute_amax("entropy", stride=0)
    with pytest.raises(ValueError, match="num_bins"):
        calib.HistogramCalibrator(8, None, False, num_bins=1)
    assert c.compute_amax("entropy") is None
    c.collect(torch.randn(3, 4))
    c.collect(torch.randn(5))  # per tensor, any shape
    per_channel = calib.HistogramCalibrator(8, 0, False)
    per_channel.collect(torch.randn(3, 4))
    with pytest.raises(ValueError, match="channels changed"):
        per_channel.collect(torch.randn(4, 4))
    with pytest.warns(DeprecationWarning, match="grow_method"):
        calib.HistogramCalibrator(8, None, False, grow_method="stretch")
    with pytest.raises(NotImplementedError, match="integer num_bits"):
        fp8 = calib.HistogramCalibrator((4, 3), None, False)
        fp8.collect(torch.randn(10))
        fp8.compute_amax("mse")


# --- amax searches against brute force -------------------------------------------------


def brute_mse(hist, edges, num_bits, unsigned, stride, start_bin, narrow_range=True):
    centers = torch.from_numpy((edges[1:] + edges[:-1]) / 2).float()
    counts = torch.from_numpy(hist).double()
    errors = [(((ops.fake_quantize_amax(centers, centers[i], num_bits, unsigned, narrow_range) - centers).double()
                ** 2) * counts).sum().item() for i in range(start_bin, len(centers), stride)]
    return centers[start_bin + stride * int(np.argmin(errors))].item()


def brute_percentile(hist, edges, percentile):
    cdf = np.cumsum(hist / hist.sum())
    return edges[np.searchsorted(cdf, percentile / 100)]


def random_histogram(rng, n):
    x = np.abs(rng.standard_normal(20000) * rng.uniform(0.5, 3)) ** rng.uniform(0.5, 2)
    hist, _ = np.histogram(x, bins=n, range=(0, x.max()))
    if rng.uniform() < 0.4:
        hist[rng.integers(0, n, size=n // 4)] = 0  # empty bins inside the range
    return hist.astype(np.int64), float(x.max())


def calibrator_with(hist, xmax):
    c = calib.HistogramCalibrator(8, None, False, num_bins=len(hist))
    c.collect(torch.tensor([xmax]))  # sets the bin layout
    c._hist.zero_()
    c._hist[0] += torch.from_numpy(hist)
    return c


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("num_bits, unsigned, stride, start_bin", [(8, False, 1, 128), (8, True, 2, 128),
                                                                   (4, False, 3, 20)])
def test_entropy_and_mse_match_brute_force(seed, num_bits, unsigned, stride, start_bin):
    rng = np.random.default_rng(seed)
    hist, xmax = random_histogram(rng, int(rng.integers(140, 300)))
    c = calibrator_with(hist, xmax)
    c._num_bits, c._unsigned = num_bits, unsigned
    edges = c._calib_bin_edges.double().numpy()
    got = c.compute_amax("entropy", stride=stride, start_bin=start_bin).item()
    assert got == pytest.approx(reference.entropy_amax(hist, edges, num_bits, unsigned, stride, start_bin), rel=1e-6)
    got = c.compute_amax("mse", stride=stride, start_bin=start_bin).item()
    assert got == pytest.approx(brute_mse(hist, edges, num_bits, unsigned, stride, start_bin), rel=1e-6)


@pytest.mark.parametrize("seed", range(4))
def test_mse_quantizes_with_the_quantizers_narrow_range(seed):
    """The MSE search quantizes with the calibrated range: [-bound - 1, bound] when the
    quantizer is not narrow (it once always used [-bound, bound])."""
    rng = np.random.default_rng(seed)
    hist, xmax = random_histogram(rng, 200)
    for narrow in (True, False):
        c = calibrator_with(hist, xmax)
        c._num_bits, c._narrow_range = 3, narrow  # few levels: the extra one matters
        edges = c._calib_bin_edges.double().numpy()
        got = c.compute_amax("mse", start_bin=10).item()
        assert got == pytest.approx(brute_mse(hist, edges, 3, False, 1, 10, narrow_range=narrow), rel=1e-6)
    assert calib.HistogramCalibrator().narrow_range is True  # pytorch-quantization's default


def test_mse_narrow_range_reaches_the_search_from_a_quantizer():
    x = torch.randn(4000, generator=torch.Generator().manual_seed(1)) ** 3

    def mse_search(narrow_range):
        seen = []
        desc = QuantDescriptor(num_bits=3, calib_method="histogram", narrow_range=narrow_range)
        q = quant_nn.TensorQuantizer(desc)
        assert q._calibrator.narrow_range is narrow_range
        real = ops.fake_quantize_amax
        try:
            def spy(*args, **kwargs):
                seen.append(args[4])
                return real(*args, **kwargs)
            ops.fake_quantize_amax = spy
            q.enable_calib()
            q.disable_quant()
            q(x)
            q.load_calib_amax("mse")
        finally:
            ops.fake_quantize_amax = real
        return set(seen), q.amax

    for narrow in (False, True):
        seen, amax = mse_search(narrow)
        assert seen == {narrow}
    # the setter reaches the calibrator too, and calibrate_weights takes the quantizer's range
    q = quant_nn.TensorQuantizer(QuantDescriptor(calib_method="histogram"))
    q.narrow_range = True
    assert q._calibrator.narrow_range is True
    model = torch.nn.Sequential(quant_nn.Linear(50, 6, quant_desc_weight=QuantDescriptor(num_bits=3, axis=0)))
    c_narrow = calib.HistogramCalibrator(3, 0, False, narrow_range=False)
    c_narrow.collect(model[0].weight.detach())
    calib.calibrate_weights(model, method="mse")
    assert torch.equal(model[0].weight_quantizer.amax, c_narrow.compute_amax("mse"))


@pytest.mark.parametrize("percentile", [0.0, 50.0, 99.0, 99.99, 100.0])
def test_percentile_matches_brute_force(percentile):
    hist, xmax = random_histogram(np.random.default_rng(7), 500)
    c = calibrator_with(hist, xmax)
    edges = c._calib_bin_edges.double().numpy()
    assert c.compute_amax("percentile", percentile=percentile).item() == pytest.approx(
        brute_percentile(hist, edges, percentile), rel=1e-6)


def test_entropy_with_fewer_bins_than_start_bin():
    c = calib.HistogramCalibrator(8, None, False, num_bins=64)
    x = torch.randn(1000)
    c.collect(x)
    assert c.compute_amax("entropy").item() == pytest.approx(float(x.abs().max()), rel=1e-6)
    assert c.compute_amax("mse").item() <= float(x.abs().max())


def test_entropy_clips_outliers():
    x = torch.cat([torch.randn(100000), torch.tensor([40.0])])
    c = calib.HistogramCalibrator(8, None, False)
    c.collect(x)
    assert 3.0 < c.compute_amax("entropy").item() < 10.0
    assert c.compute_amax("mse").item() < 40.0
    assert c.compute_amax("max").item() == 40.0


# --- calibrate_weights ---------------------------------------------------------------------


def test_calibrate_weights():
    model = torch.nn.Sequential(quant_nn.Conv2d(3, 4, 3), quant_nn.ConvTranspose2d(4, 2, 3), quant_nn.Linear(5, 6))
    calib.calibrate_weights(model, method="max")
    assert bits_equal(model[0].weight_quantizer.amax, model[0].weight.detach().abs().amax((1, 2, 3), keepdim=True))
    assert model[1].weight_quantizer.amax.shape == (1, 2, 1, 1)  # output channels of a transposed conv
    calib.calibrate_weights(model, method="percentile", perchannel=False, percentile=100.0)
    assert model[2].weight_quantizer.amax.shape == ()
    calib.calibrate_weights(model, method="mse")
    amax = model[2].weight_quantizer.amax
    assert amax.shape == (6, 1) and bool((amax <= model[2].weight.detach().abs().amax(1, keepdim=True)).all())
    with pytest.raises(ValueError, match="method"):
        calib.calibrate_weights(model, method="kl")


def test_calibrate_weights_lives_at_the_model_level():
    # it walks modules: fakequant.utils has it; pytorch-quantization's paths name the same function
    import fakequant.utils
    from fakequant.calib.histogram import calibrate_weights

    assert calib.calibrate_weights is calibrate_weights is fakequant.utils.calibrate_weights
    assert calibrate_weights.__module__ == "fakequant.utils.calibrate"


def test_quantizer_histogram_descriptor_end_to_end():
    q = quant_nn.TensorQuantizer(QuantDescriptor(calib_method="histogram", axis=0))
    q.enable_calib()
    q.disable_quant()
    q(torch.randn(2, 1000) * torch.tensor([[1.0], [5.0]]))
    q.load_calib_amax("entropy")
    assert q.amax.shape == (2, 1) and q.amax[1] > q.amax[0]
