#!/usr/bin/env bash
# The whole test suite: C++ core (GoogleTest through CTest) and Python (pytest, CPU always,
# CUDA tests too when a GPU is present). Installs what it needs first.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh

cmake -S . -B build/cmake -G Ninja -DCMAKE_BUILD_TYPE=Release
cmake --build build/cmake
(cd build/cmake && ctest --output-on-failure)

# pytest exits 5 when it collects nothing; set -e turns that (and any failure) into a failed run.
python3 -m pytest tests/python -q -rs
