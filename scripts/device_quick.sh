#!/usr/bin/env bash
# The shortest useful device call, for a session with little device time left: the binding
# build against prebuilt kernel objects (GNNIO_CUDA_OBJECTS, scripts/cuda_objects.py, carried),
# the CUDA tests picked by TEST_K (QUICK_TEST_S), then the powerlaw-1M-16M rows of QUICK_LAYERS
# against PyG in the same process (QUICK_BENCH_S). Everything prints as it goes: the output's
# tail comes back even when the call is cut short. QUICK_TEST_FILES replaces the attention test
# files (run with -k TEST_K, without -m cuda: files whose CUDA cases come from the `device`
# fixture); QUICK_GRAPHS the graph. Rows are named by the card. Pass GNNIO_COMMIT=<sent commit>.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
# A test run cut by its time box prints no summary: the progress line (dots, F, E) is the verdict
# then, so the log's tail is printed either way.
card=$(device_prefix)
if [ -n "${QUICK_TEST_FILES:-}" ]; then
  selection=(${QUICK_TEST_FILES} -k "${TEST_K:-cuda}")
else
  selection=(tests/python/test_head_scores.py tests/python/test_attention_cuda.py
             tests/python/test_attention_cuda_hub.py tests/python/test_layers.py -m cuda -k "${TEST_K:-hubs}")
fi
timeout "${QUICK_TEST_S:-90}" python3 -m pytest "${selection[@]}" -q -rfE -p no:cacheprovider \
  > "$OUT/pytest.log" 2>&1 || echo "tests: rc $?"
grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | cut -c1-200 | head -20
tail -c 400 "$OUT/pytest.log"; echo
echo "tests: $(( $(date +%s) - T0 )) s"
timeout "${QUICK_BENCH_S:-40}" python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot \
  --graphs "${QUICK_GRAPHS:-powerlaw-1M-16M}" --layers "${QUICK_LAYERS:-GATv2Conv}" \
  --out "$OUT/$card-attention-quick.json" > "$OUT/bench.log" 2>&1 || echo "bench: stopped"
grep -E "${QUICK_GRAPHS:-powerlaw-1M-16M}" "$OUT"/$card-attention-quick.md | cut -c1-260
echo "bench: $(( $(date +%s) - T0 )) s"
