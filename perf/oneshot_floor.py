"""What a one-shot ``groth16 prove --backend gpu`` pays before any proving: each start step alone.

The one-shot CLI overlaps its steps (the backend starts on a helper thread beside the key and
witness reads), so its log cannot say what each step costs. This script runs them one after
another in fresh processes and times each: the interpreter up to the first line of the script
(from just before the parent starts it), numpy, CuPy, the CUDA context (a first allocation), the
GPU backend (its kernel modules), the prover's modules (``cuzk_mp.groth16.prover``) and the
process's exit (measured from outside); numba's import only for ``--backend cpu`` (the GPU path
imports none: ``numba_loaded`` in the result says so). The sum is
the floor a one-shot process starts from whatever the proof itself takes.

Usage: ``python3 perf/oneshot_floor.py [--runs 3] [--out FILE.json]`` on a GPU machine (with
``--backend cpu`` the CuPy steps are left out, for a dry run).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

from env_arg import env_variable  # perf/, the script's own folder

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time
t = time.time()
out = {"interpreter_s": t - float(sys.argv[2])}
def step(name, fn):
    global t
    fn()
    now = time.time()
    out[name + "_s"] = now - t
    t = now
step("numpy", lambda: __import__("numpy"))
if sys.argv[1] == "cpu":  # the CPU backend's kernels are numba's; the GPU path imports no numba
    step("numba", lambda: __import__("numba"))
if sys.argv[1] == "gpu":
    step("cupy", lambda: __import__("cupy"))
    def context():
        import cupy
        cupy.zeros(1).sum().item()
    step("cuda_context", context)
    def backend():
        from cuzk_mp.backends import get_backend
        get_backend("gpu")
    step("gpu_backend", backend)
step("prover_modules", lambda: __import__("cuzk_mp.groth16.prover"))
out["numba_loaded"] = "numba" in sys.modules
out["exit_at"] = time.time()
sys.stdout.write(json.dumps(out) + "\n")
sys.stdout.flush()
"""


def one(backend: str, env: dict[str, str]) -> dict[str, float]:
    """One fresh process (``env`` added to its environment): its steps, and its exit time after the last step."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    res = subprocess.run([sys.executable, "-c", CHILD, backend, repr(time.time())], capture_output=True, text=True,
                         check=True, cwd=ROOT, env={**os.environ, **env, "PYTHONPATH": path})
    ended = time.time()
    row: dict[str, float] = json.loads(res.stdout.strip().splitlines()[-1])
    row["exit_s"] = ended - row.pop("exit_at")
    return row


def main() -> None:
    """Run the steps ``--runs`` times (after one unrecorded warm-up), print medians, write the JSON."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--backend", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", type=env_variable,
                    help="an environment variable for the children (e.g. OPENBLAS_NUM_THREADS=1); repeatable")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    env = dict(args.env)
    one(args.backend, env)  # warm-up: page cache, CuPy's and numba's caches
    runs = [one(args.backend, env) for _ in range(args.runs)]
    medians = {k: statistics.median(r[k] for r in runs) for k in runs[0] if k.endswith("_s")}
    medians["total_s"] = sum(medians.values())
    result = {"what": __doc__.splitlines()[0], "command": f"python3 perf/oneshot_floor.py --runs {args.runs}"
              f" --backend {args.backend}" + "".join(f" --env {n}={v}" for n, v in args.env), "medians": medians,
              "numba_loaded": any(r["numba_loaded"] for r in runs), "runs": runs}
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    for k, v in medians.items():
        print(f"{k:24} {v * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
