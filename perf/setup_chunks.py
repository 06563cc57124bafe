"""How the development setup's chunk size costs: 2^N fixed-base G1 rows in one backend call
against the same rows in chunks (each call rebuilds its window table), full-width scalars,
CPU backend. The chunk is the unit of setup's progress, so it should be as small as costs
nothing measurable::

    .venv/bin/python perf/setup_chunks.py [--log-n 20] [--repeat 2] [--json perf/results/setup-chunks-cpu.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np
import psutil
from py_arkworks_bls12381 import G1Point

from cuzk_mp.algebra import fr
from cuzk_mp.algebra.field import R_MOD
from cuzk_mp.backends.cpu import CpuBackend


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-n", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", help="write the result here")
    a = ap.parse_args()
    n = 1 << a.log_n
    rng = np.random.default_rng(20261201)
    scalars = fr.from_ints([int.from_bytes(rng.bytes(32), "little") % R_MOD for _ in range(n)], mont=False)
    backend = CpuBackend()
    backend.fixed_base_g1(G1Point(), scalars[:1024])  # compile
    chunks = [n >> k for k in range(0, 4)]
    times: dict[str, list[float]] = {str(c): [] for c in chunks}
    for _ in range(a.repeat):
        for c in chunks:  # interleaved, so that load on the machine hits every size alike
            t0 = time.perf_counter()
            for lo in range(0, n, c):
                backend.fixed_base_g1(G1Point(), np.ascontiguousarray(scalars[lo : lo + c]))
            times[str(c)].append(time.perf_counter() - t0)
            print(f"2^{a.log_n} rows in chunks of {c}: {times[str(c)][-1]:.2f} s", flush=True)
    result = {
        "what": f"2^{a.log_n} fixed-base G1 rows (full-width scalars), CPU backend, by chunk size",
        "command": f"python perf/setup_chunks.py --log-n {a.log_n} --repeat {a.repeat}",
        "seconds_by_chunk_rows": times,
        "min_s_by_chunk_rows": {c: min(v) for c, v in times.items()},
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                    "load_avg_1m_at_end": os.getloadavg()[0]},
    }
    if a.json:
        with open(a.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
