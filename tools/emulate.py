"""The CUDA kernels of csrc/cuda built for the SIMT emulator (tests/emulator/simt_emulator.h)
and run on the CPU: `make cuda-emulate`.

  python tools/emulate.py build VARIANT      builds build/emulate/VARIANT/libfakequant_emulated.so
  python tools/emulate.py test VARIANT       builds it, then runs tests/test_cuda_emulated.py on it
  python tools/emulate.py planted            plants known mistakes in copies of the device code
                                             and checks that the emulated tests catch each one

The library is the operators' host functions (csrc/ops, shared with the real
build) and the CUDA launch code and kernels (csrc/cuda/*.cu compiled as C++ with
FAKEQUANT_SIMT_EMULATOR, against the emulator and its runtime stand-ins in
tests/emulator, which are test infrastructure and not shipped), registered under the namespace `fakequant_emulated`
for CPU tensors: torch.ops.fakequant_emulated.fake_quantize_affine runs the CUDA
kernel, torch.ops.fakequant.fake_quantize_affine the CPU one.

Variants: plain (with UBSan's alignment check: a misaligned vector access stops
the run), asan (AddressSanitizer and UndefinedBehaviorSanitizer; out-of-bounds
accesses and undefined behaviour in a kernel stop the run) and tsan
(ThreadSanitizer: two emulated threads, of one block or two, accessing one
global or shared address, one of them writing, without a barrier, warp-level
call or atomic between them, stop the run). Only the device code is
instrumented; the host functions are built once, plain, and shared. The
sanitizer runtime is preloaded into the test process, as tools/sanitize.sh does.

The library also has a device of its own, "simt" (torch's PrivateUse1,
tests/emulator/simt_device.cpp, compiled with the host functions): its tensors
take the host functions' device branches and the CUDA slots of the kernel table,
and its memory is readable by the host only during a launch or a copy.

Everything is built under build/emulate (out of the source tree), with ninja.
"""
import argparse
import concurrent.futures
import os
import re
import shlex
import shutil
import subprocess
import sys
import sysconfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "build", "emulate")
# simt_emulator.h and simt_runtime.h, which csrc/cuda/launch.cuh includes in the emulation build
EMULATOR = os.path.join(ROOT, "tests", "emulator")
CXX = os.environ.get("CXX", "g++")
NAMESPACE = "fakequant_emulated"

SANITIZERS = {
    # (UBSan's alignment check only: a vector access at an address that is not a
    # multiple of its size, which x86 would forgive and a GPU would not)
    "plain": ["-fsanitize=alignment", "-fno-sanitize-recover=alignment"],
    "asan": ["-fsanitize=address,undefined,float-cast-overflow", "-fno-sanitize-recover=all",
             "-fno-omit-frame-pointer"],
    "tsan": ["-fsanitize=thread"],
}
RUNTIMES = {"plain": [], "asan": ["libasan.so", "libubsan.so"], "tsan": ["libtsan.so"]}
SANITIZER_ENV = {
    "asan": {"ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:detect_odr_violation=0",
             "UBSAN_OPTIONS": "print_stacktrace=1:halt_on_error=1"},
    # The CPU operators on one thread: libgomp is not instrumented, so its
    # synchronisation is invisible to ThreadSanitizer.
    "tsan": {"TSAN_OPTIONS": "halt_on_error=1:exitcode=66:history_size=4:report_signal_unsafe=0",
             "OMP_NUM_THREADS": "1"},
}

# The mistakes `planted` puts into a copy of the device code, one at a time: the
# file, the exact text replaced (it must occur once), the replacement, the tests
# (a pytest -k expression) expected to catch it, the variant they run on (a
# wrong value is caught plain; an access past the end, by AddressSanitizer; a
# second store of the same value, by another thread of the block or by another
# block, only by ThreadSanitizer), and the translation unit that compiles it
# (quantize.cu compiles float32's forward kernels, which the tests named run).
PLANTED = [
    ("off-by-one in a tail loop", "kernels.cuh",
     "for (int64_t e = n_vec + tid; e < n; e += stride) {",
     "for (int64_t e = n_vec + tid; e <= n; e += stride) {",
     "mask_backward", "asan", "mask_backward.cu"),
    ("wrong shuffle offset", "kernels.cuh",
     "bits |= __shfl_down_sync(kFullWarp, bits, s) << (V * s);",
     "bits |= __shfl_down_sync(kFullWarp, bits, s + 1) << (V * s);",
     "quantize_sizes", "plain", "quantize.cu"),
    ("missing __syncthreads", "lsq_backward.cu",
     "    shared_s[t] = acc_s;\n    shared_z[t] = acc_z;\n    __syncthreads();",
     "    shared_s[t] = acc_s;\n    shared_z[t] = acc_z;",
     "lsq_backward_per_channel", "plain", "lsq_backward.cu"),
    ("a mask word written twice", "blockwise.cuh",
     "if (lane == 0 && offset < len) store_mask_word(",
     "if (lane < 2 && offset < len) store_mask_word(",
     "blockwise_block_sizes", "tsan", "blockwise.cu"),
    ("mask bit in the wrong place", "kernels.cuh",
     "atomicOr(words + pos / 32, bits << shift);",
     "atomicOr(words + pos / 32, bits << (shift ^ 1));",
     "blockwise_block_sizes", "plain", "blockwise.cu"),
    ("vector access on an unaligned input", "quantize.cuh",
     "return aligned16(x) && aligned16(y) &&",
     "return aligned16(y) &&",
     "quantize_sizes", "plain", "quantize.cu"),
    ("NVFP4's zeros signed by the quotient that lost x's sign", "blockwise.cuh",
     "v = blockwise_inside_value<F>(quotient_of<false>(xv, Divisor{sk[k], yk[k], lk[k], true}), xv, sk[k]);",
     "v = blockwise_inside_value<F>(quotient_of<false>(xv, Divisor{sk[k], yk[k], lk[k], true}), "
     "quotient_of<false>(xv, Divisor{sk[k], yk[k], lk[k], true}), sk[k]);",
     "inside_the_limit_zero_signs", "plain", "blockwise.cu"),
    ("a block's max over half its lanes", "blockwise.cuh",
     "for (int lanes = 1; lanes < G; lanes *= 2) {",
     "for (int lanes = 2; lanes < G; lanes *= 2) {",
     "blockwise_vectors", "plain", "blockwise.cu"),
    ("a neighbour block's scale", "blockwise.cuh",
     "const int owner = (R == 1 ? k : k & ((1 << kShift) - 1)) * per_load + (lane >> shift);",
     "const int owner = ((R == 1 ? k : k & ((1 << kShift) - 1)) * per_load + (lane >> shift)) ^ 1;",
     "blockwise_vectors", "plain", "blockwise.cu"),
    ("a lane's second block given its first's scale (blocks of two vectors)", "blockwise.cuh",
     "const int r = R == 1 ? 0 : k >> kShift;",
     "const int r = 0;",
     "blockwise_vectors and bfloat16", "plain", "blockwise_bfloat16.cu"),
    ("a lane's second block left out of the trip's vote (blocks of two vectors)", "blockwise.cuh",
     "outside |= in_trip & (slow | !(quotient_of(a, d) < rule.float_limit));",
     "if (r == 0) outside |= in_trip & (slow | !(quotient_of(a, d) < rule.float_limit));",
     "blockwise_vectors_inside_the_limit and bfloat16", "plain", "blockwise_bfloat16.cu"),
    ("a block on the saturation limit taken as inside it", "blockwise.cuh",
     "(quotient_of(a, d) < rule.float_limit)",
     "(quotient_of(a, d) <= rule.float_limit)",
     "blockwise_vectors_inside_the_limit", "plain", "blockwise.cu"),
    ("a tile's rows past the block's threads left unmade (rows of 3 vectors)", "kernels.cuh",
     "for (uint32_t r = threadIdx.x; r < count; r += kThreads)",
     "for (uint32_t r = threadIdx.x; r < count && r < kThreads; r += kThreads)",
     "quantize_rows_in_shared_memory", "plain", "quantize.cu"),
    ("bfloat16 amax from the even elements only", "kernels.cuh",
     "return max(m & 0xffff0000u, m << 16);",
     "return m << 16;",
     "blockwise_vectors and bfloat16", "plain", "blockwise_bfloat16.cu"),
    # (a mistake in contract.h itself would not show: the emulated library's host objects,
    # built from the real csrc, hold the same inline functions, and the linker keeps one)
    ("the amax family's zero case in the fast division (a Divisor of scale 1)", "kernels.cuh",
     ": c(p.family.template make<C>(0)), d(make_divisor(static_cast<float>(c.scale))), limit(dividend_limit(d)) {}",
     ": c(p.family.template make<C>(0)), d(make_divisor(c.hi == 0 ? 1.0f : static_cast<float>(c.scale))),"
     " limit(dividend_limit(d)) {}",
     "quantize_zero_amax", "plain", "quantize.cu"),
    ("bfloat16 rows' max as unsigned bits (negatives above positives)", "kernels.cuh",
     "m = __vmaxs2(m, w[k]);",
     "m = __vmaxu2(m, w[k]);",
     "blockwise_long_rows_keys and bfloat16", "plain", "blockwise_bfloat16.cu"),
    ("an all-negative bfloat16 row's max as its most negative number", "kernels.cuh",
     "const uint32_t hi = positive ? signed_max : negative ? unsigned_min : 0xffffu;",
     "const uint32_t hi = positive ? signed_max : negative ? unsigned_max : 0xffffu;",
     "blockwise_long_rows_keys and bfloat16", "plain", "blockwise_bfloat16.cu"),
    ("a bfloat16 row key widened without a negative's low ones", "kernels.cuh",
     "return (key16 << 16) | ((key16 & 0x8000u) ? 0u : 0xffffu);",
     "return key16 << 16;",
     "blockwise_long_rows_keys and bfloat16", "plain", "blockwise_bfloat16.cu"),
    ("long blocks without their last mask word", "blockwise.cuh",
     "store_row_bits<V>(wt + k * kStep / 32, kWholeSteps || i < len, bits);",
     "store_row_bits<V>(wt + k * kStep / 32, kWholeSteps || i + 32 < len, bits);",
     "blockwise_long_rows_held_and_read_twice and float32", "plain", "blockwise.cu"),
    ("a warp's rows' max over half the warp", "blockwise.cuh",
     "for (int lanes = kWarpSize / 2; lanes > 0; lanes /= 2) {",
     "for (int lanes = kWarpSize / 4; lanes > 0; lanes /= 2) {",
     "blockwise_long_rows_keys and float32", "plain", "blockwise.cu"),
    ("a warp given rows of a partial step", "blockwise.cuh",
     "return geo.block_size <= step * kWarpHeldSteps && geo.block_size % step == 0;",
     "return geo.block_size <= step * kWarpHeldSteps && geo.block_size % (warps * kWarpSize) == 0;",
     "blockwise_long_rows_held_and_read_twice and float32", "plain", "blockwise.cu"),
    ("the fast division on any dividend", "kernels.cuh",
     "for (int k = 0; k < V; ++k) fast &= abs_value(xf.v[k]) <= limit;",
     "for (int k = 0; k < V; ++k) fast &= limit > 0.0f;",
     "quantize_sizes", "plain", "quantize.cu"),
    ("the fast division on any dividend of a channel", "kernels.cuh",
     "for (int k = 0; k < V; ++k) fast &= fast_dividend(xf.v[k]);",
     "for (int k = 0; k < V; ++k) fast &= true;",
     "per_channel", "plain", "quantize.cu"),
    ("a channel's vector with its neighbour's entry", "kernels.cuh",
     "const Consts<float> c = load_consts(params.table + entry);",
     "const Consts<float> c = load_consts(params.table + (entry > 0 ? entry - 1 : entry));",
     "per_channel", "plain", "quantize.cu"),
    ("a vector one element past its channel's run", "kernels.cuh",
     "(col + V <= params.short_layout.inner.d)",
     "(col + V <= params.short_layout.inner.d + 1)",
     "per_channel", "plain", "quantize.cu"),
    ("consecutive channels' entries swapped in pairs", "kernels.cuh",
     "c[k] = load_consts(params.table + lookup.j + k);",
     "c[k] = load_consts(params.table + lookup.j + (k ^ 1));",
     "per_channel", "plain", "quantize.cu"),
    ("an element's row from its successor's index", "kernels.cuh",
     "const uint32_t r = L.inner.div(e);",
     "const uint32_t r = L.inner.div(e + 1);",
     "per_channel", "plain", "quantize.cu"),
    ("ggml: Q4_0's tie to the last lane of a block", "ggml.cu",
     "first_lane + __ffs(static_cast<int>(group_bits)) - 1",
     "first_lane + 31 - __clz(static_cast<int>(group_bits))",
     "ggml_vectors", "plain", "ggml.cu"),
    ("a group of warps' row max over its first warp alone", "blockwise.cuh",
     "for (int w = 0; w < kGroupWarps; ++w) {",
     "for (int w = 0; w < 1; ++w) {",
     "long_rows_warp_groups", "plain", "blockwise.cu"),
    ("a group of warps' row max without its barrier", "blockwise.cuh",
     "  __syncthreads();\n  const int first = set + warp / kGroupWarps * kGroupWarps;",
     "  const int first = set + warp / kGroupWarps * kGroupWarps;",
     "long_rows_warp_groups", "tsan", "blockwise.cu"),
    ("a group of warps' slots the same every round", "blockwise.cuh",
     "blk += int64_t{gridDim.x} * kGroups, parity ^= 1) {",
     "blk += int64_t{gridDim.x} * kGroups) {",
     "long_rows_warp_groups", "tsan", "blockwise.cu"),
    ("ggml: Q4_0's packed keys index a neighbour lane's elements", "ggml.cu",
     "const uint32_t top = 255u - static_cast<uint32_t>((lane & (G - 1)) * V);",
     "const uint32_t top = 255u - static_cast<uint32_t>(((lane & (G - 1)) ^ 1) * V);",
     "ggml_vectors", "plain", "ggml.cu"),
    ("ggml: Q4_0's packed keys without the sign", "ggml.cu",
     "(index << 4) | hi) & 0x7fffff80u;",
     "(index << 4) | hi) & 0x7fffff00u;",
     "ggml_vectors", "plain", "ggml.cu"),
    ("ggml: a block's constants from its neighbour", "ggml.cu",
     "const int owner = k * per_load + (lane >> shift);",
     "const int owner = (k * per_load + (lane >> shift)) ^ 1;",
     "ggml_vectors", "plain", "ggml.cu"),
    ("ggml: the general path's mask bits one place off", "ggml.cu",
     "if (lane == 0) or_mask_bits(mask_words, start + base, ballot);",
     "if (lane == 0) or_mask_bits(mask_words, start + base + 1, ballot);",
     "ggml_ragged_rows", "plain", "ggml.cu"),
    ("grid-stride step of one block", "kernels.cuh",
     "const int64_t nwarps = static_cast<int64_t>(gridDim.x) * blockDim.x / kWarpSize;\n\n  const int64_t vec_tiles",
     "const int64_t nwarps = static_cast<int64_t>(blockDim.x) / kWarpSize;\n\n  const int64_t vec_tiles",
     "quantize_sizes", "tsan", "quantize.cu"),
    ("a thread's channels from its neighbour's (channels innermost)", "kernels.cuh",
     "params.table + tid % (channels / V) * V;",
     "params.table + (tid + 1) % (channels / V) * V;",
     "channels_innermost", "plain", "quantize.cu"),
    ("the innermost grid a multiple of the warp only", "quantize.cuh",
     "std::lcm(layout.sizes[nd - 1] / V, int64_t{kWarpSize});",
     "std::lcm(int64_t{1}, int64_t{kWarpSize});",
     "channels_innermost", "plain", "quantize.cu"),
    ("a last-axis trip's vectors past the second left undone", "kernels.cuh",
     "for (int k = 0; k < kTrip; ++k) {\n      quantize_lane_innermost<",
     "for (int k = 0; k < 2; ++k) {\n      quantize_lane_innermost<",
     "channels_innermost", "plain", "quantize.cu"),
    ("a trip skipped where only its first vector is in range", "kernels.cuh",
     "for (int64_t v = tid; v - lane < n / V; v += kTrip * threads) {",
     "for (int64_t v = tid; v + threads - lane < n / V; v += kTrip * threads) {",
     "channels_innermost", "plain", "quantize.cu"),
    ("a tile's last row not made (shared memory)", "kernels.cuh",
     "count = inner.div(t0 + kTile - 1) - first + 1;",
     "count = inner.div(t0 + kTile - 1) - first;",
     "rows_in_shared_memory", "plain", "quantize.cu"),
    ("one shared buffer for every tile", "kernels.cuh",
     "t += gridDim.x, buffer ^= kTileRows) {",
     "t += gridDim.x) {",
     "rows_in_shared_memory", "tsan", "quantize.cu"),
    ("a held vector of another step", "blockwise.cuh",
     "to_floats(kHeld ? held[kHeld ? k : 0] :",
     "to_floats(kHeld ? held[kHeld ? (k > 0 ? k - 1 : 0) : 0] :",
     "long_rows_held", "plain", "blockwise.cu"),
]


def torch_flags():
    import torch
    from torch.utils import cpp_extension

    include = [f"-I{p}" for p in cpp_extension.include_paths()]
    abi = int(torch._C._GLIBCXX_USE_CXX11_ABI)
    # -g1: line tables (a sanitizer report's files, lines and inlined frames) without the types
    # and variables of -g, which took 44% of the device code's compile time (blockwise.cu
    # under ASan: 45 s -> 25 s)
    cflags = ["-std=c++20", "-fPIC", "-g1", "-O1", "-pthread", "-ffp-contract=off",
              "-fvisibility=hidden", "-fvisibility-inlines-hidden", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
              f"-DFAKEQUANT_NAMESPACE={NAMESPACE}", "-DFAKEQUANT_EMULATION_LIBRARY", *include]
    libdirs = cpp_extension.library_paths()
    ldflags = [*(f"-L{p}" for p in libdirs), *(f"-Wl,-rpath,{p}" for p in libdirs),
               "-lc10", "-ltorch_cpu", "-ltorch", "-pthread", "-Wl,-Bsymbolic"]
    return cflags, ldflags


def _ninja():
    local = os.path.join(sysconfig.get_path("scripts"), "ninja")
    return local if os.path.exists(local) else (shutil.which("ninja") or "ninja")


def _q(args):
    return " ".join(shlex.quote(a) for a in args)


def ninja_rules(cflags, ldflags, csrc):
    includes = [f"-I{csrc}", f"-I{csrc}/include", f"-I{csrc}/cuda", f"-I{EMULATOR}"]
    return [
        "ninja_required_version = 1.3",
        f"cxx = {CXX}",
        f"cflags = {_q(cflags + includes)}",
        f"ldflags = {_q(ldflags)}",
        "rule host",
        # (the host functions are not under test: compiled for speed of compiling)
        "  command = $cxx -MMD -MF $out.d $cflags -O0 -g1 -c $in -o $out",
        "  description = compiling $in",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule device",
        "  command = $cxx -MMD -MF $out.d $cflags -x c++ -DFAKEQUANT_SIMT_EMULATOR $sanitize -c $in -o $out",
        "  description = compiling $in for the emulator $sanitize",
        "  depfile = $out.d",
        "  deps = gcc",
        "rule link",
        "  command = $cxx -shared $in -o $out $ldflags $sanitize",
        "  description = linking $out",
    ]


def device_lines(device_sources, csrc, out, variant, host_objects):
    """Compile and link lines of one variant's library in `out`; returns (lines, lib)."""
    lines, objects = [], list(host_objects)
    sanitize = _q(SANITIZERS[variant])
    for src in device_sources:
        obj = os.path.join(out, "device", os.path.relpath(src, csrc) + ".o")
        lines += [f"build {obj}: device {src}", f"  sanitize = {sanitize}"]
        objects.append(obj)
    lib = os.path.join(out, f"lib{NAMESPACE}.so")
    lines += [f"build {lib}: link {' '.join(objects)}", f"  sanitize = {sanitize}"]
    return lines, lib


def host_objects(host_sources, csrc):
    return [os.path.join(OUT, "host", (os.path.relpath(src, csrc) if src.startswith(csrc + os.sep)
                                       else os.path.basename(src)) + ".o") for src in host_sources]


def run_ninja(path, lines, target, jobs, quiet=False):
    """ninja on the build file `path` (written where its text changed); `quiet`: its output is
    kept from the terminal unless it fails (builds that run beside each other)."""
    text = "\n".join(lines) + "\n"
    os.makedirs(os.path.dirname(path), exist_ok=True)
    if not os.path.exists(path) or open(path).read() != text:
        with open(path, "w") as f:
            f.write(text)
    jobs = jobs or os.environ.get("MAX_JOBS", str(os.cpu_count() or 1))
    run = subprocess.run([_ninja(), "-f", path, "-j", str(jobs), target], cwd=os.path.dirname(path),
                         capture_output=quiet, text=True)
    if run.returncode != 0:
        if quiet:
            sys.stdout.write(run.stdout + run.stderr)
        raise subprocess.CalledProcessError(run.returncode, run.args)


def sources(csrc):
    host = [os.path.join(csrc, "fakequant.cpp")]
    host += sorted(os.path.join(csrc, "ops", f) for f in os.listdir(os.path.join(csrc, "ops")) if f.endswith(".cpp"))
    host.append(os.path.join(EMULATOR, "simt_device.cpp"))  # the emulated device (PrivateUse1)
    device = sorted(os.path.join(csrc, "cuda", f) for f in os.listdir(os.path.join(csrc, "cuda")) if f.endswith(".cu"))
    return host, device


def build(variant, jobs=None):
    """Builds the emulation library of `variant` (build/emulate/VARIANT); returns its path.
    One ninja file for every variant, so that the host functions compile once."""
    csrc = os.path.join(ROOT, "csrc")
    cflags, ldflags = torch_flags()
    host, device = sources(csrc)
    lines = ninja_rules(cflags, ldflags, csrc)
    hosts = host_objects(host, csrc)
    lines += [f"build {obj}: host {src}" for obj, src in zip(hosts, host)]
    libs = {}
    for v in SANITIZERS:
        more, libs[v] = device_lines(device, csrc, os.path.join(OUT, v), v, hosts)
        lines += more
    run_ninja(os.path.join(OUT, "build.ninja"), lines, libs[variant], jobs)
    return libs[variant]


def build_planted(csrc, unit, variant, out, jobs=None):
    """The `variant` library with translation unit `unit` compiled from `csrc`
    (a copy with a planted mistake); the other units and the host functions
    are the real build's (`build(variant)`, which the caller has run: builds of
    several mistakes run beside each other, each in its own directory)."""
    real = os.path.join(ROOT, "csrc")
    cflags, ldflags = torch_flags()
    host, device = sources(real)
    compiled = [src for src in sources(csrc)[1] if os.path.basename(src) == unit]
    kept = [os.path.join(OUT, variant, "device", os.path.relpath(src, real) + ".o") for src in device
            if os.path.basename(src) not in {os.path.basename(c) for c in compiled}]
    lines = ninja_rules(cflags, ldflags, csrc)
    more, lib = device_lines(compiled, csrc, out, variant, host_objects(host, real) + kept)
    run_ninja(os.path.join(out, "build.ninja"), lines + more, lib, jobs, quiet=True)
    return lib


def test_env(variant, lib):
    env = dict(os.environ)
    env["FAKEQUANT_EMULATED_LIB"] = lib
    env.pop("LD_PRELOAD", None)
    runtimes = [subprocess.run([CXX, f"-print-file-name={r}"], capture_output=True, text=True, check=True).stdout.strip()
                for r in RUNTIMES[variant]]
    if runtimes:
        env["LD_PRELOAD"] = " ".join(runtimes)
    env.update(SANITIZER_ENV.get(variant, {}))
    return env


def run_tests(variant, lib, pytest_args=(), jobs=None):
    # (--capture=sys: a sanitizer report, written to fd 2 just before the process
    # exits, must not go into pytest's capture file.) The emulator runs a launch on one
    # thread, so the tests run in MAX_JOBS pytest-xdist workers: a worker stopped by a
    # sanitizer fails the run ("worker crashed"), its report on the workers' shared stderr.
    workers = jobs or int(os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--capture=sys", "--rootdir", ROOT,
           *(["-n", str(workers)] if workers > 1 else []),
           os.path.join(ROOT, "tests", "test_cuda_emulated.py"), *pytest_args]
    return subprocess.run(cmd, env=test_env(variant, lib), cwd=ROOT)


def plant(base, mistake, jobs=None):
    """One mistake of PLANTED in its own copy of csrc, built and tested (in its own
    directories under `base`). Returns (caught, the lines to print)."""
    name, filename, old, new, tests, variant, unit = mistake
    slug = re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")
    copy = os.path.join(base, slug, "csrc")
    if os.path.exists(copy):
        shutil.rmtree(copy)
    shutil.copytree(os.path.join(ROOT, "csrc"), copy)
    path = os.path.join(copy, "cuda", filename)
    text = open(path).read()
    if text.count(old) != 1:
        raise SystemExit(f"planted: {name!r}: the text to replace occurs {text.count(old)} times in "
                         f"csrc/cuda/{filename}, not once; update PLANTED")
    with open(path, "w") as f:
        f.write(text.replace(old, new))
    lines = [f"planted: {name} (csrc/cuda/{filename}); expecting failures in -k {tests} ({variant})"]
    lib = build_planted(copy, unit, variant, os.path.join(base, slug, "build"), jobs)
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", "--capture=sys", "--rootdir", ROOT,
         os.path.join(ROOT, "tests", "test_cuda_emulated.py"), "-k", tests],
        env=test_env(variant, lib), cwd=ROOT, capture_output=True, text=True)
    output = run.stdout + run.stderr
    tail = output.strip().splitlines()[-3:]
    # a test failed (a wrong output, or an emulator error such as divergence), a
    # sanitizer stopped the run (a race, a misaligned or out-of-bounds access), or the test
    # process died of the mistake (a read past the end that left the plain build's memory:
    # "a warp given rows of a partial step" fails a test or faults, run by run)
    reports = ("ThreadSanitizer: data race", "runtime error:", "AddressSanitizer:", "Fatal Python error:")
    caught = run.returncode != 0 and (
        (run.returncode == 1 and any(" failed" in line for line in tail))
        or run.returncode < 0 or any(r in output for r in reports))
    if any(r in output for r in reports):
        tail = [next(line for line in output.splitlines() if any(r in line for r in reports))]
    lines.append(f"  {'caught' if caught else 'NOT CAUGHT'}: {' | '.join(tail)}")
    return caught, lines


def planted(only=None, jobs=None):
    """Each mistake of PLANTED in its own copy of csrc, built and tested: the
    tests must fail. Returns the number of mistakes not caught. A mistake's build
    (one translation unit) and its tests (the emulator runs a launch on one thread)
    keep one core busy, so MAX_JOBS of them run at once; each is printed, in
    PLANTED's order, when it and those before it are done."""
    base = os.path.join(OUT, "planted")
    chosen = [p for p in PLANTED if only is None or only in p[0]]
    for variant in sorted({p[5] for p in chosen}):  # the real builds, whose objects the mistakes' libraries link
        build(variant, jobs)
    workers = int(jobs or os.environ.get("MAX_JOBS") or os.cpu_count() or 1)
    missed = []
    with concurrent.futures.ThreadPoolExecutor(max(workers, 1)) as pool:
        for mistake, (caught, lines) in zip(chosen, pool.map(lambda m: plant(base, m, jobs), chosen)):
            print("\n".join(lines), flush=True)
            if not caught:
                missed.append(mistake[0])
    print(f"planted: {len(chosen) - len(missed)} of {len(chosen)} mistakes caught"
          + (f"; missed: {', '.join(missed)}" if missed else ""))
    return len(missed)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    for name in ("build", "test"):
        p = sub.add_parser(name)
        p.add_argument("variant", choices=sorted(SANITIZERS))
        p.add_argument("pytest_args", nargs="*")
    p = sub.add_parser("planted")
    p.add_argument("only", nargs="?", help="only the mistakes whose name contains this")
    args = parser.parse_args()
    if args.command == "planted":
        sys.exit(1 if planted(args.only) else 0)
    lib = build(args.variant)
    print(lib)
    if args.command == "test":
        sys.exit(run_tests(args.variant, lib, args.pytest_args).returncode)


if __name__ == "__main__":
    main()
