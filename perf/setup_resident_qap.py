"""Host time of the resident dev setup's QAP columns (:func:`cuzk_mp.groth16.setup_resident.qap_columns`),
step by step, for the PoRep-like circuit's compact data: the Lagrange values at tau, the three
transposed products (A, B, C column sums) and beta u + alpha v + w.

The transposed products split the columns into ``tasks`` ranges, one per thread by default. A box
with T cores runs T ranges; ``--tasks 16`` runs the 16 ranges of a 16-core box on whatever cores
are here, so the work per product (each range's reading of the rows it needs) is the box's::

    NUMBA_NUM_THREADS=2 .venv/bin/python perf/setup_resident_qap.py --log-n 22 --tasks 16 [--reps 2]
        [--json perf/results/setup-resident-qap-cpu.json --label after]

The circuit data is built once under ``--cache`` (default: a temp directory per run). With
``--json`` the run goes into the file under ``--label`` (other labels are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any


def run(log_n: int, tasks: int | None, reps: int, cache: Path) -> dict[str, Any]:
    import numba

    from cuzk_mp.algebra import coded_sparse, fr
    from cuzk_mp.algebra.field import fr_root_of_unity
    from cuzk_mp.groth16.setup import ToxicWaste, lagrange_factor
    from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data, open_device_circuit_data

    data = open_device_circuit_data(ensure_synthetic_circuit_data("porep-like", log_n, cache), "porep-like", log_n)
    rng = random.Random(log_n)
    toxic = ToxicWaste(*(rng.randrange(2, 1 << 250) for _ in range(4)))
    counts = data.counts
    n_rows = max(data.a.n_rows, data.b.n_rows, data.c.n_rows)
    nnz = {"a": data.a.nnz, "b": data.b.nnz, "c": data.c.nnz}
    best: dict[str, float] = {}
    for _ in range(reps + 1):  # the first round compiles or loads the kernels: not kept
        t: dict[str, float] = {}
        t0 = time.perf_counter()
        lag = fr.geometric_ratios(toxic.tau, lagrange_factor(toxic.tau, 1 << log_n), fr_root_of_unity(log_n), 1,
                                  n_rows)
        t["lagrange"] = time.perf_counter() - t0
        cols = {}
        for name in ("a", "b", "c"):
            t0 = time.perf_counter()
            cols[name] = coded_sparse.rmatvec(getattr(data, name), data.table_mont, lag, counts.n_vars, tasks)
            t[f"column_sums_{name}"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        fr.add_scaled2_into(cols["c"], cols["a"], toxic.beta, cols["b"], toxic.alpha)
        t["combine"] = time.perf_counter() - t0
        t["qap_columns"] = sum(t.values())
        if _ > 0:
            best = {k: min(v, best.get(k, v)) for k, v in t.items()}
        del lag, cols
    data.close()
    return {"log_n": log_n, "tasks": tasks, "threads": numba.get_num_threads(), "reps": reps,
            "nnz": nnz,
            "best_wall_s": {k: round(v, 3) for k, v in best.items()}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--log-n", type=int, default=22)
    ap.add_argument("--tasks", type=int, default=None, help="column ranges of each product (default: threads)")
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--cache", type=Path, default=None)
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--label", default="run")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = run(args.log_n, args.tasks, args.reps, args.cache or Path(tmp))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
    tasks = f" --tasks {args.tasks}" if args.tasks else ""
    out.update(machine=f"{platform.machine()}, {os.cpu_count()} cores", commit=commit,
               command=f"NUMBA_NUM_THREADS={out['threads']} .venv/bin/python perf/setup_resident_qap.py "
                       f"--log-n {args.log_n}{tasks} --reps {args.reps}")
    print(json.dumps(out, indent=1))
    if args.json:
        doc = json.loads(args.json.read_text()) if args.json.exists() else {}
        doc[args.label] = out
        args.json.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
