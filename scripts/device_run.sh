#!/usr/bin/env bash
# Everything one GPU session needs, in one call of the device tool:
#   bash scripts/device_run.sh [build] [ctest] [test] [sanitize] [bench-spmm] [bench-reduce]
#                              [bench-attention]   (default: all; "bench" = every bench stage)
# PYTEST_ARGS passes extra arguments to pytest (e.g. "-k cuda"). Pass GNNIO_COMMIT=<hash of the
# commit sent> in the command: the copied tree's git metadata on the device can be stale.
# Run from the repository root with the shared graphs copied to .data/graphs (git-ignored)
# and, where the machine lacks pytest, wheels in .whl. Logs and results go to $OUT.
set -uo pipefail
OUT=${OUT:-/tmp/gnnio-out}
mkdir -p "$OUT"
stages=${*:-build ctest test sanitize bench}
expanded=""
for s in $stages; do
  [ "$s" = bench ] && s="bench-spmm bench-reduce bench-attention"
  expanded="$expanded $s"
done
stages=$expanded
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
export GNNIO_GRAPH_DIR="$PWD/.data/graphs"

if ! python3 -c "import pytest" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl
  export PYTHONPATH="$PYTHONPATH:/tmp/site"
fi
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$OUT/gpu.txt"

summary=""
for stage in $stages; do
  echo "=== $stage ($(date +%T))"
  started=$(date +%s)
  case $stage in
    build)
      { time MAX_JOBS=16 python3 setup.py build_ext --inplace; } > "$OUT/build.log" 2>&1 \
        || { tail -60 "$OUT/build.log"; exit 1; }
      tail -3 "$OUT/build.log"
      python3 -c "import gnnio; assert gnnio._ops.HAS_CUDA_KERNELS, 'built without CUDA'; print('CUDA kernels loaded')" || exit 1
      ;;
    ctest)
      cmake -S . -B build/cmake -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90a > "$OUT/cmake.log" 2>&1 \
        && cmake --build build/cmake -j 16 >> "$OUT/cmake.log" 2>&1 \
        && (cd build/cmake && ctest --output-on-failure 2>&1 | tail -4) \
        || { echo "ctest stage failed (GoogleTest may be missing here)"; tail -5 "$OUT/cmake.log"; }
      ;;
    test)
      python3 -m pytest tests/python -q -rs ${PYTEST_ARGS:-} 2>&1 | tee "$OUT/pytest.log" | tail -25
      ;;
    sanitize)
      compute-sanitizer --tool memcheck --error-exitcode 3 python3 tests/cuda_sanitize.py 2>&1 | tee "$OUT/sanitize.log" | tail -8
      ;;
    bench-spmm)
      python3 -m gnnio.bench --graphs standard,real --layers spmm,GCNConv,GraphConv\(add\),GraphConv\(mean\),SAGEConv\(mean\) \
        --out "$OUT/nvidia-h200-spmm.json" 2>&1 | tee "$OUT/bench-spmm.log" | tail -3
      ;;
    bench-reduce)
      for dtype in float32 bfloat16; do
        python3 -m gnnio.bench --graphs standard,real --dtype $dtype \
          --layers "segment_reduce(max),SAGEConv(max),SAGEConv(min),GraphConv(max),GraphConv(max)+weight" \
          --out "$OUT/nvidia-h200-reduce-$dtype.json" 2>&1 | tee "$OUT/bench-reduce-$dtype.log" | tail -3
      done
      ;;
    bench-attention)
      for dtype in float32 bfloat16; do
        python3 -m gnnio.bench --graphs standard,real --dtype $dtype --layers "graph_attention(gat),graph_attention(gatv2),graph_attention(dot),GATConv,GATv2Conv,TransformerConv" \
          --out "$OUT/nvidia-h200-attention-$dtype.json" 2>&1 | tee "$OUT/bench-attention-$dtype.log" | tail -3
      done
      ;;
  esac
  summary="$summary\n$stage: $(( $(date +%s) - started )) s"
done
# The tail of the output is what comes back first: the verdicts go last.
echo -e "=== summary$summary"
[ -f "$OUT/pytest.log" ] && { grep -E "^(FAILED|ERROR)" "$OUT/pytest.log" | head -30; tail -1 "$OUT/pytest.log"; }
[ -f "$OUT/sanitize.log" ] && { grep -E "FAILED|ERROR SUMMARY|sanitize cases" "$OUT/sanitize.log" | head -10; }
# The device tool brings back only a few files: results JSON as they are, everything else in one
# archive (the .md tables are regenerated from the JSON by gnnio.bench.report).
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '\.json$' | grep -v '^logs.tgz$') 2>/dev/null)
