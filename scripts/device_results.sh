#!/usr/bin/env bash
# One device call for the results files: build; the WSB CUDA tests; then benchmarks, each under
# its own time limit (WSB_S, RED_S, ATT_S seconds) so a slow stage cannot take the others' rows:
#   spmm(wsb) vs the CSR spmm on locally dense graphs (fp32, bf16)   -> nvidia-h200-wsb-*.json
#   the reduction family on standard and real graphs (fp32, bf16)    -> nvidia-h200-reduce-*.json
#   the attention family in ATT_DTYPES on ATT_GRAPHS                 -> nvidia-h200-attention-*.json
# BUILD=0 skips the build (a warm machine that built the same tree). Pass GNNIO_COMMIT.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
if [ "${WSB_TEST_S:-0}" -gt 0 ]; then
  timeout $WSB_TEST_S python3 -m pytest tests/python/test_wsb_cuda.py -v -p no:cacheprovider > "$OUT/pytest-wsb.log" 2>&1
  echo "wsb tests: $(( $(date +%s) - T0 )) s"
fi
bench() {  # name, seconds, args...
  local name=$1 limit=$2; shift 2
  [ "$limit" -gt 0 ] || return 0
  timeout "$limit" python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot --out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1 || echo "$name: stopped (rc $?)"
  echo "$name: $(( $(date +%s) - T0 )) s"
}
for dtype in float32 bfloat16; do
  bench nvidia-h200-wsb-$dtype ${WSB_S:-0} --dtype $dtype --compare none \
    --graphs blockdiag-1M-16M,bcsstk25,bcsstk13,delaunay-n16,grid-1000x1000,powerlaw-1M-16M --layers "spmm(wsb)"
done
for dtype in float32 bfloat16; do
  bench nvidia-h200-reduce-$dtype ${RED_S:-0} --dtype $dtype --graphs standard,real \
    --layers "segment_reduce(max),SAGEConv(max),SAGEConv(min),GraphConv(max),GraphConv(max)+weight"
done
for dtype in ${ATT_DTYPES:-}; do
  bench nvidia-h200-attention-$dtype ${ATT_S:-0} --dtype $dtype --graphs "${ATT_GRAPHS:-standard,real}" \
    --layers "graph_attention(gat),graph_attention(gatv2),graph_attention(dot),GATConv,GATv2Conv,TransformerConv"
done
if [ "${PROF_S:-0}" -gt 0 ]; then
  timeout $PROF_S python3 bench/profile_layers.py > "$OUT/profile-layers.log" 2>&1 || echo "profile: stopped (rc $?)"
  echo "profile: $(( $(date +%s) - T0 )) s"
fi
echo "=== wsb tests"; [ -f "$OUT/pytest-wsb.log" ] && { grep -E "FAILED|ERROR" "$OUT/pytest-wsb.log" | cut -c1-200 | head -15; tail -1 "$OUT/pytest-wsb.log"; }
echo "=== results"; for f in "$OUT"/*.md; do [ -f "$f" ] && grep -hE "powerlaw-1M-16M|blockdiag|bcsstk25|as20000102" "$f" | cut -c1-200 | head -14; done
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '\.json$' | grep -v '^logs.tgz$') 2>/dev/null)
