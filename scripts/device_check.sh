#!/usr/bin/env bash
# One device call after a kernel change: build, every CUDA test (time-boxed, names printed as
# they run so a cut log still says which passed), then the attention benchmark on the graphs in
# ATT_GRAPHS. Pass GNNIO_COMMIT=<sent commit>. Limits: TEST_S, ATT_S seconds. Summary last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
timeout ${TEST_S:-200} python3 -m pytest tests/python -m cuda -v -p no:cacheprovider ${TEST_ARGS:-} \
  > "$OUT/pytest.log" 2>&1
echo "tests: $(( $(date +%s) - T0 )) s"
if [ "${SAN_S:-0}" -gt 0 ]; then
  timeout $SAN_S compute-sanitizer --tool memcheck --error-exitcode 3 python3 tests/cuda_sanitize.py > "$OUT/sanitize.log" 2>&1
  echo "sanitize: rc $? at $(( $(date +%s) - T0 )) s"
fi
if [ "${RED_S:-0}" -gt 0 ]; then
  timeout $RED_S python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot --dtype float32 --graphs standard,real \
    --layers "segment_reduce(max),SAGEConv(max),SAGEConv(min),GraphConv(max),GraphConv(max)+weight" \
    --out "$OUT/nvidia-h200-reduce-float32.json" > "$OUT/bench-reduce.log" 2>&1 || echo "reduce: stopped (rc $?)"
  echo "reduce: $(( $(date +%s) - T0 )) s"
fi
[ "${ATT_S:-120}" -gt 0 ] && for dtype in ${ATT_DTYPES:-float32}; do
  timeout ${ATT_S:-120} python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot --dtype $dtype \
    --out "$OUT/nvidia-h200-attention-$dtype.json" --graphs "${ATT_GRAPHS:-powerlaw-1M-16M}" \
    --layers "graph_attention(gat),graph_attention(gatv2),graph_attention(dot),GATConv,GATv2Conv,TransformerConv" \
    > "$OUT/bench-attention-$dtype.log" 2>&1 || echo "attention $dtype: stopped (rc $?)"
done
echo "bench: $(( $(date +%s) - T0 )) s"
echo "=== pytest"; grep -E "^(FAILED|ERROR)|FAILED|ERROR" "$OUT/pytest.log" | cut -c1-220 | head -30
grep -cE " PASSED" "$OUT/pytest.log"; tail -1 "$OUT/pytest.log" | cut -c1-200
[ -f "$OUT/sanitize.log" ] && { echo "=== sanitize"; grep -E "ERROR SUMMARY|FAILED|sanitize cases" "$OUT/sanitize.log" | head -8; }
echo "=== reduce"; grep -hE "as20000102.*pyg" "$OUT"/nvidia-h200-reduce-float32.md 2>/dev/null | cut -c1-160
echo "=== attention"; grep -hE "powerlaw-1M-16M" "$OUT"/nvidia-h200-attention-*.md | cut -c1-220 | head -40
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '\.json$' | grep -v '^logs.tgz$') 2>/dev/null)
