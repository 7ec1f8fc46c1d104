#!/usr/bin/env bash
# One device call for GAT attention on WSB tiles (issue 5; bench/NOTES.md "WSB attention"):
# build; the CUDA tests (test_wsb_attention_cuda.py, TEST_S) and compute-sanitizer on a few of
# them (SANITIZE_S); then the graph_attention(wsb) rows (tiles against the fused CSR kernels,
# same process and inputs) per dtype in DTYPES on GRAPHS, BENCH_S each. float32 runs the tiles
# as tf32 (torch.backends.cuda.matmul allow_tf32 is not needed: the op is forced), so its rows
# compare tf32 tiles against float32 CSR, as the spmm(wsb) rows do. EXTRA_TESTS: more test files
# run whole after the WSB tests (EXTRA_S; e.g. tests/python/test_reduce_weighted.py, whose CUDA
# cases have never run), selected by EXTRA_K (pytest -k) if set; EXTRA_SANITIZE: pytest arguments
# also run under memcheck (SANITIZE_S). DIAG=1: scripts/device_diag_wsb_attention.py (each
# kernel's time by the profiler, DIAG_ARGS) after the tests. Pass GNNIO_COMMIT=<sent commit>.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
PREFIX=${PREFIX:-$(device_prefix)}
if [ "${TEST_S:-200}" -gt 0 ]; then
  timeout "${TEST_S:-200}" python3 -m pytest tests/python/test_wsb_attention_cuda.py \
    tests/python/test_wsb_attention.py -q -p no:cacheprovider > "$OUT/pytest-wsb-attention.log" 2>&1
  echo "tests: $(( $(date +%s) - T0 )) s"
fi
if [ -n "${EXTRA_TESTS:-}" ]; then
  timeout "${EXTRA_S:-120}" python3 -m pytest ${EXTRA_TESTS} ${EXTRA_K:+-k "$EXTRA_K"} -q -p no:cacheprovider \
    > "$OUT/pytest-extra.log" 2>&1
  echo "extra tests: $(( $(date +%s) - T0 )) s"
fi
if [ "${SANITIZE_S:-90}" -gt 0 ]; then
  timeout "${SANITIZE_S:-90}" compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m pytest tests/python/test_wsb_attention_cuda.py -q -p no:cacheprovider \
    -k "empty or n37 or bipartite or heads_and_channels and (5-7 or 2-100)" \
    > "$OUT/sanitizer-wsb-attention.log" 2>&1
  echo "sanitizer rc $?: $(( $(date +%s) - T0 )) s"
fi
if [ -n "${EXTRA_SANITIZE:-}" ] && [ "${SANITIZE_S:-90}" -gt 0 ]; then
  eval "timeout ${SANITIZE_S:-90} compute-sanitizer --tool memcheck --error-exitcode 3 \
    python3 -m pytest ${EXTRA_SANITIZE} -q -p no:cacheprovider" > "$OUT/sanitizer-extra.log" 2>&1
  echo "extra sanitizer rc $?: $(( $(date +%s) - T0 )) s"
fi
if [ "${DIAG:-0}" = 1 ]; then
  timeout "${DIAG_S:-90}" python3 scripts/device_diag_wsb_attention.py ${DIAG_ARGS:-} > "$OUT/diag-wsb-attention.log" 2>&1
  echo "diag rc $?: $(( $(date +%s) - T0 )) s"
fi
if [ "${NCU_S:-0}" -gt 0 ]; then  # the tile kernels of one float32 forward and backward
  timeout "$NCU_S" ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
    --section SchedulerStats -k "regex:wsb_attention_(forward|pass)" -c 3 -f -o "$OUT/ncu-wsb-attention" \
    python3 scripts/device_diag_wsb_attention.py --ncu > "$OUT/ncu-run.log" 2>&1 || echo "ncu: stopped (rc $?)"
  ncu --import "$OUT/ncu-wsb-attention.ncu-rep" --page details > "$OUT/ncu-wsb-attention.txt" 2>&1
  echo "ncu: $(( $(date +%s) - T0 )) s"
fi
for dtype in ${DTYPES-float32 bfloat16}; do
  timeout "${BENCH_S:-150}" python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot --compare none \
    --dtype "$dtype" --graphs "${GRAPHS:-blockdiag-1M-16M,grid-1000x1000,uniform-1M-16M,powerlaw-1M-16M,real}" \
    --layers "graph_attention(wsb)" --out "$OUT/$PREFIX-wsb-attention-$dtype.json" \
    > "$OUT/bench-wsb-attention-$dtype.log" 2>&1 || echo "$dtype: stopped (rc $?)"
  echo "bench $dtype: $(( $(date +%s) - T0 )) s"
done
for log in pytest-wsb-attention pytest-extra sanitizer-wsb-attention sanitizer-extra; do
  [ -f "$OUT/$log.log" ] || continue
  echo "=== $log"; grep -E "^(FAILED|ERROR)|ERROR SUMMARY" "$OUT/$log.log" | cut -c1-200 | head -20
  tail -1 "$OUT/$log.log" | cut -c1-200
done
[ -f "$OUT/diag-wsb-attention.log" ] && { echo "=== diag"; grep -vE "^-+$|^ *$" "$OUT/diag-wsb-attention.log" | cut -c1-200 | head -70; }
[ -f "$OUT/ncu-wsb-attention.txt" ] && { echo "=== ncu"; grep -E "wsb_attention_[a-z_]*kernel|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|Est. Speedup" "$OUT/ncu-wsb-attention.txt" | cut -c1-160 | head -60; }
echo "=== rows"; grep -h "graph_attention(wsb)" "$OUT"/$PREFIX-wsb-attention-*.md | cut -c1-220
exit 0  # the summary may grep nothing (a stopped bench): not a failure of the call
