"""benchmarks/bench_compiled_qat.py's budget and its CUDA defaults, on the CPU and without compiling:
what is measured, left out and named when time runs out (issue 36, item 3). No time is asserted."""
import pytest

import fakequant

from conftest import benchmark_module

@pytest.fixture(scope="module")
def bench():
    return benchmark_module("bench_compiled_qat")


def test_out_of_time_every_configuration_is_named_not_measured(bench):
    result = bench.run(["resnet", "llama"], rounds=3, progress=False, only=["float eager", "fakequant compiled"],
                       budget=0)
    for model in ("resnet", "llama"):
        rows = result["models"][model]
        assert [r["config"] for r in rows] == ["float eager", "fakequant compiled"]
        assert all(r["error"].startswith("not measured: out of time") for r in rows)
    table = bench.format_tables(result)
    assert table.count("not measured: out of time") == 4 and "did not run" not in table


def test_each_model_is_reported_as_it_completes(bench):
    seen = []
    result = bench.run(["resnet"], rounds=2, progress=False, only=["float eager", "fakequant eager"], steps=2,
                       on_model=lambda model, rows: seen.append((model, [r["config"] for r in rows])))
    assert seen == [("resnet", ["float eager", "fakequant eager"])]
    rows = {r["config"]: r for r in result["models"]["resnet"]}
    for row in rows.values():
        assert row["rounds"] == 2 and row["steps_per_sample"] == 2 and row["step_ms"] > 0
        assert row["saved_mb"] > 0 and row["compile_s"] is None
    assert rows["float eager"]["vs_float_same_mode"] == 1.0
    assert "| fakequant eager |" in bench.format_tables(result)


def test_a_compiled_configuration_is_not_started_where_its_build_would_end_past_the_deadline(bench, monkeypatch):
    import time

    built = []

    def build(model, name):
        built.append(name)
        raise RuntimeError("not built here")

    monkeypatch.setattr(bench, "Run", build)
    rows = bench.measure("resnet", ["float eager", "float compiled"], rounds=1, deadline=time.monotonic() + 5,
                         compile_s=[60.0])
    assert built == ["float eager"]  # (the eager one is cheap: tried, here it raises and is reported)
    assert rows[0]["error"] == "RuntimeError: not built here"
    assert rows[1]["error"].startswith("not measured: out of time (a compiled configuration took 60 s")


def test_the_cuda_defaults_are_the_targets_configurations(bench):
    assert set(bench.CUDA_CONFIGS) == {"float eager", "float compiled", "fakequant eager", "fakequant compiled",
                                       "fakequant compiled (mask_backward op)"}
    assert set(bench.CUDA_CONFIGS) <= set(bench.CONFIGS) and bench.CUDA_STEPS > 1


def test_each_device_measures_the_backward_its_default_does_not_take(bench, monkeypatch):
    from fakequant.composite import compiled

    assert compiled.FUSED_BACKWARD_DEVICE_TYPES == ("cuda",)
    for model in ("resnet", "llama"):  # the CPU: the fused backward, measured against the default's call
        assert "fakequant compiled (fused backward)" in bench.configs_for(model)
        assert "fakequant compiled (mask_backward op)" not in bench.configs_for(model)
    monkeypatch.setattr(bench, "DEVICE", bench.torch.device("cuda"))
    assert "fakequant compiled (mask_backward op)" in bench.configs_for("resnet")
    for model in ("resnet", "llama", "moe"):
        assert "fakequant compiled (fused backward)" not in bench.configs_for(model)
    assert "fakequant compiled (mask_backward op)" not in bench.configs_for("llama")
    for name, device_types in (("fakequant compiled (fused backward)", ("cpu", "cuda")),
                               ("fakequant compiled (mask_backward op)", ())):
        with bench.CONFIGS[name][2]():
            assert compiled.FUSED_BACKWARD_DEVICE_TYPES == device_types and fakequant.compiled_path() == "opaque"
        assert compiled.FUSED_BACKWARD_DEVICE_TYPES == ("cuda",)


def test_cuda_graph_configurations_compare_with_float_under_cuda_graphs(bench, monkeypatch):
    # --cudagraphs (CUDA only): each configuration against the float step of its own mode, and
    # Inductor asked for CUDA graphs for those two alone
    assert bench._mode("fakequant compiled (CUDA graphs)") == "float compiled (CUDA graphs)"
    assert bench._mode("fakequant compiled") == "float compiled"
    assert bench._mode("fakequant eager") == "float eager"
    assert not set(bench.CUDA_GRAPH_CONFIGS) & set(bench.configs_for("resnet"))  # (the CPU)
    monkeypatch.setattr(bench, "DEVICE", bench.torch.device("cuda"))
    assert set(bench.CUDA_GRAPH_CONFIGS) <= set(bench.configs_for("resnet")) & set(bench.configs_for("moe"))
    seen = []
    import torch._inductor.compile_fx as compile_fx
    monkeypatch.setattr(compile_fx, "compile_fx", lambda gm, inputs, config_patches=None: seen.append(config_patches))
    for name in ("float compiled", "fakequant compiled (CUDA graphs)"):
        bench._backend(name)(None, [])
    assert seen == [None, {"triton.cudagraphs": True}]


def test_graph_breaks_are_counted_while_compiling(bench):
    import torch

    def breaks(x):
        y = x * 2
        print("a graph break")
        return y + 1

    before = bench.graph_break_count()
    torch.compile(breaks, backend="eager")(torch.randn(3))
    assert bench.graph_break_count() - before == 1


def test_a_backend_that_fails_is_counted_as_a_break(bench):
    # (Dynamo runs the frame eagerly and warns "Adding a graph break", but counts no graph break)
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException

    def failing(gm, inputs):
        raise DataDependentOutputException(torch.ops.aten._local_scalar_dense.default)

    def f(x):
        return (x * 2).sum() + 1

    before = bench.graph_break_count()
    x = torch.randn(3)
    assert torch.equal(torch.compile(f, backend=failing)(x), f(x))
    assert bench.graph_break_count() - before == 1


def test_the_compiled_configurations_of_a_model_are_built_together_or_not_at_all(bench, monkeypatch):
    import time

    class Built:
        def __init__(self, model, name):
            self.compiled = bench.CONFIGS[name][1]

        def step(self):
            pass

    monkeypatch.setattr(bench, "Run", Built)
    monkeypatch.setattr(bench, "peak_step_mb", lambda run: 1.0)
    monkeypatch.setattr(bench, "saved_mb", lambda run: 1.0)
    configs = ["float eager", "float compiled", "fakequant eager", "fakequant compiled"]
    # two compiles of 30 s do not fit 40 s: neither is started; the eager ones are
    rows = {r["config"]: r for r in bench.measure("resnet", configs, rounds=1, deadline=time.monotonic() + 40,
                                                   compile_s=[30.0])}
    assert all(rows[c]["error"].startswith("not measured: out of time") for c in ("float compiled",
                                                                                  "fakequant compiled"))
    assert rows["float eager"]["step_ms"] >= 0 and rows["fakequant eager"]["vs_float_same_mode"] is not None
    # they fit the whole budget (compile_deadline) though not this model's share (deadline)
    rows = {r["config"]: r for r in bench.measure("resnet", configs, rounds=1, deadline=time.monotonic() + 40,
                                                   compile_s=[30.0], compile_deadline=time.monotonic() + 100)}
    assert all("step_ms" in r for r in rows.values()) and rows["float compiled"]["graph_breaks"] == 0


def test_a_configuration_that_fails_in_a_timed_round_is_reported_and_the_others_stand(bench, monkeypatch):
    import time

    class Built:
        def __init__(self, model, name):
            self.compiled, self.name, self.steps = bench.CONFIGS[name][1], name, 0

        def step(self):
            self.steps += 1
            if self.name == "fakequant compiled" and self.steps == 3:  # (the builds' two steps pass)
                raise RuntimeError("recording failed\nmore")

    monkeypatch.setattr(bench, "Run", Built)
    monkeypatch.setattr(bench, "peak_step_mb", lambda run: 1.0)

    def saved_mb(run):
        if run.name == "float compiled":
            raise RuntimeError("no hooks under CUDA graphs")
        return 1.0

    monkeypatch.setattr(bench, "saved_mb", saved_mb)
    real_profile = bench.profile_steps

    def profile_steps(run, steps):
        if run.name == "float eager":
            raise AttributeError("no profile here")
        return real_profile(run, steps)

    monkeypatch.setattr(bench, "profile_steps", profile_steps)
    configs = ["float eager", "float compiled", "fakequant eager", "fakequant compiled"]
    result = bench.measure("resnet", configs, rounds=2, deadline=time.monotonic() + 60)
    rows = {r["config"]: r for r in result}
    assert rows["fakequant compiled"]["error"] == "RuntimeError in round 1: recording failed"
    assert "step_ms" not in rows["fakequant compiled"]
    assert rows["float compiled"]["step_ms"] >= 0 and rows["float compiled"]["saved_mb"] is None
    assert rows["fakequant eager"]["rounds"] == 2 and rows["fakequant eager"]["saved_mb"] == 1.0
    table = bench.format_tables({"models": {"resnet": result}})
    assert "| fakequant compiled | did not run: RuntimeError in round 1: recording failed |" in table
    assert "Memory and saved bytes not measured: float compiled (RuntimeError: no hooks under CUDA graphs)" in table
    # (a profile that fails is named apart, and the memory figures stand)
    assert rows["float eager"]["profile_error"].startswith("AttributeError") and "profile" not in rows["float eager"]
    assert "Not profiled: float eager (AttributeError" in table


def test_the_profile_counts_each_operator_call_once(bench):
    """40 linear layers, 80 quantizers: a step calls the operator 80 times forward and 79 times
    backward (the first layer's input needs no gradient), whatever levels the profiler records a
    call at; a float step calls none. On the CPU there are no launches or GPU time to count."""
    for name, calls in (("fakequant eager", 159), ("float eager", 0)):
        profile = bench.profile_steps(bench.Run("host", name), steps=2)
        assert profile["fakequant_calls"] == calls
        assert profile["launches"] is None and profile["gpu_kernel_ms"] is None
        assert profile["profiled_step_ms"] > 0 and len(profile["top_host"]) == 12
        if calls:
            assert any(e["name"] == "fakequant::fake_quantize_amax" and e["calls"] == 80 for e in profile["top_host"])
    row = dict(config="fakequant eager", step_ms=4.0, vs_float_same_mode=None, vs_float_eager=None, compile_s=None,
               graph_breaks=None, peak_step_mb=None, saved_mb=None, profile=profile)
    table = bench.format_tables({"models": {"host": [dict(row, profile=dict(
        profile, fakequant_calls=159, launches=300.0, gpu_kernel_ms=1.0))]}})
    assert "| fakequant eager | 159 | 300 | 1.00 | 25% |" in table
