#!/usr/bin/env bash
# One device call for the dot kind's kernels (bench/NOTES.md v28: pass A's register bound). Build;
# the dot kind's CUDA attention tests and TransformerConv's (TEST_S); then TransformerConv's
# benchmark rows per form in FORMS (BENCH_S each, PyG in the same process). Pass GNNIO_COMMIT.
# (v28's A/B of three bounds ran scripts/device_diag_pass_a.py with a knob, both deleted after:
# git show ef0196c.)
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
card=$(device_prefix)
if [ "${TEST_S:-150}" -gt 0 ]; then
  timeout "${TEST_S:-150}" python3 -m pytest tests/python/test_attention_cuda.py \
    tests/python/test_attention_cuda_hub.py tests/python/test_transformer_fused_cuda.py \
    -k "${TEST_K:-dot or Transformer or fused}" -q -p no:cacheprovider > "$OUT/pytest-pass-a.log" 2>&1
  grep -E "^(FAILED|ERROR)" "$OUT/pytest-pass-a.log" | cut -c1-200 | head -20
  tail -1 "$OUT/pytest-pass-a.log" | cut -c1-200
  echo "tests: $(( $(date +%s) - T0 )) s"
fi
for form in ${FORMS:-direct}; do
  GNNIO_TRANSFORMER_FORM=$form timeout "${BENCH_S:-100}" python3 -m gnnio.bench --warmup 3 \
    --repeat 10 --no-plot --dtype float32 --graphs "${GRAPHS:-powerlaw-1M-16M}" \
    --layers TransformerConv --out "$OUT/$card-transformer-$form-float32.json" \
    > "$OUT/bench-$form.log" 2>&1 || echo "bench $form: stopped (rc $?)"
  grep -h "TransformerConv" "$OUT/$card-transformer-$form-float32.md" | cut -c1-220
  echo "bench $form: $(( $(date +%s) - T0 )) s"
done
exit 0
