#!/usr/bin/env bash
# One device call for TransformerConv's fused form (gnnio::transformer_fused_forward, bench/
# NOTES.md v21): build; the fused CUDA tests and the forms' tests (TEST_S); the forward's
# kernels by the profiler (scripts/device_diag_fused.py, DIAG_S); the fused kernel under ncu
# (NCU_S, default off); then TransformerConv's rows on
# GRAPHS per form in FORMS (each run has PyG's layer in the same process), BENCH_S each.
# Results are named by the card (device_prefix). Pass GNNIO_COMMIT=<sent commit>. DIAG_BACKWARD=1:
# the diag also profiles one forward+backward per form. TEST_FILES: other test files (the dot
# kind's pass A, NOTES v28: "tests/python/test_attention_cuda.py tests/python/test_attention_cuda_hub.py
# tests/python/test_transformer_fused_cuda.py" with TEST_K="dot or Transformer or fused").
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
card=$(device_prefix)
if [ "${TEST_S:-150}" -gt 0 ]; then
  timeout "${TEST_S:-150}" python3 -m pytest ${TEST_FILES:-tests/python/test_transformer_fused_cuda.py \
    tests/python/test_transformer_forms.py} ${TEST_K:+-k "$TEST_K"} \
    -q -p no:cacheprovider > "$OUT/pytest-fused.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest-fused.log" | cut -c1-200 | head -20
  tail -1 "$OUT/pytest-fused.log" | cut -c1-200
  echo "tests: $(( $(date +%s) - T0 )) s"
fi
if [ "${DIAG_S:-60}" -gt 0 ]; then
  timeout "${DIAG_S:-60}" python3 scripts/device_diag_fused.py ${DIAG_GRAPHS:-powerlaw-1M-16M} \
    > "$OUT/diag-fused.log" 2>&1 || echo "diag: stopped (rc $?)"
  grep -E "forward|fused_kernel|merge_kernel|gemm|Kernel|elementwise" "$OUT/diag-fused.log" | cut -c1-160 | head -30
fi
if [ "${NCU_S:-0}" -gt 0 ]; then
  timeout "${NCU_S}" ncu --clock-control none --section SpeedOfLight --section Occupancy \
    --section LaunchStats --section WarpStateStats --section SchedulerStats \
    --section MemoryWorkloadAnalysis -k "regex:fused_kernel" -c 1 -f -o "$OUT/ncu-fused" \
    python3 scripts/device_diag_fused.py --ncu ${DIAG_GRAPHS:-powerlaw-1M-16M} > "$OUT/ncu-run.log" 2>&1 \
    || echo "ncu: stopped (rc $?)"
  ncu --import "$OUT/ncu-fused.ncu-rep" --page details > "$OUT/ncu-fused.txt" 2>&1
  grep -E "Duration|Throughput|Achieved Occupancy|Theoretical Occupancy|Block Limit|Warp Cycles Per Issued|Issue Slots Busy|No Eligible|Stall|Registers Per|Shared Memory Config" "$OUT/ncu-fused.txt" | head -40
  echo "ncu: $(( $(date +%s) - T0 )) s"
fi
# TransformerConv's rows, tagged $1, with the settings (NAME=value) that follow.
bench_rows() {
  local tag=$1
  shift
  env "$@" timeout "${BENCH_S:-120}" python3 -m gnnio.bench --warmup 3 --repeat 10 --no-plot \
    --dtype float32 --graphs "${GRAPHS:-powerlaw-1M-16M,uniform-200K-10M}" --layers TransformerConv \
    --out "$OUT/$card-transformer-$tag-float32.json" > "$OUT/bench-$tag.log" 2>&1 \
    || echo "$tag: stopped (rc $?)"
}
for form in ${FORMS:-direct fused}; do
  bench_rows "$form" GNNIO_TRANSFORMER_FORM="$form"
  echo "bench $form: $(( $(date +%s) - T0 )) s"
done
# AB_ENV="NAME=value" AB_NAME=tag: the fused form again with that variable set (for an A/B build
# that the binding selects by it; none does now), rows in *-fused-<tag>-*, and its kernels by the
# profiler.
if [ -n "${AB_ENV:-}" ]; then
  bench_rows "fused-${AB_NAME:-ab}" GNNIO_TRANSFORMER_FORM=fused "$AB_ENV"
  env "$AB_ENV" DIAG_BACKWARD=0 timeout "${DIAG_S:-60}" python3 scripts/device_diag_fused.py \
    ${DIAG_GRAPHS:-powerlaw-1M-16M} > "$OUT/diag-fused-${AB_NAME:-ab}.log" 2>&1 || echo "diag ${AB_NAME:-ab}: stopped"
  grep -E "fused: forward|fused_kernel" "$OUT/diag-fused-${AB_NAME:-ab}.log" | cut -c1-160
  echo "${AB_NAME:-ab}: $(( $(date +%s) - T0 )) s"
fi
echo "=== rows"; grep -hE "TransformerConv" "$OUT"/$card-transformer-*.md | cut -c1-220
exit 0
