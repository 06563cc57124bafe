"""Where the host time of the development setup goes: each host step of ``cuzk-mp setup`` for
the porep-like circuit, with the fixed-base calls stubbed out (they return zero rows of the
right shape), so what is timed is only what runs on the host before, between and after the
backend's fixed-base kernels. Also the r1cs generation, its write and read, ``write_zkey`` of the
in-memory key, and ``setup_file`` (read, set up and write, streamed where the code streams) as a whole.

Each size runs in a child process (a fresh heap: its peak RSS is its own), and ``setup_file`` in
another (``setup_file_peak_rss_gib``: what the command holds, r1cs included)::

    .venv/bin/python perf/setup_host.py [--log-n 18 20 22] [--label after]
        [--json perf/results/setup-host-cpu.json]

With ``--json`` the sizes' results go into the file under ``--label`` (other labels in the
file are kept, so one file holds the before and the after; with both labels ``before`` and
``after`` present, ``before_vs_after`` compares them), with the command, the machine,
the growth factor per doubling of each step (wall and CPU seconds) and the host time at 2^26
extrapolated two ways: by each step's last growth per doubling, and linearly from the largest size.
"""

from __future__ import annotations

import argparse
import functools
import json
import logging
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import psutil

STEPS = ("r1cs_generate", "r1cs_write", "r1cs_read", "lagrange", "column_sums_a", "column_sums_b",
         "column_sums_c", "qap_columns", "h_scalars", "coefs", "setup_total", "write_zkey", "setup_file")


class StubBackend:
    """Fixed-base calls that cost next to nothing: zero rows of the zkey layout's shape, written
    (not np.zeros' untouched pages), so that they take the host memory real points take."""

    def fixed_base_g1(self, base: object, scalars: np.ndarray) -> np.ndarray:
        return _zero_rows(scalars.shape[0], 12)

    def fixed_base_g2(self, base: object, scalars: np.ndarray) -> np.ndarray:
        return _zero_rows(scalars.shape[0], 24)


def _zero_rows(n: int, width: int) -> np.ndarray:
    out = np.empty((n, width), dtype=np.uint64)
    out.fill(0)
    return out


def _timed(times: dict[str, float], name: str, fn: Callable[[], Any]) -> Any:
    """``fn()``; its wall time into ``times[name]``, its CPU time (every thread of the process) into
    ``times[name + "_cpu"]``: the work done, which the other load on a shared machine blurs less."""
    t0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    times[name] = round(time.perf_counter() - t0, 3)
    times[name + "_cpu"] = round(time.process_time() - c0, 3)
    print(f"  {name}: {times[name]:.3f} s ({times[name + '_cpu']:.3f} s CPU)", file=sys.stderr, flush=True)
    return out


def one_size(log_n: int, work: Path) -> dict[str, Any]:
    """Every host step at 2^log_n but ``setup_file`` (run in a child process); leaves ``work/c.r1cs``."""
    from cuzk_mp.circuits.synthetic import PorepLike
    from cuzk_mp.formats.r1cs import read_r1cs, write_r1cs
    from cuzk_mp.formats.zkey import write_zkey
    from cuzk_mp.groth16 import setup as dev

    warm = PorepLike(10).r1cs()  # compile (or load) every kernel on a small circuit first
    with tempfile.TemporaryDirectory(prefix="setup-host-") as tmp:
        write_r1cs(Path(tmp) / "w.r1cs", warm)
        warm = read_r1cs(Path(tmp) / "w.r1cs")
        write_zkey(Path(tmp) / "w.zkey", dev.setup(warm, StubBackend(), toxic=dev.ToxicWaste(5, 7, 11, 13)))
        _lagrange(5, 10, 1000)
    times: dict[str, float] = {}
    print(f"2^{log_n}:", file=sys.stderr, flush=True)
    circuit = PorepLike(log_n)
    r1cs = _timed(times, "r1cs_generate", circuit.r1cs)
    toxic = dev.ToxicWaste.fresh(log_n)
    with tempfile.TemporaryDirectory(prefix="setup-host-") as tmp:
        path = work / "c.r1cs"
        _timed(times, "r1cs_write", lambda: write_r1cs(path, r1cs))
        del r1cs, circuit
        r1cs = _timed(times, "r1cs_read", lambda: read_r1cs(path))
        n_rows = r1cs.n_constraints + r1cs.n_public + 1
        lag = _timed(times, "lagrange", lambda: _lagrange(toxic.tau, log_n, n_rows))
        for m in "abc":
            _timed(times, f"column_sums_{m}", functools.partial(dev._column_sums, getattr(r1cs, m), lag))
        _timed(times, "qap_columns", lambda: dev._qap_columns(r1cs, toxic, log_n))
        _timed(times, "h_scalars", lambda: dev.h_scalars(toxic, log_n))
        _timed(times, "coefs", lambda: dev.snarkjs_coefs(r1cs))
        zkey = _timed(times, "setup_total", lambda: dev.setup(r1cs, StubBackend(), toxic=toxic))
        _timed(times, "write_zkey", functools.partial(write_zkey, Path(tmp) / "c.zkey", zkey))
        zkey_bytes = (Path(tmp) / "c.zkey").stat().st_size
    return {"log_n": log_n, "n_wires": int(r1cs.n_wires), "nnz": {m: int(getattr(r1cs, m).nnz) for m in "abc"},
            "zkey_bytes": zkey_bytes, "seconds": times,
            "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def _lagrange(tau: int, log_n: int, n_rows: int) -> np.ndarray:
    """The QAP's Lagrange values as the setup computes them: fused where ``fr.geometric_ratios`` exists
    (the code after), else powers then ``lagrange_values`` (before)."""
    from cuzk_mp.algebra import fr
    from cuzk_mp.algebra.field import fr_root_of_unity
    from cuzk_mp.groth16 import setup as dev

    n, w = 1 << log_n, fr_root_of_unity(log_n)
    if hasattr(fr, "geometric_ratios"):
        return fr.geometric_ratios(tau, dev.lagrange_factor(tau, n), w, 1, n_rows)
    return dev.lagrange_values(tau, n, fr.powers(w, n_rows))


def file_size(log_n: int, work: Path) -> dict[str, Any]:
    """``setup_file`` alone on ``work/c.r1cs`` (a fresh child process: the peak RSS is setup_file's)."""
    from cuzk_mp.groth16 import setup as dev

    times: dict[str, float] = {}
    print(f"2^{log_n} setup_file:", file=sys.stderr, flush=True)
    _timed(times, "setup_file", lambda: dev.setup_file(work / "c.r1cs", work / "f.zkey", StubBackend()))
    return {"seconds": times, "peak_rss_gib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)}


def growth(results: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Per step: t(2^(k+d)) / t(2^k) per doubling (d-th root when sizes skip), for consecutive sizes."""
    out: dict[str, list[float]] = {}
    for step in [s for step in STEPS for s in (step, step + "_cpu")]:
        ratios = []
        for lo, hi in zip(results, results[1:]):
            t0, t1 = lo["seconds"][step], hi["seconds"][step]
            if t0 > 0.005:
                ratios.append(round((t1 / t0) ** (1 / (hi["log_n"] - lo["log_n"])), 2))
        out[step] = ratios
    return out


def extrapolate(results: list[dict[str, Any]], log_n: int) -> dict[str, float]:
    """Each step at 2^log_n from the largest measured size times its last growth per doubling."""
    last, grow = results[-1], growth(results)
    k = log_n - last["log_n"]
    return {step: round(last["seconds"][step] * (grow[step][-1] if grow[step] else 2.0) ** k, 1) for step in grow}


def compare(doc: dict[str, Any], before: str = "before", after: str = "after") -> dict[str, Any]:
    """Per size and step: before / after seconds (wall and CPU), from two labels of one results file."""
    out: dict[str, Any] = {}
    sizes = {s["log_n"]: s for s in doc[before]["sizes"]}
    for s in doc[after]["sizes"]:
        b = sizes.get(s["log_n"])
        if b is None:
            continue
        out[f"2^{s['log_n']}"] = {
            step: {"before_s": b["seconds"][step], "after_s": s["seconds"][step],
                   "speedup_wall": round(b["seconds"][step] / max(s["seconds"][step], 1e-3), 2),
                   "speedup_cpu": round(b["seconds"][step + "_cpu"] / max(s["seconds"][step + "_cpu"], 1e-3), 2)}
            for step in STEPS if step in s["seconds"] and step in b["seconds"]}
        out[f"2^{s['log_n']}"]["setup_file_peak_rss_gib"] = {"before": b.get("setup_file_peak_rss_gib"),
                                                              "after": s.get("setup_file_peak_rss_gib")}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-n", type=int, nargs="+", default=[18, 20, 22])
    ap.add_argument("--label", default="current", help="the key the results go under in the JSON file")
    ap.add_argument("--json", help="write (merge) the results into this file")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)  # a child: one size, JSON on stdout
    ap.add_argument("--file", type=int, help=argparse.SUPPRESS)  # a child: setup_file at one size
    ap.add_argument("--work", help=argparse.SUPPRESS)  # the children's shared folder
    a = ap.parse_args()
    if a.one is not None or a.file is not None:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="    %(message)s")
        print(json.dumps(one_size(a.one, Path(a.work)) if a.one is not None else file_size(a.file, Path(a.work))))
        return
    results = []
    for log_n in a.log_n:
        with tempfile.TemporaryDirectory(prefix="setup-host-") as work:
            run_child = lambda *args: json.loads(subprocess.run(  # noqa: E731
                [sys.executable, __file__, *args, str(log_n), "--work", work], stdout=subprocess.PIPE,
                check=True).stdout)
            result = run_child("--one")
            whole = run_child("--file")
        result["seconds"].update(whole["seconds"])
        result["setup_file_peak_rss_gib"] = whole["peak_rss_gib"]
        results.append(result)
    run = {
        "command": "python perf/setup_host.py --log-n " + " ".join(map(str, a.log_n)) + f" --label {a.label}",
        "sizes": results,
        "growth_per_doubling": growth(results),
        "extrapolated_s_at_2^26": extrapolate(results, 26) if len(results) > 1 else None,
        "linear_s_at_2^26": {step: round(t * 2 ** (26 - results[-1]["log_n"]), 1)
                             for step, t in results[-1]["seconds"].items()},
        "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                    "numba_threads": os.environ.get("NUMBA_NUM_THREADS", str(os.cpu_count())),
                    "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
                    "load_avg_1m_at_end": os.getloadavg()[0]},
    }
    print(json.dumps(run, indent=1))
    if a.json:
        path = Path(a.json)
        doc = json.loads(path.read_text()) if path.exists() else {}
        doc.setdefault("what", "host steps of the development setup (fixed-base calls stubbed), porep-like circuit")
        doc[a.label] = run
        if "before" in doc and "after" in doc:
            doc["before_vs_after"] = compare(doc)
        path.write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
