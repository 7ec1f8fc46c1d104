#!/usr/bin/env bash
# One device call for issue 7's GPU bars, after the build:
#   1. train: the GATv2x3 training step on powerlaw-1M-16M (gnnio, PyG, torch.compile'd gnnio;
#      same process and initial weights; 20-step loss curves)           -> $OUT/nvidia-h200-train-float32.json
#   2. scale: one GATv2Conv step on 20M-node power-law graphs of growing E until out of memory
#                                                                     -> $OUT/nvidia-h200-scale.json
#   3. train2 (if time is left): the training step where PyG may fit better (TRAIN2_ARGS, default
#      powerlaw-1M-8M in float32)                                     -> $OUT/nvidia-h200-train2.json
# Each stage has its own limit (TRAIN_S, SCALE_S, TRAIN2_S seconds), cut to what is left of
# TOTAL_S (the whole call, build included), so a slow stage cannot take the others' results with
# it; the JSON files are rewritten row by row, so a stage stopped by its limit keeps its rows.
# Pass GNNIO_COMMIT=<sent commit>. The summary goes last (the tail of the output comes back).
# BUILD=0 skips the build (a dry run of the rest, e.g. on a CPU with small *_ARGS).
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
TOTAL_S=${TOTAL_S:-580} TRAIN_S=${TRAIN_S:-170} SCALE_S=${SCALE_S:-240} TRAIN2_S=${TRAIN2_S:-120}
TRAIN_ARGS=${TRAIN_ARGS:---graphs powerlaw-1M-16M}
TRAIN2_ARGS=${TRAIN2_ARGS:---graphs powerlaw-1M-8M}
SCALE_ARGS=${SCALE_ARGS:-}
left() { echo $(( TOTAL_S - ($(date +%s) - T0) )); }
cap() { local l; l=$(( $(left) - ${2:-10} )); echo $(( $1 < l ? $1 : l )); }  # limit, reserve

source scripts/device_common.sh
device_build
device_env

train() {  # name, seconds, args...
  local name=$1 limit=$2; shift 2
  [ "$limit" -ge 30 ] || { echo "$name: skipped, $limit s left"; return; }
  echo "=== $name ($limit s)"
  timeout "$limit" python3 -m gnnio.bench --layers GATv2x3-train --warmup 3 --repeat 10 --no-plot \
    --out "$OUT/nvidia-h200-$name.json" "$@" > "$OUT/$name.log" 2>&1 || echo "$name: stopped (rc $?)"
}
train "train-${TRAIN_NAME:-float32}" "$(cap "$TRAIN_S" 10)" $TRAIN_ARGS
limit=$(cap "$SCALE_S" 10)
echo "=== scale ($limit s)"
if [ "$limit" -ge 30 ]; then
  PYTORCH_CUDA_ALLOC_CONF=${PYTORCH_CUDA_ALLOC_CONF:-expandable_segments:True} \
    timeout "$limit" python3 -m gnnio.bench.scale --time-limit $(( limit - 8 )) \
    --out "$OUT/nvidia-h200-scale.json" $SCALE_ARGS > "$OUT/scale.log" 2>&1 || echo "scale: stopped (rc $?)"
fi
[ "$TRAIN2_S" -gt 0 ] && train train2 "$(cap "$TRAIN2_S" 5)" $TRAIN2_ARGS

echo "=== summary ($(( $(date +%s) - T0 )) s in all)"
python3 - "$OUT" <<'EOF'
import glob, json, os, sys
for path in sorted(glob.glob(os.path.join(sys.argv[1], "nvidia-h200-*.json"))):
    with open(path) as f:
        res = json.load(f)
    print(f"{os.path.basename(path)}: {res['card']}, commit {res['commit'][:10]}"
          + (f", stopped: {res['stopped']}" if res.get("stopped") else ""))
    f = lambda v, s=".1f": "-" if v is None else format(v, s)  # noqa: E731
    for r in res["rows"]:
        if r["layer"] == "GATv2x3-train":
            print(f"  {r['graph']} {r['dtype']} {r['impl']:14s} step {f(r['fwd_bwd_ms'])} ms  fwd {f(r['fwd_ms'])} ms"
                  f"  extra {f(r['peak_extra_gib'], '.2f')} GiB  state {f(r.get('state_gib'), '.2f')} GiB"
                  f"  loss diff {f(r.get('loss_max_abs_diff'), '.2e')} ({r.get('loss_steps')} steps)"
                  f"  compile {f(r.get('compile_s'))} s  {r.get('note', '')[:60]}  {r.get('error', '')[:150]}")
        elif r["layer"] == "GATv2Conv-scale":
            print(f"  {r['dtype']:8s} E={r['num_edges']:>13,} fits={r['fits']!s:5s} step {f(r['fwd_bwd_ms'])} ms"
                  f"  peak {f(r['peak_gib'], '.1f')} GiB  graph {f(r.get('graph_gib'), '.1f')} GiB"
                  f"  check {f(r.get('check_max_rel_diff'), '.1e')}  {(r.get('error') or '')[:150]}")
    if "largest_fit" in res:
        print(f"  largest fit: {res['largest_fit']}")
EOF
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '\.json$' | grep -v '^logs.tgz$') 2>/dev/null)
