# Sourced by the scripts/device_*.sh scripts (one device call each): what they all do first.
# Needs OUT and T0 set by the caller.

# Builds the extension (scripts/device_run.sh build, log in $OUT/build-stage.log) unless
# BUILD=0 (a warm machine that built the same tree); on failure prints the log's tail and exits.
# With .cuda_objects/ carried (scripts/cuda_objects.py), only the binding is compiled (~64 s).
device_build() {
  mkdir -p "$OUT/build"
  [ "${BUILD:-1}" = 1 ] || return 0
  # Kernel objects built on the CPU machine (scripts/cuda_objects.py) and carried: setup.py links
  # them if their MANIFEST matches this tree, and refuses them otherwise.
  if [ -z "${GNNIO_CUDA_OBJECTS:-}" ] && [ -f .cuda_objects/MANIFEST ]; then
    export GNNIO_CUDA_OBJECTS=.cuda_objects
  fi
  OUT="$OUT/build" bash scripts/device_run.sh build > "$OUT/build-stage.log" 2>&1 \
    || { tail -30 "$OUT/build-stage.log"; exit 1; }
  echo "build: $(( $(date +%s) - T0 )) s"
}

# The checkout's Python package and the carried graphs, for the stages' python3 runs.
device_env() {
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python" GNNIO_GRAPH_DIR="$PWD/.data/graphs"
}
