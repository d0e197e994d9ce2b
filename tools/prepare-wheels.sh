#!/usr/bin/env bash
# Builds ./wheels for tools/gpu-check.sh: the project wheel plus every dependency that a
# GPU machine with python3.12, PyTorch (CUDA), nvidia-ml-py, prometheus-client, psutil and
# httpx lacks, as cp312 manylinux x86_64 (or pure-Python) wheels. Run it with network.
#
#   tools/prepare-wheels.sh [--dry-run] [--python-version 3.12] [--dest wheels]
set -euo pipefail
cd "$(dirname "$0")/.."
PY_VERSION=3.12
DEST=wheels
DRY=0
PIP=${PIP:-.venv/bin/python -m pip}
usage() { sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'; }
while [ $# -gt 0 ]; do
  case "$1" in
    -h|--help) usage; exit 0 ;;
    --dry-run) DRY=1 ;;
    --python-version) PY_VERSION=$2; shift ;;
    --dest) DEST=$2; shift ;;
    *) echo "prepare-wheels: unknown argument $1" >&2; usage >&2; exit 2 ;;
  esac
  shift
done
ABI="cp${PY_VERSION/./}"
# The runtime dependencies from pyproject.toml, minus what the GPU machine already has.
DEPS=$(sed -n '/^dependencies = \[/,/^\]/p' pyproject.toml | grep -o '"[^"]*"' | tr -d '"' \
  | grep -viE '^(nvidia-ml-py|prometheus-client|psutil)\b' || true)
run() { echo "+ $*"; [ "$DRY" = 1 ] || "$@"; }
run mkdir -p "$DEST"
run $PIP wheel --no-deps --wheel-dir "$DEST" .
# shellcheck disable=SC2086
run $PIP download --dest "$DEST" --only-binary=:all: --python-version "$PY_VERSION" \
  --implementation cp --abi "$ABI" --platform manylinux2014_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux_2_28_x86_64 --platform any $DEPS
echo "prepare-wheels: $( [ "$DRY" = 1 ] && echo would write || echo wrote ) $DEST/ for python $PY_VERSION ($ABI)"
