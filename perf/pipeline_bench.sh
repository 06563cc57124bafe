#!/usr/bin/env bash
# The pipeline measurements behind perf/results/pipeline-*.json (run from anywhere; it works in the repo root).
#
#   perf/pipeline_bench.sh MODE [OUT_DIR]     JSON goes to OUT_DIR (default perf/results), one file per mode
#
# CPU modes (the 2-core machine):
#   cpu          2^12, 10 partitions x 6 jobs, partition_workers 1 and 2              -> pipeline-cpu.json
#   cpu-ring     2^18, ring 2, 2 synthesis workers, 4 partitions x 2 jobs: s/partition, synthesis
#                core-seconds, peak PSS vs the bound, each process's USS            -> pipeline-cpu-ring.json
#   cpu-reuse    2^20 and 2^22, ring 2, 2 workers x 1 thread, 3 partitions x 2 jobs: the stage times
#                (shm_write: the slot's segment, made once and then reused)          -> pipeline-cpu-reuse.json
#   synth-threads  core-seconds of one partition against threads, with numba's default OpenMP waiting
#                and with the pipeline's (OMP_WAIT_POLICY=PASSIVE); LOG_N (20) and THREADS (1,2)
#                                                                                   -> synthesis-threads.json
# GPU modes (the H200 box):
#   gpu          the GPU defaults of `cuzk-mp bench` (shape derived from the machine), 3 processes -> pipeline-gpu.json
#   gpu-sweep    PoRep-like 2^22, 10 partitions x 8 jobs, 8 in flight, partition_workers 4/8/12 x
#                ring_slots 2/4/8                                                   -> pipeline-gpu-sweep.json
#   gpu-2^24     PoRep-like 2^24, 10 partitions x 8 jobs, 8 in flight, the shape the bench derives
#                for the machine (the target: GPU kernel-busy >= 95%, s/partition <= 1.05 x the
#                device stage, <= 6 ring slots, peak PSS <= slots x segment + zkey + 4 GiB)  -> pipeline-gpu-2^24.json
#   gpu-budget   PoRep-like 2^24, 10 partitions x 5 jobs, --host-budget 24/48/96 GiB choosing the shape
#                (throughput should not depend on it)                                -> pipeline-gpu-budget.json
#   gpu-2^26     PoRep-like 2^26, 10 partitions x 3 jobs, 3 in flight, derived shape, the INSECURE dev key
#                generated in the prover (--key-source device: a ~50 GB key file would not fit the disk
#                beside the rest): the configuration of the run recorded in pipeline-gpu-2^26.json (a
#                lone bench JSON there; this mode writes it under "runs" of its summary) -> pipeline-gpu-2^26.json
#   gpu-2^27     PoRep-like 2^27 (Filecoin's partition size), 10 partitions x 3 jobs, derived shape,
#                --key-source device                                                -> pipeline-gpu-2^27.json
#   gpu-sort     the large window batches' sort A/B (CUZK_GPU_MSM_SORT radix, then argsort) at each size of
#                SIZES (24 26 27), 10 partitions x JOBS (2) jobs each, --key-source device: which sort to
#                keep at which size                                                  -> pipeline-gpu-sort.json
#   h200         all of it in one call (437 s on the H200 box in h200-summary.json, the 2^24 dev key's setup
#                included, from a run whose 2^26 step was skipped: gpu-2^26 adds its own time):
#                the key, the shm first-touch probe (fresh / remapped / reused 1 GiB segments), gpu-2^24,
#                gpu-budget, synth-threads at 2^24 (1,2,4,7,14 threads), gpu-2^26; then one table
#                                              -> the files above + shm-first-touch-h200.json + h200-summary.json
#
# Each configuration is a separate `cuzk-mp bench` process (the "across processes" spread: compare the
# s_per_proof of the runs in the combined file). Run it when the machine is quiet: every result records
# the load average at its end. PY overrides the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
KIND=${1:-cpu}
OUT=${2:-perf/results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

bench() {  # bench DIR NAME ARGS...
  local dir=$1 name=$2; shift 2
  mkdir -p "$dir"
  echo "== $name: cuzk-mp bench $*" >&2
  "$PY" -m cuzk_mp.cli bench --quiet --json "$dir/$name.json" "$@"
}

summarize() {  # summarize DIR MODE OUT_FILE LOAD_BEFORE: the runs of DIR into one JSON
  "$PY" perf/pipeline_summary.py runs "$1" "$2" "$3" "$4"
}

run_mode() {  # run_mode MODE: runs into $TMP/MODE, summary into $OUT
  local mode=$1 dir="$TMP/$1" load
  load=$(cut -d' ' -f1-3 /proc/loadavg)
  mkdir -p "$dir"
  case "$mode" in
    cpu)
      for pw in 1 2; do
        bench "$dir" "pw$pw" --backend cpu --log-n 12 --partitions 10 --jobs 6 --in-flight 2 \
          --partition-workers "$pw" --gpu-workers 2 --ring-slots 4
      done ;;
    cpu-ring)
      bench "$dir" "lg18-k2" --backend cpu --log-n 18 --partitions 4 --jobs 2 --in-flight 1 \
        --partition-workers 2 --gpu-workers 2 --ring-slots 2 ;;
    cpu-reuse)
      for lg in 20 22; do
        bench "$dir" "lg$lg-k2" --backend cpu --log-n "$lg" --partitions 3 --jobs 2 --in-flight 1 \
          --partition-workers 2 --synthesis-threads 1 --ring-slots 2
      done ;;
    synth-threads)
      local lg=${LOG_N:-20} threads=${THREADS:-1,2}
      for policy in default PASSIVE; do
        echo "== synthesis 2^$lg, threads $threads, OMP_WAIT_POLICY=$policy" >&2
        if [ "$policy" = default ]; then
          env -u OMP_WAIT_POLICY "$PY" perf/synthesis_bench.py --log-n "$lg" --threads "$threads" --reps "${REPS:-3}" \
            --work-dir "$TMP/synth-work" --out "$dir/$policy.json"
        else
          OMP_WAIT_POLICY=$policy "$PY" perf/synthesis_bench.py --log-n "$lg" --threads "$threads" \
            --reps "${REPS:-3}" --work-dir "$TMP/synth-work" --out "$dir/$policy.json"
        fi
      done
      "$PY" perf/pipeline_summary.py threads "$dir" "$OUT/synthesis-threads${SUFFIX:-}.json" "$load"
      return ;;
    gpu-sweep)
      for pw in 4 8 12; do
        for k in 2 4 8; do
          bench "$dir" "pw${pw}-k${k}" --backend gpu --log-n "${LOG_N:-22}" --partitions 10 --jobs 8 --in-flight 8 \
            --partition-workers "$pw" --ring-slots "$k"
        done
      done ;;
    gpu-2^24)
      bench "$dir" "lg24-derived" --backend gpu --circuit porep-like --log-n 24 --partitions 10 --jobs 8 --in-flight 8 ;;
    gpu-budget)
      for gib in 24 48 96; do
        bench "$dir" "budget-${gib}GiB" --backend gpu --log-n "${LOG_N:-24}" --partitions 10 --jobs "${JOBS:-5}" \
          --in-flight "${JOBS:-5}" --host-budget "${gib}GiB"
      done ;;
    gpu-2^26)
      bench "$dir" "lg26-derived" --backend gpu --circuit porep-like --log-n 26 --partitions 10 --jobs 3 --in-flight 3 \
        --key-source device ;;
    gpu-2^27)
      bench "$dir" "lg27-derived" --backend gpu --circuit porep-like --log-n 27 --partitions 10 --jobs 3 \
        --in-flight 3 --key-source device ;;
    gpu-sort)
      for lg in ${SIZES:-24 26 27}; do
        for sort in radix argsort; do
          CUZK_GPU_MSM_SORT=$sort bench "$dir" "lg$lg-$sort" --backend gpu --circuit porep-like --log-n "$lg" \
            --partitions 10 --jobs "${JOBS:-2}" --in-flight "${JOBS:-2}" --key-source device
        done
      done ;;
    gpu)
      for i in 1 2 3; do
        bench "$dir" "run$i" --backend gpu
      done ;;
    *)
      echo "unknown mode $mode (see the head of $0)" >&2
      exit 2 ;;
  esac
  summarize "$dir" "$mode" "$OUT/pipeline-$mode.json" "$load"
}

if [ "$KIND" = h200 ]; then
  T0=$(date +%s)
  echo "== the 2^24 dev key (made once, in the param cache)" >&2
  "$PY" perf/pipeline_summary.py key 24 "$TMP/key.json"
  echo "== shm first touch: fresh, remapped and reused segments (1 GiB)" >&2
  "$PY" -m cuzk_mp.pipeline.shmprobe --mib 1024 --repeat 3 --json "$OUT/shm-first-touch-h200.json" >/dev/null
  run_mode gpu-2^24
  run_mode gpu-budget
  LOG_N=24 THREADS=${THREADS:-1,2,4,7,14} REPS=${REPS:-2} SUFFIX=-h200 run_mode synth-threads
  run_mode gpu-2^26
  "$PY" perf/pipeline_summary.py table "$OUT" "$TMP/key.json" "$(( $(date +%s) - T0 ))"
else
  run_mode "$KIND"
fi
