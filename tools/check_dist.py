"""`make dist`'s check of what it built: python tools/check_dist.py DIST_DIR

DIST_DIR holds one sdist (fakequant-X.tar.gz) and one wheel, built from that sdist
for the torch of the running Python. Checked:

- the sdist holds everything a build needs: every file under csrc/ (each header and
  .cu file), setup.py, pyproject.toml, MANIFEST.in, every module of the package,
  py.typed, LICENSE, README.md and CHANGELOG.md; and no compiled library, object
  file, test or build leftover. Its version carries no torch label.
- neither holds a file of the SIMT emulator (tests/emulator/: test infrastructure),
  under any folder: no file named as one of them.
- the wheel holds every module of the package, both compiled libraries, py.typed and
  the license; nothing from tests/, benchmarks/, tools/ or csrc/, and no build
  leftover. Its version is fakequant's with the local label naming the torch it was
  built for (0.2.0+torch2.13.0cpu) and it requires exactly that torch release.

Prints the wheel's contents (the modules counted per package) and both sizes.
"""
import email.parser
import os
import re
import sys
import tarfile
import zipfile
from collections import Counter
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from setup import local_label, read_version  # noqa: E402  (setup() runs only as __main__)

LEFTOVER = re.compile(r"(^|/)(__pycache__|build|dist|[^/]*\.egg-info)(/|$)|\.(so|o|pyc|pyd)$")
EMULATOR = "tests/emulator"


def source_files(top):
    """The files of the checkout under `top` (relative to ROOT), less caches and
    the libraries an editable install puts into fakequant/."""
    found = set()
    for folder, dirs, files in os.walk(ROOT / top):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        for name in files:
            if not re.search(r"\.(so|pyc)$", name):
                found.add(str((Path(folder) / name).relative_to(ROOT)))
    return found


def emulator_files(names):
    """Those of `names` (paths in an archive) that are files of the SIMT emulator,
    wherever they were put."""
    emulator = {os.path.basename(p) for p in source_files(EMULATOR)}
    if not emulator:
        sys.exit(f"check_dist: no files under {EMULATOR}/: update EMULATOR")
    return {n for n in names if os.path.basename(n) in emulator}


def fail(problems, what):
    if problems:
        sys.exit(f"check_dist: {what}:\n  " + "\n  ".join(sorted(problems)))


def metadata(text):
    return email.parser.Parser().parsestr(text)


def check_sdist(path, version):
    with tarfile.open(path) as tar:
        names = [m.name for m in tar.getmembers() if m.isfile()]
        prefix = f"fakequant-{version}/"
        pkg_info = tar.extractfile(prefix + "PKG-INFO").read().decode()
    fail([n for n in names if not n.startswith(prefix)], f"{path.name}: files outside {prefix}")
    inside = {n[len(prefix):] for n in names}
    needed = source_files("csrc") | {p for p in source_files("fakequant") if p.endswith((".py", ".pyi", "py.typed"))}
    needed |= {"setup.py", "pyproject.toml", "MANIFEST.in", "LICENSE", "README.md", "CHANGELOG.md"}
    fail(needed - inside, f"{path.name} lacks files a build or a user needs")
    unwanted = {n for n in inside if n.startswith(("tests/", "benchmarks/", "tools/", "docs/", "examples/"))}
    unwanted |= {n for n in inside if LEFTOVER.search(n) and not n.startswith("fakequant.egg-info/")}
    fail(unwanted, f"{path.name} holds files it should not")
    fail(emulator_files(inside), f"{path.name} holds the SIMT emulator ({EMULATOR}/), which is test infrastructure")
    meta = metadata(pkg_info)
    fail([] if meta["Version"] == version else [meta["Version"]], f"{path.name}: version is not {version}")
    print(f"sdist {path.name}: {len(inside)} files ({len(source_files('csrc'))} under csrc/), "
          f"{path.stat().st_size / 1024:.0f} KiB")


def check_wheel(path, version):
    label = local_label()
    full = f"{version}+{label}"
    with zipfile.ZipFile(path) as whl:
        names = whl.namelist()
        info = f"fakequant-{full}.dist-info/"
        meta = metadata(whl.read(info + "METADATA").decode())
        wheel_meta = metadata(whl.read(info + "WHEEL").decode())
    package = [n for n in names if not n.startswith(info)]
    needed = {p for p in source_files("fakequant") if p.endswith((".py", ".pyi", "py.typed"))}
    fail(needed - set(package), f"{path.name} lacks modules of the package")
    fail({info + "licenses/LICENSE"} - set(names), f"{path.name} lacks the license file")
    libraries = [n for n in package if n.endswith(".so")]
    fail({"fakequant/_C", "fakequant/_build"} - {n.split(".")[0] for n in libraries},
         f"{path.name} lacks a compiled library")
    fail([n for n in package if not n.startswith("fakequant/")], f"{path.name} holds files outside fakequant/")
    fail(emulator_files(names), f"{path.name} holds the SIMT emulator ({EMULATOR}/), which is test infrastructure")
    fail([n for n in package if n not in libraries and LEFTOVER.search(n)], f"{path.name} holds build leftovers")
    release = torch.__version__.split("+")[0]
    problems = [] if meta["Version"] == full else [f"version {meta['Version']}, expected {full}"]
    requires = meta.get_all("Requires-Dist") or []
    if f"torch=={release}" not in requires:
        problems.append(f"requires {requires}, not torch=={release}")
    if meta["License-Expression"] != "Apache-2.0":
        problems.append(f"License-Expression {meta['License-Expression']}")
    if wheel_meta["Root-Is-Purelib"] != "false":
        problems.append("a pure-Python wheel")
    fail(problems, f"{path.name}'s metadata")
    per_package = Counter(os.path.dirname(n) for n in package if n.endswith(".py"))
    print(f"wheel {path.name}: {len(package)} files, {path.stat().st_size / 1024:.0f} KiB; "
          f"requires {', '.join(r for r in requires if 'extra ==' not in r)}")
    for folder, count in sorted(per_package.items()):
        print(f"  {folder}/: {count} modules")
    others = sorted(n for n in package if not n.endswith(".py"))
    print(f"  and {', '.join(others)}; {info}licenses/LICENSE")


def main(dist):
    dist = Path(dist)
    sdists, wheels = sorted(dist.glob("fakequant-*.tar.gz")), sorted(dist.glob("fakequant-*.whl"))
    if len(sdists) != 1 or len(wheels) != 1:
        sys.exit(f"check_dist: expected one sdist and one wheel in {dist}, found {[p.name for p in dist.iterdir()]}")
    version = read_version()
    check_sdist(sdists[0], version)
    check_wheel(wheels[0], version)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "dist")
