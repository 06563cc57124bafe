"""Whole ``groth16 prove`` processes: one-shot against ``--keep-warm`` (a private daemon of the key).

Times, from outside, fresh processes of ``python -m cuzk_mp groth16 prove``: ``--runs`` one-shot
ones, then the ``--keep-warm`` call that starts the key's warm daemon, then ``--runs`` calls that
find it running, and finally how long after the last call the daemon leaves (its ``exit_when_idle``,
``--idle`` seconds, plus the drain). Every proof is checked with ``groth16 verify`` against the
key's verification key. The warm daemon runs in a private ``$XDG_RUNTIME_DIR`` made for this run.

With ``--profile DIR`` one more one-shot process runs last with ``python -X importtime``, the CLI's
``--log-level DEBUG`` and the stack sampler (``CUZK_MP_STACK_PROFILE=DIR``): its stderr lands in
``DIR/oneshot-stderr.txt``, its threads' stacks in ``DIR/cuzk-mp-groth16-PID.txt``, and the result
gets the imports that took longest (cumulative: packages, and this package's modules) and the log lines with their
offsets from the process's start. ``--env K=V`` (repeatable) adds a variable to every prove process.
``--against K=V`` (repeatable) is an A/B of whole one-shot processes: each of the ``--runs`` rounds
runs one one-shot process with the base environment, then one with each ``--against`` variable added,
so a drifting machine (page cache, clocks, a neighbour) weighs on every setting alike; the result
gets each setting's times and median beside the base's ``oneshot_s``.

Usage: ``python perf/keep_warm.py --zkey K.zkey --wtns W.wtns [--backend cpu|gpu|auto] [--runs 5]
[--idle 5] [--env K=V] [--against K=V] [--profile DIR] [--out FILE.json]``; prints a short table last.
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
from env_arg import env_variable  # noqa: E402  (perf/, the script's own folder)


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


def _profile(args: argparse.Namespace, env: dict[str, str], out: Path) -> dict[str, object]:
    """One more one-shot prove with ``-X importtime``, DEBUG logs and the stack sampler into
    ``args.profile``: the slowest top-level imports and the log lines, seconds from the start."""
    args.profile.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-X", "importtime", "-m", "cuzk_mp", "--log-level", "DEBUG", "groth16", "prove",
           "--backend", args.backend, str(args.zkey), str(args.wtns), str(out / "proof-p.json"),
           str(out / "public-p.json")]
    started = time.time()
    res = subprocess.run(cmd, env={**env, "CUZK_MP_STACK_PROFILE": str(args.profile)}, capture_output=True,
                         text=True)
    took = time.time() - started
    (args.profile / "oneshot-stderr.txt").write_text(res.stderr)
    if res.returncode:
        raise SystemExit(f"the profiled prove failed ({res.returncode}):\n{res.stderr[-3000:]}")
    imports: dict[str, float] = {}
    logs: list[str] = []
    for line in res.stderr.splitlines():
        if line.startswith("import time:"):
            parts = line.split("|")
            if len(parts) == 3 and parts[1].strip().isdigit():
                # a package's own line (numpy, cupy) or one of this package's modules (cuzk_mp.backends.gpu.msm),
                # wherever it is first imported: its cumulative time includes what it imports
                name = parts[2].strip()
                if "." not in name or name.startswith("cuzk_mp."):
                    imports[name] = max(imports.get(name, 0.0), int(parts[1]) / 1e6)
        elif line[:4].isdigit() and " " in line:  # "YYYY-MM-DD HH:MM:SS,mmm LEVEL name: message"
            try:
                when = datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()
            except ValueError:
                continue
            logs.append(f"+{when - started:6.3f} s {line[24:]}")
    slowest = dict(sorted(imports.items(), key=lambda kv: -kv[1])[:25])
    return {"wall_s": took, "imports_cumulative_s": slowest, "log": logs}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--zkey", type=Path, required=True)
    ap.add_argument("--wtns", type=Path, required=True)
    ap.add_argument("--backend", default="auto", choices=("auto", "cpu", "gpu"))
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--idle", type=float, default=5.0, help="--keep-warm seconds (the daemon's idle exit)")
    ap.add_argument("--env", action="append", default=[], metavar="K=V", type=env_variable,
                    help="an environment variable for every prove process (e.g. OPENBLAS_NUM_THREADS=1); repeatable")
    ap.add_argument("--against", action="append", default=[], metavar="K=V", type=env_variable,
                    help="one-shot processes with this variable added, interleaved with the base ones; repeatable")
    ap.add_argument("--profile", type=Path, default=None, metavar="DIR",
                    help="one more one-shot prove with -X importtime, DEBUG logs and the stack sampler into DIR")
    ap.add_argument("--out", type=Path, default=None, help="write the result as JSON here")
    args = ap.parse_args()
    runtime = Path(tempfile.mkdtemp(prefix="kw", dir="/tmp"))
    work = Path(tempfile.mkdtemp(prefix="keep-warm-"))
    env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime), "PYTHONPATH": f"{ROOT}{os.pathsep}"
           f"{os.environ.get('PYTHONPATH', '')}"}
    env.pop("CUZK_MP_KEEP_WARM", None)
    env.update(args.env)
    profile: dict[str, object] | None = None
    try:
        subprocess.run([sys.executable, "-m", "cuzk_mp", "zkey", "export", "verificationkey", str(args.zkey),
                        str(work / "vk.json")], env=env, check=True, capture_output=True)
        _prove(args, env, work, 0, False)  # caches (circuit data beside the key, bytecode) as a user's 2nd call
        variants = [(f"{name}={value}", {**env, name: value}) for name, value in args.against]
        oneshot: list[float] = []
        against: dict[str, list[float]] = {kv: [] for kv, _ in variants}
        for i in range(1, args.runs + 1):  # interleaved: base, then each variant, every round
            oneshot.append(_prove(args, env, work, i, False))
            for k, (kv, venv) in enumerate(variants, 1):
                against[kv].append(_prove(args, venv, work, 1000 * k + i, False))
        start = _prove(args, env, work, 100, True)
        warm_runs = [_prove(args, env, work, 100 + i, True) for i in range(1, args.runs + 1)]
        sock = runtime / "cuzk-mp" / f"{warm.warm_id(_spec(args))}.sock"
        t0 = time.perf_counter()
        while sock.exists() and time.perf_counter() - t0 < args.idle + 120:
            time.sleep(0.05)
        gone = time.perf_counter() - t0 if not sock.exists() else None
        if args.profile:
            profile = _profile(args, env, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(runtime, ignore_errors=True)
    arms = {kv: {"oneshot_s": t, "oneshot_median_s": statistics.median(t)} for kv, t in against.items()}
    row = {
        "command": " ".join(["python", "perf/keep_warm.py", *sys.argv[1:]]),
        "date": datetime.date.today().isoformat(),
        "what": "whole `groth16 prove` processes (start to exit, seconds), every proof verified: one-shot, the "
                "--keep-warm call that starts the key's warm daemon, --keep-warm calls that find it running",
        "zkey": args.zkey.name, "backend": args.backend, "runs": args.runs,
        "oneshot_s": oneshot, "oneshot_median_s": statistics.median(oneshot),
        "keep_warm_start_s": start,
        "keep_warm_s": warm_runs, "keep_warm_median_s": statistics.median(warm_runs),
        "idle_s": args.idle, "daemon_gone_after_s": gone, "env": [f"{n}={v}" for n, v in args.env], "profile": profile,
        "against": arms,
        "machine": machine_info([] if args.backend == "cpu" else None),  # the GPU the proves could take
    }
    if args.out:
        args.out.write_text(json.dumps(row, indent=1) + "\n")
    print(f"{'one-shot':36} {row['oneshot_median_s']:8.3f} s  ({', '.join(f'{x:.2f}' for x in oneshot)})")
    for kv, t in against.items():
        print(f"{'one-shot, ' + kv:36} {arms[kv]['oneshot_median_s']:8.3f} s  ({', '.join(f'{x:.2f}' for x in t)})")
    print(f"{'--keep-warm, starts daemon':36} {start:8.3f} s")
    print(f"{'--keep-warm, daemon running':36} {row['keep_warm_median_s']:8.3f} s  "
          f"({', '.join(f'{x:.2f}' for x in warm_runs)})")
    print(f"{'daemon gone after last call':36} {gone if gone is None else f'{gone:8.3f} s'}")
    if profile is not None:
        print(f"{'profiled one-shot':36} {profile['wall_s']:8.3f} s; slowest imports (cumulative):")
        for name, s in profile["imports_cumulative_s"].items():  # type: ignore[union-attr]
            print(f"  {name:40} {s:8.3f} s")
        print("\n".join(profile["log"]))  # type: ignore[arg-type]


def _spec(args: argparse.Namespace) -> warm.WarmSpec:
    return warm.WarmSpec(args.zkey.absolute(), args.backend, None, True, args.idle)


if __name__ == "__main__":
    main()
