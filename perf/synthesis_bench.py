"""Synthesis cost of one partition: witness, a/b/c, witness check, in core-seconds, per thread count.

For each size it makes the synthetic circuit's .r1cs and a synthesis-only .zkey (its coefficient
section is what snarkjs's setup writes; every point is zero, no setup runs) in a work directory,
unless the param cache already holds the real pair (``<kind>-<log_n>.{zkey,r1cs}`` in cuzk-mp's cache
folder: ``$CUZK_MP_CACHE``, else ``$XDG_CACHE_HOME/cuzk-mp``, else ``~/.cache/cuzk-mp``),
then measures, on a partition whose w, a, b, c live in one POSIX shm segment (as a ring slot):

* cache: building the circuit-data cache (once per circuit), its size next to the 32-byte CSR
  form it replaces, and opening it (header + body hash, what every worker pays once);
* per thread count: ``witness_into`` (witness), ``evaluate_into`` without the r1cs (abc) and
  with it (abc+check; check = the difference), wall and CPU seconds (CPU = core-seconds: every
  thread of the process), best of ``--reps``; and the peak of the process's anonymous memory
  above its level before the call (private memory of one ``evaluate_into``), sampled by a
  thread while the kernel runs without the GIL.

``--legacy`` measures the code this replaced instead (32-byte CSR mat-vecs, a separate C w,
new arrays per call); run it on an older checkout to get the "before" numbers, and pass its
JSON to ``--before`` to keep both in one file. Examples:

    .venv/bin/python perf/synthesis_bench.py --log-n 20,22 --threads 1,2 --out perf/results/synthesis-cpu.json
    python3 perf/synthesis_bench.py --log-n 24 --threads 1,4,16          # the 16-core GPU box
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Self

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PHASES = ("witness", "abc", "check")


def _anon_bytes() -> int:
    """Anonymous (private heap) memory of this process: smaps_rollup's Anonymous line."""
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Anonymous:"):
                return int(line.split()[1]) * 1024
    return 0


class AnonPeak:
    """Peak of the anonymous memory above its level at start, sampled every millisecond by a thread."""

    def __enter__(self) -> Self:
        self.base = _anon_bytes()
        self.peak = self.base
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(0.001):
            self.peak = max(self.peak, _anon_bytes())

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join()
        self.peak = max(self.peak, _anon_bytes())

    @property
    def delta(self) -> int:
        """Peak minus the starting level, in bytes."""
        return self.peak - self.base


def timed(fn: Any, reps: int) -> dict[str, float]:
    """Best wall and CPU seconds of ``reps`` calls of fn()."""
    wall, cpu = [], []
    for _ in range(reps):
        t0, c0 = time.perf_counter(), time.process_time()
        fn()
        wall.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return {"wall_s": min(wall), "cpu_s": min(cpu)}


def witness_profile(make: Any, runs: int = 3) -> dict[str, Any]:
    """Where one witness's time goes (cProfile, one thread, the fastest of ``runs``): the six
    functions with the most self time."""
    import cProfile
    import pstats

    best: dict[str, Any] | None = None
    for _ in range(runs):
        prof = cProfile.Profile()
        prof.enable()
        make()
        prof.disable()
        stats = pstats.Stats(prof)
        total = stats.total_tt  # type: ignore[attr-defined]
        top = sorted(((v[2], f"{Path(k[0]).name}:{k[2]}") for k, v in stats.stats.items()), reverse=True)[:6]  # type: ignore[attr-defined]
        if best is None or total < best["total_s"]:
            best = {"total_s": total, "top": [{"function": name, "self_s": t, "share": t / total} for t, name in top]}
    assert best is not None
    return best


def circuit_files(kind: str, log_n: int, work: Path) -> tuple[Path, Path, str]:
    """(zkey, r1cs, where they came from): the param cache's real key, else a synthesis-only key made here."""
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.r1cs import write_r1cs
    from cuzk_mp.groth16.synthesis_key import write_synthesis_only_zkey
    from cuzk_mp.paths import default_cache_dir

    cache = default_cache_dir()
    zkey, r1cs = cache / f"{kind}-{log_n}.zkey", cache / f"{kind}-{log_n}.r1cs"
    if zkey.exists() and r1cs.exists():
        return zkey, r1cs, "param cache (real key)"
    zkey, r1cs = work / f"{kind}-{log_n}.zkey", work / f"{kind}-{log_n}.r1cs"
    if zkey.exists() and r1cs.exists():
        return zkey, r1cs, "work dir (synthesis-only key)"
    t0 = time.perf_counter()
    rc = synthetic_circuit(kind, log_n).r1cs()
    write_r1cs(r1cs, rc)
    write_synthesis_only_zkey(rc, zkey)
    print(f"  made {r1cs.name} and a synthesis-only {zkey.name} in {time.perf_counter() - t0:.1f} s", flush=True)
    return zkey, r1cs, "work dir (synthesis-only key)"


class Slot:
    """w, a, b, c of one partition in one POSIX shm segment (like a ring slot)."""

    def __init__(self, n_vars: int, domain: int) -> None:
        self.size = (3 * domain + n_vars) * 32
        self.path = Path("/dev/shm") / f"synthesis-bench-{os.getpid()}"
        with open(self.path, "w+b") as f:
            f.truncate(self.size)
            self.mm = mmap.mmap(f.fileno(), self.size)
        buf = np.frombuffer(self.mm, dtype=np.uint64)
        self.w = buf[: 4 * n_vars].reshape(n_vars, 4)
        rest = buf[4 * n_vars :].reshape(3, domain, 4)
        self.a, self.b, self.c = rest[0], rest[1], rest[2]
        buf[:] = 0  # first touch outside the measurements

    def close(self) -> None:
        self.w = self.a = self.b = self.c = None  # type: ignore[assignment]
        self.mm.close()
        self.path.unlink(missing_ok=True)


def bench_new(kind: str, log_n: int, threads: list[int], reps: int, work: Path) -> dict[str, Any]:
    from cuzk_mp.algebra.threads import numba_threads
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.groth16.circuit_data import cache_candidates
    from cuzk_mp.groth16.synthesis import ConstraintEvaluator

    cache_dir = work / "circuit-data"
    small = circuit_files(kind, 10, work)  # warm-up: the builder's kernels load (or compile) outside the timing
    ConstraintEvaluator.from_files(str(small[0]), str(small[1]), cache_dir=str(cache_dir)).close()
    zkey, r1cs, source = circuit_files(kind, log_n, work)
    out: dict[str, Any] = {"kind": kind, "log_n": log_n, "key": source}
    for path in cache_candidates(zkey, True, cache_dir) + cache_candidates(zkey, False, cache_dir):
        path.unlink(missing_ok=True)
    t0 = time.perf_counter()
    checked = ConstraintEvaluator.from_files(str(zkey), str(r1cs), cache_dir=str(cache_dir))
    t_build = time.perf_counter() - t0
    t0 = time.perf_counter()
    ConstraintEvaluator.from_files(str(zkey), str(r1cs), cache_dir=str(cache_dir)).close()
    t_open = time.perf_counter() - t0
    plain = ConstraintEvaluator.from_files(str(zkey), None, cache_dir=str(cache_dir))
    counts = checked.data.counts
    rows = counts.a_rows + counts.b_rows + counts.c_rows
    csr_bytes = 36 * (counts.a_nnz + counts.b_nnz + counts.c_nnz) + 8 * (rows + 3)
    out["cache"] = {"build_s": t_build, "open_s": t_open, "bytes": os.path.getsize(checked.data.path or ""),
                    "bytes_without_c": os.path.getsize(plain.data.path or ""), "csr_32byte_bytes": csr_bytes,
                    "entries": {"a": counts.a_nnz, "b": counts.b_nnz, "c": counts.c_nnz}, "distinct": counts.n_codes}
    circuit = synthetic_circuit(kind, log_n)
    slot = Slot(checked.n_vars, checked.domain_size)
    try:
        circuit.witness_into(1, 0, slot.w)  # warm-up: kernels load from numba's cache (or compile)
        checked.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=1)
        plain.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=1)
        with numba_threads(1):
            out["witness_profile"] = witness_profile(lambda: circuit.witness_into(9, 1, slot.w))
        out["threads"] = {}
        for t in threads:
            row: dict[str, Any] = {}
            row["witness"] = timed(lambda t=t: circuit.witness_into(7, 3, slot.w, threads=t), reps)
            row["abc"] = timed(lambda t=t: plain.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=t), reps)
            both = timed(lambda t=t: checked.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=t), reps)
            row["check"] = {k: max(0.0, both[k] - row["abc"][k]) for k in both}
            row["total"] = {k: row["witness"][k] + both[k] for k in both}
            with AnonPeak() as peak:
                checked.evaluate_into(slot.w, slot.a, slot.b, slot.c, threads=t)
            row["evaluate_into_private_peak_bytes"] = peak.delta
            out["threads"][str(t)] = row
            print(f"  2^{log_n} {kind} threads {t}: " + ", ".join(
                f"{p} {row[p]['cpu_s']:.3f} core-s ({row[p]['wall_s']:.3f} s)" for p in (*PHASES, "total"))
                + f"; evaluate_into private peak {peak.delta / 2**20:.1f} MiB", flush=True)
    finally:
        slot.close()
        checked.close()
        plain.close()
    return out


def bench_legacy(kind: str, log_n: int, threads: list[int], reps: int) -> dict[str, Any]:
    """The replaced path: 32-byte CSR A, B (from section 4) and C (from the r1cs), new arrays per call."""
    import numba

    from cuzk_mp.algebra import fr
    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.zkey import ZKey, coef_matrices
    from cuzk_mp.groth16.setup import snarkjs_coefs

    circuit = synthetic_circuit(kind, log_n)
    rc = circuit.r1cs()
    zk = ZKey(path=None, n8q=48, q=0, n8r=32, r=0, n_vars=rc.n_wires, n_public=rc.n_public, domain_size=1 << log_n,
              alpha1=None, beta1=None, beta2=None, gamma2=None, delta1=None, delta2=None, ic=None,  # type: ignore[arg-type]
              coefs=snarkjs_coefs(rc), a=None, b1=None, b2=None, c=None, h=None, contributions=b"")  # type: ignore[arg-type]
    a, b = coef_matrices(zk)
    c = rc.c.to_r2_form()
    out: dict[str, Any] = {"kind": kind, "log_n": log_n, "csr_bytes": a.nbytes + b.nbytes + c.nbytes, "threads": {}}
    state: dict[str, Any] = {}

    def witness() -> None:
        state["w"] = circuit.witness(7, 3)

    def abc() -> None:
        w = state["w"]
        fr.first_noncanonical(w)
        state["c"] = fr.mul(a.matvec(w), b.matvec(w))

    def check() -> None:
        cw = c.matvec(state["w"])
        assert not (state["c"][: cw.shape[0]] != cw).any()

    witness(), abc(), check()  # warm-up
    numba.set_num_threads(1)
    out["witness_profile"] = witness_profile(lambda: circuit.witness(9, 1))
    for t in threads:
        numba.set_num_threads(min(t, numba.config.NUMBA_NUM_THREADS))
        row = {"witness": timed(witness, reps), "abc": timed(abc, reps), "check": timed(check, reps)}
        row["total"] = {k: sum(row[p][k] for p in PHASES) for k in ("wall_s", "cpu_s")}
        out["threads"][str(t)] = row
        print(f"  legacy 2^{log_n} {kind} threads {t}: " + ", ".join(
            f"{p} {row[p]['cpu_s']:.3f} core-s ({row[p]['wall_s']:.3f} s)" for p in (*PHASES, "total")), flush=True)
    return out


def projection(run: dict[str, Any]) -> dict[str, Any]:
    """Cache size and build time at 2^24 and 2^27, scaled linearly from the largest size measured."""
    c, k = run["cache"], run["log_n"]
    return {"from_log_n": k, "method": "linear in the domain size", **{
        f"2^{t}": {"bytes": c["bytes"] << (t - k), "build_s": c["build_s"] * (1 << (t - k)),
                   "csr_32byte_bytes": c["csr_32byte_bytes"] << (t - k)} for t in (24, 27)}}


def table(results: list[dict[str, Any]]) -> str:
    """A short text table: one line per (size, threads), core-seconds per phase."""
    head = ("size", "thr", "witness", "a/b/c", "check", "total", "wall", "priv MiB")
    lines = [" ".join(f"{h:>{w}}" for h, w in zip(head, (6, 4, 9, 9, 9, 9, 8, 9), strict=True))]
    for r in results:
        for t, row in r["threads"].items():
            priv = row.get("evaluate_into_private_peak_bytes")
            lines.append(f"2^{r['log_n']:<4} {t:>4} " + " ".join(f"{row[p]['cpu_s']:9.3f}" for p in (*PHASES, "total"))
                         + f" {row['total']['wall_s']:8.3f} "
                         + (f"{priv / 2**20:9.1f}" if priv is not None else f"{'-':>9}"))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--log-n", default="20,22", help="sizes, comma-separated (default 20,22)")
    ap.add_argument("--threads", default="1,2", help="threads per partition, comma-separated (default 1,2)")
    ap.add_argument("--kind", default="porep-like", help="synthetic circuit (porep-like | dense-random)")
    ap.add_argument("--reps", type=int, default=3, help="calls per measurement, the best is kept")
    ap.add_argument("--work-dir", type=Path, default=None, help="keep keys and caches here (default: a temp dir)")
    ap.add_argument("--legacy", action="store_true", help="measure the replaced 32-byte CSR path instead")
    ap.add_argument("--before", type=Path, default=None, help="a --legacy JSON to keep beside these results")
    ap.add_argument("--out", type=Path, default=None, help="write the results as JSON here")
    a = ap.parse_args()
    sizes = [int(x) for x in a.log_n.split(",")]
    threads = [int(x) for x in a.threads.split(",")]
    from cuzk_mp.pipeline.benchreport import machine_info

    command = " ".join([Path(sys.argv[0]).name] + sys.argv[1:])
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d"), "command": command,
                              "mode": "legacy" if a.legacy else "new", "units": "cpu_s = core-seconds (process CPU "
                              "time, all threads); wall_s = elapsed; best of reps", "results": []}
    with tempfile.TemporaryDirectory(prefix="synthesis-bench-") as tmp:
        work = a.work_dir or Path(tmp)
        work.mkdir(parents=True, exist_ok=True)
        for k in sizes:
            print(f"2^{k} {a.kind}:", flush=True)
            run = bench_legacy(a.kind, k, threads, a.reps) if a.legacy else bench_new(a.kind, k, threads, a.reps, work)
            result["results"].append(run)
            if not a.legacy:
                c = run["cache"]
                print(f"  cache: {c['bytes'] / 2**20:.1f} MiB (32-byte CSR: {c['csr_32byte_bytes'] / 2**20:.1f} MiB), "
                      f"built in {c['build_s']:.1f} s, opened in {c['open_s']:.2f} s", flush=True)
    if not a.legacy:
        result["cache_projection"] = projection(result["results"][-1])
    if a.before is not None:
        result["before"] = json.loads(a.before.read_text())
    result["machine"] = machine_info([])
    print(table(result["results"]))
    if a.out is not None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
