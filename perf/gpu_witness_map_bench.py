"""The device witness map (cuzk_mp.backends.gpu.witness_map) alone: CUDA-event time of one
launch over a synthetic circuit's coded rows, the entries it reads and the bytes it moves, and its
output checked against the host's map (cuzk_mp.algebra.coded_sparse.evaluate_rows_into).

Why: in the pipeline the map of the next partition runs on the device beside the current one's
MSMs, so its kernel time adds to every partition's device time.

    python3 perf/gpu_witness_map_bench.py [--kind porep-like] [--log-n 24] [--reps 5]
        [--variants shipped,batch2,s32,...] [--json OUT]

A variant is the kernel's knobs: ``batchB`` sets WM_BATCH=B (entries read ahead per thread), ``_sS``
the long rows' threshold S (e.g. batch4_s32); ``shipped`` the defaults.
Each variant's output is checked against the host's map; the variants are timed in turn, rep by rep.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cuzk_mp.algebra.coded_sparse import evaluate_rows_into  # noqa: E402
from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit  # noqa: E402
from cuzk_mp.pipeline.keys import ensure_synthetic_circuit_data, open_device_circuit_data  # noqa: E402


def bytes_moved(rows: object, n: int) -> int:
    """What one launch must read and write at least: row pointers, columns and codes of A and B,
    one 32-byte witness row per entry, and a, b, c."""
    total = 0
    for m in (rows.a, rows.b):  # type: ignore[attr-defined]
        nnz = int(m.cols.shape[0])
        total += m.indptr.nbytes + nnz * (m.cols.itemsize + m.codes.itemsize + 32)
    return total + 3 * 32 * n


def knobs_of(variant: str) -> tuple[dict[str, int] | None, int]:
    """The -D knobs and the long rows' threshold a variant name stands for (module docstring)."""
    from cuzk_mp.backends.gpu.witness_map import SHORT_MAX

    if variant == "shipped":
        return None, SHORT_MAX
    out: dict[str, int] = {}
    short_max = SHORT_MAX
    for part in variant.split("_"):
        if part.startswith("batch"):
            out["WM_BATCH"] = int(part[5:])
        elif part.startswith("s"):
            short_max = int(part[1:])
        else:
            raise ValueError(f"variant {variant!r}: parts batchB, sS")
    return out or None, short_max


def run(kind: str, log_n: int, reps: int, cache: Path, variants: list[str]) -> list[dict[str, object]]:
    import cupy

    from cuzk_mp.backends.gpu.witness_map import DeviceWitnessMap, LongRows

    n = 1 << log_n
    t0 = time.perf_counter()
    path = ensure_synthetic_circuit_data(kind, log_n, cache)
    rows = open_device_circuit_data(path, kind, log_n)
    build_s = time.perf_counter() - t0
    w = synthetic_circuit(kind, log_n).witness(1, 0)
    maps = {}
    for v in variants:
        defines, short_max = knobs_of(v)
        long = LongRows.of(rows.a, rows.b, short_max)
        maps[v] = DeviceWitnessMap(rows.a, rows.b, rows.table_mont, rows.table_r2, n, long, defines)
    d_w = cupy.asarray(w)
    out = [cupy.empty((n, 4), dtype=np.uint64) for _ in range(3)]
    host = [np.empty((n, 4), dtype=np.uint64) for _ in range(3)]
    evaluate_rows_into(rows.a, rows.b, None, rows.table_mont, rows.table_r2, w, host[0], host[1], host[2])
    ok = {}
    for v, dmap in maps.items():
        for o in out:
            o.fill(7)  # garbage: every row must be written
        dmap.run(d_w, *out)
        ok[v] = all(bool(np.array_equal(cupy.asnumpy(d), h)) for d, h in zip(out, host))
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(reps):
        for v, dmap in maps.items():
            ev = [cupy.cuda.Event() for _ in range(2)]
            ev[0].record()
            dmap.run(d_w, *out)
            ev[1].record()
            ev[1].synchronize()
            times[v].append(float(cupy.cuda.get_elapsed_time(ev[0], ev[1])))
    moved = bytes_moved(rows, n)
    nnz = {s: int(getattr(rows, s).cols.shape[0]) for s in "ab"}
    for dmap in maps.values():
        dmap.close()
    return [{"kind": kind, "log_n": log_n, "variant": v, "ms": statistics.median(times[v]), "runs_ms": times[v],
             "ok": ok[v], "nnz": nnz, "bytes_min": moved, "gb_per_s": moved / statistics.median(times[v]) / 1e6,
             "circuit_data_s": build_s} for v in variants]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kind", default="porep-like")
    ap.add_argument("--log-n", type=int, nargs="+", default=[24])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--variants", default="shipped", help="comma list of shipped, batchB[_mbK]")
    ap.add_argument("--cache", type=Path, default=None, help="circuit data folder (default: a temporary one)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import cupy

    props = cupy.cuda.runtime.getDeviceProperties(0)
    with tempfile.TemporaryDirectory() as tmp:
        variants = args.variants.split(",")
        rows = [r for lg in args.log_n for r in run(args.kind, lg, args.reps, args.cache or Path(tmp), variants)]
    print(f"{'kind':<12} {'log_n':>5} {'variant':<14} {'ms':>8} {'GB/s':>7} {'nnz a':>11} {'nnz b':>11} ok")
    for r in rows:
        print(f"{r['kind']:<12} {r['log_n']:>5} {r['variant']:<14} {r['ms']:>8.2f} {r['gb_per_s']:>7.0f} "
              f"{r['nnz']['a']:>11} {r['nnz']['b']:>11} {r['ok']}")  # type: ignore[index]
    if args.json:
        command = "python3 perf/gpu_witness_map_bench.py " + " ".join(sys.argv[1:])
        out = {"what": __doc__.splitlines()[0], "command": command,
               "machine": {"gpu": props["name"].decode(), "python": platform.python_version()}, "rows": rows}
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
