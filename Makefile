# `make test` and `make demo` do all set-up on a fresh machine: a virtualenv in
# $(VENV), torch, the test dependencies, and the extension built in place.
PYTHON ?= python3
VENV ?= .venv
# Any torch >= 2.4 works: make test TORCH="torch==2.6.0"
TORCH ?= torch==2.13.0
MAX_JOBS ?= 2

PY := $(VENV)/bin/python
PIP := $(PY) -m pip --disable-pip-version-check
DEPS := $(VENV)/.deps-$(subst =,-,$(subst $() ,_,$(TORCH)))
SOURCES := setup.py pyproject.toml $(wildcard csrc/*.h csrc/*.cpp csrc/cpu/*.h csrc/cpu/*.cpp csrc/cuda/*.cu csrc/cuda/*.cuh)

.PHONY: build test demo bench clean

$(DEPS):
	$(PYTHON) -m venv $(VENV)
	$(PIP) install -q --upgrade "setuptools>=64" wheel ninja
	$(PIP) install -q "$(TORCH)"
	rm -f $(VENV)/.deps-* $(VENV)/.built
	touch $@

$(VENV)/.built: $(DEPS) $(SOURCES)
	MAX_JOBS=$(MAX_JOBS) $(PIP) install -q --no-build-isolation -e ".[test,demo]"
	touch $@

build: $(VENV)/.built

test: build
	$(PY) -m pytest -q tests

# The main job: float training, PTQ with four calibrations, QAT, ONNX Runtime (examples/).
demo: build
	$(PY) examples/digits_qat.py --out demo-output

bench: build
	$(PY) benchmarks/bench_ops.py
	$(PY) benchmarks/bench_ops.py --thp

clean:
	rm -rf build *.egg-info fakequant/_C*.so fakequant/_build_info.py $(VENV)
