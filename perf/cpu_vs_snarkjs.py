"""The CPU comparison with snarkjs: `cuzk-mp groth16 prove` vs `snarkjs groth16 prove` on the CPU.

Same zkey and witness for both, same machine, same run, median of N runs each,
at 2^12, 2^14 and 2^16 rows, for both synthetic circuits (keys from `cuzk-mp
setup`): porep-like (80% of the witness 0 or 1, where our MSMs skip zeros and
add ones) and dense-random (every witness value full-width: full Pippenger
passes for both tools, the like-for-like comparison). Both are timed end to end as command lines (process start,
key loading and JSON writing included), as a user would run them. Also times
the dev setup (2^16, 2^18) and synthesis (witness + a, b, c) per core.

    .venv/bin/python perf/cpu_vs_snarkjs.py --out perf/results/cpu-vs-snarkjs.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402  (one machine description)

SNARKJS = ROOT / "tools" / "node_modules" / "snarkjs" / "cli.js"
CUZK = [str(ROOT / ".venv" / "bin" / "cuzk-mp")]


def _run(cmd: list[str]) -> float:
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def _median_runs(cmd: list[str], runs: int) -> tuple[float, list[float]]:
    times = [_run(cmd) for _ in range(runs)]
    return statistics.median(times), times


def bench_prove(kind: str, log_n: int, work: Path, runs: int) -> dict[str, object]:
    """Prove the same witness with both tools; verify both proofs with both verifiers."""
    from cuzk_mp.circuits.synthetic_kinds import write_synthetic

    r1cs, wtns = write_synthetic(kind, log_n, work)
    zkey = work / f"{kind}-{log_n}.zkey"
    t_setup = _run(CUZK + ["setup", str(r1cs), str(zkey), "--backend", "cpu"])
    vk = work / "vk.json"
    subprocess.run(CUZK + ["zkey", "export", "verificationkey", str(zkey), str(vk)], check=True)
    ours = CUZK + ["groth16", "prove", str(zkey), str(wtns), str(work / "p1.json"), str(work / "pub1.json"), "--backend", "cpu"]
    theirs = ["node", str(SNARKJS), "groth16", "prove", str(zkey), str(wtns), str(work / "p2.json"), str(work / "pub2.json")]
    _run(ours)  # warm numba's on-disk cache once, as any installed user would have it
    cuzk_med, cuzk_all = _median_runs(ours, runs)
    snark_med, snark_all = _median_runs(theirs, runs)
    for proof, pub in (("p1.json", "pub1.json"), ("p2.json", "pub2.json")):
        subprocess.run(["node", str(SNARKJS), "groth16", "verify", str(vk), str(work / pub), str(work / proof)], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(CUZK + ["groth16", "verify", str(vk), str(work / pub), str(work / proof)], check=True, stdout=subprocess.DEVNULL)
    return {"circuit": kind, "log_n": log_n, "cuzk_s": cuzk_med, "cuzk_runs_s": cuzk_all, "snarkjs_s": snark_med,
            "snarkjs_runs_s": snark_all, "speedup": snark_med / cuzk_med, "setup_s": t_setup}


def bench_setup(log_n: int, work: Path) -> float:
    """Wall time of `cuzk-mp setup` (CPU backend) for the synthetic circuit."""
    from cuzk_mp.circuits.synthetic_kinds import write_synthetic

    r1cs, _ = write_synthetic("porep-like", log_n, work)
    return _run(CUZK + ["setup", str(r1cs), str(work / f"s{log_n}.zkey"), "--backend", "cpu"])


def bench_synthesis(log_n: int) -> dict[str, float]:
    """Witness generation and a, b, c for one partition on one numba thread."""
    import numba

    from cuzk_mp.algebra.sparse import CsrMatrix
    from cuzk_mp.circuits.synthetic import PorepLike

    numba.set_num_threads(1)
    circ = PorepLike(log_n)
    r1cs = circ.r1cs()
    a: CsrMatrix = r1cs.a.to_r2_form()
    b: CsrMatrix = r1cs.b.to_r2_form()
    circ.witness(1, 0)  # JIT warm-up
    t0 = time.perf_counter()
    w = circ.witness(2, 3)
    t1 = time.perf_counter()
    from cuzk_mp.algebra import fr

    fr.mul(a.matvec(w), b.matvec(w))
    t2 = time.perf_counter()
    return {"log_n": log_n, "witness_s": t1 - t0, "abc_s": t2 - t1, "total_s": t2 - t0}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=ROOT / "perf" / "results" / "cpu-vs-snarkjs.json")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--sizes", type=int, nargs="*", default=[12, 14, 16])
    ap.add_argument("--circuits", nargs="*", default=["porep-like", "dense-random"])
    ap.add_argument("--setup-sizes", type=int, nargs="*", default=[16, 18])
    ap.add_argument("--synthesis-sizes", type=int, nargs="*", default=[16, 20])
    args = ap.parse_args()
    if not SNARKJS.exists():
        print("snarkjs not installed: run `make tools` first", file=sys.stderr)
        return 2
    result: dict[str, object] = {"date": time.strftime("%Y-%m-%d"), "loadavg_start": list(os.getloadavg()),
                                 "command": " ".join(sys.argv), "prove": [], "setup": [], "synthesis": []}
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.circuits:
            for k in args.sizes:
                row = bench_prove(kind, k, Path(tmp) / f"{kind}{k}", args.runs)
                print(f"{kind} 2^{k}: cuzk-mp {row['cuzk_s']:.2f} s, snarkjs {row['snarkjs_s']:.2f} s, "
                      f"x{row['speedup']:.2f}", flush=True)
                result["prove"].append(row)  # type: ignore[union-attr]
        for k in args.setup_sizes:
            t = bench_setup(k, Path(tmp) / f"s{k}")
            print(f"setup 2^{k}: {t:.1f} s", flush=True)
            result["setup"].append({"log_n": k, "seconds": t})  # type: ignore[union-attr]
    for k in args.synthesis_sizes:
        row = bench_synthesis(k)
        print(f"synthesis 2^{k} (1 core): witness {row['witness_s']:.2f} s, a/b/c {row['abc_s']:.2f} s", flush=True)
        result["synthesis"].append(row)  # type: ignore[union-attr]
    result["machine"] = machine_info([])  # read at the end: its load average is the end's
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
