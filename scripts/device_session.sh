#!/usr/bin/env bash
# One device call that chains the other scripts, each stage in its own $OUT subfolder and time
# box, so one call (one cold start, one build) serves a whole session's measurements:
#   build + attention CUDA tests   scripts/device_attention.sh   (TEST_S; ATT_DTYPES rows, if any)
#   planner study                  scripts/device_issue5.sh      (PLAN_S; 0 skips)
#   profiles                       bench/profile_layers.py       (PROFILE_S each; PROFILES lists
#                                  "train:<graph>", "layers:<graph>:<layer,...>" or
#                                  "forward:<graph>:<layer,...>")
#   memory snapshots               bench/memory_snapshot.py      (SNAPSHOTS, like PROFILES)
#   ncu                            bench/profile_layers.py --ncu under Nsight Compute (NCU_S; NCU lists
#                                  "<graph>:<layer or train>:<kernel regex>"; --set full, clocks left alone)
#   GATv2x3-train                  scripts/device_issue7.sh      (TRAIN_S on TRAIN_ARGS as TRAIN_NAME,
#                                  TRAIN2_S on TRAIN2_ARGS; 0 skips)
# Results to commit are copied to $OUT (JSON + MD); everything else is tarred into logs.tgz (the
# device tool returns at most 8 files). Pass GNNIO_COMMIT=<sent commit>.
set -uo pipefail
T0=$(date +%s)
ROOT=${OUT:-/tmp/gnnio-out}
mkdir -p "$ROOT"
export GNNIO_COMMIT=${GNNIO_COMMIT:-unknown}
stamp() { echo "[$1: $(( $(date +%s) - T0 )) s]"; }

OUT="$ROOT/attention" DTYPES="${ATT_DTYPES:-}" TEST_S=${TEST_S:-150} bash scripts/device_attention.sh || exit 1
stamp attention
source scripts/device_common.sh
device_env
if [ "${PLAN_S:-0}" -gt 0 ]; then
  OUT="$ROOT/planner" BUILD=0 REORDER_S=0 PLAN_S="$PLAN_S" bash scripts/device_issue5.sh | tail -40
  stamp planner
fi
mkdir -p "$ROOT/profiles"
for spec in ${PROFILES:-}; do
  IFS=: read -r kind graph layers <<< "$spec"
  case "$kind" in
    train) args=(--train) ;;
    forward) args=(--forward --layers "$layers") ;;
    *) args=(--layers "$layers") ;;
  esac
  timeout "${PROFILE_S:-60}" python3 bench/profile_layers.py --graph "$graph" "${args[@]}" --top 18 \
    > "$ROOT/profiles/$kind-$graph.log" 2>&1 || echo "profile $spec: stopped (rc $?)"
  cat "$ROOT/profiles/$kind-$graph.log" | cut -c1-150 | grep -v "^-\|^$" | head -"${PROFILE_LINES:-30}"
  stamp "profile $spec"
done
for spec in ${SNAPSHOTS:-}; do  # "train:<graph>" or "layer:<graph>:<layer>"
  IFS=: read -r kind graph layer <<< "$spec"
  if [ "$kind" = train ]; then args=(); else args=(--layer "$layer"); fi
  timeout "${PROFILE_S:-60}" python3 bench/memory_snapshot.py --graph "$graph" "${args[@]}" \
    > "$ROOT/profiles/snapshot-$kind-$graph.log" 2>&1 || echo "snapshot $spec: stopped (rc $?)"
  tail -18 "$ROOT/profiles/snapshot-$kind-$graph.log" | cut -c1-230
  stamp "snapshot $spec"
done
mkdir -p "$ROOT/ncu"
for spec in ${NCU:-}; do
  IFS=: read -r graph layer kernels <<< "$spec"
  if [ "$layer" = train ]; then args=(--train); else args=(--layers "$layer"); fi
  rep="$ROOT/ncu/$layer-$graph"
  timeout "${NCU_S:-120}" ncu --clock-control none --profile-from-start off --set full \
    -k "regex:$kernels" -c "${NCU_COUNT:-8}" -f -o "$rep" \
    python3 bench/profile_layers.py --graph "$graph" "${args[@]}" --ncu > "$rep.run.log" 2>&1 \
    || echo "ncu $spec: stopped (rc $?)"
  tail -3 "$rep.run.log"
  ncu --import "$rep.ncu-rep" --page details --print-details all > "$rep.details.log" 2>&1
  grep -E "^  [a-z_]+<|^  [a-z_]+_kernel|Duration|DRAM Throughput|L1/TEX Hit|L2 Hit|Achieved Occupancy|Theoretical Occupancy|Registers Per|Block Limit|Warp Cycles Per Issued|Issued Warp|Local Memory|stalled|Est. Speedup" \
    "$rep.details.log" | cut -c1-200 | head -150
  stamp "ncu $spec"
done
if [ "${TRAIN_S:-0}" -gt 0 ] || [ "${TRAIN2_S:-0}" -gt 0 ]; then  # TRAIN_ARGS / TRAIN2_ARGS pass through
  OUT="$ROOT/train" BUILD=0 TRAIN_S="${TRAIN_S:-0}" SCALE_S=0 TRAIN2_S="${TRAIN2_S:-0}" \
    TOTAL_S=$(( ${TRAIN_S:-0} + ${TRAIN2_S:-0} + 30 )) bash scripts/device_issue7.sh | tail -8
  stamp train
fi
# Keep the JSON/MD results at the top, tar the rest.
find "$ROOT" -mindepth 2 \( -name 'nvidia-h200-*.json' -o -name 'nvidia-h200-*.md' \) -exec mv {} "$ROOT"/ \;
# (Written outside $ROOT first: an --exclude=logs.tgz would also drop the stages' own logs.tgz.)
(cd "$ROOT" && tar czf /tmp/gnnio-session-logs.tgz $(ls -d */ 2>/dev/null) && rm -rf $(ls -d */ 2>/dev/null) \
  && mv /tmp/gnnio-session-logs.tgz logs.tgz)
ls "$ROOT"
