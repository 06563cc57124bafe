"""End-to-end latency of one small job through the daemon, next to the proof itself.

Starts ``cuzk-mp daemon`` (synthetic porep-like 2^log_n, one synthesis worker, one prover
worker) on a unix socket in a temp dir, warms it (key loaded, kernels compiled), then sends
``--jobs`` one-partition jobs one after another, each the way a user's script would: connect,
``Prove`` (submit and wait), write proof.json and public.json (the client's
``write_outputs``), so a latency is client submit -> proof on disk. Every proof is verified
against the daemon's verification key. Each job's partition timings (synthesis, staging,
device, finalize, ...) say where the time went; what is left is the daemon's own per-job
overhead (protocol, journal, engine messages, ring hand-offs). Next to it: the same proof in
this process (witness map, stage, device work, assembly + self-verification on a resident key).
Then ``--client-processes`` whole ``cuzk-mp client prove`` processes, one after another, timed
from their start to their exit: what a shell script that proves through the resident daemon
pays per proof (interpreter, the client's imports, the job, the files), beside a one-shot
``groth16 prove`` process::

    .venv/bin/python perf/daemon_latency.py [--backend cpu] [--log-n 12] [--jobs 30] \
        [--client-processes 5] [--json perf/results/daemon-latency-cpu.json]
"""

from __future__ import annotations

import argparse
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

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "perf"))

from daemon_load import _cpu_model, launch_daemon, percentile  # noqa: E402

from cuzk_mp.daemon.client import Client, synthetic_partitions, write_outputs  # noqa: E402

CONFIG = """
[daemon]
listen = "unix://{work}/cuzk.sock"
journal = "{work}/journal.sqlite"
[srs]
param_cache = "{cache}"
[memory]
total_budget = "16GiB"
safety_margin = "1GiB"
[synthesis]
partition_workers = 1
[pipeline]
ring_slots = 2
[gpus]
backend = "{backend}"
devices = [0]
gpu_workers_per_device = 1
[logging]
level = "warning"
[circuits.syn]
synthetic = "porep-like"
log_n = {log_n}
"""
SPLIT = ("queue_wait", "ring_wait", "shm_write", "synthesis", "staging", "device_wait", "device", "finalize")


def start_daemon(work: Path, cache: Path, backend: str, log_n: int) -> tuple[subprocess.Popen[bytes], str]:
    """Launch the daemon and wait until it serves (a first GPU start compiles); returns (process, address)."""
    return launch_daemon(work, CONFIG.format(work=work, cache=cache, backend=backend, log_n=log_n), 900)


def one_job(addr: str, seed: int, out_dir: Path) -> tuple[float, Any]:
    """Connect, prove one partition, write its files: (seconds, reply)."""
    t0 = time.perf_counter()
    with Client(addr) as c:
        reply = c.prove("syn", synthetic_partitions(1, first_seed=seed), timeout_s=600)
    write_outputs(reply, out_dir, None)
    return time.perf_counter() - t0, reply


def client_process(addr: str, out_dir: Path) -> float:
    """One whole ``cuzk-mp client prove`` process (one partition): seconds from start to exit."""
    cmd = [sys.executable, "-m", "cuzk_mp", "client", "prove", "--connect", addr, "--circuit", "syn",
           "--partitions", "1", "--out", str(out_dir), "--timeout", "600"]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, capture_output=True, text=True, check=False, cwd=REPO)
    took = time.perf_counter() - t0
    if res.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {res.returncode}: {res.stderr[-2000:]}")
    return took


def in_process(backend_name: str, zkey_path: Path, log_n: int, reps: int) -> dict[str, float]:
    """The same proof in this process on a resident key: median seconds of each step."""
    from cuzk_mp.backends import get_backend
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.prover import prove_finalize, prove_start, public_signals
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator

    backend = get_backend(backend_name)
    steps: dict[str, list[float]] = {"witness_map": [], "stage": [], "device": [], "finalize": [], "total": []}
    with read_zkey(zkey_path) as zkey:
        key, ev, circuit = backend.load_key(zkey), ConstraintEvaluator.from_zkey(zkey), PorepLike(log_n)
        for i in range(reps + 1):
            w = circuit.witness(10_000 + i, 0)
            t0 = time.perf_counter()
            inputs = ev.evaluate(w)
            t1 = time.perf_counter()
            staged = backend.stage(key, inputs)
            t2 = time.perf_counter()
            try:
                sums = prove_start(backend, key, staged, zkey.n_public)
            finally:
                backend.release(staged)
            t3 = time.perf_counter()
            prove_finalize(zkey, sums, public_signals(inputs.w, zkey.n_public))
            t4 = time.perf_counter()
            if i:  # the first warms
                for k, v in zip(steps, (t1 - t0, t2 - t1, t3 - t2, t4 - t3, t4 - t0)):
                    steps[k].append(v)
        key.close()
    return {k: round(statistics.median(v), 5) for k, v in steps.items()}


def measure(backend: str, log_n: int, jobs: int, cache: Path, client_processes: int = 0) -> dict[str, Any]:
    """Run the daemon, the jobs and the in-process reference; the report's fields."""
    from cuzk_mp.formats.snarkjs_json import proof_from_json, public_from_json, vk_from_json
    from cuzk_mp.groth16.keys import prepare_vk
    from cuzk_mp.groth16.verifier import verify

    with tempfile.TemporaryDirectory(prefix="cuzk-latency-") as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        proc, addr = start_daemon(work, cache, backend, log_n)
        start_s = time.perf_counter() - t0
        lat: list[float] = []
        split: dict[str, list[float]] = {k: [] for k in SPLIT}
        verified = 0
        try:
            with Client(addr) as c:
                c.preload("syn")
                pvk = prepare_vk(vk_from_json(c.verification_key("syn")))
            for i in range(2):  # warm: the first partitions compile and map what they need
                one_job(addr, 1_000_000 + i, work / "warm")
            for i in range(jobs):
                out = work / f"job-{i}"
                s, reply = one_job(addr, 100 + i, out)
                lat.append(s)
                p = reply.partitions[0]
                for k in SPLIT:
                    split[k].append(float(p.timings.get(k, 0.0)))
                proof = proof_from_json(json.loads((out / "proof_0.json").read_text()))
                public = public_from_json(json.loads((out / "public_0.json").read_text()))
                verified += bool(reply.state == "done" and verify(pvk, public, proof))
            procs: list[float] = []
            for i in range(client_processes):
                out = work / f"client-{i}"
                procs.append(client_process(addr, out))
                proof = proof_from_json(json.loads((out / "proof_0.json").read_text()))
                public = public_from_json(json.loads((out / "public_0.json").read_text()))
                verified += bool(verify(pvk, public, proof))
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
    from cuzk_mp.pipeline.keys import synthetic_key_paths

    ref = in_process(backend, synthetic_key_paths("porep-like", log_n, cache)[0], log_n, 10)
    med = {k: statistics.median(v) for k, v in split.items()}
    accounted = sum(med[k] for k in ("synthesis", "staging", "device", "finalize"))
    p50 = percentile(lat, 0.5)
    return {
        "daemon_start_s": round(start_s, 3),
        "jobs": jobs, "client_processes": client_processes, "proofs_verified": verified,
        "daemon_exit_code_after_sigterm": rc,
        "client_process_s": {"median": round(statistics.median(procs), 4), "min": round(min(procs), 4),
                             "max": round(max(procs), 4)} if procs else None,
        "latency_s": {"p50": round(p50, 5), "p90": round(percentile(lat, 0.9), 5), "min": round(min(lat), 5),
                      "max": round(max(lat), 5), "mean": round(statistics.fmean(lat), 5)},
        "partition_stage_median_s": {k: round(v, 5) for k, v in med.items()},
        "work_in_stages_s": round(accounted, 5),
        "overhead_p50_s": round(p50 - accounted, 5),
        "in_process_proof_s": ref,
        "overhead_vs_in_process_p50_s": round(p50 - ref["total"], 5),
    }


def main() -> int:
    """Measure and write the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backend", default="cpu", choices=("cpu", "gpu"))
    ap.add_argument("--log-n", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=30)
    ap.add_argument("--client-processes", type=int, default=5,
                    help="whole `cuzk-mp client prove` processes timed after the jobs (0: none)")
    ap.add_argument("--cache", type=Path, default=REPO / ".cache" / "daemon-latency-keys",
                    help="where the synthetic circuit's dev key is made once and kept")
    ap.add_argument("--json", type=Path, default=REPO / "perf" / "results" / "daemon-latency-cpu.json")
    args = ap.parse_args()
    args.cache.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    out = measure(args.backend, args.log_n, args.jobs, args.cache, args.client_processes)
    report = {
        "what": f"one-partition jobs (porep-like 2^{args.log_n}, {args.backend} backend) one after another, "
                "each: connect, Prove, write proof.json + public.json; latency = client submit -> files on disk",
        "command": "python perf/daemon_latency.py " + " ".join(sys.argv[1:]),
        **out,
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "config": {"partition_workers": 1, "ring_slots": 2, "prover_processes": 1, "gpu_workers_per_device": 1},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    ok = out["proofs_verified"] == args.jobs + args.client_processes and out["daemon_exit_code_after_sigterm"] == 0
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
