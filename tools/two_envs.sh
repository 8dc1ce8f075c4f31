#!/usr/bin/env bash
# `make two-envs`: one checkout built into two environments with two torch
# releases, and both keep working.
#
#   A: `make build`'s virtualenv (.venv, torch 2.13.0), an editable install.
#   B: a second virtualenv ($ENV2, $TORCH2), a CPU-only non-editable install
#      (`pip install --no-build-isolation .`) from the same checkout; its torch is that of
#      $TORCH2_FROM when that virtualenv holds the release $TORCH2 names.
#
# Checked: B's install changes nothing in the source tree's package (A's
# editable install still has its libraries, unchanged); each environment
# imports fakequant and runs an operator; B's wheel pins its torch release; and
# B importing the checkout's in-tree package (built for A's torch) gets a clean
# ImportError naming both torch versions, before the operator library loads.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PY_A=$(realpath -s "${PY:-.venv/bin/python}")
ENV2=${ENV2:-.venv-torch2141}
TORCH2=${TORCH2:-torch==2.14.1}
MAX_JOBS=${MAX_JOBS:-2}

# B's torch: when $TORCH2_FROM (make cuda-build's .venv-cuda) holds that very release, a .pth
# file puts its site-packages after B's own instead of a second copy of it (5.5 GB on disk: CI's
# disk once ran out); B's own site-packages, first on sys.path, holds B's fakequant.
if [ ! -x "$ENV2/bin/python" ]; then
    python3 -m venv "$ENV2"
    want=${TORCH2#torch==}
    from_py=${TORCH2_FROM:+$TORCH2_FROM/bin/python}
    if [ -n "$from_py" ] && [ -x "$from_py" ] &&
       [ "$("$from_py" -c 'import torch; print(torch.__version__.split("+")[0])' 2>/dev/null)" = "$want" ]; then
        site=$("$from_py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
        echo "$site" > "$("$ENV2/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/torch_from.pth"
        echo "== B's torch from $site"
        "$ENV2/bin/python" -m pip install -q --disable-pip-version-check "setuptools>=77" wheel ninja numpy
    else
        "$ENV2/bin/python" -m pip install -q --disable-pip-version-check "setuptools>=77" wheel ninja numpy "$TORCH2"
    fi
fi
PY_B=$(realpath -s "$ENV2/bin/python")

snapshot() { (cd "$ROOT" && find fakequant -type f ! -path '*/__pycache__/*' | sort | xargs sha256sum); }
before=$(snapshot)

echo "== B: FAKEQUANT_CPU_ONLY=1 pip install --no-build-isolation . (torch $("$PY_B" -c 'import torch; print(torch.__version__)' 2>/dev/null))"
FAKEQUANT_CPU_ONLY=1 MAX_JOBS=$MAX_JOBS "$PY_B" -m pip install -q --disable-pip-version-check \
    --no-build-isolation --force-reinstall --no-deps . 2>&1 | grep -v "is ignored" || true

after=$(snapshot)
if [ "$before" != "$after" ]; then
    echo "B's install changed the source tree's package:"; diff <(echo "$before") <(echo "$after") || true; exit 1
fi
echo "source tree's fakequant/ unchanged by B's install ($(echo "$after" | wc -l) files)"

RUN_OP='
import sys, torch, fakequant
y = fakequant.fake_quantize_amax(torch.tensor([-2.0, -0.5, 0.3, 2.0]), 1.0)
assert y[0].item() == -1.0 and y[3].item() == 1.0 and y[2].item() == (torch.tensor(38.0) * (torch.tensor(1.0) / 127)).item(), y
print(f"  fakequant {fakequant.__version__} from {fakequant.__file__}")
print(f"  torch {torch.__version__}, built for {fakequant.BUILT_FOR_TORCH} (CUDA {fakequant.BUILT_FOR_CUDA})")
print(f"  fake_quantize_amax -> {y.tolist()}")
'
# From an empty directory outside the checkout, so that each imports its own install (not
# /tmp itself: a stray module there, an enum.py, would shadow the standard library's).
RUN_DIR=$(mktemp -d)
trap 'rm -rf "$RUN_DIR"' EXIT
cd "$RUN_DIR"
for side in A B; do
    py=PY_$side
    echo "== $side: import fakequant and run an operator"
    "${!py}" -c "$RUN_OP"
    "${!py}" -m fakequant info | tail -n 1
done

echo "== B's wheel metadata"
"$PY_B" - <<'EOF'
from importlib.metadata import requires, version
import torch
print(f"  fakequant {version('fakequant')} requires {requires('fakequant')}")
assert f"torch=={torch.__version__.split('+')[0]}" in requires("fakequant")
EOF

echo "== B importing the checkout's package (built for A's torch)"
PYTHONPATH=$ROOT "$PY_B" "$ROOT/tools/expect_import_error.py" "built for torch $("$PY_A" -c 'import torch; print(torch.__version__)')"

echo "== A again, after B's install"
"$PY_A" -c "$RUN_OP"
echo "make two-envs: both environments work; the mismatched one gets a clear ImportError"
