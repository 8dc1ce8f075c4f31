"""Packaging: the build information compiled into fakequant._build and checked
before fakequant._C loads, the one version string, the torch pin of the wheel,
the default CUDA architectures and the error for ones the kernels cannot build
for. (Two environments built from one checkout: `make two-envs`.)"""
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fakequant
from fakequant import _build, _extension

ROOT = Path(__file__).resolve().parent.parent

# `nvcc --list-gpu-arch` of CUDA 12.4 and of CUDA 13.0, as (major, minor).
NVCC_12_4 = {(5, 0), (5, 2), (5, 3), (6, 0), (6, 1), (6, 2), (7, 0), (7, 2), (7, 5), (8, 0), (8, 6), (8, 7),
             (8, 9), (9, 0)}
NVCC_13_0 = {(7, 5), (8, 0), (8, 6), (8, 7), (8, 8), (8, 9), (9, 0), (10, 0), (11, 0), (10, 3), (12, 0), (12, 1)}


@pytest.fixture(scope="module")
def setup_py():
    """setup.py as a module (its setup() call runs only as __main__), with the
    environment restored after its import."""
    saved = dict(os.environ)
    try:
        spec = importlib.util.spec_from_file_location("fakequant_setup_py", ROOT / "setup.py")
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return module


def test_build_info_is_compiled_in():
    assert _build.TORCH_VERSION == torch.__version__ == fakequant.BUILT_FOR_TORCH
    assert _build.VERSION == fakequant.__version__
    assert (_build.CUDA_VERSION is None) == (_build.CUDA_ARCH_LIST is None)
    assert fakequant.BUILT_FOR_CUDA == _build.CUDA_VERSION and fakequant.CUDA_ARCH_LIST == _build.CUDA_ARCH_LIST
    # nothing generated into the source tree: the package holds no Python file of build information
    assert not list((ROOT / "fakequant").glob("_build_info*.py"))


@pytest.mark.skipif(shutil.which("readelf") is None, reason="needs readelf")
def test_build_module_links_no_torch():
    needed = subprocess.run(["readelf", "-d", _build.__file__], capture_output=True, text=True, check=True).stdout
    libraries = re.findall(r"\(NEEDED\)\s+Shared library: \[(.+?)\]", needed)
    assert not [lib for lib in libraries if re.search(r"torch|c10", lib)], libraries


def test_another_torch_gets_a_clear_import_error_before_the_library_loads():
    code = (
        "import sys, torch\n"
        "real = torch.__version__\n"
        "torch.__version__ = '2.0.0+other'\n"
        "try:\n"
        "    import fakequant\n"
        "except ImportError as e:\n"
        "    assert 'fakequant._C' not in sys.modules, 'the library was loaded'\n"
        "    print(e)\n"
        "    sys.exit(3)\n"
        "sys.exit('imported')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 3, (out.returncode, out.stdout, out.stderr)
    assert f"built for torch {torch.__version__}" in out.stdout and "torch 2.0.0+other" in out.stdout
    assert "pip install --no-build-isolation" in out.stdout


def test_a_library_built_from_another_version_is_refused(monkeypatch):
    monkeypatch.setattr(_build, "VERSION", "0.0.1")
    with pytest.raises(ImportError, match=rf"version {re.escape(fakequant.__version__)}.*version 0\.0\.1"):
        _extension.check_build()


def test_one_version_string(setup_py):
    from fakequant import _version

    assert fakequant.__version__ == _version.__version__ == setup_py.VERSION
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert not re.search(r"^version\s*=", pyproject, flags=re.M)
    assert re.search(r'^dynamic = \[.*"version".*"dependencies".*\]', pyproject, flags=re.M)
    # no other copy of it in the sources
    hits = [p for p in [*ROOT.glob("fakequant/**/*.py"), ROOT / "setup.py"]
            if p.name != "_version.py" and f'"{fakequant.__version__}"' in p.read_text()]
    assert not hits, hits


def test_wheel_pins_the_torch_release(setup_py):
    release = torch.__version__.split("+")[0]
    assert setup_py.requirements() == [f"torch=={release}", "tqdm>=4.60", "pyyaml>=5.4", "numpy"]
    assert setup_py.RUNTIME_REQUIREMENTS == ["tqdm>=4.60", "pyyaml>=5.4", "numpy"]
    from importlib.metadata import PackageNotFoundError, requires

    try:
        declared = requires("fakequant")
    except PackageNotFoundError:  # run from a checkout that was not pip-installed
        pytest.skip("fakequant is not installed")
    assert f"torch=={release}" in declared


@pytest.mark.parametrize("torch_version,with_cuda,label", [
    ("2.13.0+cpu", False, "torch2.13.0cpu"),
    ("2.13.0", False, "torch2.13.0cpu"),                    # a torch without a local label (macOS, PyPI)
    ("2.14.1+cu130", True, "torch2.14.1cu130"),
    ("2.14.1+cu130", False, "torch2.14.1cu130.cpuonly"),    # FAKEQUANT_CPU_ONLY=1 beside a CUDA torch
    ("2.8.0+rocm6.3", True, "torch2.8.0rocm63"),
])
def test_wheel_version_names_its_torch(setup_py, torch_version, with_cuda, label):
    from packaging.version import Version

    assert setup_py.local_label(torch_version, with_cuda) == label
    version = Version(f"{setup_py.VERSION}+{label}")  # a valid PEP 440 local version
    assert version.public == setup_py.VERSION and version.local == label


def test_installed_version_carries_the_label(setup_py):
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("fakequant")
    except PackageNotFoundError:
        pytest.skip("fakequant is not installed")
    assert installed == f"{fakequant.__version__}+{setup_py.local_label()}"


def test_changelog_has_this_release():
    text = (ROOT / "CHANGELOG.md").read_text()
    releases = re.findall(r"^## (\d+\.\d+\.\d+) \(\d{4}-\d{2}-\d{2}\)$", text, flags=re.M)
    assert releases and releases[0] == fakequant.__version__, releases  # the newest entry first


def test_sdist_names_no_torch(setup_py):
    assert setup_py.building_sdist(["sdist", "--formats", "gztar"])
    assert not setup_py.building_sdist(["bdist_wheel"]) and not setup_py.building_sdist(["editable_wheel"])
    assert setup_py.MIN_TORCH == "torch>=2.4"
    manifest = (ROOT / "MANIFEST.in").read_text()
    assert "graft csrc" in manifest and "LICENSE" in manifest


def test_default_cuda_arch_list(setup_py):
    assert setup_py.cuda_arch_list(None, NVCC_12_4) == "7.0;7.5;8.0;8.6;8.9;9.0+PTX"
    assert setup_py.cuda_arch_list("", NVCC_13_0) == "7.5;8.0;8.6;8.9;9.0+PTX"  # CUDA 13 dropped 7.0
    assert setup_py.cuda_arch_list(None, None) == "7.0;7.5;8.0;8.6;8.9;9.0+PTX"  # nvcc could not say
    with pytest.raises(ValueError, match="supports none of fakequant's default architectures"):
        setup_py.cuda_arch_list(None, {(5, 0), (6, 1)})


@pytest.mark.parametrize("requested", ["8.0;9.0", "8.0 9.0+PTX", "7.5;8.6", "9.0a", "Ampere;Hopper", "native"])
def test_cuda_arch_list_accepted(setup_py, requested):
    assert setup_py.cuda_arch_list(requested, NVCC_13_0) == requested


@pytest.mark.parametrize("requested, bad", [("6.1;8.0", "6.1"), ("5.2+PTX", "5.2+PTX"), ("Pascal;Ampere", "Pascal"),
                                            ("7.0;3.7", "3.7")])
def test_cuda_arch_below_7_0_is_refused(setup_py, requested, bad):
    with pytest.raises(ValueError) as info:
        setup_py.cuda_arch_list(requested, NVCC_12_4)
    message = str(info.value)
    assert f"TORCH_CUDA_ARCH_LIST={requested!r}" in message and repr(bad) in message
    assert "7.0 or newer" in message and "__grid_constant__" in message and "allowed" in message


def test_cuda_arch_the_toolkit_lacks_is_refused(setup_py):
    with pytest.raises(ValueError, match=r"cannot build for '7\.0'; allowed: 7\.5, 8\.0"):
        setup_py.cuda_arch_list("7.0;8.0", NVCC_13_0)


def test_each_environment_builds_in_its_own_directory(setup_py):
    path = Path(setup_py.build_dir())
    assert path.parent == Path("build")
    assert f"torch{torch.__version__}" in path.name and f"cp{sys.version_info[0]}{sys.version_info[1]}" in path.name


@pytest.mark.skipif(shutil.which("readelf") is None or shutil.which("g++") is None, reason="needs g++ and readelf")
def test_a_compiler_that_links_libstdcxx_statically_is_told(setup_py, tmp_path):
    """A library with its own copy of libstdc++ beside torch's crashed the process at the first C++
    exception on the first GPU machine (its toolchain shipped only libstdc++.a): the build refuses
    such a compiler, and takes the usual one."""
    assert setup_py.static_libstdcxx(["g++", "-static-libstdc++"], str(tmp_path / "static")) is True
    assert setup_py.static_libstdcxx(["g++"], str(tmp_path / "shared")) is False
    assert setup_py.static_libstdcxx(["no-such-compiler-g++"], str(tmp_path / "none")) is None


def test_the_library_links_libstdcxx_dynamically():
    if shutil.which("readelf") is None:
        pytest.skip("needs readelf")
    dynamic = subprocess.run(["readelf", "-d", fakequant._C.__file__], capture_output=True, text=True, check=True).stdout
    assert "libstdc++" in dynamic
