"""Compile the package's bytecode and numba's kernels into their on-disk caches once, at install time.

First the package's modules are byte-compiled (``compileall``, what a wheel install does; an
editable install leaves it to the first import, which never writes it where
``PYTHONDONTWRITEBYTECODE`` is set: every one-shot process then compiles ~0.35 s of source).
numba compiles a kernel on its first call and, for the kernels declared ``cache=True``, keeps
the machine code beside the module; without this step the first proof on a fresh machine pays
for every compilation. This runs what a first user runs, on the CPU backend and a 2^10
synthetic circuit: make the circuit, its development key, a proof, the verification key, the
verification. Exit status 0 when all of it worked (the proof verified), 1 otherwise.

Last, the installed packages a proving process imports (numpy, CuPy and theirs: the modules
loaded by the steps above and by the GPU backend's import, where CuPy is installed) are
byte-compiled where they came without bytecode. Container images are often built that way
(``pip install --no-compile``, ``PYTHONDONTWRITEBYTECODE``): a GPU box's numpy of 407 modules
and no ``.pyc`` took 0.29 s of every one-shot process's start to compile them again. The
standard library is left alone; a package folder this user cannot write is named, not fatal.

    .venv/bin/python scripts/warm_caches.py
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import importlib
import importlib.util
import io
import os
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType

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
    t0 = time.perf_counter()
    with contextlib.suppress(ImportError):  # the GPU path's imports, where CuPy is installed (no device needed)
        importlib.import_module("cuzk_mp.backends.gpu.backend")
    compiled, refused = compile_dependencies(list(sys.modules.values()))
    print(f"warm_caches: bytecode of installed packages that had none: {compiled} module(s) in "
          f"{time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    for folder in refused:
        print(f"warm_caches: {folder} has modules without bytecode and this user cannot write there; "
              f"every process compiles them again (run `python -m compileall -q {folder}` as its owner)",
              file=sys.stderr)
    print(f"warm_caches: bytecode and numba kernels compiled and cached in {time.perf_counter() - t_all:.0f} s",
          file=sys.stderr)
    return 0


def compile_dependencies(modules: Iterable[ModuleType]) -> tuple[int, list[str]]:
    """Byte-compile the installed packages of ``modules`` (not the standard library's, not this
    package's: compiled above) whose source has no bytecode beside it: each such module's whole
    top-level package, as ``pip install`` would have. The number of modules compiled, and the
    folders that needed it but are not writable by this user."""
    own = os.path.realpath(Path(cuzk_mp.__file__).parent)
    roots: set[str] = set()
    for mod in modules:
        origin = getattr(getattr(mod, "__spec__", None), "origin", None)
        if not origin or not origin.endswith(".py") or not os.path.isfile(origin):
            continue
        path = os.path.realpath(origin)
        # by name: in a virtualenv sysconfig's platstdlib is the venv's lib/pythonX.Y, site-packages' parent
        if path.startswith(own + os.sep) or mod.__name__.partition(".")[0] in sys.stdlib_module_names:
            continue
        if os.path.exists(importlib.util.cache_from_source(origin)):
            continue
        roots.add(str(_package_root(mod.__name__, Path(path))))
    compiled, refused = 0, []
    for root in sorted(roots):
        folder = root if os.path.isdir(root) else os.path.dirname(root)
        if not os.access(folder, os.W_OK):
            refused.append(root)
            continue
        before = _missing(root)
        with contextlib.redirect_stdout(io.StringIO()):  # a test file of another Python's syntax: not ours to fix
            if os.path.isdir(root):
                compileall.compile_dir(root, quiet=2)
            else:
                compileall.compile_file(root, quiet=2)
        compiled += before - _missing(root)
    return compiled, refused


def _package_root(name: str, path: Path) -> Path:
    """The top-level package folder of module ``name`` found at ``path`` (the file itself for a
    top-level single-file module, or where the layout is not the name's)."""
    depth = name.count(".")
    if path.name == "__init__.py":
        root = path.parents[depth]
    elif depth:
        root = path.parents[depth - 1]
    else:
        return path
    return root if root.name == name.partition(".")[0] else path


def _missing(root: str) -> int:
    """Modules under ``root`` (a folder or one file) without their bytecode."""
    files = [os.path.join(d, f) for d, _, names in os.walk(root) for f in names if f.endswith(".py")] \
        if os.path.isdir(root) else [root]
    return sum(not os.path.exists(importlib.util.cache_from_source(f)) for f in files)


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
