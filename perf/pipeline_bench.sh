#!/usr/bin/env bash
# The pipeline measurements behind perf/results/pipeline-*.json (run from the repo root).
#
#   perf/pipeline_bench.sh cpu   # 2^12, 10 partitions x 6 jobs, partition_workers 1 and 2 -> pipeline-cpu.json
#   perf/pipeline_bench.sh cpu-ring  # 2^18, ring 2, 2 synthesis workers, 4 partitions x 2 jobs: s/partition,
#                                    # synthesis core-seconds, peak PSS vs the bound, each process's USS
#                                    # -> pipeline-cpu-ring.json
#   perf/pipeline_bench.sh gpu   # the GPU defaults of `cuzk-mp bench`, 3 processes  -> pipeline-gpu.json
#   perf/pipeline_bench.sh gpu-sweep  # the H200 sweep: PoRep-like 2^22, 10 partitions x 8 jobs, 8 in
#                                     # flight, partition_workers 4/8/12 x ring_slots 2/4/8 -> pipeline-gpu-sweep.json
#   perf/pipeline_bench.sh gpu-budget  # throughput against the host budget: PoRep-like 2^24, 10 partitions x 8 jobs,
#                                      # --host-budget 24/48/96 GiB choosing the shape -> pipeline-gpu-budget.json
#
# Each configuration is a separate `cuzk-mp bench` process (the "across processes" spread: compare
# the s_per_proof of the runs in the combined file). Run it when the machine is quiet: every result
# records the load average at its end. PY overrides the interpreter (default .venv/bin/python).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
KIND=${1:-cpu}
OUT=perf/results
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
LOAD_BEFORE=$(cut -d' ' -f1-3 /proc/loadavg)

bench() {  # bench NAME ARGS...
  local name=$1; shift
  echo "== $name: cuzk-mp bench $*" >&2
  "$PY" -m cuzk_mp.cli bench --quiet --json "$TMP/$name.json" "$@"
}

if [ "$KIND" = cpu ]; then
  for pw in 1 2; do
    bench "pw$pw" --backend cpu --log-n 12 --partitions 10 --jobs 6 --in-flight 2 \
      --partition-workers "$pw" --gpu-workers 2 --ring-slots 4
  done
elif [ "$KIND" = cpu-ring ]; then
  bench "lg18-k2" --backend cpu --log-n 18 --partitions 4 --jobs 2 --in-flight 1 \
    --partition-workers 2 --gpu-workers 2 --ring-slots 2
elif [ "$KIND" = gpu-sweep ]; then
  LOG_N=${LOG_N:-22}
  for pw in 4 8 12; do
    for k in 2 4 8; do
      bench "pw${pw}-k${k}" --backend gpu --log-n "$LOG_N" --partitions 10 --jobs 8 --in-flight 8 \
        --partition-workers "$pw" --ring-slots "$k"
    done
  done
elif [ "$KIND" = gpu-budget ]; then
  LOG_N=${LOG_N:-24}
  for gib in 24 48 96; do
    bench "budget-${gib}GiB" --backend gpu --log-n "$LOG_N" --partitions 10 --jobs 8 --in-flight 8 \
      --host-budget "${gib}GiB"
  done
else
  for i in 1 2 3; do
    bench "run$i" --backend gpu
  done
fi

"$PY" - "$TMP" "$OUT/pipeline-$KIND.json" "$LOAD_BEFORE" "$KIND" <<'PYEOF'
import json, os, pathlib, statistics, sys
tmp, out = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
load_before = [float(x) for x in sys.argv[3].split()]
runs = {p.stem: json.loads(p.read_text()) for p in sorted(tmp.glob("*.json"))}
for r in runs.values():
    r.pop("partitions", None)  # per-partition rows stay out of the committed summary
summary = {name: {**{k: r[k] for k in ("s_per_proof", "first_job_s", "proofs_total", "proofs_verified",
                                        "peak_host_bytes", "peak_pss_bytes", "peak_shm_bytes", "peak_live_segments",
                                        "gpu_busy_fraction", "device_busy_fraction_by_device", "synthesis_core_s",
                                        "peak_uss_by_process")},
                  "median_stage_s": {k: r["median_stage_s"][k] for k in ("synthesis", "device") if k in r["median_stage_s"]},
                  "memory_bound_bytes": r["memory_bound"]["bound_bytes"],
                  "memory_margin_bytes": r["memory_bound"]["margin_bytes"],
                  "model_bound_bytes": r["memory_bound"]["model_bound_bytes"],
                  "model_margin_bytes": r["memory_bound"]["model_margin_bytes"],
                  "segment_bytes": r["memory_bound"]["segment_bytes"],
                  "working_set_excess_bytes": r["memory_bound"]["working_set_excess_bytes"],
                  "peak_host_bytes_by_job": r["memory_bound"]["peak_host_bytes_by_job"],
                  "ring_margin_bytes": r["memory_bound"]["ring_margin_bytes"]} for name, r in runs.items()}
spp = [r["s_per_proof"] for r in runs.values()]
out.write_text(json.dumps({"command": "perf/pipeline_bench.sh " + sys.argv[4],
                           "accounting": "host bytes = PSS of the process tree (shared pages once, without shm) "
                                         "+ the ring's shm; USS per process beside it",
                           "summary": summary, "s_per_proof_median": statistics.median(spp),
                           "s_per_proof_min_max": [min(spp), max(spp)], "loadavg_before": load_before,
                           "loadavg_after": os.getloadavg(), "runs": runs}, indent=1) + "\n")
print(f"wrote {out}")
PYEOF
