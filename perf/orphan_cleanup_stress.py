"""Stress check: SIGKILL the engine mid-job, many times, on a loaded machine; nothing may leak.

Each trial starts an engine in its own process (CPU backend, porep-like 2^10, one synthesis
worker, ring_slots = 2, a 400-partition job), waits until the ring holds a segment, SIGKILLs
the engine and then waits up to 30 s for its orphaned children to remove every IPC object of
the prefix from /dev/shm and to exit. ``--busy N`` keeps N busy-loop processes running
meanwhile (the load that made the cleanup race show up in CI). A trial fails if anything of
the prefix is left or a child still runs::

    .venv/bin/python perf/orphan_cleanup_stress.py [--trials 40] [--busy 2] \
        [--json perf/results/orphan-cleanup-stress.json]

Exit code 0 when every trial was clean.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402
from cuzk_mp.pipeline.keys import ensure_synthetic_key  # noqa: E402
from cuzk_mp.pipeline.shm_names import cleanup_stale, live_segments, shm_entries  # noqa: E402

LOG_N = 10
ENGINE = """
import sys, time
from pathlib import Path
from cuzk_mp.pipeline.engine import Engine
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput
engine = Engine(EngineConfig(backend="cpu", devices=[0], partition_workers=1, ring_slots=2,
                             shm_prefix=sys.argv[1], param_cache=Path(sys.argv[2]))).start()
engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=int(sys.argv[3])))
engine.submit(JobSpec("long", "porep", [PartitionInput("synthetic", seed=i) for i in range(400)]))
print(" ".join(str(p.pid) for p in engine.status().processes), flush=True)
time.sleep(600)
"""


def _running(children: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for c in children:
        try:
            if c.is_running() and c.status() != psutil.STATUS_ZOMBIE:
                out.append(c)
        except psutil.NoSuchProcess:
            continue
    return out


def trial(prefix: str, cache: Path) -> dict[str, object]:
    """One engine kill; what was left and how long the orphans took to clean up."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-c", ENGINE, prefix, str(cache), str(LOG_N)],
                            stdout=subprocess.PIPE, text=True, env=env)
    children: list[psutil.Process] = []
    try:
        children = [psutil.Process(int(p)) for p in proc.stdout.readline().split()]  # type: ignore[union-attr]
        t0 = time.monotonic()
        while live_segments(prefix) < 1 and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(10)
        t0 = time.monotonic()
        while (shm_entries(prefix) or _running(children)) and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        left, alive = shm_entries(prefix), [c.pid for c in _running(children)]
        return {"clean": not left and not alive, "cleanup_s": round(time.monotonic() - t0, 3),
                "left_in_dev_shm": left, "children_alive": alive}
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in _running(children):
            c.kill()
        cleanup_stale(prefix)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--busy", type=int, default=2, help="busy-loop processes running meanwhile")
    ap.add_argument("--json", type=Path, default=REPO / "perf" / "results" / "orphan-cleanup-stress.json")
    args = ap.parse_args()
    cache = Path(tempfile.mkdtemp(prefix="cuzk-orphan-keys-"))
    ensure_synthetic_key("porep-like", LOG_N, cache, "cpu")
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        rows = []
        for i in range(args.trials):
            row = trial(f"cuzk-orphan-{os.getpid()}-{i}", cache)
            rows.append(row)
            print(f"trial {i}: {'clean' if row['clean'] else 'LEAK'} after {row['cleanup_s']} s", flush=True)
    finally:
        for b in busy:
            b.kill()
    clean = sum(1 for r in rows if r["clean"])
    result = {"what": "SIGKILL of the engine mid-job; orphans must remove the ring and exit within 30 s",
              "command": " ".join(["python", *sys.argv]), "trials": args.trials, "busy_loops": args.busy,
              "clean": clean, "max_cleanup_s": max(r["cleanup_s"] for r in rows), "rows": rows,
              "machine": machine_info([])}
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(f"{clean}/{args.trials} clean; wrote {args.json}")
    return 0 if clean == args.trials else 1


if __name__ == "__main__":
    sys.exit(main())
