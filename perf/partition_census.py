#!/usr/bin/env python3
"""Where one partition's device time goes, kernel by kernel: Nsight Compute's duration and launch
figures of every kernel of one timed partition (``perf/gpu_session.py --sections partition
--profile-last``), summed by kernel; with ``--counters`` also each kernel's SM and DRAM throughput
and achieved occupancy.

Why: the partition's stage timings (CUDA events) say how long each MSM and the H step take with G2
beside the G1 chain; the floors (``perf/floors.py``) say what the arithmetic needs. Between the two
sits what a kernel spends below the multiply pipe's rate: short kernels at low occupancy, the
sorts and scans at a fraction of the memory's bandwidth, launches. Nsight Compute runs the kernels
one at a time, so the census's sum is the partition's serial work (no G2 beside the G1 chain) and
each kernel's figures are its own.

On the GPU machine (repository root, the cp312 wheels on PYTHONPATH as README "The GPU machine" says):

    python3 perf/partition_census.py --out DIR [--log-n 24] [--key circuit]

runs ``ncu --profile-from-start off`` on perf/gpu_session.py's partition section (its default multiples
plan, one checked warm-up, one profiled partition), writes ``DIR/census-raw.csv`` (Nsight Compute's
raw page), ``DIR/census.json`` (every kernel, then the sums by kernel) and prints the table.
``--csv FILE`` summarises a raw page made before, without a GPU. The durations take one collection
pass (a 2^24 partition's ~330 kernels in ~30 s on an H100); the counters are replayed (see COUNTERS).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import subprocess
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
# One collection pass, no kernel replay: durations and launch figures.
METRICS = {
    "gpu__time_duration.sum": "ns",
    "launch__registers_per_thread": "registers",
    "launch__grid_size": "grid",
    "launch__block_size": "block",
}
# --counters: the kernels' own throughputs. Nsight Compute replays each kernel for them (9 passes on
# an H100, the written device memory saved and restored around each): a 2^24 partition's ~330 kernels
# did not finish in 220 s.
COUNTERS = {
    "sm__throughput.avg.pct_of_peak_sustained_elapsed": "sm_pct",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "dram_pct",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "occupancy_pct",
}


def _ncu() -> str:
    found = os.environ.get("NCU") or shutil.which("ncu")
    if found:
        return found
    tops = sorted(Path("/opt/nvidia").glob("nsight-compute/*/ncu")) if Path("/opt/nvidia").exists() else []
    if not tops:
        sys.exit("partition_census: no ncu (set NCU=path)")
    return str(tops[-1])


def _number(text: str) -> float:
    return float(text.replace(",", "")) if text not in ("", "n/a") else float("nan")


def read_raw(path: Path) -> list[dict[str, Any]]:
    """One dict per kernel launch of Nsight Compute's raw page (its second row holds the units)."""
    with path.open(newline="") as f:
        rows = [r for r in csv.reader(f) if r and not r[0].startswith("==")]
    head = rows[0]
    col = {name: i for i, name in enumerate(head)}
    body = [r for r in rows[1:] if r[col.get("ID", 0)].strip()]  # the units row has no ID
    missing = [m for m in METRICS if m not in col]
    if missing:
        raise SystemExit(f"partition_census: {path} has no column {missing[0]} (ncu --metrics?)")
    out = []
    for r in body:
        k: dict[str, Any] = {"kernel": r[col["Kernel Name"]].split("(")[0].strip()}
        for m, short in {**METRICS, **COUNTERS}.items():
            k[short] = _number(r[col[m]]) if m in col else float("nan")
        out.append(k)
    return out


def summarise(kernels: list[dict[str, Any]]) -> dict[str, Any]:
    """Sums by kernel (name and register count: the G2 module's kernels hold more), largest first;
    throughputs weighted by duration."""
    groups: dict[tuple[str, int], list[dict[str, Any]]] = defaultdict(list)
    for k in kernels:
        groups[(k["kernel"], int(k["registers"]))].append(k)
    total_ns = sum(k["ns"] for k in kernels)
    rows = []
    for (name, regs), ks in groups.items():
        ns = sum(k["ns"] for k in ks)

        def weighted(key: str, ks: list[dict[str, Any]] = ks, ns: float = ns) -> float:
            return sum(k[key] * k["ns"] for k in ks) / ns if ns else float("nan")

        rows.append({"kernel": name, "registers": regs, "launches": len(ks), "ms": ns / 1e6,
                     "share": ns / total_ns if total_ns else 0.0, "sm_pct": weighted("sm_pct"),
                     "dram_pct": weighted("dram_pct"), "occupancy_pct": weighted("occupancy_pct")})
    rows.sort(key=lambda r: -r["ms"])
    summary: dict[str, Any] = {"launches": len(kernels), "serial_ms": total_ns / 1e6, "by_kernel": rows}
    if not math.isnan(rows[0]["sm_pct"] if rows else math.nan):
        summary["ms_in_kernels_below_half_sm_peak"] = sum(r["ms"] for r in rows if r["sm_pct"] < 50.0)
    return summary


def table(summary: dict[str, Any], most: int = 30) -> str:
    below = summary.get("ms_in_kernels_below_half_sm_peak")
    lines = [f"{summary['launches']} launches, {summary['serial_ms']:.1f} ms one at a time"
             + (f"; {below:.1f} ms in kernels under half the SM peak" if below is not None else ""),
             f"{'kernel':<34} {'regs':>4} {'n':>4} {'ms':>8} {'share':>6} {'sm%':>5} {'dram%':>5} {'occ%':>5}"]

    def pct(v: float) -> str:
        return f"{v:>5.1f}" if not math.isnan(v) else f"{'-':>5}"

    for r in summary["by_kernel"][:most]:
        lines.append(f"{r['kernel'][:34]:<34} {r['registers']:>4} {r['launches']:>4} {r['ms']:>8.2f} "
                     f"{100 * r['share']:>5.1f}% {pct(r['sm_pct'])} {pct(r['dram_pct'])} {pct(r['occupancy_pct'])}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "out")), help="output folder")
    ap.add_argument("--log-n", type=int, default=24, help="the partition's rows (2^N)")
    ap.add_argument("--key", choices=("points", "circuit"), default="points",
                    help="gpu_session.py's partition key: a point on every row, or the PoRep-like circuit's own "
                         "shape with its own witness")
    ap.add_argument("--counters", action="store_true",
                    help="also each kernel's SM and DRAM throughput and occupancy (replayed: slow)")
    ap.add_argument("--csv", type=Path, help="summarise this raw page instead of running ncu")
    args = ap.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    raw = args.csv
    if raw is None:
        raw = args.out / "census-raw.csv"
        rep = args.out / "census"
        session = [sys.executable, str(HERE / "gpu_session.py"), "--out", str(args.out / "session"),
                   "--sections", "partition", "--partition-quick", "--reps", "1", "--profile-last",
                   "--partition-log-n", str(args.log_n), "--budget-s", "600"]
        if args.key == "circuit":
            session += ["--partition-key", "circuit", "--partition-witnesses", "circuit"]
        ncu = _ncu()
        metrics = [*METRICS, *(COUNTERS if args.counters else ())]
        subprocess.run([ncu, "--clock-control", "none", "--profile-from-start", "off", "--metrics",
                        ",".join(metrics), "-o", str(rep), "-f", *session], check=True)
        with raw.open("w") as f:
            subprocess.run([ncu, "--import", f"{rep}.ncu-rep", "--page", "raw", "--csv", "--print-units", "base"],
                           check=True, stdout=f)
    kernels = read_raw(raw)
    summary = summarise(kernels)
    (args.out / "census.json").write_text(json.dumps({"log_n": args.log_n, "key": args.key, **summary,
                                                      "kernels": kernels}, indent=1))
    print(table(summary))


if __name__ == "__main__":
    main()
