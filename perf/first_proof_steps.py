"""Where a one-shot's first proof goes: each step of a fresh process's first proofs, to a device synchronize.

``perf/key_load_probe.py`` reads the steps of whole ``prove`` calls from the prover's log; this one calls
the steps itself, as ``prove`` does for a key loaded for one proof, and ends each with a device
synchronize, so a step's figure is its own: the backend's start, the circuit data, the key load (with
the circuit's coded rows, as ``prove`` passes them, unless ``--no-rows``), the witness check, the key's
header points and prepared verification key, then per proof ``stage_witness``, ``prove_start`` (the
device step), ``release`` and ``prove_finalize``. ``--pool-first BYTES`` first has CuPy's memory pool
take that many bytes in one block (kept idle in the pool), before the key load. Env variables such as
``CUZK_GPU_MSM_GRAPHS=0`` reach the backend as usual.

Usage (a GPU machine, one fresh process a run): ``python3 perf/first_proof_steps.py --zkey K --wtns W
[--proofs 3] [--pool-first BYTES] [--no-rows]``; prints one JSON line of milliseconds (``stage1``,
``device1``, ... for each proof).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

T = TypeVar("T")


def main() -> None:
    t_start = time.perf_counter()
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--zkey", type=Path, required=True)
    ap.add_argument("--wtns", type=Path, required=True)
    ap.add_argument("--proofs", type=int, default=3)
    ap.add_argument("--pool-first", type=int, default=0, metavar="BYTES")
    ap.add_argument("--no-rows", action="store_true", help="load the key without the circuit's coded rows")
    args = ap.parse_args()

    import cupy

    from cuzk_mp.backends import get_backend
    from cuzk_mp.backends.gpu import memory
    from cuzk_mp.formats.wtns import read_wtns
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16 import prover
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator

    out: dict[str, Any] = {"graphs": os.environ.get("CUZK_GPU_MSM_GRAPHS", "1"), "pool_first": args.pool_first,
                           "rows": not args.no_rows}

    def step(name: str, fn: Callable[[], T]) -> T:
        t = time.perf_counter()
        r = fn()
        cupy.cuda.Device().synchronize()
        out[name] = round(1e3 * (time.perf_counter() - t), 2)
        return r

    backend = step("backend", lambda: get_backend("gpu"))
    ev = step("evaluator", lambda: ConstraintEvaluator.from_files(str(args.zkey), None))
    zkey = read_zkey(args.zkey, check_coefs=False)
    w = read_wtns(args.wtns)
    if args.pool_first:
        step("pool_first", lambda: memory.grow_pool(args.pool_first))
    rows = None if args.no_rows else ev.data
    key = step("load_key", lambda: backend.load_key(zkey, lasting=False, witness_rows=rows))
    try:
        w = step("validate", lambda: ev.validate_witness(w))
        step("header_pvk", lambda: (prover.header_points(zkey), prover.prepared_vk_of(zkey)))
        public = prover.public_signals(w, zkey.n_public)
        for i in range(1, args.proofs + 1):
            staged = step(f"stage{i}", lambda: backend.stage_witness(key, ev.data, w))
            sums = step(f"device{i}", lambda: prover.prove_start(backend, key, staged, zkey.n_public))
            step(f"release{i}", lambda: backend.release(staged))
            step(f"finalize{i}", lambda: prover.prove_finalize(zkey, sums, public, verify=True))
    finally:
        key.close()
    out["total"] = round(1e3 * (time.perf_counter() - t_start), 1)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
