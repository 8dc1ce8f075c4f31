#!/usr/bin/env bash
# `make sanitize`: the CPU extension built with AddressSanitizer and
# UndefinedBehaviorSanitizer, out of the source tree (build/asan), and the
# operator tests run against it.
#
# Python is not instrumented: libasan is preloaded (it must come first), leaks
# are not reported (the interpreter's own allocations would drown them), and any
# sanitizer report stops the run with an error (-fno-sanitize-recover, halt_on_error). The tests
# import a copy of the fakequant package whose _C is the sanitized build; the
# script checks that they do before running them.
set -euo pipefail
cd "$(dirname "$0")/.."
# (absolute paths, as the tests run from $OUT; -s keeps the virtualenv's python link)
PY=$(realpath -s "${PY:-.venv/bin/python}")
OUT=$(realpath -m -s "${ASAN_BUILD:-build/asan}")
ROOT=$PWD
MAX_JOBS=${MAX_JOBS:-2}
CC=${CC:-gcc}
# -g1: line tables (a report's files, lines and inlined frames) in less compile time than -g's
# types and variables (FAKEQUANT_DEBUG_INFO=1 keeps setup.py from adding -g0 after it)
SAN="-fsanitize=address,undefined,float-cast-overflow -fno-sanitize-recover=all -fno-omit-frame-pointer -g1"

# distutils appends CFLAGS to every compile and LDFLAGS to the link (setup.py's own
# -O3 etc. stay).
FAKEQUANT_CPU_ONLY=1 FAKEQUANT_DEBUG_INFO=1 MAX_JOBS=$MAX_JOBS \
CFLAGS="$SAN" LDFLAGS="-fsanitize=address,undefined,float-cast-overflow" \
    "$PY" setup.py -q build_ext --build-lib "$OUT/lib" --build-temp "$OUT/temp"

# A copy of the package with the sanitized libraries in place of the in-tree ones.
rm -rf "$OUT/pkg"
mkdir -p "$OUT/pkg"
cp -r fakequant "$OUT/pkg/"
find "$OUT/pkg" -name '__pycache__' -prune -exec rm -rf {} +
rm -f "$OUT"/pkg/fakequant/_C*.so "$OUT"/pkg/fakequant/_build*.so
cp "$OUT"/lib/fakequant/_C*.so "$OUT"/lib/fakequant/_build*.so "$OUT/pkg/fakequant/"

ASAN_LIB=$("$CC" -print-file-name=libasan.so)
UBSAN_LIB=$("$CC" -print-file-name=libubsan.so)
# (ldd's whole output first: `ldd | grep -q` fails under pipefail whenever grep exits
# at its first match while ldd is still writing, and ldd dies of SIGPIPE)
DEPS=$(ldd "$OUT"/pkg/fakequant/_C*.so)
grep -q libasan <<<"$DEPS" || { echo "the build is not sanitized:"; echo "$DEPS"; exit 1; }

# The canary: a library with a heap overflow and an overlong shift, loaded the same
# way; if this environment did not abort on them, a clean run would prove nothing.
mkdir -p "$OUT/canary"
cat > "$OUT/canary/bad.c" <<'C'
#include <stdlib.h>
int overflow(int i) { volatile int *p = malloc(4 * sizeof(int)); int v = p[i]; free((void *)p); return v; }
int shift(int a, int b) { return a << b; }
C
"$CC" -shared -fPIC $SAN "$OUT/canary/bad.c" -o "$OUT/canary/libbad.so"

export LD_PRELOAD="$ASAN_LIB $UBSAN_LIB"
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=0:halt_on_error=1:detect_odr_violation=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
export PYTHONPATH="$OUT/pkg"
export FAKEQUANT_FUZZ_EXAMPLES=${FAKEQUANT_SANITIZE_FUZZ_EXAMPLES:-500}
for call in "overflow(4)" "shift(1, 40)"; do
    if "$PY" -c "import ctypes; ctypes.CDLL('$OUT/canary/libbad.so').$call" >"$OUT/canary/log" 2>&1; then
        echo "the sanitizers did not catch the canary's $call"; exit 1
    fi
    grep -q "AddressSanitizer: heap-buffer-overflow\|runtime error: shift exponent" "$OUT/canary/log" || {
        cat "$OUT/canary/log"; echo "the canary's $call failed for another reason"; exit 1; }
done
echo "canary: the sanitizers stop the run on a heap overflow and on undefined behaviour"
# Run from $OUT so that the source tree's fakequant is not on sys.path.
cd "$OUT"
"$PY" -c "
import fakequant, fakequant._C as c
assert c.__file__.startswith('$OUT/pkg/'), c.__file__
print('sanitized library:', c.__file__)
"
TESTS="tests/test_ops.py tests/test_errors.py tests/test_op_registration.py tests/test_eager_calls.py tests/test_fuzz.py tests/test_threads.py
       tests/test_compile_export.py tests/test_quantizer.py tests/test_fp8.py tests/test_blockwise.py tests/test_lsq.py"
# (the 2^31-element test needs 9 GiB and minutes under ASan: left to `make test`)
"$PY" -m pytest -q -p no:cacheprovider --rootdir "$ROOT" \
    $(for t in $TESTS; do echo "$ROOT/$t"; done) -k "not more_than_2_to_31" "$@"
echo "make sanitize: clean (AddressSanitizer + UndefinedBehaviorSanitizer, no report)"
