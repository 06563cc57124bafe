"""Which start steps of a one-shot GPU process overlap: the CUDA context, CuPy's import, numpy's and the
prover's modules, alone, one after another and on threads as ``groth16 prove`` runs them.

:mod:`perf.oneshot_floor` times each step alone, one after another; the one-shot command runs them on
three threads (:mod:`cuzk_mp.backends.gpu.early_context`, the backend's start, the key and witness
reads). Whether the threads gain depends on what each step holds: the driver's calls through ctypes
release the GIL, Python's imports do not. Each variant runs in fresh processes; the times are seconds
from just before the parent started the child (the interpreter's start included), medians of ``--runs``.

Usage: ``python3 perf/oneshot_start_probe.py [--runs 4] [--out FILE.json] [--env KEY=VALUE ...]`` on a GPU
machine; each ``--env`` runs numpy's import, and CuPy's after it, again with that variable set (whether a
library's own start, OpenBLAS's thread pool for one, is part of the import's time).
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

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import ctypes, json, sys, threading, time
T0 = float(sys.argv[2])
out = {"interp": time.time() - T0}
def now():
    return round(time.time() - T0, 4)
def ctx():  # what early_context does: the driver's calls, GIL released
    out["ctx_start"] = now()
    lib = ctypes.CDLL("libcuda.so.1")
    lib.cuInit(0)
    out["ctx_init"] = now()
    dev, c = ctypes.c_int(), ctypes.c_void_p()
    lib.cuDeviceGet(ctypes.byref(dev), 0)
    lib.cuDevicePrimaryCtxRetain(ctypes.byref(c), dev)
    out["ctx_end"] = now()
def numpy_import():
    out["numpy_start"] = now()
    import numpy  # noqa: F401
    out["numpy_end"] = now()
def cupy_import():
    out["cupy_start"] = now()
    import cupy  # noqa: F401
    out["cupy_end"] = now()
def ours():  # the main thread's imports in groth16 prove
    out["ours_start"] = now()
    import numpy  # noqa: F401
    out["numpy_end"] = now()
    from cuzk_mp.formats.r1cs import read_r1cs  # noqa: F401
    from cuzk_mp.formats.wtns import read_wtns  # noqa: F401
    from cuzk_mp.formats.zkey import read_zkey  # noqa: F401
    from cuzk_mp.groth16.prover import prove  # noqa: F401
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator  # noqa: F401
    out["ours_end"] = now()
variant = sys.argv[1]
threads = {"parallel": [ctx, cupy_import], "parallel_noours": [ctx, cupy_import], "parallel_no_ctx": [cupy_import]}
if variant in threads:
    ts = [threading.Thread(target=f) for f in threads[variant]]
    for t in ts:
        t.start()
    if variant != "parallel_noours":
        ours()
    for t in ts:
        t.join()
else:
    for f in {"ctx_alone": [ctx], "cupy_alone": [cupy_import], "ctx_then_cupy": [ctx, cupy_import],
              "serial": [ours, cupy_import, ctx], "numpy_alone": [numpy_import],
              "numpy_then_cupy": [numpy_import, cupy_import]}[variant]:
        f()
out["end"] = now()
print(json.dumps(out))
"""

VARIANTS = ("ctx_alone", "cupy_alone", "ctx_then_cupy", "serial", "parallel", "parallel_noours", "parallel_no_ctx",
            "numpy_alone", "numpy_then_cupy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE",
                    help="also run the numpy and CuPy imports with this variable set (repeatable: one run each)")
    args = ap.parse_args()
    result: dict[str, dict[str, float]] = {}
    plan = [(variant, {}) for variant in VARIANTS]
    plan += [(f"{variant} {kv}", dict([kv.split("=", 1)])) for kv in args.env
             for variant in ("numpy_alone", "numpy_then_cupy")]
    for variant, env in plan:
        runs = []
        for _ in range(args.runs):
            p = subprocess.run([sys.executable, "-c", CHILD, variant.split()[0], repr(time.time())],
                               capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})
            if p.returncode != 0:
                print(f"{variant}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        result[variant] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0]}
        print(variant, json.dumps(result[variant]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
