#!/usr/bin/env python3
"""Time of setting a circom circuit's input values (``wtns calculate``, ``fullprove``), per value.

Compiles (circom2 from tools/node_modules, cached in .cache/perf-circom-inputs) a circuit of one input
array ``a[N]`` whose witness is one product (``s <== a[0] * a[N-1]``), so that a witness costs little
beyond setting its N inputs, and runs :meth:`WitnessCalculator.calculate` on N values of each shape:
``packed`` (random field elements as PackedValues: what a JSON array of decimal strings reads as),
``int64`` (random numbers below 2^53, negative ones too: what a JSON array of numbers reads as),
``list`` (a Python list of random field elements). The time inside ``_set_signal`` (every value of
one signal set) is ``set_s``; the rest of ``calculate`` (instance, init, reading the witness) is
``rest_s``. ``--label`` names the run in the ``--out`` file, which keeps the other labels' runs: the
code before a change (run there) beside the code after it.

    python3 perf/circom_inputs.py --values 65536,2621440 --label after \
        --out perf/results/circom-inputs-cpu.json
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from cuzk_mp.algebra.field import R_MOD  # noqa: E402
from cuzk_mp.circuits import circom  # noqa: E402
from cuzk_mp.circuits.circom_values import PackedValues, _limbs  # noqa: E402
from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402

SHAPES = ("packed", "int64", "list")
CACHE = REPO / ".cache" / "perf-circom-inputs"


def circuit(n: int) -> Path:
    """The wasm of ``a[n]`` -> ``a[0] * a[n-1]``, compiled once."""
    wasm = CACHE / f"big{n}_js" / f"big{n}.wasm"
    if not wasm.exists():
        CACHE.mkdir(parents=True, exist_ok=True)
        src = CACHE / f"big{n}.circom"
        src.write_text("pragma circom 2.0.0;\ntemplate Big(N) { signal input a[N]; signal output s; "
                       f"s <== a[0] * a[N - 1]; }}\ncomponent main = Big({n});\n")
        subprocess.run(["node", str(REPO / "tools" / "node_modules" / "circom2" / "cli.js"), str(src),
                        "--wasm", "--O2", "-p", "bls12381", "-o", str(CACHE)],
                       check=True, stdout=subprocess.DEVNULL)
    return wasm


def values(shape: str, n: int, rng: random.Random) -> Any:
    """``n`` input values of ``shape``."""
    if shape == "packed":
        return PackedValues(_limbs([rng.randrange(R_MOD) for _ in range(n)]))
    if shape == "int64":
        return np.array([rng.randrange(-(2**53) + 1, 2**53) for _ in range(n)], dtype=np.int64)
    return [rng.randrange(R_MOD) for _ in range(n)]


def measure(n: int, shape: str) -> dict[str, float]:
    """One witness of ``n`` values of ``shape``: seconds setting them, seconds in the rest."""
    calc = circom.WitnessCalculator(circuit(n))
    inputs = {"a": values(shape, n, random.Random(n))}
    spent = [0.0]
    set_signal = circom.WitnessCalculator._set_signal

    def timed(self: Any, *args: Any) -> int:
        t = time.perf_counter()
        try:
            return set_signal(self, *args)
        finally:
            spent[0] += time.perf_counter() - t

    circom.WitnessCalculator._set_signal = timed  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        calc.calculate(inputs)
        total = time.perf_counter() - t0
    finally:
        circom.WitnessCalculator._set_signal = set_signal  # type: ignore[method-assign]
    return {"values": n, "set_s": round(spent[0], 4), "rest_s": round(total - spent[0], 4),
            "set_us_per_value": round(spent[0] / n * 1e6, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--values", default="65536,1048576", help="input sizes, comma-separated")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--label", default="run")
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    run: dict[str, Any] = {"commit": commit, "date": time.strftime("%Y-%m-%d"),
                           "command": "python3 " + " ".join([f"perf/{Path(__file__).name}", *sys.argv[1:]])}
    for n in map(int, args.values.split(",")):
        for shape in args.shapes.split(","):
            run[f"{shape}_{n}"] = result = measure(n, shape)
            print(shape, result, flush=True)
    if args.out:
        doc = json.loads(args.out.read_text()) if args.out.exists() else {}
        doc.setdefault("machine", machine_info([]))
        doc[args.label] = run
        args.out.write_text(json.dumps(doc, indent=1) + "\n")



if __name__ == "__main__":
    main()
