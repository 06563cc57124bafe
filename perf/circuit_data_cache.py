#!/usr/bin/env python3
"""What the one-shot prove saves by keeping a key's coded rows (the shared circuit-data cache).

``cuzk-mp groth16 prove`` maps the key's coded A, B rows from ``KEY.zkey.synth-ab`` (built by the
first proof) instead of building them from the key's coefficient section every proof. Per size of
the PoRep-like dev key (made once in the cache folder): the in-memory build a proof without the
cache pays (``build_in_memory_ms``), the first proof's cache build (``cache_build_ms``) and a later
proof's mapping (``cache_open_ms``); medians of ``--reps`` after one warm-up build (numba's compile
is not counted). Host only: no GPU involved.

    python3 perf/circuit_data_cache.py --sizes 16,20 --out perf/results/circuit-data-cache-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cuzk_mp.formats.zkey import read_zkey  # noqa: E402
from cuzk_mp.groth16.circuit_data import build_in_memory  # noqa: E402
from cuzk_mp.groth16.synthesis import ConstraintEvaluator  # noqa: E402
from cuzk_mp.paths import default_cache_dir  # noqa: E402
from cuzk_mp.pipeline.keys import ensure_synthetic_key  # noqa: E402


def _ms(fn: Callable[[], object]) -> float:
    t0 = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t0)


def rows_for(lg: int, reps: int) -> dict[str, float]:
    """The three timings of the porep-like 2^lg key, ms."""
    zpath = ensure_synthetic_key("porep-like", lg, default_cache_dir())[0]
    zkey = read_zkey(zpath)
    build_in_memory(zkey)  # warm-up: numba's kernels compiled or loaded
    build = [_ms(lambda: build_in_memory(zkey)) for _ in range(reps)]
    made, opened = [], []
    for _ in range(reps):
        with tempfile.TemporaryDirectory() as d:
            made.append(_ms(lambda: ConstraintEvaluator.from_files(os.fspath(zpath), None, cache_dir=d)))
            opened.append(_ms(lambda: ConstraintEvaluator.from_files(os.fspath(zpath), None, cache_dir=d)))
    zkey.close()
    return {f"build_in_memory_2^{lg}_ms": statistics.median(build), f"cache_build_2^{lg}_ms": statistics.median(made),
            f"cache_open_2^{lg}_ms": statistics.median(opened)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="16,20", help="log2 domain sizes of the porep-like key")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="write the rows as JSON here")
    args = ap.parse_args()
    rows: dict[str, object] = {
        "command": f"python3 perf/circuit_data_cache.py --sizes {args.sizes} --reps {args.reps}",
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "python": platform.python_version(), "gpu": "none (host only)"},
    }
    for lg in map(int, args.sizes.split(",")):
        rows.update(rows_for(lg, args.reps))
    text = json.dumps(rows, indent=1)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
