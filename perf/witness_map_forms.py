"""The CPU witness map's kernel in other forms against the shipped one: compile time and evaluation time.

A form is a file standing in for ``cuzk_mp/algebra/coded_sparse_kernels.py`` (the shipped module with a
change: ``git show HEAD:cuzk_mp/algebra/coded_sparse_kernels.py > form.py``, edit). Each form is loaded
as a sibling module of the shipped one (its relative imports resolve in ``cuzk_mp.algebra``), and for
each the script times the first ``evaluate_into`` call (numba compiles the kernel there when its cache
has none: run with ``NUMBA_CACHE_DIR`` set to an empty folder to time the compile), checks that a, b, c
equal the shipped module's, then runs the evaluations round by round, the forms in alternating order, at
1 and 2 threads, without (abc) and with (abc+check) the r1cs's C rows. The circuit is
``perf/synthesis_bench.py``'s (its work folder's synthesis-only key). Medians and minima, ms:

    NUMBA_CACHE_DIR=$(mktemp -d) .venv/bin/python perf/witness_map_forms.py --log-n 20 --rounds 21 \\
        --form loop=loop.py --out result.json
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "perf"))


def load_form(name: str, path: Path) -> ModuleType:
    """``path`` as the module ``cuzk_mp.algebra._form_<name>`` (relative imports as the shipped module's)."""
    spec = importlib.util.spec_from_file_location(f"cuzk_mp.algebra._form_{name}", path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-n", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--form", action="append", default=[], metavar="NAME=FILE", help="a form to compare (repeat)")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep the key and caches here (default: a temp dir)")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="cuzk-witness-map-forms-") as tmp:
        return run(args, args.work_dir or Path(tmp))


def run(args: argparse.Namespace, work: Path) -> int:
    """Load the forms, check them against the shipped kernel, time them (see the module docstring)."""

    from synthesis_bench import Slot, circuit_files

    from cuzk_mp.algebra import coded_sparse, coded_sparse_kernels
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator

    work.mkdir(parents=True, exist_ok=True)
    zkey, r1cs, _ = circuit_files("porep-like", args.log_n, work)
    checked = ConstraintEvaluator.from_files(str(zkey), str(r1cs), cache_dir=str(work / "circuit-data"))
    plain = ConstraintEvaluator.from_files(str(zkey), None, cache_dir=str(work / "circuit-data"))
    slot = Slot(checked.n_vars, checked.domain_size)
    synthetic_circuit("porep-like", args.log_n).witness_into(1, 0, slot.w)

    forms: dict[str, ModuleType] = {"shipped": coded_sparse_kernels}
    for spec in args.form:
        name, _, path = spec.partition("=")
        forms[name] = load_form(name, Path(path))
    result: dict[str, Any] = {"log_n": args.log_n, "rounds": args.rounds, "first_call_s": {}, "ms": {}}
    reference = None
    try:
        for name, mod in forms.items():
            coded_sparse._k = lambda mod=mod: mod  # type: ignore[assignment]
            t0 = time.perf_counter()
            checked.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=1)
            result["first_call_s"][name] = round(time.perf_counter() - t0, 2)
            out = (slot.a.copy(), slot.b.copy(), slot.c.copy())
            if reference is None:
                reference = out
            elif not all(np.array_equal(x, y) for x, y in zip(reference, out)):
                print(f"form {name}: a, b, c differ from the shipped kernel's", file=sys.stderr)
                return 1
            print(f"{name}: first call {result['first_call_s'][name]} s, outputs checked", flush=True)
        times: dict[tuple[str, int, str], list[float]] = {}
        names = list(forms)
        for i in range(args.rounds):
            for name in names if i % 2 == 0 else names[::-1]:
                coded_sparse._k = lambda mod=forms[name]: mod  # type: ignore[assignment]
                for threads in (1, 2):
                    for what, ev in (("abc", plain), ("abc+check", checked)):
                        t0 = time.perf_counter()
                        ev.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=threads)
                        times.setdefault((what, threads, name), []).append(time.perf_counter() - t0)
    finally:
        coded_sparse._k = lambda: coded_sparse_kernels  # type: ignore[assignment]
    print(f"{'what':<10} {'thr':>3} {'form':<10} {'median ms':>10} {'min ms':>8}")
    for (what, threads, name), ts in sorted(times.items()):
        med, low = statistics.median(ts) * 1e3, min(ts) * 1e3
        result["ms"][f"{what}, {threads} thread(s), {name}"] = {"median": round(med, 1), "min": round(low, 1)}
        print(f"{what:<10} {threads:>3} {name:<10} {med:>10.1f} {low:>8.1f}")
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
