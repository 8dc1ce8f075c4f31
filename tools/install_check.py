"""`make install-check`: the wheel of `make dist`, tested as a user gets it.

1. A fresh virtualenv (build/install-check/venv) gets the torch of `make build`
   and the wheel with its test extra (`pip install "fakequant-...whl[test]"`): not
   editable, and nothing of the checkout on sys.path.
2. There, from a directory outside the checkout: `python -m fakequant info` (its
   self-check of every operator), and a representative part of the test suite
   (INSTALLED_TESTS: the operators, the quantizers and modules, calibration, ONNX
   export, serialization), copied out of the checkout with its conftest.
3. The same test files run in the editable install of `make build`; every test
   must end the same way in both (passed, skipped, failed), test by test.
4. A second fresh virtualenv gets another torch (that of $ENV2, else $TORCH2) and the
   wheel without its dependencies: `import fakequant` must raise the ImportError that names both
   torch versions, and must not load the operator library or crash.

Environment: PY (make build's python), DIST (the folder with the wheel), TORCH
and TORCH2 (pip requirements), ENV2 (a virtualenv holding another torch, make
two-envs' .venv-torch2141, used when present), WORK (default build/install-check).
"""
import os
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
INSTALLED_TESTS = [
    "test_ops.py", "test_tensor_quant.py", "test_quantizer.py", "test_quant_nn.py", "test_quant_modules.py",
    "test_calib.py", "test_onnx_export.py", "test_serialization.py", "test_cli.py",
]
# What the copied tests import besides fakequant.
TEST_HELPERS = ["conftest.py", "reference.py", "dist_helpers.py"]
PYTEST_INI = "[pytest]\nmarkers =\n    slow: long-running cases (make slow)\naddopts = -ra\n"


def run(cmd, **kwargs):
    print("+", " ".join(map(str, cmd)), flush=True)
    return subprocess.run(list(map(str, cmd)), check=True, **kwargs)


def fresh_venv(path):
    shutil.rmtree(path, ignore_errors=True)
    run([sys.executable, "-m", "venv", path])
    python = path / "bin" / "python"
    return python


def output(python, code, cwd=None):
    """What `python -c code` prints, stripped."""
    return subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True, check=True).stdout.strip()


def purelib(python):
    return output(python, "import sysconfig; print(sysconfig.get_paths()['purelib'])")


def check_origin(python, cwd):
    """fakequant, found from `cwd`, must be the environment's installed copy."""
    origin = output(python, "import importlib.util; print(importlib.util.find_spec('fakequant').origin)", cwd)
    if not origin.startswith(purelib(python) + os.sep):
        sys.exit(f"install_check: {python} finds fakequant at {origin}, not in its site-packages")
    print(f"fakequant found at {origin}")


def pip(python, *args):
    run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])


def outcomes(junit):
    """{test id: 'passed' | 'skipped' | 'failed'} from a pytest junit XML file."""
    result = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        result[name] = ("failed" if kinds & {"failure", "error"} else "skipped" if "skipped" in kinds else "passed")
    return result


def pytest(runs):
    """The copied tests run by each (python, cwd, junit) of `runs`, the runs at once (a pytest
    process keeps one core busy), each one's output printed when all are done; returns each
    one's exit code, and the wall time of them all."""
    tests = [f"tests/{name}" for name in INSTALLED_TESTS]
    start = time.perf_counter()
    processes = []
    for python, cwd, junit in runs:
        cmd = [python, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}", *tests]
        log = open(Path(junit).with_suffix(".log"), "w+")
        processes.append((" ".join(map(str, cmd)) + f" (in {cwd})", log,
                          subprocess.Popen(list(map(str, cmd)), cwd=cwd, stdout=log, stderr=subprocess.STDOUT)))
    codes = []
    for line, log, process in processes:
        codes.append(process.wait())
        log.seek(0)
        print("+", line, flush=True)
        sys.stdout.write(log.read())
        log.close()
    return codes, time.perf_counter() - start


def main():
    py = Path(os.environ.get("PY", ROOT / ".venv" / "bin" / "python")).absolute()
    dist = ROOT / os.environ.get("DIST", "dist")
    torch_req, torch2_req = os.environ.get("TORCH", "torch==2.13.0"), os.environ.get("TORCH2", "torch==2.14.1")
    work = ROOT / os.environ.get("WORK", "build/install-check")
    wheels = sorted(dist.glob("fakequant-*.whl"))
    if len(wheels) != 1:
        sys.exit(f"install_check: expected one wheel in {dist} (make dist), found {[w.name for w in wheels]}")
    wheel = wheels[0]
    work.mkdir(parents=True, exist_ok=True)
    timings = {}

    start = time.perf_counter()
    python = fresh_venv(work / "venv")
    pip(python, torch_req)
    pip(python, f"{wheel}[test]")
    timings["install"] = time.perf_counter() - start

    # The tests, copied out of the checkout: a directory holding no fakequant/.
    outside = work / "run"
    shutil.rmtree(outside, ignore_errors=True)
    (outside / "tests").mkdir(parents=True)
    for name in TEST_HELPERS + INSTALLED_TESTS:
        shutil.copy(ROOT / "tests" / name, outside / "tests" / name)
    (outside / "pytest.ini").write_text(PYTEST_INI)
    check_origin(python, outside)
    run([python, "-m", "fakequant", "info"], cwd=outside)

    (installed_code, editable_code), timings["tests, installed and editable at once"] = pytest(
        [(python, outside, work / "installed.xml"), (py, ROOT, work / "editable.xml")])
    installed, editable = outcomes(work / "installed.xml"), outcomes(work / "editable.xml")
    differences = [f"{name}: {editable.get(name, 'absent')} editable, {installed.get(name, 'absent')} installed"
                   for name in sorted(set(installed) | set(editable)) if installed.get(name) != editable.get(name)]
    counts = {kind: sum(1 for v in installed.values() if v == kind) for kind in ("passed", "skipped", "failed")}
    print(f"installed wheel: {len(installed)} tests, {counts}; pytest exit {installed_code} "
          f"(editable: exit {editable_code})")
    if differences:
        sys.exit("install_check: the installed wheel and the editable install differ:\n  " + "\n  ".join(differences))
    if installed_code or editable_code or counts["failed"] or not counts["passed"]:
        sys.exit("install_check: the tests failed")

    # Another torch: the clear ImportError, before the operator library loads. The torch
    # is the one $ENV2 (make two-envs' virtualenv) imports, when it has one: a .pth file puts
    # the site-packages holding it after the fresh environment's own, which holds the wheel
    # (a CUDA torch installed afresh would cost minutes and gigabytes); otherwise pip
    # installs $TORCH2. (That site-packages may be another virtualenv's: make two-envs
    # borrows make cuda-build's torch the same way.)
    start = time.perf_counter()
    python2 = fresh_venv(work / "venv-torch2")
    env2 = ROOT / os.environ.get("ENV2", ".venv-torch2141")
    if (env2 / "bin" / "python").exists():
        site2 = output(env2 / "bin" / "python", "import os, torch; print(os.path.dirname(os.path.dirname(torch.__file__)))")
        Path(purelib(python2), "other_torch.pth").write_text(site2 + "\n")
        print(f"torch from {site2}")
    else:
        pip(python2, torch2_req)
    pip(python2, "--no-deps", wheel)
    check_origin(python2, outside)
    built_for = output(py, "import torch; print(torch.__version__)")
    if subprocess.run([python2, ROOT / "tools" / "expect_import_error.py", f"built for torch {built_for}"],
                      cwd=outside).returncode:
        sys.exit(f"install_check: under another torch, `import fakequant` did not raise the ImportError "
                 f"naming torch {built_for}")
    timings["other torch"] = time.perf_counter() - start
    print("make install-check: the installed wheel passes the tests as the editable install does; "
          "another torch gets the clear ImportError (" + ", ".join(f"{k} {v:.0f} s" for k, v in timings.items()) + ")")


if __name__ == "__main__":
    main()
