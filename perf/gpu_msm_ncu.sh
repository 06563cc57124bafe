#!/usr/bin/env bash
# Hardware counters (Nsight Compute) of the MSM bucket accumulation: msm_accumulate (XYZZ), G1 and
# G2, random scalars, each launch of the warm-up and one timed run of perf/gpu_msm_bench.py
# --accumulate (results checked as there).
#
# Why: the counters say where the accumulation's time goes (issue slots, fixed-latency waits,
# instruction fetch, memory, spills).
#
# Usage: perf/gpu_msm_ncu.sh OUTDIR [LG_G1] [LG_G2] [SET]  (defaults 24, 22, full)
# Writes OUTDIR/acc-GRP.ncu-rep, acc-GRP-details.csv, acc-GRP-raw.csv, acc-GRP-source.csv and
# acc-GRP.json (the bench rows). Clocks are left alone (--clock-control none).
set -euo pipefail
out=$1
lg1=${2:-24}
lg2=${3:-22}
set_name=${4:-full}
ncu=${NCU:-$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
for grp in g1 g2; do
  lg=$lg1
  [ "$grp" = g2 ] && lg=$lg2
  echo "== $grp 2^$lg: $ncu --set $set_name"
  "$ncu" --clock-control none --kernel-name regex:'^msm_accumulate' --launch-count 4 --set "$set_name" \
    --import-source no -o "$out/acc-$grp" -f \
    python3 "$here/gpu_msm_bench.py" --accumulate --variants xyzz --groups "$grp" --reps 1 \
    --lg "$lg" --dists random --out "$out/acc-$grp.json"
  "$ncu" --import "$out/acc-$grp.ncu-rep" --page details --csv > "$out/acc-$grp-details.csv"
  "$ncu" --import "$out/acc-$grp.ncu-rep" --page raw --csv > "$out/acc-$grp-raw.csv"
  "$ncu" --import "$out/acc-$grp.ncu-rep" --page source --csv --print-source sass > "$out/acc-$grp-source.csv" || true
done
