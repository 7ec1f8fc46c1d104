#!/usr/bin/env bash
# The main job: gnnio against PyG on the bundled real graph (Cora), on the GPU when there is one
# and on the CPU otherwise. Extra arguments go to `python -m gnnio.bench` (see --help).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
python3 -m gnnio.bench --graphs cora "$@"
