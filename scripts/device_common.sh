# Sourced by the scripts/device_*.sh scripts (one device call each): what they all do first.
# Needs OUT and T0 set by the caller.

# Builds the extension (scripts/device_run.sh build, log in $OUT/build-stage.log) unless
# BUILD=0 (a warm machine that built the same tree); on failure prints the log's tail and exits.
device_build() {
  mkdir -p "$OUT/build"
  [ "${BUILD:-1}" = 1 ] || return 0
  OUT="$OUT/build" bash scripts/device_run.sh build > "$OUT/build-stage.log" 2>&1 \
    || { tail -30 "$OUT/build-stage.log"; exit 1; }
  echo "build: $(( $(date +%s) - T0 )) s"
}

# The checkout's Python package and the carried graphs, for the stages' python3 runs.
device_env() {
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python" GNNIO_GRAPH_DIR="$PWD/.data/graphs"
}
