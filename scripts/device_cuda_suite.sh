#!/usr/bin/env bash
# The whole suite's CUDA cases (marked `cuda` or parametrised on the `device` fixture: both match
# -k cuda), file by file in the order of FILES, in one time box (SUITE_S). Names are logged as they
# run (-v), so a call cut by the box says where the next one starts (FILES=the rest). Pass
# GNNIO_COMMIT=<sent commit>.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
FILES=${FILES:-$(ls tests/python/test_*.py)}
timeout "${SUITE_S:-420}" python3 -m pytest ${FILES} -k cuda -v -rfE -p no:cacheprovider \
  --durations=15 > "$OUT/pytest-cuda-suite.log" 2>&1 || echo "tests: rc $?"
echo "tests: $(( $(date +%s) - T0 )) s"
grep -E "^(FAILED|ERROR)" "$OUT/pytest-cuda-suite.log" | cut -c1-220 | head -30
echo "passed: $(grep -c ' PASSED' "$OUT/pytest-cuda-suite.log"), failed: $(grep -c ' FAILED' "$OUT/pytest-cuda-suite.log"), skipped: $(grep -c ' SKIPPED' "$OUT/pytest-cuda-suite.log")"
echo "last file reached: $(grep -oE '^tests/python/test_[a-z0-9_]+\.py' "$OUT/pytest-cuda-suite.log" | tail -1)"
tail -3 "$OUT/pytest-cuda-suite.log" | cut -c1-300
