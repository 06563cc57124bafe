"""Compile the package's bytecode and numba's kernels into their on-disk caches once, at install time.

First the package's modules are byte-compiled (``compileall``, what a wheel install does; an
editable install leaves it to the first import, which never writes it where
``PYTHONDONTWRITEBYTECODE`` is set: every one-shot process then compiles ~0.35 s of source).
numba compiles a kernel on its first call and, for the kernels declared ``cache=True``, keeps
the machine code beside the module; without this step the first proof on a fresh machine pays
for every compilation. This runs what a first user runs, on the CPU backend and a 2^10
synthetic circuit: make the circuit, its development key, a proof, the verification key, the
verification. Exit status 0 when all of it worked (the proof verified), 1 otherwise.

    .venv/bin/python scripts/warm_caches.py
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import io
import sys
import tempfile
import time
from pathlib import Path

import cuzk_mp
from cuzk_mp.cli import main

LOG_N = 10


def warm(folder: Path) -> int:
    """Each step through the command line, as a user runs it; the first failing exit code."""
    r1cs, wtns = folder / f"porep-like-{LOG_N}.r1cs", folder / f"porep-like-{LOG_N}.wtns"
    zkey, vk, proof, public = (folder / name for name in ("c.zkey", "vk.json", "proof.json", "public.json"))
    steps = [
        ("synthetic circuit", ["circuit", "porep-like", "--log-n", str(LOG_N), str(folder)]),
        ("development setup", ["setup", "--backend", "cpu", str(r1cs), str(zkey)]),
        ("proof", ["groth16", "prove", "--backend", "cpu", str(zkey), str(wtns), str(proof), str(public)]),
        ("verification key", ["zkey", "export", "verificationkey", str(zkey), str(vk)]),
        ("verification", ["groth16", "verify", str(vk), str(public), str(proof)]),
    ]
    t_all = time.perf_counter()
    if not compileall.compile_dir(str(Path(cuzk_mp.__file__).parent), quiet=1):
        print("warm_caches: byte-compiling the package failed", file=sys.stderr)
        return 1
    print(f"warm_caches: bytecode: {time.perf_counter() - t_all:.1f} s", file=sys.stderr, flush=True)
    for what, argv in steps:
        t0 = time.perf_counter()
        with contextlib.redirect_stdout(io.StringIO()):  # the verbs' own output (paths, OK!) is no news here
            code = main(["--log-level", "ERROR", *argv])
        print(f"warm_caches: {what}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        if code != 0:
            print(f"warm_caches: `cuzk-mp {' '.join(argv)}` exited {code}", file=sys.stderr)
            return code
    print(f"warm_caches: bytecode and numba kernels compiled and cached in {time.perf_counter() - t_all:.0f} s",
          file=sys.stderr)
    return 0


def run(argv: list[str] | None = None) -> int:
    """The script: no arguments but ``--help``; 0 when every step worked, 1 otherwise."""
    argparse.ArgumentParser(
        prog="warm_caches.py",
        description="Byte-compile the cuzk_mp package and fill numba's kernel caches once, at install time: "
                    f"make a 2^{LOG_N} synthetic circuit, its development key, a proof (CPU backend), the "
                    "verification key and the verification, in a temporary folder. Exit 0 when all of it "
                    "worked (the proof verified), 1 otherwise. It takes no arguments.").parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cuzk-mp-warm-") as tmp:
        return 1 if warm(Path(tmp)) else 0


if __name__ == "__main__":
    sys.exit(run())
