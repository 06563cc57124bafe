#!/usr/bin/env python3
"""Peak memory and time of reading a large circom input JSON (``wtns calculate``, ``fullprove``).

Generates input files of the given sizes (MiB) in three shapes: ``strings`` (one array of decimal
strings of random field elements, what a large input usually is), ``mixed`` (a 2-D array of decimal
strings, an array of hex strings and one of plain numbers below 2^32, a few scalars) and
``numbers`` (one array of plain JSON numbers below 2^32). Each is read by
:func:`cuzk_mp.circuits.circom.load_input_json` in a fresh process, twice: once for the peak
resident set (VmHWM, reset after the imports, less the resident set before the read) and the wall
time, once under tracemalloc for the peak of Python's own allocations. Each peak is also given as a
multiple of the file's size. ``--label`` names the run in the ``--out`` file, which keeps the other
labels' runs: the code before a change (run there) beside the code after it.

    python3 perf/input_json_memory.py --sizes 16,64,200 --label after \
        --out perf/results/input-json-memory-cpu.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from cuzk_mp.algebra.field import R_MOD  # noqa: E402
from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402

SHAPES = ("strings", "mixed", "numbers")

# Run in a fresh process: what one read of the file costs (argv: path, "rss" or "tracemalloc").
_PROBE = r"""
import resource, sys, time
from cuzk_mp.circuits.circom import load_input_json
path, how = sys.argv[1], sys.argv[2]

def rss():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize()

def peak_rss():  # VmHWM: the mm's own peak (ru_maxrss can carry the parent's over fork and exec)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

if how == "tracemalloc":
    import tracemalloc
    tracemalloc.start()
    kept = load_input_json(path)
    current, peak = tracemalloc.get_traced_memory()
    print(peak, current)
else:
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # the peak so far (the imports') is forgotten: VmHWM starts at the current RSS
    before = rss()
    t0 = time.perf_counter()
    kept = load_input_json(path)
    seconds = time.perf_counter() - t0
    print(peak_rss() - before, rss() - before, seconds)
"""


def _write_values(f: TextIO, values: Iterable[str]) -> None:
    f.write("[")
    for i, v in enumerate(values):
        f.write(("," if i else "") + v)
    f.write("]")


def generate(path: Path, shape: str, mib: int, seed: int = 20261201) -> None:
    """An input file of ``shape`` of about ``mib`` MiB (within one value's length)."""
    rng = random.Random(seed)
    target = mib << 20

    def field_strings(nbytes: int) -> Iterator[str]:
        n = 0
        while n < nbytes:
            s = f'"{rng.getrandbits(255) % R_MOD}"'
            n += len(s) + 1
            yield s

    def numbers(nbytes: int) -> Iterator[str]:
        n = 0
        while n < nbytes:
            s = str(rng.getrandbits(32))
            n += len(s) + 1
            yield s

    with open(path, "w") as f:
        if shape == "strings":
            f.write('{"a": ')
            _write_values(f, field_strings(target))
        elif shape == "numbers":
            f.write('{"a": ')
            _write_values(f, numbers(target))
        else:
            f.write('{"x": "7", "y": 12, "rows": [')
            rows = list(field_strings(target // 2))
            for i in range(0, len(rows), 1000):
                f.write(("," if i else "") + "[" + ",".join(rows[i:i + 1000]) + "]")
            f.write('], "hex": ')
            _write_values(f, (f'"{hex(rng.getrandbits(250))}"' for _ in range(target // 4 // 66)))
            f.write(', "small": ')
            _write_values(f, numbers(target // 4))
        f.write("}")


def probe(path: Path, how: str) -> list[float]:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c", _PROBE, str(path), how], env=env, check=True,
                         capture_output=True, text=True).stdout
    return [float(x) for x in out.split()]


def measure(folder: Path, shape: str, mib: int) -> dict[str, float]:
    path = folder / f"{shape}-{mib}.json"
    generate(path, shape, mib)
    size = path.stat().st_size
    peak_rss, kept_rss, seconds = probe(path, "rss")
    peak_py, kept_py = probe(path, "tracemalloc")
    path.unlink()
    return {"file_bytes": size, "seconds": round(seconds, 3),
            "peak_rss_bytes": int(peak_rss), "peak_rss_x_file": round(peak_rss / size, 2),
            "kept_rss_bytes": int(kept_rss),
            "peak_tracemalloc_bytes": int(peak_py), "peak_tracemalloc_x_file": round(peak_py / size, 2),
            "kept_tracemalloc_bytes": int(kept_py), "kept_tracemalloc_x_file": round(kept_py / size, 2)}



def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64,200", help="file sizes, MiB, comma-separated")
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"among {','.join(SHAPES)}")
    ap.add_argument("--label", default="run", help="the name of this run in the --out file")
    ap.add_argument("--out", type=Path, help="write the results (JSON) here too, beside its other labels' runs")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    run: dict[str, object] = {"commit": commit, "date": time.strftime("%Y-%m-%d"),
                              "command": "python3 perf/input_json_memory.py " + " ".join(sys.argv[1:])}
    with tempfile.TemporaryDirectory() as d:
        for shape in args.shapes.split(","):
            for mib in sizes:
                row = measure(Path(d), shape, mib)
                run[f"{shape}_{mib}MiB"] = row
                print(f"{shape:8} {mib:4} MiB: peak RSS {row['peak_rss_x_file']:5.2f}x, tracemalloc "
                      f"{row['peak_tracemalloc_x_file']:5.2f}x (kept {row['kept_tracemalloc_x_file']:.2f}x), "
                      f"{row['seconds']:.2f} s", flush=True)
    if args.out:
        results = json.loads(args.out.read_text()) if args.out.exists() else {}
        results.update({
            "what": "peak memory and wall time of load_input_json on generated input files, as multiples of "
                    "the file's size (peak RSS: VmHWM after the imports; tracemalloc: Python's allocations)",
            "machine": machine_info([])})
        results[args.label] = run
        args.out.write_text(json.dumps(results, indent=1) + "\n")

if __name__ == "__main__":
    main()
