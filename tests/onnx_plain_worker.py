"""Exports models of tests/onnx_cases.py with a plain ``torch.onnx.export`` in a fresh
process that calls no ``fakequant.onnx`` function: what a user's script does after
``import fakequant``. Run by tests/test_onnx_plain.py:

    python tests/onnx_plain_worker.py OUT_DIR JOBS_JSON

JOBS_JSON lists [case, exporter, opset, declared] jobs; each writes
OUT_DIR/<case>_<exporter>_<opset>[_declared].onnx, or a .error file with the exception, and
.warnings with the warnings fakequant raised. The "declared" jobs alone wrap the call in
``fakequant.onnx.export_options(opset_version=opset)``.
"""
import contextlib
import json
import pathlib
import sys
import traceback
import warnings

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))

import fakequant  # noqa: E402,F401
import onnx_cases  # noqa: E402


def export(case_name: str, exporter: str, opset: int, declared: bool, out: pathlib.Path) -> None:
    case = onnx_cases.CASES[case_name]
    model = case.make().eval()
    x = case.inputs()[0]
    kwargs = {"dynamic_axes": {"x": {0: "batch"}}} if case.dynamic_batch else {}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # The user's call: torch.onnx.export with torch's defaults but the opset (dynamo=True
        # is the default; named here to run both exporters).
        with fakequant.onnx.export_options(opset_version=opset) if declared else contextlib.nullcontext():
            torch.onnx.export(model, (x,), str(out), dynamo=exporter == "dynamo", opset_version=opset,
                              input_names=["x"], **kwargs)
    ours = [f"{w.category.__name__}: {w.message}" for w in caught if w.category.__module__.startswith("fakequant")]
    out.with_suffix(".warnings").write_text(json.dumps(ours))


def main() -> None:
    out_dir = pathlib.Path(sys.argv[1])
    for case_name, exporter, opset, declared in json.loads(sys.argv[2]):
        out = out_dir / f"{case_name}_{exporter}_{opset}{'_declared' if declared else ''}.onnx"
        try:
            export(case_name, exporter, opset, declared, out)
        except Exception:  # noqa: BLE001  (reported by the test of this job)
            out.with_suffix(".error").write_text(traceback.format_exc())


if __name__ == "__main__":
    main()
