"""Where a GPU key load goes: each step of ``GpuBackend.load_key`` timed, in fresh processes.

A one-shot ``groth16 prove --backend gpu`` loads its key once, in a process that has loaded nothing
else yet; what that first load pays beyond the copies (CUDA loading a module's functions as they
are first asked for, the NTT tables) is what this measures. Each child process makes the CUDA
context as the CLI does, starts the GPU backend, reads the key and the witness, then times
``load_key(lasting=False)`` with a timer around its steps (the section uploads, the device plan,
each MSM object's construction, the module kernels' loads, the NTT tables), closes the key and
makes one proof as ``groth16 prove`` does (the key loaded for it, with the circuit's coded rows),
whose prover log gives each of its steps (``prove: witness_map .., load_key .., key_wait .., stage ..,
device .., finalize ..``): what a first proof pays in its stage, device and finalize steps shows
against two more proofs with a key resident. The ``--cold-runs`` children first drop the key file from
the page cache (``posix_fadvise`` DONTNEED), as a lasting load of the same key elsewhere does.

Usage (a GPU machine): ``python3 perf/key_load_probe.py --zkey K --wtns W [--runs 3] [--cold-runs 2]
[--out FILE.json]``; prints one line per child and the medians last.
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
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
STEPS = {  # timer name -> what it wraps: an attribute path from key_load or msm (gmsm)
    "upload_section": "key_load._upload_release",
    "plan_device": "key_load.plan_device",
    "msm_kernels": "gmsm.load_kernels",
    "msm_g1_object": "gmsm.MsmG1.__init__",
    "msm_g2_object": "gmsm.MsmG2.__init__",
}


def _child(zkey_path: str, wtns_path: str, cold: bool) -> dict[str, Any]:
    """One fresh process's figures (milliseconds)."""
    fd = os.open(zkey_path, os.O_RDONLY)
    try:
        if cold:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        else:
            while os.read(fd, 1 << 24):
                pass
    finally:
        os.close(fd)
    t0 = time.perf_counter()
    from cuzk_mp.backends.gpu.early_context import start_primary_context

    start_primary_context()
    from cuzk_mp.backends import get_backend

    backend = get_backend("gpu")
    ready = time.perf_counter() - t0
    import logging

    from cuzk_mp.backends.gpu import key_load
    from cuzk_mp.backends.gpu import msm as gmsm
    from cuzk_mp.formats.wtns import read_wtns
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.prover import STEPS_LINE, prove, steps_of
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator

    times: dict[str, list[float]] = {}

    def timed(owner: Any, attr: str, label: str) -> None:
        fn = getattr(owner, attr)

        def wrap(*args: Any, **kwargs: Any) -> Any:
            t = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                times.setdefault(label, []).append(round((time.perf_counter() - t) * 1e3, 2))
        setattr(owner, attr, wrap)

    spaces = {"key_load": key_load, "gmsm": gmsm}
    for label, path in STEPS.items():
        first, *rest = path.split(".")
        owner = spaces[first]
        for part in rest[:-1]:
            owner = getattr(owner, part)
        timed(owner, rest[-1], label)
    timed(backend.ntt_engine, "plan", "ntt_tables")
    evaluator = ConstraintEvaluator.from_files(zkey_path, None)
    zkey = read_zkey(zkey_path, check_coefs=False)
    w = read_wtns(wtns_path)
    t = time.perf_counter()
    key = backend.load_key(zkey, lasting=False)
    first = {"load_key": round((time.perf_counter() - t) * 1e3, 2), **{k: sum(v) for k, v in times.items()},
             "steps": dict(times)}
    key.close()
    records: list[str] = []

    class _Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    prover_log = logging.getLogger("cuzk_mp.groth16.prover")
    prover_log.setLevel(logging.INFO)
    prover_log.addHandler(_Keep())
    prove(backend, zkey, w, evaluator=evaluator)
    resident = backend.load_key(zkey, lasting=False, witness_rows=evaluator.data)
    try:
        for _ in range(2):
            prove(backend, zkey, w, key=resident, evaluator=evaluator)
    finally:
        resident.close()
    proofs = [steps_of(r) for r in records if r.startswith(STEPS_LINE)]
    return {"cold": cold, "backend_ready_s": round(ready, 3), "first_load_ms": first,
            "load_in_prove_ms": proofs[0]["load_key"], "first_proof_ms": proofs[0],
            "resident_key_proofs_ms": proofs[1:]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zkey", type=Path, required=True)
    ap.add_argument("--wtns", type=Path, required=True)
    ap.add_argument("--runs", type=int, default=3, help="children with the key file in the page cache")
    ap.add_argument("--cold-runs", type=int, default=2, help="children with it dropped from the page cache first")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--child", choices=("warm", "cold"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(_child(str(args.zkey), str(args.wtns), args.child == "cold")))
        return
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
    rows = []
    for kind in ["warm"] * args.runs + ["cold"] * args.cold_runs:
        res = subprocess.run([sys.executable, __file__, "--zkey", str(args.zkey), "--wtns", str(args.wtns),
                              "--child", kind], env=env, capture_output=True, text=True)
        if res.returncode:
            raise SystemExit(f"the {kind} child failed ({res.returncode}):\n{res.stderr[-3000:]}")
        rows.append(json.loads(res.stdout.strip().splitlines()[-1]))
        print(json.dumps({k: v for k, v in rows[-1]["first_load_ms"].items() if k != "steps"}), kind)
        print("  proofs:", json.dumps([rows[-1]["first_proof_ms"], *rows[-1]["resident_key_proofs_ms"]]))
    summary = {}
    for kind in ("warm", "cold"):
        first = [r["first_load_ms"] for r in rows if r["cold"] == (kind == "cold")]
        if first:
            labels = sorted({k for f in first for k in f if k != "steps"})
            summary[kind] = {k: round(statistics.median(f.get(k, 0.0) for f in first), 2) for k in labels}
            proofs = [r["first_proof_ms"] for r in rows if r["cold"] == (kind == "cold")]
            summary[kind]["first_proof"] = {k: round(statistics.median(p[k] for p in proofs), 2) for k in proofs[0]}
            later = [p for r in rows if r["cold"] == (kind == "cold") for p in r["resident_key_proofs_ms"]]
            summary[kind]["resident_key_proof"] = {k: round(statistics.median(p[k] for p in later), 2)
                                                   for k in later[0]}
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "medians_ms": summary}, indent=1) + "\n")
    for kind, med in summary.items():
        print(f"{kind:5} first load, medians (ms): " + ", ".join(f"{k} {v}" for k, v in med.items()
                                                                  if not isinstance(v, dict)))
        for which in ("first_proof", "resident_key_proof"):
            print(f"{kind:5} {which}, medians (ms): " + ", ".join(f"{k} {v}" for k, v in med[which].items()))


if __name__ == "__main__":
    main()
