#!/usr/bin/env bash
# One device call for an attention change: build, the attention family's CUDA tests (TEST_S),
# then the powerlaw-1M-16M attention rows in DTYPES (ATT_S each; ATT_LAYERS overrides the six). TEST_K: a pytest -k expression
# (spaces allowed); EXTRA_TESTS: more test files, run whole (EXTRA_S). Pass GNNIO_COMMIT=<sent commit>.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
if [ "${TEST_S:-200}" -gt 0 ]; then
  timeout "${TEST_S:-200}" python3 -m pytest tests/python/test_head_scores.py tests/python/test_attention_cuda.py tests/python/test_attention_cuda_hub.py tests/python/test_column_sum.py \
    tests/python/test_layers.py -m cuda ${TEST_K:+-k "$TEST_K"} -q -p no:cacheprovider > "$OUT/pytest-attention.log" 2>&1
  echo "tests: $(( $(date +%s) - T0 )) s"
fi
# EXTRA_TESTS: test files run whole (their CUDA cases come from the `device` fixture, not -m cuda).
if [ -n "${EXTRA_TESTS:-}" ]; then
  timeout "${EXTRA_S:-120}" python3 -m pytest ${EXTRA_TESTS} -q -p no:cacheprovider > "$OUT/pytest-extra.log" 2>&1
  echo "extra tests: $(( $(date +%s) - T0 )) s"; grep -E "^(FAILED|ERROR)" "$OUT/pytest-extra.log" | cut -c1-200 | head -20
  tail -1 "$OUT/pytest-extra.log" | cut -c1-200
fi
for dtype in ${DTYPES-float32}; do  # DTYPES="" runs no bench rows
  timeout "${ATT_S:-140}" python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot --dtype "$dtype" \
    --out "$OUT/nvidia-h200-attention-powerlaw-$dtype.json" --graphs powerlaw-1M-16M \
    --layers "${ATT_LAYERS:-graph_attention(gat),graph_attention(gatv2),graph_attention(dot),GATConv,GATv2Conv,TransformerConv}" \
    > "$OUT/bench-attention-$dtype.log" 2>&1 || echo "attention $dtype: stopped (rc $?)"
  echo "bench $dtype: $(( $(date +%s) - T0 )) s"
done
echo "=== pytest"; grep -E "^(FAILED|ERROR)" "$OUT/pytest-attention.log" | cut -c1-200 | head -20
tail -1 "$OUT/pytest-attention.log" | cut -c1-200
if [ -n "${DTYPES-float32}" ]; then
  echo "=== attention"; grep -hE "powerlaw-1M-16M" "$OUT"/nvidia-h200-attention-powerlaw-*.md | cut -c1-220
fi
exit 0  # the summary above may grep nothing (a stopped bench): not a failure of the call
