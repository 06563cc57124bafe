"""The summaries of ``perf/pipeline_bench.sh``: its bench runs combined into one JSON, the synthesis
thread sweep, the dev key it needs, and the table
printed at the end of the one-call H200 mode.

    python perf/pipeline_summary.py runs DIR MODE OUT.json "LOADAVG"   # bench JSONs of DIR -> OUT.json
    python perf/pipeline_summary.py threads DIR OUT.json "LOADAVG"     # synthesis_bench JSONs (one per policy)
    python perf/pipeline_summary.py key LOG_N OUT.json                 # make the porep-like dev key, timed
    python perf/pipeline_summary.py table OUT_DIR KEY.json SECONDS      # the H200 table
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from cuzk_mp.pipeline.benchreport import s_per_partition

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

GiB = 2**30
ACCOUNTING = "host bytes = PSS of the process tree (shared pages once, without shm) + the ring's shm; USS per process"


def _shmem_thp() -> str | None:
    """The kernel's transparent-huge-page policy for tmpfs (huge pages make a segment's first touch cheaper)."""
    try:
        return Path("/sys/kernel/mm/transparent_hugepage/shmem_enabled").read_text().strip()
    except OSError:
        return None


def _run_summary(r: dict[str, Any]) -> dict[str, Any]:
    """What the committed summary keeps of one bench run (the per-partition rows stay out)."""
    stages = r["median_stage_s"]
    config = r["config"]
    bound = r["memory_bound"]
    device = stages.get("device")
    zkey_bytes = r.get("zkey_bytes")
    target = None
    if zkey_bytes is not None:
        target = config["ring_slots"] * bound["segment_bytes"] + zkey_bytes + 4 * GiB
    prover = next(iter(r.get("prover_stats", {}).values()), {})
    per_partition = s_per_partition(r)[0]
    return {
        "shape": {k: config[k] for k in ("ring_slots", "partition_workers", "synthesis_threads", "gpu_workers")},
        "shape_reason": config.get("shape_reason"), "backend_reason": config.get("backend_reason"),
        # s_per_proof: the former name of s_per_partition (older readers); s_per_job None in older files
        "s_per_partition": per_partition, "s_per_proof": per_partition, "s_per_job": r.get("s_per_job"),
        **{k: r[k] for k in ("first_job_s", "proofs_total", "proofs_verified", "peak_host_bytes",
                             "peak_pss_bytes", "peak_shm_bytes", "peak_live_segments", "gpu_busy_fraction",
                             "device_busy_fraction_by_device", "synthesis_core_s", "peak_uss_by_process")},
        "s_per_partition_over_device": (per_partition / device) if device else None,
        "median_stage_s": {k: stages[k] for k in ("ring_wait", "shm_write", "witness", "synthesis", "staging",
                                                  "device_wait", "device") if k in stages},
        "ring": r.get("ring"),
        "memory_bound_bytes": bound["bound_bytes"], "memory_margin_bytes": bound["margin_bytes"],
        "model_bound_bytes": bound["model_bound_bytes"], "model_margin_bytes": bound["model_margin_bytes"],
        "segment_bytes": bound["segment_bytes"], "working_set_excess_bytes": bound["working_set_excess_bytes"],
        "peak_host_bytes_by_job": bound["peak_host_bytes_by_job"], "ring_margin_bytes": bound["ring_margin_bytes"],
        "target_bound_bytes": target, "idle_pss_by_process": bound["idle_pss_by_process"],
        "host_key_resident_bytes": prover.get("host_key_resident_bytes"),
        "host_key_released_bytes": prover.get("host_key_released_bytes"),
    }


def _zkey_bytes(config: dict[str, Any]) -> int | None:
    from cuzk_mp.paths import default_cache_dir

    if config.get("circuit") not in ("porep-like", "dense-random"):
        return None
    path = default_cache_dir() / f"{config['circuit']}-{config['log_n']}.zkey"
    return path.stat().st_size if path.exists() else None


def _envelope(command: str, load_before: str) -> dict[str, Any]:
    from cuzk_mp.pipeline.benchreport import machine_info

    return {"command": command, "date": time.strftime("%Y-%m-%d %H:%M"), "accounting": ACCOUNTING,
            "loadavg_before": [float(x) for x in load_before.split()], "loadavg_after": list(os.getloadavg()),
            "shmem_thp": _shmem_thp(), "machine": machine_info([])}


def runs(folder: Path, mode: str, out: Path, load_before: str) -> None:
    """Every bench JSON of ``folder`` -> one summary file."""
    found = {p.stem: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}
    for r in found.values():
        r.pop("partitions", None)
        r["zkey_bytes"] = _zkey_bytes(r["config"])
    summary = {name: _run_summary(r) for name, r in found.items()}
    spp = [s_per_partition(r)[0] for r in found.values()]
    doc = {**_envelope(f"perf/pipeline_bench.sh {mode}", load_before), "summary": summary,
           "s_per_partition_median": statistics.median(spp) if spp else None,
           "s_per_partition_min_max": [min(spp), max(spp)] if spp else None,
           # former names of the two above, for readers of older summaries
           "s_per_proof_median": statistics.median(spp) if spp else None,
           "s_per_proof_min_max": [min(spp), max(spp)] if spp else None, "runs": found}
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    print(f"wrote {out}")


def threads(folder: Path, out: Path, load_before: str) -> None:
    """The synthesis thread sweep, one synthesis_bench JSON per wait policy -> core-seconds per thread count."""
    table: dict[str, Any] = {}
    raw = {}
    for p in sorted(folder.glob("*.json")):
        raw[p.stem] = doc = json.loads(p.read_text())
        for res in doc["results"]:
            one = res["threads"].get("1", {}).get("total", {}).get("cpu_s")
            rows = {}
            for t, row in res["threads"].items():
                rows[t] = {"core_s": row["total"]["cpu_s"], "wall_s": row["total"]["wall_s"],
                           "core_s_over_1_thread": (row["total"]["cpu_s"] / one) if one else None,
                           **{f"{ph}_core_s": row[ph]["cpu_s"] for ph in ("witness", "abc", "check")}}
            table.setdefault(f"2^{res['log_n']} {res['kind']}", {})[f"OMP_WAIT_POLICY={p.stem}"] = rows
    doc = {**_envelope("perf/pipeline_bench.sh synth-threads", load_before),
           "units": "core_s = process CPU seconds of one partition (witness + a/b/c + check), best of reps",
           "summary": table, "runs": raw}
    out.write_text(json.dumps(doc, indent=1, default=str) + "\n")
    for size, policies in table.items():
        for policy, rows in policies.items():
            print(f"{size} {policy}: " + ", ".join(
                f"{t} thr {r['core_s']:.2f} core-s ({r['core_s_over_1_thread'] or 0:.2f}x) {r['wall_s']:.2f} s"
                for t, r in rows.items()))
    print(f"wrote {out}")


def key(log_n: int, out: Path) -> None:
    """Make (or find) the porep-like dev key in the param cache; the seconds it took."""
    from cuzk_mp.paths import default_cache_dir
    from cuzk_mp.pipeline.keys import ensure_synthetic_key

    t0 = time.perf_counter()
    zkey, _ = ensure_synthetic_key("porep-like", log_n, default_cache_dir(), "auto")
    took = time.perf_counter() - t0
    out.write_text(json.dumps({"log_n": log_n, "seconds": took, "zkey_bytes": zkey.stat().st_size}) + "\n")
    print(f"porep-like 2^{log_n} dev key: {took:.1f} s ({zkey.stat().st_size / GiB:.1f} GiB)")


def _fmt_gib(n: float | None) -> str:
    return "-" if n is None else f"{n / GiB:.1f}"


def table(folder: Path, key_json: Path, seconds: float) -> None:
    """One table of the H200 mode's results, and the same as h200-summary.json."""
    rows = []
    for name in ("pipeline-gpu-2^24.json", "pipeline-gpu-budget.json"):
        path = folder / name
        if not path.exists():
            continue
        for run, s in json.loads(path.read_text())["summary"].items():
            st = s["median_stage_s"]
            rows.append({
                "run": run, "shape": "{partition_workers}x{synthesis_threads} k{ring_slots}".format(**s["shape"]),
                "s_per_partition": s.get("s_per_partition", s["s_per_proof"]), "s_per_job": s.get("s_per_job"),
                "device_s": st.get("device"),
                "ratio": s["s_per_partition_over_device"], "gpu_busy": s["gpu_busy_fraction"],
                "shm_write_s": st.get("shm_write"), "synthesis_s": st.get("synthesis"),
                "synthesis_core_s": s["synthesis_core_s"], "peak_host_gib": _fmt_gib(s["peak_host_bytes"]),
                "target_gib": _fmt_gib(s["target_bound_bytes"]),
                "prover_key_host_gib": _fmt_gib(s["host_key_resident_bytes"]),
                "verified": f"{s['proofs_verified']}/{s['proofs_total']}"})
    head = ("run", "shape", "s/part", "s/job", "device", "ratio", "busy", "shm_wr", "synth", "core-s", "peakGiB",
            "target", "keyGiB", "verified")
    lines = ["  ".join(f"{h:>9}" for h in head)]

    def f(x: Any, spec: str) -> str:
        return "-" if x is None else format(x, spec)

    for r in rows:
        lines.append("  ".join(f"{v:>9}" for v in (
            r["run"][:9], r["shape"], f(r["s_per_partition"], ".3f"), f(r["s_per_job"], ".2f"),
            f(r["device_s"], ".3f"), f(r["ratio"], ".2f"),
            f(r["gpu_busy"], ".1%"), f(r["shm_write_s"], ".3f"), f(r["synthesis_s"], ".3f"),
            f(r["synthesis_core_s"], ".2f"), r["peak_host_gib"], r["target_gib"], r["prover_key_host_gib"],
            r["verified"])))
    threads_path = folder / "synthesis-threads-h200.json"
    extra = {}
    if threads_path.exists():
        extra["synthesis_threads"] = json.loads(threads_path.read_text())["summary"]
        for size, policies in extra["synthesis_threads"].items():
            for policy, per in policies.items():
                lines.append(f"synthesis {size} {policy}: " + ", ".join(
                    f"{t}: {r['core_s']:.2f} core-s {r['wall_s']:.2f} s" for t, r in per.items()))
    shm = folder / "shm-first-touch-h200.json"
    if shm.exists():
        probe = json.loads(shm.read_text())
        touch = extra["shm_first_touch"] = {k: probe[k] for k in ("madv_populate", "remap", "reuse") if k in probe}
        lines.append("shm producer, 1 GiB: " + ", ".join(
            f"{k} {v['producer_s']:.3f} s ({v['producer_gbps']:.1f} GB/s)" for k, v in touch.items()))
    p26 = folder / "pipeline-gpu-2^26.json"
    if p26.exists():
        doc = json.loads(p26.read_text())
        extra["gpu_2^26"] = doc.get("skipped") or doc.get("summary")
        lines.append("2^26: " + (f"skipped ({doc['skipped'][:90]}...); model: {doc['model']['reason']}"
                                 if "skipped" in doc else "ran (see pipeline-gpu-2^26.json)"))
    keyinfo = json.loads(key_json.read_text()) if key_json.exists() else None
    if keyinfo:
        lines.append(f"2^24 dev key: {keyinfo['seconds']:.1f} s; whole mode: {seconds:.0f} s")
    text = "\n".join(lines)
    print(text)
    (folder / "h200-summary.json").write_text(json.dumps(
        {"rows": rows, "key": keyinfo, "seconds": seconds, "table": text, **extra}, indent=1, default=str) + "\n")


def main(argv: list[str]) -> int:
    what = argv[0] if argv else ""
    if what in ("-h", "--help"):
        print(__doc__)
        return 0
    if what == "runs":
        runs(Path(argv[1]), argv[2], Path(argv[3]), argv[4])
    elif what == "threads":
        threads(Path(argv[1]), Path(argv[2]), argv[3])
    elif what == "key":
        key(int(argv[1]), Path(argv[2]))
    elif what == "table":
        table(Path(argv[1]), Path(argv[2]), float(argv[3]))
    else:
        print(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
