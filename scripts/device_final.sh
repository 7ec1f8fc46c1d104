#!/usr/bin/env bash
# One device call for the attention and reduction results: build, the CUDA tests of both
# families, then the benchmarks, each under its own time limit so that a slow stage cannot
# take the others' results with it.
set -uo pipefail
OUT=${OUT:-/tmp/gnnio-out}
export PYTEST_ARGS="-k cuda --continue-on-collection-errors"
T0=$(date +%s)
source scripts/device_common.sh
device_build
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python:/tmp/site" GNNIO_GRAPH_DIR="$PWD/.data/graphs"
[ -d /tmp/site ] || python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
timeout ${TEST_S:-90} python3 -m pytest tests/python/test_attention_cuda.py tests/python/test_attention_cuda_hub.py tests/python/test_cuda_graphs.py \
  tests/python/test_reduce.py -v -k cuda -p no:cacheprovider > "$OUT/pytest.log" 2>&1  # -v: names survive a timeout
bench() {  # name, seconds, args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m gnnio.bench --warmup 3 --repeat 10 --out "$OUT/$name.json" "$@" \
    > "$OUT/$name.log" 2>&1 || echo "$name: stopped (rc $?)"
}
bench nvidia-h200-attention-float32 ${ATT_S:-200} --graphs standard,real \
  --layers "graph_attention(gat),graph_attention(gatv2),graph_attention(dot),GATConv,GATv2Conv,TransformerConv"
bench nvidia-h200-attention-bfloat16 ${ATT16_S:-60} --graphs standard --dtype bfloat16 \
  --layers "graph_attention(gatv2),GATConv,GATv2Conv,TransformerConv"
bench nvidia-h200-reduce-check ${RED_S:-40} --graphs powerlaw-1M-16M,as20000102 --dtype bfloat16 \
  --layers "segment_reduce(max),SAGEConv(max)"
grep -E "FAILED|ERROR" "$OUT/pytest.log" | head -20; tail -1 "$OUT/pytest.log"
grep -hE "powerlaw-1M-16M \| (graph_attention|GAT|Transformer|SAGE|segment)" "$OUT"/*.md 2>/dev/null | cut -c1-200
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '\.json$' | grep -v '^logs.tgz$') 2>/dev/null)
