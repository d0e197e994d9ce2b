#!/usr/bin/env bash
# The GPU check, as one command, on a machine with one NVIDIA (Hopper) GPU and no network.
#
#   tools/gpu-check.sh [--seconds 20] [--warmup 8] [--only NAME] [--dry-run]
#   PYTHON=.venv/bin/python tools/gpu-check.sh --rehearse   # no GPU: the same pipeline on the CPU
#
# Needs python3.12 with PyTorch (CUDA), nvidia-ml-py, prometheus-client, psutil and httpx;
# everything else (pydantic, pydantic-settings, kopf, ...) and the project itself come from
# ./wheels, made beforehand (with network) by tools/prepare-wheels.sh. Installs into a venv
# that sees the system packages (.out/gpu-check-venv), then runs tools/gpu_check.py under an
# 8-minute timeout (SIGTERM: the check stops the sidecar and the workload and exits; SIGKILL 30 s later).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=.out/gpu-check-venv

for a in "$@"; do
  case "$a" in
    -h|--help|--dry-run|--rehearse) exec "$PYTHON" tools/gpu_check.py "$@" ;;
  esac
done

if [ ! -d wheels ] || ! ls wheels/dam_operator-*.whl >/dev/null 2>&1; then
  echo "gpu-check: no wheels/dam_operator-*.whl; run tools/prepare-wheels.sh (with network) first" >&2
  exit 2
fi
if [ ! -x "$VENV/bin/python" ]; then
  "$PYTHON" -m venv --system-site-packages "$VENV"
fi
"$VENV/bin/python" -m pip install -q --no-index --find-links wheels --force-reinstall --no-deps wheels/dam_operator-*.whl
"$VENV/bin/python" -m pip install -q --no-index --find-links wheels wheels/dam_operator-*.whl
exec timeout --kill-after=30 480 "$VENV/bin/python" tools/gpu_check.py "$@"
