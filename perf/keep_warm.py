"""Whole ``groth16 prove`` processes: one-shot against ``--keep-warm`` (a private daemon of the key).

Times, from outside, fresh processes of ``python -m cuzk_mp groth16 prove``: ``--runs`` one-shot
ones, then the ``--keep-warm`` call that starts the key's warm daemon, then ``--runs`` calls that
find it running, and finally how long after the last call the daemon leaves (its ``exit_when_idle``,
``--idle`` seconds, plus the drain). Every proof is checked with ``groth16 verify`` against the
key's verification key. The warm daemon runs in a private ``$XDG_RUNTIME_DIR`` made for this run.

Usage: ``python perf/keep_warm.py --zkey K.zkey --wtns W.wtns [--backend cpu|gpu|auto] [--runs 5]
[--idle 5] [--out FILE.json]``; prints a short table last.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from cuzk_mp.daemon import warm  # noqa: E402
from cuzk_mp.pipeline.benchreport import machine_info  # noqa: E402


def _prove(args: argparse.Namespace, env: dict[str, str], out: Path, i: int, keep_warm: bool) -> float:
    """Seconds of one whole prove process (from before its start to its exit); its proof verified."""
    proof, public = out / f"proof{i}.json", out / f"public{i}.json"
    cmd = [sys.executable, "-m", "cuzk_mp", "groth16", "prove", "--backend", args.backend,
           *(["--keep-warm", str(args.idle)] if keep_warm else []), str(args.zkey), str(args.wtns), str(proof),
           str(public)]
    t0 = time.perf_counter()
    res = subprocess.run(cmd, env=env, capture_output=True, text=True)
    took = time.perf_counter() - t0
    if res.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed ({res.returncode}):\n{res.stderr[-3000:]}")
    ok = subprocess.run([sys.executable, "-m", "cuzk_mp", "groth16", "verify", str(out / "vk.json"), str(public),
                         str(proof)], env=env, capture_output=True, text=True)
    if ok.returncode:
        raise SystemExit(f"proof {proof} does not verify: {ok.stdout}{ok.stderr}")
    return took


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zkey", type=Path, required=True)
    ap.add_argument("--wtns", type=Path, required=True)
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle", type=float, default=5.0, help="--keep-warm seconds (the daemon's idle exit)")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args()
    runtime = Path(tempfile.mkdtemp(prefix="kw", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="keep-warm-"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": f"{ROOT}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CUZK_MP_KEEP_WARM", None)
    try:
        subprocess.run([sys.executable, "-m", "cuzk_mp", "zkey", "export", "verificationkey", str(args.zkey),
                        str(work / "vk.json")], env=env, check=True, capture_output=True)
        _prove(args, env, work, 0, False)  # caches (circuit data beside the key, bytecode) as a user's 2nd call
        oneshot = [_prove(args, env, work, i, False) for i in range(1, args.runs + 1)]
        start = _prove(args, env, work, 100, True)
        warm_runs = [_prove(args, env, work, 100 + i, True) for i in range(1, args.runs + 1)]
        sock = runtime / "cuzk-mp" / f"{warm.warm_id(_spec(args))}.sock"
        t0 = time.perf_counter()
        while sock.exists() and time.perf_counter() - t0 < args.idle + 120:
            time.sleep(0.05)
        gone = time.perf_counter() - t0 if not sock.exists() else None
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
    row = {
        "command": " ".join(["python", "perf/keep_warm.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "what": "whole `groth16 prove` processes (start to exit, seconds), every proof verified: one-shot, the "
                "--keep-warm call that starts the key's warm daemon, --keep-warm calls that find it running",
        "zkey": args.zkey.name, "backend": args.backend, "runs": args.runs,
        "oneshot_s": oneshot, "oneshot_median_s": statistics.median(oneshot),
        "keep_warm_start_s": start,
        "keep_warm_s": warm_runs, "keep_warm_median_s": statistics.median(warm_runs),
        "idle_s": args.idle, "daemon_gone_after_s": gone,
        "machine": machine_info([]),
    }
    if args.out:
        args.out.write_text(json.dumps(row, indent=1) + "\n")
    print(f"{'one-shot':28} {row['oneshot_median_s']:8.3f} s  ({', '.join(f'{x:.2f}' for x in oneshot)})")
    print(f"{'--keep-warm, starts daemon':28} {start:8.3f} s")
    print(f"{'--keep-warm, daemon running':28} {row['keep_warm_median_s']:8.3f} s  "
          f"({', '.join(f'{x:.2f}' for x in warm_runs)})")
    print(f"{'daemon gone after last call':28} {gone if gone is None else f'{gone:8.3f} s'}")


def _spec(args: argparse.Namespace) -> warm.WarmSpec:
    return warm.WarmSpec(args.zkey.absolute(), args.backend, None, True, args.idle)


if __name__ == "__main__":
    main()
