"""Which start steps of a one-shot GPU process overlap: the CUDA context, CuPy's import, numpy's and the
prover's modules, alone, one after another and on threads as ``groth16 prove`` runs them.

:mod:`perf.oneshot_floor` times each step alone, one after another; the one-shot command runs them on
three threads (:mod:`cuzk_mp.backends.gpu.early_context`, the backend's start, the key and witness
reads). Whether the threads gain depends on what each step holds: the driver's calls through ctypes
release the GIL, Python's imports do not. Each variant runs in fresh processes; the times are seconds
from just before the parent started the child (the interpreter's start included), medians of ``--runs``.
``cupy_after_ctx`` holds CuPy's import (its many shared libraries' loads) until the context is made
while the main thread imports numpy and the prover's modules: whether the driver's start and the
library loads slow each other when they run together (``parallel``).

Usage: ``python3 perf/oneshot_start_probe.py [--runs 4] [--out FILE.json] [--env KEY=VALUE ...] [--zkey K
--wtns W] [--only V,V..]`` on a GPU machine; each ``--env`` runs the context alone, numpy's import, CuPy's
after it and (with a key) ``full`` again with that variable set: whether a library's own start (OpenBLAS's
thread pool) is part of an import's time, or what a driver setting (``CUDA_DEVICE_MAX_CONNECTIONS``: the
package's 32 against the driver's 8) costs the context. With a key and a witness the variant ``full``
follows the parallel imports with what the one-shot command does after them, serially: the GPU backend's
modules, its start, the key and witness reads and one proof (each kernel module's load timed).
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

from env_arg import env_variable  # perf/, the script's own folder

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
def backend_and_proof():  # after the imports, serially: what `groth16 prove` does once its backend thread has CuPy
    out["gpu_modules_start"] = now()
    import cuzk_mp.backends.gpu.modules as modules  # patched before any module that binds get_module imports
    loads = out.setdefault("module_loads", [])
    get_module = modules.get_module
    def timed(path, defines=None, root=None):
        t = time.time()
        mod = get_module(path, defines, root)
        loads.append([path, round(time.time() - t, 4)])
        return mod
    modules.get_module = timed
    from cuzk_mp.backends import get_backend
    from cuzk_mp.backends.gpu import backend as _backend  # noqa: F401
    out["gpu_modules_end"] = now()
    backend = get_backend("gpu")
    out["backend_end"] = now()
    from cuzk_mp.formats.wtns import read_wtns
    from cuzk_mp.formats.zkey import read_zkey
    from cuzk_mp.groth16.prover import prove
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator
    ev = ConstraintEvaluator.from_files(sys.argv[3], None)
    zkey = read_zkey(sys.argv[3], check_coefs=False)
    w = read_wtns(sys.argv[4])
    out["key_witness_end"] = now()
    prove(backend, zkey, w, evaluator=ev, r1cs=None, verify=True)
    out["prove_end"] = now()
def cupy_after_ctx():  # one side thread: the context, then CuPy's import (its libraries' loads)
    ctx()
    cupy_import()
variant = sys.argv[1]
threads = {"parallel": [ctx, cupy_import], "parallel_noours": [ctx, cupy_import], "parallel_no_ctx": [cupy_import],
           "full": [ctx, cupy_import], "cupy_after_ctx": [cupy_after_ctx]}
if variant in threads:
    ts = [threading.Thread(target=f) for f in threads[variant]]
    for t in ts:
        t.start()
    if variant != "parallel_noours":
        ours()
    for t in ts:
        t.join()
    if variant == "full":
        backend_and_proof()
else:
    for f in {"ctx_alone": [ctx], "cupy_alone": [cupy_import], "ctx_then_cupy": [ctx, cupy_import],
              "serial": [ours, cupy_import, ctx], "numpy_alone": [numpy_import],
              "numpy_then_cupy": [numpy_import, cupy_import]}[variant]:
        f()
out["end"] = now()
print(json.dumps(out))
"""

VARIANTS = ("ctx_alone", "cupy_alone", "ctx_then_cupy", "serial", "parallel", "parallel_noours", "parallel_no_ctx",
            "cupy_after_ctx", "numpy_alone", "numpy_then_cupy")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=4)
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--zkey", type=Path, default=None,
                    help="with --wtns: also the variant 'full' (the parallel imports, then serially the GPU "
                         "backend's modules, its start, the key and witness reads and one proof, each kernel "
                         "module's load timed)")
    ap.add_argument("--wtns", type=Path, default=None)
    ap.add_argument("--only", default=None, help="comma-separated variants to run (default: all)")
    ap.add_argument("--env", action="append", default=[], metavar="KEY=VALUE", type=env_variable,
                    help="also run the context alone, the numpy and CuPy imports and (with --zkey) full with this "
                         "variable set (repeatable: one run each)")
    args = ap.parse_args()
    result: dict[str, dict[str, Any]] = {}
    if (args.zkey is None) != (args.wtns is None):
        ap.error("--zkey and --wtns go together")
    variants = VARIANTS + (("full",) if args.zkey else ())
    if args.only:
        only = args.only.split(",")
        unknown = sorted(set(only) - set(VARIANTS + ("full",)))
        if unknown:
            ap.error(f"--only: no variant {unknown} ({', '.join(VARIANTS)}, full)")
        if "full" in only and not args.zkey:
            ap.error("--only full needs --zkey and --wtns")
        variants = tuple(v for v in variants if v in only)
    plan: list[tuple[str, dict[str, str]]] = [(variant, {}) for variant in variants]
    with_env = ("ctx_alone", "numpy_alone", "numpy_then_cupy") + (("full",) if args.zkey else ())
    plan += [(f"{variant} {name}={value}", {name: value}) for name, value in args.env for variant in with_env]
    for variant, env in plan:
        runs = []
        for _ in range(args.runs):
            extra = [str(args.zkey), str(args.wtns)] if variant.split()[0] == "full" else []
            p = subprocess.run([sys.executable, "-c", CHILD, variant.split()[0], repr(time.time()), *extra],
                               capture_output=True, text=True, cwd=ROOT, env={**os.environ, **env})
            if p.returncode != 0:
                print(f"{variant}: failed\n{p.stderr[-2000:]}", file=sys.stderr)
                return 1
            runs.append(json.loads(p.stdout.strip().splitlines()[-1]))
        result[variant] = {k: round(statistics.median(r[k] for r in runs), 3) for k in runs[0] if k != "module_loads"}
        if "module_loads" in runs[0]:  # each kernel module's load, median over the runs
            loads = [[path, round(statistics.median(r["module_loads"][i][1] for r in runs), 4)]
                     for i, (path, _) in enumerate(runs[0]["module_loads"])]
            result[variant]["module_loads"] = loads
        print(variant, json.dumps(result[variant]), flush=True)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
