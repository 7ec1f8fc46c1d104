#!/usr/bin/env bash
# One device call: why a dtype's attention kernels are slower than another's. Build; then
# bench/profile_attention_dtypes.py (torch.profiler: kernels by time per kind and dtype,
# PROF_S); then Nsight Compute on the forward kernels of NCU_KINDS in both dtypes (a few
# sections, NCU_S), report and its text in $OUT. Pass GNNIO_COMMIT=<sent commit>.
set -uo pipefail
T0=$(date +%s)
OUT=${OUT:-/tmp/gnnio-out}
source scripts/device_common.sh
device_build
device_env
timeout "${PROF_S:-120}" python3 bench/profile_attention_dtypes.py > "$OUT/profile-dtypes.log" 2>&1 \
  || echo "profile: stopped (rc $?)"
echo "profile: $(( $(date +%s) - T0 )) s"
if [ -n "${NCU_KINDS:-dot,gatv2}" ]; then
  timeout "${NCU_S:-150}" ncu --clock-control none --profile-from-start off \
    --section SpeedOfLight --section Occupancy --section LaunchStats --section WarpStateStats \
    --section MemoryWorkloadAnalysis --section SchedulerStats --section SourceCounters \
    -k "regex:forward_kernel" -f -o "$OUT/ncu-dtypes" \
    python3 bench/profile_attention_dtypes.py --kinds "${NCU_KINDS:-dot,gatv2}" --ncu > "$OUT/ncu-run.log" 2>&1 \
    || echo "ncu: stopped (rc $?)"
  ncu --import "$OUT/ncu-dtypes.ncu-rep" --page details > "$OUT/ncu-dtypes.txt" 2>&1
  echo "ncu: $(( $(date +%s) - T0 )) s"
fi
cat "$OUT/profile-dtypes.log"
exit 0
