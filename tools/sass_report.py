"""The instruction count of each CUDA kernel's hot loop, from the SASS of a build.

    python tools/sass_report.py [LIBRARY] [--arch sm_90] [--json FILE] [--opcodes]
    python tools/sass_report.py --diff BEFORE.json AFTER.json

LIBRARY is a fakequant._C built with CUDA, or the folder `make cuda-build` writes
(default: build/cuda; `make sass` runs this on it). No GPU is needed: cuobjdump reads
the machine code that nvcc wrote for the architecture, and for each kernel of
KERNELS this finds its hot loop, the innermost loop that both loads and stores
global memory (a backward branch and the instructions from its target to it; of
several, the one with the widest load), and counts:

  - instructions in the loop body, per element of the loop's work and per byte
    moved (the element read plus written: the floor a memory-bound kernel pays),
    less the out-of-line slow paths it calls (counted apart, see slow_calls);
  - global loads and stores by width (LDG.E.128 is 16 bytes, LDG.E.U16 two);
  - with --opcodes, every opcode's count; --diff compares two builds' counts per
    element.

Counts are static: the body's instructions once each, whatever branch a warp
takes inside it (so a branch's cold side counts as if it ran), but for the slow
paths called out of line (a correctly rounded division's operands near the ends of
the float range, the kernels' blocks and trips that take their slow path), counted
apart. docs/performance.md ("The GPU kernels' instruction budget") explains the
budget: an H200 issues about 7 thread-instructions per byte that its memory moves,
so a kernel under about 5 per byte is limited by memory.
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# What an H200 issues and moves per second (docs/performance.md): 132 SMs x 4
# schedulers x 32 lanes x 1.98 GHz thread-instructions, 4.8e12 bytes.
ISSUE_RATE = 132 * 4 * 32 * 1.98e9
MEMORY_RATE = 4.8e12
LIMIT_PER_BYTE = ISSUE_RATE / MEMORY_RATE  # about 7
BUDGET_PER_BYTE = 5.0


@dataclass
class Kernel:
    """One kernel instantiation to report: the first of `patterns` (regular expressions,
    each with the elements one thread handles in one trip of its hot loop) that matches a
    demangled name in the build, so that a label follows its work from one kernel
    generation to the next; `element_bytes` is what one element costs in memory (read
    and written)."""

    label: str
    patterns: List[Tuple[str, int]]
    element_bytes: int


_DTYPES = [("float32", "float", 4), ("bfloat16", "c10::BFloat16", 2)]


QUANTIZE_TRIP = 4  # kQuantizeTrip (csrc/cuda/kernels.cuh)


def _rows_pattern(ctype: str, size: int) -> Callable[[str, str], Tuple[str, int]]:
    """quantize_rows_kernel: QUANTIZE_TRIP vectors a thread a tile (two before 2026-11-29: such a
    build's per-element counts are twice what this report prints for it)."""
    def pattern(window: str, family: str) -> Tuple[str, int]:
        return (rf"quantize_rows_kernel<{re.escape(ctype)}, \(fakequant::Format\)0, \(fakequant::Output\)0, "
                rf"\(fakequant::Window\){window}, \(fakequant::MaskOut\)0, fakequant::{family}>",
                QUANTIZE_TRIP * 16 // size)
    return pattern


def _table_pattern(ctype: str, size: int) -> Callable[[str], Tuple[str, int]]:
    def pattern(window: str) -> Tuple[str, int]:
        return (rf"quantize_kernel<{re.escape(ctype)}, \(fakequant::Format\)0, \(fakequant::Output\)0, "
                rf"\(fakequant::Window\){window}, \(fakequant::MaskOut\)0, "
                rf"fakequant::gpu::TableParams<float>", QUANTIZE_TRIP * 16 // size)
    return pattern


def _quantize_kernels() -> List[Kernel]:
    """quantize_kernel<scalar_t, Format, Output, Window, MaskOut, Params> (kernels.cuh):
    Format 0 is int, 4 E4M3; Output 0 fake; Window 0 the quantization range, 1 the input, 2
    the symmetric input (the amax family's since issue 36; 1 before); MaskOut 0 packed. Each
    lane takes QUANTIZE_TRIP 16-byte vectors a trip (kQuantizeTrip: four since the loads of a
    trip were made first, two before, one before issue 36: such a build's per-element counts
    are 2 or 4 times what this report prints for it)."""
    cases = [("per-tensor amax int8", 0, "[12]", "UniformParams<float, fakequant::AmaxFamily>"),
             ("per-tensor affine", 0, "0", "UniformParams<float, fakequant::AffineFamily>"),
             ("per-tensor min/max", 0, "1", "UniformParams<float, fakequant::MinMaxFamily>"),
             ("per-tensor FP8 E4M3", 4, "[12]", "UniformParams<float, fakequant::AmaxFamily>")]
    out = []
    for dname, ctype, size in _DTYPES:
        for label, fmt, window, params in cases:
            pattern = (rf"quantize_kernel<{re.escape(ctype)}, \(fakequant::Format\){fmt}, \(fakequant::Output\)0, "
                       rf"\(fakequant::Window\){window}, \(fakequant::MaskOut\)0, fakequant::gpu::{re.escape(params)}")
            out.append(Kernel(f"{label}, {dname}", [(pattern, QUANTIZE_TRIP * 16 // size)], 2 * size))
        # per channel where each run of the innermost dimension shares a channel: the rows'
        # constants in shared memory (quantize_rows_kernel) since issue 36, a table before
        rows, table = _rows_pattern(ctype, size), _table_pattern(ctype, size)
        out.append(Kernel(f"per-channel affine, {dname}", [rows("0", "AffineFamily"), table("0")], 2 * size))
        out.append(Kernel(f"per-channel amax int8 (static blocks of 32), {dname}",
                          [rows("[12]", "AmaxFamily"), table("[12]")], 2 * size))
        out.append(Kernel(f"per-channel affine, other layouts (a table), {dname}", [table("0")], 2 * size))
        # the last axis per channel (channels innermost): its kernel since issue 36
        out.append(Kernel(f"per-channel affine, last axis, {dname}",
                          [(rf"quantize_innermost_kernel<{re.escape(ctype)}, \(fakequant::Format\)0, "
                            rf"\(fakequant::Output\)0, \(fakequant::Window\)0, \(fakequant::MaskOut\)0>",
                            (QUANTIZE_TRIP if size >= 4 else 2) * 16 // size)], 2 * size))  # kInnermostTrip
    return out


def _block_kernels() -> List[Kernel]:
    """NVFP4's blocks of 16 and the others' of 32: blockwise_vector_kernel<scalar_t, Format,
    BlockScale, K, shift> (K 16-byte vectors a lane and trip, 4 for blocks of 2 or 4 vectors, 8
    above; shift log2 of the vectors a block below 8, else 0); builds before issue 36's
    loads-ahead work had no shift and K = min(vectors a block, 8); before the vector kernel,
    blockwise_kernel<scalar_t, Format, 1> (one element a lane and trip). BlockScale 0 is
    float32, 1 E4M3 (two levels), 2 E8M0."""
    cases = [("NVFP4 (E2M1, E4M3 scales, blocks of 16)", 1, 1, 16),
             ("MXFP4 (E2M1, E8M0 scales, blocks of 32)", 1, 2, 32),
             ("MXFP8 (E4M3, E8M0 scales, blocks of 32)", 4, 2, 32),
             ("MXINT8 (int, E8M0 scales, blocks of 32)", 0, 2, 32),
             ("int8 blocks of 32 (float32 scales)", 0, 0, 32)]
    out = []
    for dname, ctype, size in _DTYPES:
        c = re.escape(ctype)
        vec = 16 // size
        for label, fmt, scale, block in cases:
            lanes = block // vec
            k, shift = max(4, min(lanes, 8)), (lanes.bit_length() - 1 if lanes < 8 else 0)
            vector = rf"blockwise_vector_kernel<{c}, \(fakequant::Format\){fmt}, \(fakequant::BlockScale\){scale}, "
            out.append(Kernel(f"{label}, {dname}",
                              [(vector + rf"{k}, {shift}>", k * vec),
                               (vector + rf"{min(lanes, 8)}>", min(lanes, 8) * vec),
                               (rf"blockwise_kernel<{c}, \(fakequant::Format\){fmt}, 1>", 1)], 2 * size))
    return out


def _long_block_kernels() -> List[Kernel]:
    """Blocks of 1024 elements or more (per token: a whole row; here int8 about the row's centre,
    Model Optimizer's dynamic per-token asymmetric rule): blockwise_long_vector_kernel<scalar_t,
    Format, centered, held, group, prefetch> (no prefetch before 2026-11-29). A warp a row (group 32) for rows of up to 16 of a warp's
    vectors a thread (4096 bfloat16, 2048 float32 elements), held in registers: its loop is a
    row, both passes, 16 vectors a thread. A thread block a row (group 256), held for rows of up
    to 8 of its vectors a thread: its loop is a row of 8 vectors a thread (a shorter row pays the
    same row costs for fewer: 2 vectors a thread at 4096 bfloat16 elements, what the warp kernel
    is for). Two or four warps a row (groups 64, 128) for rows of whole steps of theirs, up to
    16 vectors a thread, held as a warp holds its rows: their loop is a row of 16 vectors a
    thread. Older builds had no group (and before them no held kernel: one 16-byte vector a
    thread and step of the second pass; before that blockwise_long_kernel, one element)."""
    out = []
    for dname, ctype, size in _DTYPES:
        c = re.escape(ctype)
        head = rf"blockwise_long_vector_kernel<{c}, \(fakequant::Format\)0, true"
        out.append(Kernel(f"per token, a warp a row (rows of 1024 to {512 * 16 // size}, centered int8), {dname}",
                          [(rf"{head}, true, 32(, true)?>", 16 * 16 // size)], 2 * size))
        for warps in (2, 4):  # (since 2026-11-29: rows of whole steps of a group of warps, 16 vectors a thread)
            rows = f"up to {512 * 16 * warps // size} elements, whole steps of {512 * warps // size}"
            out.append(Kernel(f"per token, {warps} warps a row (rows of {rows}, centered int8), {dname}",
                              [(rf"{head}, true, {32 * warps}, true>", 16 * 16 // size)], 2 * size))
        out.append(Kernel(f"per token (rows of 1024 or more, centered int8), {dname}",
                          [(rf"{head}, true, 256(, true)?>", 8 * 16 // size), (rf"{head}, true>", 8 * 16 // size),
                           (rf"{head}>", 16 // size),
                           (rf"blockwise_long_kernel<{c}, \(fakequant::Format\)0>", 1)], 2 * size))
    return out


def _ggml_kernels() -> List[Kernel]:
    """llama.cpp's Q8_0 and Q4_0 blocks of 32 (fake_quantize_ggml, ggml.cu):
    ggml_vector_kernel<scalar_t, GgmlType, K, kShift> (GgmlType 8 is Q8_0, 4 Q4_0; K = min(vectors
    a block, 4) 16-byte vectors a lane and trip; kShift log2 of the vectors a block, known at
    compile time for blocks of 32; builds before 2026-11-29 had no kShift)."""
    out = []
    for dname, ctype, size in _DTYPES:
        vec = 16 // size
        k = min(32 // vec, 4)
        shift = (32 // vec).bit_length() - 1
        for label, bits in (("GGML Q8_0 (blocks of 32)", 8), ("GGML Q4_0 (blocks of 32)", 4)):
            kernel = rf"ggml_vector_kernel<{re.escape(ctype)}, \(fakequant::GgmlType\){bits}, {k}"
            out.append(Kernel(f"{label}, {dname}", [(kernel + rf", {shift}>", k * vec), (kernel + ">", k * vec)],
                              2 * size))
    return out


KERNELS = _quantize_kernels() + _block_kernels() + _long_block_kernels() + _ggml_kernels() + [
    Kernel("mask backward (packed), float32", [(r"mask_backward_kernel<unsigned int, true>", 4)], 8),
    Kernel("mask backward (packed), bfloat16", [(r"mask_backward_kernel<unsigned short, true>", 8)], 4),
]


@dataclass
class Instruction:
    address: int
    predicate: str
    opcode: str
    operands: str


@dataclass
class Function:
    mangled: str
    name: str
    code: List[Instruction] = field(default_factory=list)


_FUNCTION = re.compile(r"^\s*Function : (\S+)")
_INSTRUCTION = re.compile(r"^\s*/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)\s*([^;]*);")


def find_tool(name: str) -> str:
    """cuobjdump from the CUDA toolkit (CUDA_HOME, PATH), else the copy that
    triton's wheel carries beside the running Python."""
    cuda_home = os.environ.get("CUDA_HOME", "/usr/local/cuda")
    candidates = [os.path.join(cuda_home, "bin", name), shutil.which(name) or ""]
    candidates += glob.glob(os.path.join(sys.prefix, "lib", "python*", "site-packages", "triton", "backends",
                                         "nvidia", "bin", name))
    for path in candidates:
        if path and os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    raise SystemExit(f"sass_report: no {name} (looked in {cuda_home}/bin, PATH and triton's wheel)")


def demangle(names: List[str]) -> List[str]:
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if tool is None:
        return names
    out = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def parse_sass(text: str) -> List[Function]:
    functions: List[Function] = []
    for line in text.splitlines():
        m = _FUNCTION.match(line)
        if m:
            functions.append(Function(m.group(1), m.group(1)))
            continue
        m = _INSTRUCTION.match(line)
        if m and functions:
            functions[-1].code.append(Instruction(int(m.group(1), 16), (m.group(2) or "").strip(), m.group(3),
                                                  m.group(4).strip()))
    for f, name in zip(functions, demangle([f.mangled for f in functions])):
        f.name = name
    return functions


def _is_global(ins: Instruction, prefix: str) -> bool:
    return ins.opcode == prefix or ins.opcode.startswith(prefix + ".")


def access_width(opcode: str) -> int:
    """Bytes of one LDG/STG: .128/.64 suffixes, .U8/.S8/.U16/.S16, else 4."""
    parts = opcode.split(".")
    for p in parts:
        if p in ("128", "64"):
            return int(p) // 8
        if p in ("U8", "S8"):
            return 1
        if p in ("U16", "S16"):
            return 2
    return 4


def loops(f: Function) -> List[Tuple[int, int]]:
    """(first, last) instruction indices of every conditional backward branch's loop. (An
    unconditional one is no loop's end but a return into the code, such as the way back
    from the divergent path of a warp shuffle, which a BRA.DIV jumps to.)"""
    index = {ins.address: i for i, ins in enumerate(f.code)}
    out = []
    for i, ins in enumerate(f.code):
        conditional = bool(ins.predicate) or re.match(r"\s*!?U?P\d", ins.operands) is not None
        if ins.opcode.startswith("BRA") and conditional:
            m = re.search(r"0x([0-9a-f]+)", ins.operands)
            if m and int(m.group(1), 16) <= ins.address and int(m.group(1), 16) in index:
                out.append((index[int(m.group(1), 16)], i))
    return out


def hot_loop(f: Function) -> Optional[List[Instruction]]:
    """The innermost loop that loads and stores global memory; of several, the one
    with the widest load (then the shortest)."""
    best = None
    for first, last in loops(f):
        body = f.code[first:last + 1]
        loads = [access_width(i.opcode) for i in body if _is_global(i, "LDG")]
        stores = [i for i in body if _is_global(i, "STG")]
        if not loads or not stores:
            continue
        key = (-max(loads), len(body))
        if best is None or key < best[0]:
            best = (key, body)
    return None if best is None else best[1]


def slow_calls(body: List[Instruction]) -> int:
    """Instructions that a forward branch skips, with no branch among them (but a last
    jump past the path they stand beside), and that call out of the loop: the slow path of a correctly rounded division (MOV, CALL,
    MOV), which a warp takes only for operands near the ends of the float range, and
    the out-of-line slow paths of the kernels (blocks that are degenerate or outside
    the fast divisor's range, a mask's last partial word), jumped to from elsewhere."""
    cold = 0
    for i, ins in enumerate(body):
        m = re.search(r"0x([0-9a-f]+)", ins.operands)
        if not (ins.opcode == "BRA" and m and int(m.group(1), 16) > ins.address):
            continue
        target = int(m.group(1), 16)
        skipped = [b for b in body[i + 1:] if b.address < target]
        # (the region may end by jumping past the path it stands beside)
        inner = skipped[:-1] if skipped and skipped[-1].opcode == "BRA" and not skipped[-1].predicate else skipped
        if any(b.opcode.startswith("CALL") for b in inner) and not any(b.opcode.startswith("BRA") for b in inner):
            cold += sum(1 for b in skipped if b.opcode != "NOP")
    return cold


def loads_ahead(body: List[Instruction]) -> int:
    """The most of the loop's widest loads issued in a row, with no store or call between them:
    what a lane has in flight at once where the loop's order is kept. On an H200 it set the
    time of the kernels with the fewest instructions: one 16-byte load ahead of each store cost
    the per-tensor kernel 1.19 of cudaMemcpyAsync's time, four 1.09
    (benchmarks/results/gpu-2026-11-28-h200-loop-shapes.md)."""
    widest = max((access_width(i.opcode) for i in body if _is_global(i, "LDG")), default=0)
    run = best = 0
    for ins in body:
        if _is_global(ins, "LDG") and access_width(ins.opcode) == widest:
            run += 1
            best = max(best, run)
        elif _is_global(ins, "STG") or ins.opcode.startswith("CALL"):
            run = 0
    return best


def count(body: List[Instruction]) -> Dict[str, object]:
    real = [i for i in body if i.opcode != "NOP"]
    opcodes = collections.Counter(i.opcode for i in real)
    loads = collections.Counter(i.opcode for i in real if _is_global(i, "LDG"))
    stores = collections.Counter(i.opcode for i in real if _is_global(i, "STG"))
    return {"instructions": len(real) - slow_calls(body), "with_slow_calls": len(real), "opcodes": dict(opcodes),
            "loads": dict(loads), "stores": dict(stores), "loads_ahead": loads_ahead(real)}


def report(library: str, arch: str, allow_missing: bool = False) -> List[Dict[str, object]]:
    sass = subprocess.run([find_tool("cuobjdump"), "-sass", "-arch", arch, library], capture_output=True,
                          text=True, check=True).stdout
    functions = parse_sass(sass)
    if not functions:
        raise SystemExit(f"sass_report: no {arch} code in {library} (built for other architectures?)")
    rows = []
    missing = []
    for k in KERNELS:
        found = [(f, elements) for pattern, elements in k.patterns for f in functions if re.search(pattern, f.name)]
        if not found:
            missing.append(k.label)
            continue
        f, elements = found[0]
        name = re.sub(r"\(.*", "", f.name.replace("fakequant::", "").replace("gpu::(anonymous namespace)::", ""))
        body = hot_loop(f)
        if body is None:
            rows.append({"kernel": k.label, "function": name, "instructions": None})
            continue
        c = count(body)
        per_element = c["instructions"] / elements  # type: ignore[operator]
        rows.append({"kernel": k.label, "function": name, **c, "elements": elements,
                     "per_element": per_element, "per_byte": per_element / k.element_bytes})
    if missing and not allow_missing:
        raise SystemExit(f"sass_report: {library} has no kernel for: " + "; ".join(missing)
                         + " (renamed? update KERNELS in tools/sass_report.py)")
    return rows


def _widths(counter: Dict[str, int]) -> str:
    return ", ".join(f"{n} {op}" for op, n in sorted(counter.items())) or "-"


def print_table(rows: List[Dict[str, object]], opcodes: bool) -> None:
    print(f"budget: about {BUDGET_PER_BYTE:.0f} instructions per byte moved "
          f"(an H200 issues {LIMIT_PER_BYTE:.1f} per byte at its memory's rate)")
    print("| kernel | loop instructions (+ slow-path calls) | elements per trip | per element | per byte | loads | stores "
          "| widest loads ahead of a store |")
    print("|---|---:|---:|---:|---:|---|---|---:|")
    for r in rows:
        if r["instructions"] is None:
            print(f"| {r['kernel']} | no loop found | | | | | | |")
            continue
        verdict = "" if r["per_byte"] <= BUDGET_PER_BYTE else " (over)"  # type: ignore[operator]
        slow = int(r["with_slow_calls"]) - int(r["instructions"])  # type: ignore[call-overload]
        print(f"| {r['kernel']} | {r['instructions']} (+{slow}) | {r['elements']} | {r['per_element']:.1f} | "
              f"{r['per_byte']:.1f}{verdict} | {_widths(r['loads'])} | {_widths(r['stores'])} | "  # type: ignore[arg-type]
              f"{r.get('loads_ahead', '')} |")
        if opcodes:
            ops = sorted(r["opcodes"].items(), key=lambda kv: (-kv[1], kv[0]))  # type: ignore[union-attr]
            print("|  | " + ", ".join(f"{op} {n}" for op, n in ops) + " | | | | | | |")


def print_diff(before: List[Dict[str, object]], after: List[Dict[str, object]]) -> None:
    """Per kernel label present in both: the loop's count and per element before
    and after, and the opcodes whose counts changed."""
    old = {r["kernel"]: r for r in before if r.get("instructions")}
    print("| kernel | before: loop / per element / per byte / loads ahead | after | "
          "opcodes per element removed (-) and added (+) |")
    print("|---|---|---|---|")
    for r in after:
        label = str(r["kernel"])
        base = old.get(label)
        if not r.get("instructions") or base is None:
            continue
        # per element of each loop's work (the loops of two kernel generations differ in it)
        ops_a = {op: n / float(r["elements"]) for op, n in r["opcodes"].items()}  # type: ignore[union-attr,arg-type]
        ops_b = {op: n / float(base["elements"]) for op, n in base["opcodes"].items()}  # type: ignore[union-attr,arg-type]
        changed = [(op, ops_a.get(op, 0.0) - ops_b.get(op, 0.0)) for op in sorted(set(ops_a) | set(ops_b))]
        changed = sorted((kv for kv in changed if abs(kv[1]) >= 0.05), key=lambda kv: kv[1])
        print(f"| {label} | {base['instructions']} / {base['per_element']:.1f} / {base['per_byte']:.1f} / "
              f"{base.get('loads_ahead', '?')} | "
              f"{r['instructions']} / {r['per_element']:.1f} / {r['per_byte']:.1f} / {r.get('loads_ahead', '?')} | "
              + ", ".join(f"{op} {d:+.1f}" for op, d in changed) + " |")


def library_of(build: str) -> str:
    """The fakequant._C of a `make cuda-build` folder (its lib/fakequant/_C*.so)."""
    found = sorted(glob.glob(os.path.join(build, "lib", "fakequant", "_C*.so")))
    if not found:
        raise SystemExit(f"sass_report: no {build}/lib/fakequant/_C*.so: run `make cuda-build` first")
    return found[0]


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("library", nargs="?",
                        help="a fakequant._C built with CUDA, or a make cuda-build folder (default: build/cuda)")
    parser.add_argument("--arch", default="sm_90")
    parser.add_argument("--json", help="also write the rows, opcodes included, to this file")
    parser.add_argument("--opcodes", action="store_true", help="print each loop's opcodes")
    parser.add_argument("--diff", nargs=2, metavar=("BEFORE", "AFTER"), help="compare two --json files")
    parser.add_argument("--allow-missing", action="store_true",
                        help="report what the library has (one translation unit's object, an older build)")
    args = parser.parse_args(argv)
    if args.diff:
        with open(args.diff[0]) as a, open(args.diff[1]) as b:
            print_diff(json.load(a), json.load(b))
        return 0
    library = args.library or os.path.join(ROOT, "build", "cuda")
    rows = report(library_of(library) if os.path.isdir(library) else library, args.arch, args.allow_missing)
    print_table(rows, args.opcodes)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
