# dam-operator — two commands on a fresh machine: `make demo` and `make test`.
SHELL := /bin/bash
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.dam-installed
TORCH_VERSION ?= 2.13.0

.PHONY: setup system-deps kube-bin tools image cluster cluster-down demo test lint typecheck imports unit integration bench clean

setup: $(STAMP)

# Quiet but not silent: one line a stage (pip -q prints only warnings and errors); what each
# stage costs is in the README. PyPI's torch for Linux is the CUDA build (~3 GB with its nvidia-*
# wheels); it runs on a CPU. pip's cache (where the machine keeps one) makes a second set-up fast.
PIP_QUIET := $(BIN)/python -m pip install -q --disable-pip-version-check
$(STAMP): pyproject.toml
	@test -x $(BIN)/python || { echo "setup: creating $(VENV) ($(PYTHON) -m venv)"; $(PYTHON) -m venv $(VENV); }
	@echo "setup: pip"; $(PIP_QUIET) --upgrade pip
	@echo "setup: torch==$(TORCH_VERSION) and numpy (the first time about 3 GB from PyPI; minutes)"
	@$(PIP_QUIET) torch==$(TORCH_VERSION) numpy
	@echo "setup: this package and its development tools (pip install -e '.[dev]')"
	@# -qq: errors only. At -q pip 26 relays setuptools' notice on every editable install
	@# ("Editable installation ... folders with the same name as your package": ten lines).
	@$(PIP_QUIET) -q -e '.[dev]'
	@touch $(STAMP); echo "setup: done ($(VENV))"

# From Debian, each only where it is missing: prometheus (promtool, prometheus) for the metric tests;
# containerd, runc and the CNI plugins for the node (tools/node); buildah to build the image from the
# Dockerfile with no Docker engine (tools/image; `--isolation chroot` needs neither fuse-overlayfs nor
# slirp4netns) and mmdebstrap to make its base image; gcc and libc6-dev (libc.a) for the static pause binary.
SYSTEM_DEPS = promtool:prometheus prometheus:prometheus containerd:containerd ctr:containerd runc:runc \
  /usr/lib/cni/bridge:containernetworking-plugins /usr/lib/cni/host-local:containernetworking-plugins \
  /usr/lib/cni/loopback:containernetworking-plugins buildah:buildah gcc:gcc \
  /usr/lib/$(shell uname -m)-linux-gnu/libc.a:libc6-dev mmdebstrap:mmdebstrap
system-deps:
	@missing=""; for pair in $(SYSTEM_DEPS); do what=$${pair%%:*}; pkg=$${pair##*:}; \
	  if [[ "$$what" == /* ]]; then [[ -e "$$what" ]] && continue; else command -v "$$what" >/dev/null 2>&1 && continue; fi; \
	  [[ " $$missing " == *" $$pkg "* ]] || missing="$$missing $$pkg"; done; \
	if [[ -n "$$missing" ]]; then \
	  echo "system-deps: installing Debian's$$missing"; \
	  SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq --no-install-recommends $$missing >/dev/null; \
	fi

# kube-apiserver + etcd (the control plane) and kubelet, kube-controller-manager, kube-scheduler (the
# node) built from source (tools/kube-bin), cached outside the repo (~/.cache/dam-operator/kube-bin);
# prints their directory as its last line. KUBEBUILDER_ASSETS=DIR: the binaries it holds are used.
KUBE_BIN_OR_SKIP = @tools/kube-bin/build.sh || { [ "$${CI:-}" != true ] && echo "kube-bin: NO CONTROL-PLANE BINARIES: the real-Kubernetes tests will be skipped (make kube-bin says why)"; }
# The node tier's images (operator from the Dockerfile, base/training, pause): cached by input hash.
# kubectl, helm and crictl of the pinned release (tools/kube-tools): the node tier runs the README's commands with them.
TOOLS_OR_SKIP = @tools/kube-tools/build.sh >/dev/null || { [ "$${CI:-}" != true ] && echo "tools: NO KUBECTL/HELM: the README's Kubernetes test will be skipped (make tools says why)"; }
IMAGE_OR_SKIP = @tools/image/build.sh all >/dev/null || { [ "$${CI:-}" != true ] && echo "image: NO IMAGES: the real-node tests will be skipped (make image says why)"; }

kube-bin:
	tools/kube-bin/build.sh

# kubectl (the cluster's release, v1.34.4), helm (v3) and crictl (v1.34), built from the Go module proxy
# like the control plane (tools/kube-tools), cached (~/.cache/dam-operator/tools/bin); prints that
# directory as its last line:  export PATH="$$(make -s tools | tail -n 1):$$PATH"
tools:
	@tools/kube-tools/build.sh

# The image from the Dockerfile, built with buildah (no Docker engine, no registry; tools/image/build.sh):
# an OCI archive cached by the hash of its inputs, its path the last line. Also the locally made base
# image (PYTHON_IMAGE; the node tests' training image) and the pause image, for `make cluster`.
image: system-deps
	tools/image/build.sh all

# A one-node Kubernetes cluster on this machine (root): etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, containerd, a CNI bridge and kubelet, all on 127.0.0.1; the images imported. Prints
# the admin kubeconfig's path last (progress on stderr); a second `make cluster` leaves the running one
# as it is and prints the same path. `make cluster-down` removes all of it. The node's code is
# tools/node/dam_cluster (`python -m dam_cluster`).
DAM_CLUSTER = PYTHONPATH=tools/node $(BIN)/python -m dam_cluster
cluster: setup system-deps tools
	@if $(DAM_CLUSTER) status >/dev/null 2>&1; then $(DAM_CLUSTER) up; exit; fi; \
	t0=$$SECONDS; echo "cluster: the Kubernetes binaries (tools/kube-bin; a first build takes 20-40 min on 2 cores)" >&2; \
	tools/kube-bin/build.sh >/dev/null || exit; \
	echo "cluster: the images (tools/image; a first build takes a few minutes) ($$((SECONDS - t0)) s)" >&2; \
	images=$$(tools/image/build.sh all | tail -n 3) || exit; \
	echo "cluster: starting the node ($$((SECONDS - t0)) s)" >&2; \
	$(DAM_CLUSTER) up --images $$images

cluster-down:
	@$(DAM_CLUSTER) down

demo: setup
	$(BIN)/python examples/demo.py

lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: setup
	$(BIN)/mypy sidecar operator tools/node/dam_cluster

imports: setup
	$(BIN)/lint-imports

unit: setup
	$(BIN)/pytest tests/unit -q

integration: setup system-deps
	$(KUBE_BIN_OR_SKIP)
	$(TOOLS_OR_SKIP)
	$(IMAGE_OR_SKIP)
	$(BIN)/pytest tests/integration -q

test: setup system-deps lint typecheck imports
	$(KUBE_BIN_OR_SKIP)
	$(TOOLS_OR_SKIP)
	$(IMAGE_OR_SKIP)
	$(BIN)/pytest -q

bench: setup
	$(BIN)/python benchmarks/probe_overhead.py

clean:
	rm -rf $(VENV) build dist *.egg-info .mypy_cache .ruff_cache .pytest_cache .hypothesis
