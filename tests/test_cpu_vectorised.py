"""The CPU element loops are vectorised: in the AVX2 and AVX-512 clones of every loop function
of csrc/cpu/ (csrc/cpu/loop.h's target_clones), the machine code divides or multiplies packed
floats in 256- or 512-bit registers (every rule divides by its scale, or multiplies by a
power of two's reciprocal). Read from the built library with objdump: the code, not the CPU
this runs on. A rule that GCC cannot vectorise (as the integer grid's mask bit returned in a
struct, 2026-11-28 to -29: per-tensor affine 7x slower) leaves a loop scalar, and fails here."""
import collections
import platform
import re
import shutil
import subprocess

import pytest

from fakequant import _extension

# The functions that hold an element loop (csrc/cpu/quantize.cpp, blockwise_loops.h,
# lsq_backward.cpp), each instantiated per format, dtype and mask.
LOOPS = ("run_uniform", "run_varying", "blockwise_tile", "long_blocks_tile", "rows_tile", "long_tile",
         "lsq_uniform", "lsq_varying")
CLONES = ("arch_x86_64_v3", "arch_x86_64_v4")
PACKED_ARITHMETIC = re.compile(r"^v(div|mul)p[sd]\s.*%[yz]mm")
HEADER = re.compile(r"^[0-9a-f]+ <(.*)>:$")
THUNK = re.compile(r"^jmp\s+[0-9a-f]+ <(.*)>$")  # (identical functions folded into one)

pytestmark = pytest.mark.skipif(platform.machine() != "x86_64" or shutil.which("objdump") is None,
                                reason="x86-64 clones read with objdump")


def _functions(library):
    text = subprocess.run(["objdump", "-d", "--no-show-raw-insn", "-C", library], check=True,
                          capture_output=True, text=True).stdout
    bodies, name = collections.defaultdict(list), None
    for line in text.splitlines():
        header = HEADER.match(line)
        if header:
            name = header.group(1)
        elif name is not None and "\t" in line:
            bodies[name].append(line.split("\t", 1)[1].strip())
    return bodies


def test_element_loops_are_vectorised():
    bodies = _functions(_extension._C.__file__)
    if not any("[clone .arch_x86_64_v3]" in name for name in bodies):
        pytest.skip("the library has no x86-64-v3 clones (not built by GCC for x86-64)")
    found, scalar = collections.Counter(), []
    for name, instructions in bodies.items():
        clone = next((c for c in CLONES if f"[clone .{c}]" in name), None)
        loop = re.sub(r"<.*", "", name).rsplit("::", 1)[-1]
        if clone is None or loop not in LOOPS:
            continue
        thunk = THUNK.match(instructions[0]) if instructions else None
        if thunk and thunk.group(1) in bodies:
            instructions = bodies[thunk.group(1)]
        found[loop, clone] += 1
        if not any(PACKED_ARITHMETIC.match(i) for i in instructions):
            scalar.append(name)
    assert sorted(found) == sorted((loop, clone) for loop in LOOPS for clone in CLONES), found
    assert not scalar, f"{len(scalar)} loop functions without packed arithmetic, e.g. {scalar[:3]}"
