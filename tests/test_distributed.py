"""Calibration and QAT under torch.distributed: two processes on the CPU with gloo.

Every rank calibrates on its own share of the data; fakequant.calibrate merges the
statistics (MaxCalibrator: all-reduce MAX; HistogramCalibrator: histograms summed on
a common grid), so every rank ends with the same amax, the amax of all the data.
Under DistributedDataParallel the quantizers' _amax buffers are broadcast with the
other buffers and stay in sync; FSDP2 (fully_shard) is checked on the CPU too (QAT of a
transformer under FSDP2, learned ranges and sharded checkpoints: test_fsdp.py).

One spawn of two processes runs every scenario (the start-up is most of the cost);
each rank saves what it computed and the checks run here, in the parent.
"""
import pytest
import torch
import torch.distributed as dist
from torch import nn

import fakequant
from dist_helpers import WORLD, run_ranks, save
from fakequant import calib
from fakequant import nn as quant_nn
from fakequant.nn import TensorQuantizer
from fakequant.tensor_quant import QuantDescriptor

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="needs torch.distributed with gloo")


# --- what both the ranks and the single-process references build -----------------------


def net(histogram=False):
    torch.manual_seed(1)
    desc = QuantDescriptor(calib_method="histogram") if histogram else QuantDescriptor()
    return nn.Sequential(
        quant_nn.Conv2d(3, 6, 3, padding=1, quant_desc_input=desc), nn.BatchNorm2d(6), nn.ReLU(),
        quant_nn.Conv2d(6, 6, 3, padding=1, quant_desc_input=desc), nn.ReLU(),
        quant_nn.AdaptiveAvgPool2d(1), nn.Flatten(), quant_nn.Linear(6, 4, quant_desc_input=desc),
    )


def shard(rank, batches=None, same_max=False):
    """Rank ``rank``'s batches: a different count, scale and seed per rank."""
    g = torch.Generator().manual_seed(100 + rank)
    n = (2 + rank) if batches is None else batches
    out = []
    for i in range(n):
        x = torch.randn(4, 3, 8, 8, generator=g) * (1.0 + rank)
        if same_max:
            # Every rank's first batch holds the same largest |x|: the same bin width.
            x = x.clamp(-7.0, 7.0)
            if i == 0:
                x[0, 0, 0, 0] = 8.0
        out.append(x)
    return out


def quantizer_amax(model):
    return {name: m.amax.detach().clone().cpu() for name, m in model.named_modules()
            if isinstance(m, TensorQuantizer) and m.amax is not None}


def channel_data(rank, same_max):
    g = torch.Generator().manual_seed(200 + rank)
    out = [torch.randn(5, 4000, generator=g) * torch.tensor([[0.5], [1.0], [2.0], [4.0], [1.0]]) * (1 + rank)
           for _ in range(2)]
    if same_max:
        out = [x.clamp(-15, 15) for x in out]
        out[0][:, 0] = 16.0
    else:
        out[0][4] = 0.0  # a channel that sees only zeros in a first batch
    return out


METHODS = ("max", "percentile", "entropy", "mse")


def histogram_amax(calibrator):
    return {m: calibrator.compute_amax(m, start_bin=32) for m in METHODS}


def per_channel_calibrators(rank, same_max):
    h = calib.HistogramCalibrator(8, 0, False, num_bins=256)
    mx = calib.MaxCalibrator(8, 0, False)
    for x in channel_data(rank, same_max):
        h.collect(x)
        mx.collect(x)
    return h, mx


def train_steps(model, rank, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    g = torch.Generator().manual_seed(300 + rank)
    model.train()
    for _ in range(steps):
        x = torch.randn(4, 3, 8, 8, generator=g)
        y = torch.randint(0, 4, (4,), generator=g)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()


def params(model):
    out = {}
    for name, p in model.named_parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p
        out[name] = p.detach().clone().cpu()
    return out


# --- the ranks ------------------------------------------------------------------------


def _worker(rank, world, out_dir):
    res = {}
    # Max calibration; a rank with no data at all still gets the amax.
    m = fakequant.calibrate(net(), shard(rank), progress=False)
    res["max"] = quantizer_amax(m)
    m = fakequant.calibrate(net(), shard(rank) if rank == 0 else [], progress=False)
    res["max_one_rank"] = quantizer_amax(m)

    # Histogram calibration: one collection, amax by every method (each call merges again).
    for same in (False, True):
        m = net(histogram=True)
        fakequant.utils.collect_stats(m, shard(rank, same_max=same), progress=False)
        res[f"hist_same{same}"] = {}
        for method in METHODS:
            fakequant.utils.compute_amax(m, method, start_bin=32)
            res[f"hist_same{same}"][method] = quantizer_amax(m)
        # The calibrators merge again from their own data; collecting goes on from it.
        h, mx = per_channel_calibrators(rank, same)
        local_hist = h._calib_hist.clone()
        h.sync()
        mx.sync()
        res[f"channels_same{same}"] = dict(histogram_amax(h), maxcal=mx.compute_amax())
        h.sync()  # again: not doubled
        res[f"channels_twice_same{same}"] = histogram_amax(h)
        h.collect(torch.zeros(5, 0))  # (adds nothing)
        res[f"local_after_collect_same{same}"] = torch.equal(h._calib_hist, local_hist)
    m = fakequant.calibrate(net(histogram=True), shard(rank) if rank == 1 else [], method="entropy",
                            progress=False, start_bin=32)
    res["hist_one_rank"] = quantizer_amax(m)

    # QAT under DDP: calibrated first, then wrapped; buffers broadcast from rank 0.
    model = fakequant.calibrate(net(), shard(rank), progress=False)
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=True)
    train_steps(ddp, rank)
    res["ddp_amax"], res["ddp_params"] = quantizer_amax(model), params(model)
    if rank == 1:  # a rank whose amax went astray is brought back by the next forward
        for q in model.modules():
            if isinstance(q, TensorQuantizer):
                q.amax.mul_(3.0)
    ddp.eval()
    with torch.no_grad():
        ddp(torch.randn(2, 3, 8, 8))
    res["ddp_amax_restored"] = quantizer_amax(model)

    # Wrapped in DDP before calibration (the quantizers get their _amax buffers then).
    model = net()
    ddp = nn.parallel.DistributedDataParallel(model, broadcast_buffers=True)
    fakequant.calibrate(ddp.module, shard(rank), progress=False)
    train_steps(ddp, rank)
    if rank == 1:
        for q in model.modules():
            if isinstance(q, TensorQuantizer):
                q.amax.mul_(3.0)
    train_steps(ddp, rank, steps=1)
    res["ddp_late_amax"], res["ddp_late_params"] = quantizer_amax(model), params(model)

    # FSDP2 (fully_shard) on the CPU, where this torch has it.
    try:
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
    except ImportError:
        res["fsdp"] = None
    else:
        mesh = init_device_mesh("cpu", (world,))
        model = fakequant.calibrate(net(), shard(rank), progress=False)
        for layer in model:
            if isinstance(layer, (quant_nn.Conv2d, quant_nn.Linear)):
                fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        train_steps(model, rank)
        res["fsdp"] = {"amax": quantizer_amax(model), "params": params(model)}
        fakequant.calibrate(model, shard(rank, batches=1), progress=False)  # calibrated while sharded
        res["fsdp"]["recalibrated"] = quantizer_amax(model)
    save(res, rank, out_dir)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_ranks(_worker, tmp_path_factory.mktemp("dist"))


def assert_equal_dicts(a, b):
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k


def single_process(model, data, method="max"):
    return quantizer_amax(fakequant.calibrate(model, data, method=method, progress=False, sync=False, start_bin=32))


# --- checks -------------------------------------------------------------------------------


def test_max_calibration_identical_and_equal_to_one_process(ranks):
    assert_equal_dicts(ranks[0]["max"], ranks[1]["max"])
    union = shard(0) + shard(1)
    assert_equal_dicts(ranks[0]["max"], single_process(net(), union))
    assert len(ranks[0]["max"]) == 7  # every input and weight quantizer
    # Only rank 0 had data: rank 1 gets rank 0's amax.
    assert_equal_dicts(ranks[1]["max_one_rank"], single_process(net(), shard(0)))
    assert_equal_dicts(ranks[0]["max_one_rank"], ranks[1]["max_one_rank"])


def test_histogram_calibration_identical_on_every_rank(ranks):
    for same in (False, True):
        for method in METHODS:
            assert_equal_dicts(ranks[0][f"hist_same{same}"][method], ranks[1][f"hist_same{same}"][method])
        for key in (f"channels_same{same}", f"channels_twice_same{same}"):
            assert_equal_dicts(ranks[0][key], ranks[1][key])
        assert ranks[0][f"local_after_collect_same{same}"] and ranks[1][f"local_after_collect_same{same}"]
    assert_equal_dicts(ranks[0]["hist_one_rank"], ranks[1]["hist_one_rank"])


def test_histogram_merge_is_exact_on_a_common_grid(ranks):
    # Same first-batch maximum on both ranks: the same bins, so the merged histogram
    # is the histogram of all the data, and every method gives one process's amax.
    # (The first layer's input quantizer sees the data; the later ones see activations,
    # whose maxima differ per rank.)
    union = shard(0, same_max=True) + shard(1, same_max=True)
    for method in METHODS:
        expected = single_process(net(histogram=True), union, method)["0._input_quantizer"]
        assert torch.equal(ranks[0]["hist_sameTrue"][method]["0._input_quantizer"], expected), method
    h = calib.HistogramCalibrator(8, 0, False, num_bins=256)
    mx = calib.MaxCalibrator(8, 0, False)
    for x in channel_data(0, True) + channel_data(1, True):
        h.collect(x)
        mx.collect(x)
    expected = dict(histogram_amax(h), maxcal=mx.compute_amax())
    assert_equal_dicts(ranks[0]["channels_sameTrue"], expected)
    assert_equal_dicts(ranks[0]["channels_twice_sameTrue"], histogram_amax(h))
    # Only rank 1 had data: everyone gets its amax, exactly.
    assert_equal_dicts(ranks[0]["hist_one_rank"], single_process(net(histogram=True), shard(1), "entropy"))


# How far the merged histograms' amax may be from one process's: entropy and MSE
# searches move with the binning by themselves (one process collecting the same
# per-channel data in the other order moves entropy's amax by 14%, MSE's by 6%).
RTOL = {"max": 0.0, "percentile": 0.02, "entropy": 0.15, "mse": 0.1}


def test_histogram_merge_on_different_grids_is_close_to_one_process(ranks):
    # Rank 1's data is twice as wide: its bins are the common grid, rank 0's
    # histogram is laid on them. One process collecting rank 1's data first has
    # the same grid and counts rank 0's values exactly; the amax are close.
    union = shard(1) + shard(0)
    got = ranks[0]["hist_sameFalse"]
    for method in METHODS:
        expected = single_process(net(histogram=True), union, method)
        for name, amax in expected.items():
            if "weight" in name:
                assert torch.equal(got[method][name], amax)  # same weights on every rank
            else:
                assert torch.allclose(got[method][name], amax, rtol=RTOL[method], atol=0), (method, name)
    assert_equal_dicts(got["max"], single_process(net(), union))  # "max" is exact
    h = calib.HistogramCalibrator(8, 0, False, num_bins=256)
    for x in channel_data(1, False) + channel_data(0, False):
        h.collect(x)
    for method, amax in histogram_amax(h).items():
        assert torch.allclose(ranks[0]["channels_sameFalse"][method], amax, rtol=RTOL[method], atol=0), method


def test_ddp_keeps_quantizer_buffers_in_sync(ranks):
    for key in ("ddp_amax", "ddp_params", "ddp_amax_restored", "ddp_late_amax", "ddp_late_params"):
        assert_equal_dicts(ranks[0][key], ranks[1][key])
    # QAT does not move a calibrated amax; the broadcast undid rank 1's change.
    assert_equal_dicts(ranks[0]["ddp_amax"], ranks[0]["max"])
    assert_equal_dicts(ranks[1]["ddp_amax_restored"], ranks[0]["max"])
    assert_equal_dicts(ranks[1]["ddp_late_amax"], ranks[0]["max"])


def test_fsdp_fully_shard_on_cpu(ranks):
    if ranks[0]["fsdp"] is None:
        pytest.skip("this torch has no torch.distributed.fsdp.fully_shard")
    for key in ("amax", "params", "recalibrated"):
        assert_equal_dicts(ranks[0]["fsdp"][key], ranks[1]["fsdp"][key])
    assert_equal_dicts(ranks[0]["fsdp"]["amax"], ranks[0]["max"])


def test_sync_is_a_no_op_without_distributed():
    assert not dist.is_initialized()
    c = calib.MaxCalibrator()
    c.collect(torch.tensor([1.0, -3.0]))
    c.sync()
    assert c.compute_amax().item() == 3.0
    h = calib.HistogramCalibrator(num_bins=8)
    h.sync()
    assert h.compute_amax("max") is None
    h.collect(torch.tensor([1.0, -3.0]))
    h.sync()
    assert h.compute_amax("max").item() == 3.0
    with pytest.raises(TypeError, match="sync"):
        fakequant.calibrate(net(), shard(0), progress=False, sync="yes")


def test_rebin_keeps_every_count():
    h = torch.tensor([[5, 0, 7, 1, 0, 0, 9, 2]])
    out = calib.HistogramCalibrator._rebin(h, torch.tensor([0.1], dtype=torch.float64), torch.tensor([8]),
                                           torch.tensor([0.3], dtype=torch.float64), torch.tensor([3]), 4)
    assert out.shape == (1, 4) and int(out.sum()) == int(h.sum()) and bool((out >= 0).all())
    assert out[0, 3] == 0
    same = calib.HistogramCalibrator._rebin(h, torch.tensor([0.1], dtype=torch.float64), torch.tensor([8]),
                                            torch.tensor([0.1], dtype=torch.float64), torch.tensor([8]), 10)
    assert torch.equal(same[:, :8], h) and int(same[:, 8:].sum()) == 0
