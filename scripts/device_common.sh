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
  # A refused folder (another nvcc build or torch on this machine) is not fatal: the kernels are
  # then compiled here, and the manifest lines that differ are printed for the next session.
  if [ -z "${GNNIO_CUDA_OBJECTS:-}" ] && [ -f .cuda_objects/MANIFEST ]; then
    if python3 - <<'PY'
import sys
sys.path.insert(0, "scripts")
import cuda_objects as c
here = c.manifest(c.nvcc_flags()).splitlines()
carried = open(".cuda_objects/MANIFEST").read().splitlines()
diff = [("here", x) for x in here if x not in carried] + [("carried", x) for x in carried if x not in here]
for side, line in diff[:6]:
    print(f"objects refused, {side}: {line}")  # whole: the flags line differed past 200 characters
sys.exit(1 if diff else 0)
PY
    then
      export GNNIO_CUDA_OBJECTS=.cuda_objects
    fi
  fi
  OUT="$OUT/build" bash scripts/device_run.sh build > "$OUT/build-stage.log" 2>&1 \
    || { tail -30 "$OUT/build-stage.log"; exit 1; }
  echo "build: $(( $(date +%s) - T0 )) s"
}

# The checkout's Python package and the carried graphs, for the stages' python3 runs.
device_env() {
  export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD/python" GNNIO_GRAPH_DIR="$PWD/.data/graphs"
}

# The card's name for results files: nvidia-h200, nvidia-h100, ... (nvidia-smi's first GPU).
device_prefix() {
  local name
  name=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1 | tr 'A-Z' 'a-z')
  name=$(echo "$name" | sed -E 's/^nvidia //; s/^([a-z]+[0-9]+).*/\1/')
  echo "nvidia-${name:-gpu}"
}
