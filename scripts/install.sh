#!/usr/bin/env bash
# Installs what gnnio needs on a fresh Debian/Ubuntu machine and builds it in place:
# the C++ toolchain and test libraries (apt-get), torch + PyG + pytest + matplotlib (pip; matplotlib
# draws `gnnio bench`'s plot; scipy and pymetis compute the rcm and metis reorderings), then the
# extension (CUDA kernels when torch sees a GPU and nvcc is found, CPU-only otherwise).
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES="g++ cmake ninja-build libgtest-dev zlib1g-dev"
missing=""
for p in $APT_PACKAGES; do dpkg -s "$p" >/dev/null 2>&1 || missing="$missing $p"; done
if [ -n "$missing" ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  $SUDO apt-get update -qq
  $SUDO env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $missing
fi

PY=${PYTHON:-python3}
$PY -m pip install -q --upgrade pip wheel "setuptools>=64,<82" ninja  # torch 2.11 needs setuptools<82
$PY -m pip install -q "torch==${GNNIO_TORCH_VERSION:-2.11.0}" "torch_geometric==2.8.0" numpy scipy pymetis pytest matplotlib
$PY -m pip install -q --no-build-isolation -e .
$PY -c "import gnnio, torch; print('gnnio', gnnio.__version__, 'torch', torch.__version__, 'CUDA kernels:', gnnio._ops.HAS_CUDA_KERNELS)"
