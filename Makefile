# dam-operator — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dam-installed
TORCH_VERSION ?= 2.13.0

.PHONY: setup system-deps kube-bin demo test lint typecheck imports unit integration bench clean

setup: $(STAMP)

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# PyPI's torch for Linux is the CUDA build (~3 GB with its nvidia-* wheels); it runs on a CPU.
	# pip's cache (where the machine keeps one) makes a second set-up fast.
	$(BIN)/python -m pip install -q torch==$(TORCH_VERSION) numpy
	$(BIN)/python -m pip install -q -e '.[dev]'
	touch $(STAMP)

# promtool and prometheus come from Debian's `prometheus` package.
system-deps:
	@command -v promtool >/dev/null 2>&1 && command -v prometheus >/dev/null 2>&1 || { \
	  echo "installing Debian's prometheus package (promtool, prometheus)"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# kube-apiserver + etcd built from source (tools/kube-bin), cached outside the repo
# (~/.cache/dam-operator/kube-bin); prints their directory as its last line.
# KUBEBUILDER_ASSETS=DIR uses binaries you already have and builds nothing.
KUBE_BIN_OR_SKIP = @tools/kube-bin/build.sh || { [ "$${CI:-}" != true ] && echo "kube-bin: NO CONTROL-PLANE BINARIES: the real-Kubernetes tests will be skipped (make kube-bin says why)"; }

kube-bin:
	tools/kube-bin/build.sh

demo: setup
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy sidecar operator

imports: setup
	$(BIN)/lint-imports

unit: setup
	$(BIN)/pytest tests/unit -q

integration: setup system-deps
	$(KUBE_BIN_OR_SKIP)
	$(BIN)/pytest tests/integration -q

test: setup system-deps lint typecheck imports
	$(KUBE_BIN_OR_SKIP)
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python benchmarks/probe_overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
