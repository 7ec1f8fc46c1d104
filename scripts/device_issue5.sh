#!/usr/bin/env bash
# One device call for issue 5's two results tables (op level; `python -m gnnio.bench.study`):
#   1. planner: each family's fixed backends against the planner's choice on GRAPHS, fp32 (SpMM
#      with tf32 off and on) and bf16                  -> $OUT/$PREFIX-planner.{json,md}
#   2. reorder: each order (none, degree, rcm, metis) x kernel on GRAPHS, fp32, the orders read
#      from PERMS                                      -> $OUT/$PREFIX-reorder-study.{json,md}
# Commit both pairs to bench/results/ (RESULTS_DIR=bench/results also copies them there on the
# machine that runs this). The orders: PERMS/{graph}-{order}.pt, made on a CPU with
# `python -m gnnio.bench.study --save-perms .data/perms --graphs standard,real --orders rcm,metis`
# (no pymetis on the GPU machine, and scipy's RCM takes ~5 min on powerlaw-1M-16M); the study
# refuses a file whose graph fingerprint differs. Only COMPUTE_ORDERS (default degree) are
# computed here when their file is missing.
# Limits: PLAN_S, REORDER_S seconds (default 170 + 160 = 330; expected use ~90 + ~80 s, see
# bench/NOTES.md): each stage stops by itself before the next graph (--time-limit, STOP_MARGIN_S
# earlier) and is killed at its limit (timeout); the JSON and .md are rewritten after every row,
# so a stopped stage keeps its rows. Graphs: standard first (the large ones), then the real ones.
# BUILD=0 skips the build (a warm machine that built the same tree, or a CPU dry run with e.g.
# GRAPHS=cora STUDY_ARGS="--repeat 1 --warmup 0").
# STUDY_ARGS="--device-time" adds the planner study's device-only timings (each candidate's
# CUDA-graph replays, their own verdict): about twice its time, so PLAN_S ~300 for all graphs.
# Pass GNNIO_COMMIT=<sent commit>. The summary goes last.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
PLAN_S=${PLAN_S:-170} REORDER_S=${REORDER_S:-160} STOP_MARGIN_S=${STOP_MARGIN_S:-25}
GRAPHS=${GRAPHS:-standard,real}
PERMS=${PERMS:-.data/perms}
COMPUTE_ORDERS=${COMPUTE_ORDERS:-degree}
STUDY_ARGS=${STUDY_ARGS:-}
source scripts/device_common.sh
device_build
device_env
PREFIX=${PREFIX:-$(device_prefix)}
echo "perms: $(ls "$PERMS"/*.pt 2>/dev/null | wc -l) files in $PERMS"

study() {  # name, seconds, args...
  local name=$1 limit=$2; shift 2
  [ "$limit" -ge 20 ] || { echo "$name: skipped ($limit s)"; return; }
  local soft=$(( limit - STOP_MARGIN_S )); [ "$soft" -ge 5 ] || soft=5
  echo "=== $name ($limit s, stops by itself after $soft s)"
  timeout "$limit" python3 -m gnnio.bench.study --study "$name" --graphs "$GRAPHS" --time-limit "$soft" \
    --out "$OUT/$PREFIX" "$@" $STUDY_ARGS > "$OUT/study-$name.log" 2>&1 || echo "$name: stopped (rc $?)"
  echo "$name: $(( $(date +%s) - T0 )) s"
}
study planner "$PLAN_S"
study reorder "$REORDER_S" --perms "$PERMS" --compute-orders "$COMPUTE_ORDERS"
if [ -n "${RESULTS_DIR:-}" ]; then
  mkdir -p "$RESULTS_DIR" && cp "$OUT/$PREFIX"-planner.* "$OUT/$PREFIX"-reorder-study.* "$RESULTS_DIR"/ 2>/dev/null
fi

echo "=== summary ($(( $(date +%s) - T0 )) s in all; commit $OUT/$PREFIX-{planner,reorder-study}.{json,md} to bench/results/)"
python3 - "$OUT/$PREFIX" <<'EOF'
import json, os, sys
stem = sys.argv[1]
f = lambda v, s=".2f": "-" if v is None else format(v, s)  # noqa: E731
path = stem + "-planner.json"
if os.path.exists(path):
    res = json.load(open(path))
    print(f"planner: {res['card']}, commit {res['commit'][:10]}, {len(res['rows'])} rows, "
          f"{res.get('elapsed_s', '?')} s, stopped: {res.get('stopped')}")
    n = ok = 0
    for r in res["rows"]:
        for p in ("fwd", "fwd_bwd"):
            w = r.get(f"within_10pct_{p}")
            if w is None:
                continue
            n, ok = n + 1, ok + bool(w)
            if not w or r["graph"] in ("powerlaw-1M-16M", "uniform-1M-16M", "grid-1000x1000"):
                print(f"  {r['graph'][:18]:18s} {r['family']:9s} {r['dtype']:12s} {p:7s} fastest "
                      f"{r.get(f'fastest_{p}')} {f(r.get(f'fastest_{p}_ms'), '.3f')} ms, planner "
                      f"{r['planner_pick']} {f(r.get(p + '_ms'), '.3f')} ms: {f(r.get(f'ratio_{p}'))}x"
                      + ("" if w else "  NOT within 10%"))
    print(f"  within 10%: {ok} of {n}")
path = stem + "-reorder-study.json"
if os.path.exists(path):
    res = json.load(open(path))
    print(f"reorder: {res['card']}, {len(res['rows'])} rows, {res.get('elapsed_s', '?')} s, "
          f"stopped: {res.get('stopped')}, skipped: {[(s['graph'], s['order']) for s in res['skipped']]}")
    cells = {}
    for r in res["rows"]:
        if r["order"] != "none":
            cells.setdefault((r["graph"], r["kernel"]), []).append(
                f"{r['order']} {f(r.get('speedup_fwd'))}/{f(r.get('speedup_fwd_bwd'))}")
    for (graph, kernel), v in cells.items():
        print(f"  {graph[:18]:18s} {kernel:13s} " + "  ".join(v))
EOF
(cd "$OUT" && tar czf logs.tgz --remove-files $(ls | grep -v '\.json$' | grep -v '\.md$' | grep -v '^logs.tgz$') 2>/dev/null)
