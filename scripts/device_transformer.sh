#!/usr/bin/env bash
# One device call for TransformerConv's reassociated form (bench/NOTES.md v19): build; the
# shared-row tests (CUDA and CPU), the layer's forms and the dot cases of the attention CUDA
# tests (TEST_S); then, on powerlaw-1M-16M (mean in-degree 16) and uniform-200K-10M (50: the
# byte model's break-even is ~14, NOTES v19), per dtype in DTYPES, the ops graph_attention(dot)
# and graph_attention(shared) and TransformerConv run once per form (GNNIO_TRANSFORMER_FORM:
# each run has PyG's layer in the same process), BENCH_S each. Pass GNNIO_COMMIT=<sent commit>.
# One device call holds 600 s: run it as two, `DTYPES=float32` (build, tests, fp32 rows: ~450 s)
# then, while the machine is warm, `BUILD=0 TEST_S=0 DTYPES=bfloat16` (~200 s). FORMS: the
# runs per dtype (default direct reassociated reassociated-heads2).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
if [ "${TEST_S:-240}" -gt 0 ]; then
  timeout "${TEST_S:-240}" python3 -m pytest tests/python/test_attention_shared_kv_cuda.py \
    tests/python/test_attention_shared_kv.py tests/python/test_transformer_forms.py \
    tests/python/test_attention_cuda.py -k "shared or Transformer or reassociated or dot" \
    -q -p no:cacheprovider > "$OUT/pytest-transformer.log" 2>&1
  # The layer inputs added since the last device run (sparse adj_t, lazy sizes, HeteroConv,
  # autocast, batched features): their CUDA cases (device fixture), ~450, on top.
  timeout "${INPUTS_S:-120}" python3 -m pytest tests/python/test_sparse_adjacency.py \
    tests/python/test_lazy_channels.py tests/python/test_hetero.py \
    tests/python/test_autocast.py tests/python/test_user_code.py -k cuda \
    -q -p no:cacheprovider > "$OUT/pytest-inputs.log" 2>&1
  echo "tests: $(( $(date +%s) - T0 )) s"
fi
for dtype in ${DTYPES-float32 bfloat16}; do
  # reassociated-heads2: the same with 2 heads a warp (GNNIO_SHARED_ROWS_HEADS=2, NOTES v19).
  for form in ${FORMS:-direct reassociated reassociated-heads2}; do
    layers="TransformerConv"
    [ "$form" = direct ] && layers="graph_attention(dot),graph_attention(shared),TransformerConv"
    [ "$form" = reassociated-heads2 ] && layers="graph_attention(shared),TransformerConv"
    heads=""; [ "$form" = reassociated-heads2 ] && heads=2
    GNNIO_TRANSFORMER_FORM=${form%-heads2} GNNIO_SHARED_ROWS_HEADS=$heads \
      timeout "${BENCH_S:-150}" python3 -m gnnio.bench --warmup 3 \
      --repeat 10 --no-plot --dtype "$dtype" --graphs "${GRAPHS:-powerlaw-1M-16M,uniform-200K-10M}" --layers "$layers" \
      --out "$OUT/nvidia-h200-transformer-$form-$dtype.json" > "$OUT/bench-$form-$dtype.log" 2>&1 \
      || echo "$form $dtype: stopped (rc $?)"
    echo "bench $form $dtype: $(( $(date +%s) - T0 )) s"
  done
done
for log in pytest-transformer pytest-inputs; do
  [ -f "$OUT/$log.log" ] || continue
  echo "=== $log"; grep -E "^(FAILED|ERROR)" "$OUT/$log.log" | cut -c1-200 | head -20
  tail -1 "$OUT/$log.log" | cut -c1-200
done
echo "=== rows"; grep -hE "powerlaw-1M-16M|uniform-200K-10M" "$OUT"/nvidia-h200-transformer-*.md | cut -c1-220
exit 0  # the summary may grep nothing (a stopped bench): not a failure of the call
