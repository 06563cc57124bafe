"""Load test of the proving daemon: many small jobs from many concurrent clients.

Starts ``cuzk-mp daemon`` (CPU backend, synthetic porep-like 2^10, one partition per job) on a
unix socket in a temp dir, then N clients (each its own connection) submit their share of the
jobs with unique request ids and await them, while a poller sends GetStatus every few ms on its
own connection. It checks that every job completed exactly once (no duplicate, nothing lost:
the engine's own counters must agree, and resubmitting every request id must return the same
job), verifies every proof with cuzk-mp's verifier, and records the daemon's RSS before and
after and the GetStatus latency under load::

    .venv/bin/python perf/daemon_load.py [--jobs 200] [--clients 20] [--json perf/results/daemon-cpu.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuzk_mp.daemon.client import AsyncClient, Client, synthetic_partitions  # noqa: E402
from cuzk_mp.formats.snarkjs_json import (  # noqa: E402
    proof_from_json, public_from_json, vk_from_json,
)
from cuzk_mp.groth16.keys import prepare_vk  # noqa: E402
from cuzk_mp.groth16.verifier import verify  # noqa: E402

CONFIG = """
[daemon]
listen = "unix://{work}/cuzk.sock"
journal = "{work}/journal.sqlite"
[srs]
param_cache = "{work}/keys"
[memory]
total_budget = "16GiB"
safety_margin = "1GiB"
[synthesis]
partition_workers = {workers}
[pipeline]
ring_slots = 4
[gpus]
backend = "cpu"
devices = [0]
gpu_workers_per_device = 1
[logging]
level = "warning"
[circuits.syn]
synthetic = "porep-like"
log_n = {log_n}
"""


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def start_daemon(work: Path, workers: int, log_n: int) -> tuple[subprocess.Popen[bytes], str]:
    """Launch the daemon and wait until it serves; returns (process, address)."""
    return launch_daemon(work, CONFIG.format(work=work, workers=workers, log_n=log_n), 600)


def launch_daemon(work: Path, config: str, timeout_s: float) -> tuple[subprocess.Popen[bytes], str]:
    """Write ``config`` as ``<work>/cuzk.toml``, start `cuzk-mp daemon` on it (log in ``<work>/daemon.log``)
    and wait up to ``timeout_s`` until it serves on ``unix://<work>/cuzk.sock``; returns (process, address)."""
    (work / "cuzk.toml").write_text(config)
    log = open(work / "daemon.log", "wb")
    proc = subprocess.Popen([sys.executable, "-m", "cuzk_mp.cli", "daemon", "--config",
                             str(work / "cuzk.toml")], cwd=REPO, stdout=log, stderr=log)
    addr = f"unix://{work}/cuzk.sock"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((work / "daemon.log").read_text())
        try:
            with Client(addr) as c:
                if c.status()["daemon"]["state"] == "running":
                    return proc, addr
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("daemon did not start")


def rss(pid: int) -> dict[str, int]:
    """RSS of the daemon process alone and of its whole process tree (bytes)."""
    p = psutil.Process(pid)
    tree = p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
    return {"daemon_rss_bytes": p.memory_info().rss, "tree_rss_bytes": tree}


async def one_client(addr: str, cid: int, n: int, results: dict[str, Any]) -> None:
    """Submit ``n`` jobs (pipelined), then await them all."""
    async with await AsyncClient.connect(addr) as c:
        subs = await asyncio.gather(*[
            c.submit("syn", synthetic_partitions(1, first_seed=cid * 10_000 + i),
                     request_id=f"load-{cid}-{i}") for i in range(n)])
        replies = await asyncio.gather(*[c.await_proof(s.job_id, timeout_s=1800) for s in subs])
        for s, r in zip(subs, replies):
            results[s.job_id] = r


async def poll_status(addr: str, stop: asyncio.Event, interval: float) -> list[float]:
    """GetStatus latencies (seconds) until ``stop`` is set."""
    lat = []
    async with await AsyncClient.connect(addr) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            await c.status()
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(interval)
    return lat


async def load(addr: str, jobs: int, clients: int, interval: float) -> dict[str, Any]:
    """Run the load; returns results, latencies and wall time."""
    results: dict[str, Any] = {}
    stop = asyncio.Event()
    poller = asyncio.ensure_future(poll_status(addr, stop, interval))
    per = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    t0 = time.perf_counter()
    await asyncio.gather(*[one_client(addr, i, n, results) for i, n in enumerate(per)])
    wall = time.perf_counter() - t0
    stop.set()
    lat = await poller
    async with await AsyncClient.connect(addr) as c:
        again = await asyncio.gather(*[
            c.submit("syn", synthetic_partitions(1, first_seed=cid * 10_000 + i),
                     request_id=f"load-{cid}-{i}")
            for cid, n in enumerate(per) for i in range(n)])
        status = await c.status()
        vk = await c.verification_key("syn")
    return {"results": results, "latencies": lat, "wall_s": wall, "again": again,
            "status": status, "vk": vk}


def check(out: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Completeness, duplicates and proof validity."""
    results = out["results"]
    pvk = prepare_vk(vk_from_json(out["vk"]))
    states = [r.state for r in results.values()]
    verified = sum(verify(pvk, public_from_json(r.partitions[0].public),
                          proof_from_json(r.partitions[0].proof)) for r in results.values())
    return {
        "jobs_completed": states.count("done"),
        "jobs_not_done": len(results) - states.count("done"),
        "jobs_lost": jobs - len(results),
        "distinct_job_ids": len(set(results)),
        "resubmits_returned_existing_job": sum(a.duplicate for a in out["again"]),
        "proofs_verified": verified,
        "daemon_job_counts": out["status"]["job_counts"],
    }


def main() -> int:
    """Run the load test and write the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1, help="synthesis workers")
    ap.add_argument("--log-n", type=int, default=10)
    ap.add_argument("--status-interval", type=float, default=0.02)
    ap.add_argument("--json", type=Path, default=REPO / "perf" / "results" / "daemon-cpu.json")
    args = ap.parse_args()
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cuzk-load-") as tmp:
        work = Path(tmp)
        proc, addr = start_daemon(work, args.workers, args.log_n)
        try:
            with Client(addr) as c:  # warm: key loaded, numba compiled, before measuring
                c.prove("syn", synthetic_partitions(1, first_seed=99_999_999), timeout_s=600)
                engine_before = c.metrics()
            mem_before = rss(proc.pid)
            out = asyncio.run(load(addr, args.jobs, args.clients, args.status_interval))
            mem_after = rss(proc.pid)
            with Client(addr) as c:
                engine_after = c.metrics()
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
    lat = out["latencies"]
    report = {
        "what": f"{args.jobs} one-partition jobs (porep-like 2^{args.log_n}, CPU backend) from "
                f"{args.clients} concurrent clients, GetStatus polled every "
                f"{args.status_interval * 1000:g} ms on its own connection",
        "command": "python perf/daemon_load.py " + " ".join(sys.argv[1:]),
        **check(out, args.jobs),
        "engine_partitions_proved_during_load": _counter(engine_after, "partitions_proved")
        - _counter(engine_before, "partitions_proved"),
        "engine_jobs_submitted_during_load": _counter(engine_after, "jobs_submitted")
        - _counter(engine_before, "jobs_submitted"),
        "wall_s": round(out["wall_s"], 3),
        "proofs_per_s": round(args.jobs / out["wall_s"], 3),
        "rss_before": mem_before, "rss_after": mem_after,
        "daemon_rss_growth_bytes": mem_after["daemon_rss_bytes"] - mem_before["daemon_rss_bytes"],
        "getstatus_latency_s": {"count": len(lat), "p50": round(percentile(lat, 0.5), 5),
                                "p99": round(percentile(lat, 0.99), 5),
                                "max": round(max(lat), 5),
                                "mean": round(statistics.fmean(lat), 5)},
        "daemon_exit_code_after_sigterm": rc,
        "machine": {"cpu": _cpu_model(),
                    "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "config": {"partition_workers": args.workers, "ring_slots": 4, "prover_processes": 1,
                   "gpu_workers_per_device": 1},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    ok = (report["jobs_completed"] == args.jobs and report["jobs_lost"] == 0
          and report["proofs_verified"] == args.jobs
          and report["resubmits_returned_existing_job"] == args.jobs
          and report["engine_partitions_proved_during_load"] == args.jobs and rc == 0)
    return 0 if ok else 1


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"cuzk_engine_{name}_total "):
            return float(line.split()[1])
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
