"""The outside oracle for tests: snarkjs 0.7.x and circom 2.x (npm ``circom2``) from tools/.

Owns: running the node tools (never part of the product), the test circuits' registry
(tests/circuits/*.circom plus a random valid input for each), and the build cache of what the
tools make from them: .r1cs/.wasm, a small prepared powers-of-tau, snarkjs Groth16 keys.

Cache: ``.cache/oracle/<what>-<digest>/`` (git-ignored), where the digest covers the sources,
tools/package-lock.json (so every tool version) and ``RECIPE``. A build runs under a file lock
into a temporary folder that is renamed into place when complete, so concurrent pytest runs
and interrupted builds are safe; a fresh clone builds everything once (92 CPU-seconds measured
here, over half of it ``powersoftau prepare phase2``; wall time grows with the machine's load). Only the node tools' outputs
are cached across runs, never cuzk-mp's own, so a change in our code is always re-tested.

Pytest: the session fixture :func:`oracle` skips (naming ``make tools``) when node or
tools/node_modules is missing; ``make test`` always installs them. Import it into a test
module or conftest (``from tests.oracle import oracle``), or load this file as a plugin
(``pytest_plugins = ["tests.oracle"]`` in the root conftest). Tests using it are marked
``@pytest.mark.snarkjs``.

Timings on this 2-core machine (``powersoftau new`` / ``contribute`` / ``prepare phase2``):
2^8: 1.0 / 1.5 / 7.4 s; 2^10: 0.9 / 3.7 / 44 s; 2^11: 1.1 / 6.7 / 88 s (2^12 ~ 3 min, 2^14
~ 12 min). ``PTAU_POWER`` = 10 is the smallest that fits every snarkjs-keyed circuit below
(mimc_chain: 989 constraints + 3 public + 1 = 993 rows <= 1024). The SHA-256 circuit (2^15
rows) gets its key from ``cuzk-mp setup`` instead.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOLS = REPO / "tools"
NODE_MODULES = TOOLS / "node_modules"
CIRCUIT_SOURCES = REPO / "tests" / "circuits"
CACHE = REPO / ".cache" / "oracle"
PTAU_POWER = 10
RECIPE = "oracle-1"  # bump when a build step below changes, to invalidate old cache entries
R_MOD = 0x73EDA753299D7D483339D80809A1D80553BDA402FFFE5BFEFFFFFFFF00000001
NODE_TIMEOUT_S = 900
BEACON_HASH = "0123456789abcdef" * 4  # the `zkey beacon` hash of keys made with a beacon (32 bytes, hex)


class OracleFailed(RuntimeError):
    """A node tool exited non-zero where the test needed it to succeed."""


# --- running the tools ---------------------------------------------------------------------

def tools_missing() -> str | None:
    """Why the node tools cannot run here, or None if they can."""
    if shutil.which("node") is None:
        return "node is not installed (the snarkjs oracle needs it; see `make tools`)"
    for tool in ("snarkjs/cli.js", "circom2/cli.js", "circomlib/circuits"):
        if not (NODE_MODULES / tool).exists():
            return f"tools/node_modules/{tool} is missing: run `make tools` (npm ci in tools/)"
    return None


def require_tools() -> None:
    """Skip the calling test when the node tools are not installed."""
    reason = tools_missing()
    if reason:
        pytest.skip(reason)


def run_node(script: str, *args: object, check: bool = True,
             timeout: float = NODE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """Run ``node node_modules/<script> args...`` from tools/ (circom2's WASI sandbox sees
    only the working folder and its parents, which covers the repo and /tmp)."""
    cmd = ["node", str(NODE_MODULES / script), *map(str, args)]
    proc = subprocess.run(cmd, cwd=TOOLS, capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "NO_COLOR": "1"})
    if check and proc.returncode != 0:
        raise OracleFailed(f"{' '.join(cmd)} exited {proc.returncode}\n"
                           f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def snarkjs(*args: object, check: bool = True,
            timeout: float = NODE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``snarkjs args...``; raises OracleFailed on a non-zero exit when ``check``."""
    return run_node("snarkjs/cli.js", *args, check=check, timeout=timeout)


def cuzk(*args: object, check: bool = False,
         timeout: float = NODE_TIMEOUT_S) -> subprocess.CompletedProcess[str]:
    """``cuzk-mp args...`` as a user runs it (``python -m cuzk_mp.cli``, repo on the path)."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    cmd = [sys.executable, "-m", "cuzk_mp.cli", *map(str, args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    if check and proc.returncode != 0:
        raise OracleFailed(f"{' '.join(cmd)} exited {proc.returncode}\n"
                           f"stdout:\n{proc.stdout[-4000:]}\nstderr:\n{proc.stderr[-4000:]}")
    return proc


def compile_circuit(src: Path, out_dir: Path, simplification: str = "--O2") -> tuple[Path, Path]:
    """circom2 ``src`` for BLS12-381 into ``out_dir``; returns (r1cs, wasm) paths.
    ``simplification``: circom's --O0 / --O1 / --O2 (--O0 keeps the constraints as written)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    run_node("circom2/cli.js", src, "--r1cs", "--wasm", "--sym", simplification, "-p", "bls12381",
             "-l", NODE_MODULES, "-o", out_dir)
    return out_dir / f"{src.stem}.r1cs", out_dir / f"{src.stem}_js" / f"{src.stem}.wasm"


def powersoftau(power: int, out_dir: Path) -> Path:
    """A prepared (phase 2) bls12381 powers-of-tau of ``2^power``, one contribution."""
    p0, p1, final = (out_dir / f"pot{power}_{s}.ptau" for s in ("0000", "0001", "final"))
    snarkjs("powersoftau", "new", "bls12381", power, p0)
    snarkjs("powersoftau", "contribute", p0, p1, "--name=cuzk-mp tests", "-e=cuzk-mp oracle")
    snarkjs("powersoftau", "prepare", "phase2", p1, final)
    p0.unlink()
    p1.unlink()
    return final


def groth16_setup(r1cs: Path, ptau: Path, zkey: Path, contributions: int = 1, beacon: bool = False) -> Path:
    """snarkjs ``groth16 setup`` then ``contributions`` ``zkey contribute`` rounds (one or more puts the
    sections in order, 1..10), then, with ``beacon``, a ``zkey beacon`` (2^10 hash iterations)."""
    steps = [zkey.with_name(f"{zkey.stem}_{i:04d}.zkey") for i in range(contributions + beacon)] + [zkey]
    snarkjs("groth16", "setup", r1cs, ptau, steps[0])
    for i in range(contributions):
        snarkjs("zkey", "contribute", steps[i], steps[i + 1], f"--name=cuzk-mp tests {i + 1}",
                f"-e=cuzk-mp oracle {i + 1}")
    if beacon:
        snarkjs("zkey", "beacon", steps[-2], zkey, BEACON_HASH, 10, "-n=cuzk-mp tests beacon")
    for step in steps[:-1]:
        step.unlink()
    return zkey


def export_vk(zkey: Path, vk: Path) -> Path:
    """snarkjs ``zkey export verificationkey``."""
    snarkjs("zkey", "export", "verificationkey", zkey, vk)
    return vk


def wtns_calculate(wasm: Path, input_json: Path, wtns: Path) -> Path:
    """snarkjs ``wtns calculate``."""
    snarkjs("wtns", "calculate", wasm, input_json, wtns)
    return wtns


def wtns_check(r1cs: Path, wtns: Path) -> bool:
    """snarkjs ``wtns check``: does the witness satisfy every constraint?"""
    return snarkjs("wtns", "check", r1cs, wtns, check=False).returncode == 0


def groth16_prove(zkey: Path, wtns: Path, proof: Path, public: Path) -> None:
    """snarkjs ``groth16 prove``."""
    snarkjs("groth16", "prove", zkey, wtns, proof, public)


def groth16_verify(vk: Path, public: Path, proof: Path) -> bool:
    """snarkjs ``groth16 verify``: True iff it printed OK! and exited 0."""
    proc = snarkjs("groth16", "verify", vk, public, proof, check=False)
    return proc.returncode == 0 and "OK!" in proc.stdout


# snarkjs's own groth16.verify (what `groth16 verify` runs), many proofs in one node process:
# each CLI call pays ~1 s of node start-up and curve set-up.
_VERIFY_MANY_JS = """
import * as snarkjs from "snarkjs";
import fs from "fs";
const job = JSON.parse(fs.readFileSync(0, "utf8"));
const vk = JSON.parse(fs.readFileSync(job.vk, "utf8"));
const out = [];
for (const [pub, proof] of job.cases) out.push(await snarkjs.groth16.verify(vk, pub, proof));
console.log(JSON.stringify(out));
process.exit(0);
"""


def groth16_verify_many(vk: Path, cases: list[tuple[object, object]]) -> list[bool]:
    """snarkjs ``groth16.verify`` on each (public signals, proof) JSON pair, against ``vk``."""
    proc = subprocess.run(["node", "--input-type=module", "-e", _VERIFY_MANY_JS], cwd=TOOLS,
                          input=json.dumps({"vk": str(vk), "cases": cases}), text=True,
                          capture_output=True, timeout=NODE_TIMEOUT_S)
    if proc.returncode != 0:
        raise OracleFailed(f"snarkjs groth16.verify batch exited {proc.returncode}\n{proc.stderr}")
    result: list[bool] = json.loads(proc.stdout.strip().splitlines()[-1])
    return result


def write_json(path: Path, value: object) -> Path:
    """Write ``value`` as JSON (inputs, proofs, public signals)."""
    path.write_text(json.dumps(value, indent=1))
    return path


# --- the build cache ---------------------------------------------------------------------

def _digest(*parts: bytes | str) -> str:
    h = hashlib.sha256(RECIPE.encode())
    h.update((TOOLS / "package-lock.json").read_bytes())
    for part in parts:
        h.update(b"\0" + (part.encode() if isinstance(part, str) else part))
    return h.hexdigest()[:16]


def cached_build(name: str, digest: str, build: Callable[[Path], None]) -> Path:
    """The folder ``.cache/oracle/<name>-<digest>``, running ``build(folder)`` once to fill
    it (under a lock; built in a temporary folder renamed into place when complete)."""
    final = CACHE / f"{name}-{digest}"
    if (final / ".complete").exists():
        return final
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"{name}-{digest}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (final / ".complete").exists():
            return final
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=CACHE))
        try:
            build(tmp)
            (tmp / ".complete").write_text(digest)
            if final.exists():
                shutil.rmtree(final)  # an older interrupted copy without .complete
            tmp.rename(final)
        finally:
            if tmp.exists():
                shutil.rmtree(tmp)
    return final


# --- the test circuits ---------------------------------------------------------------------

def _field(rng: random.Random) -> str:
    return str(rng.randrange(R_MOD))


def _multiplier_input(rng: random.Random) -> dict[str, object]:
    return {"a": _field(rng), "b": _field(rng)}


def _mimc_input(rng: random.Random) -> dict[str, object]:
    return {"key": _field(rng), "seed": _field(rng), "salt": [_field(rng), _field(rng)]}


def _bits_input(rng: random.Random) -> dict[str, object]:
    lower = rng.randrange(1 << 31)
    upper = rng.randrange(lower, 1 << 32)
    pairs = [[rng.randrange(lower, upper + 1) if i % 2 else rng.randrange(1 << 32),
              rng.randrange(1 << 32)] for i in range(4)]
    return {"lower": lower, "upper": str(upper), "pairs": pairs}


def _sha_input(rng: random.Random) -> dict[str, object]:
    return {"msg": [rng.randrange(256) for _ in range(55)]}


def _no_public_input(rng: random.Random) -> dict[str, object]:
    return {"a": _field(rng), "b": _field(rng)}


def _public_only_input(rng: random.Random) -> dict[str, object]:
    return {"x": [_field(rng) for _ in range(10)]}


def _unused_wires_input(rng: random.Random) -> dict[str, object]:
    return {name: _field(rng) for name in ("a", "b", "p", "q")}


@dataclass(frozen=True)
class CircuitSpec:
    """One test circuit: its source, whether snarkjs sets it up, and a valid random input."""

    name: str
    snarkjs_setup: bool  # fits PTAU_POWER; False: keyed by `cuzk-mp setup` only
    sample_input: Callable[[random.Random], dict[str, object]]
    simplification: str = "--O2"  # circom's flag (--O0 keeps a shape that --O2 would simplify away)
    contributions: int = 1  # snarkjs `zkey contribute` rounds of its key
    beacon: bool = False  # then a `zkey beacon`

    @property
    def build_options(self) -> list[str]:
        """What differs from the defaults (part of the cache digests; none for the default recipe)."""
        return [f"{field}={getattr(self, field)}" for field, default in
                (("simplification", "--O2"), ("contributions", 1), ("beacon", False))
                if getattr(self, field) != default]

    @property
    def source(self) -> Path:
        """tests/circuits/<name>.circom."""
        return CIRCUIT_SOURCES / f"{self.name}.circom"


CIRCUITS = {spec.name: spec for spec in (
    CircuitSpec("multiplier", True, _multiplier_input),
    CircuitSpec("mimc_chain", True, _mimc_input),
    CircuitSpec("bits_compare", True, _bits_input),
    CircuitSpec("sha256_block", False, _sha_input),
)}
SNARKJS_CIRCUITS = [name for name, spec in CIRCUITS.items() if spec.snarkjs_setup]
# Odd but valid shapes, snarkjs-keyed, for the interop tests alone (tests/circuits/<name>.circom
# says what each is about): no public signal; only public signals (20, and no private wire); wires
# in no constraint and linear constraints (A, B empty) under --O0, its key with three contributions
# and a beacon. Their domains (nConstraints + nPublic + 1 rows: 2, 31, 9) lie on, below and above
# a power of two.
SHAPE_CIRCUITS = {spec.name: spec for spec in (
    CircuitSpec("no_public", True, _no_public_input),
    CircuitSpec("public_only", True, _public_only_input),
    CircuitSpec("unused_wires", True, _unused_wires_input, simplification="--O0", contributions=3, beacon=True),
)}
ALL_CIRCUITS = {**CIRCUITS, **SHAPE_CIRCUITS}


@dataclass(frozen=True)
class CircuitFiles:
    """What circom2 made from one test circuit."""

    name: str
    r1cs: Path
    wasm: Path


@dataclass(frozen=True)
class SnarkjsKey:
    """A snarkjs Groth16 key (after its circuit's contributions, and beacon) and its exported verification key."""

    zkey: Path
    vk: Path


class Oracle:
    """Lazily built, cached artifacts of the test circuits (see the module docstring)."""

    def __init__(self) -> None:
        self._circuits: dict[str, CircuitFiles] = {}
        self._keys: dict[str, SnarkjsKey] = {}
        self._ptau: Path | None = None

    def circuit(self, name: str) -> CircuitFiles:
        """The compiled .r1cs and .wasm of test circuit ``name``."""
        if name not in self._circuits:
            spec = ALL_CIRCUITS[name]

            def build(d: Path) -> None:
                compile_circuit(spec.source, d, spec.simplification)

            digest = _digest(spec.source.read_bytes(), *spec.build_options)
            folder = cached_build(f"circuit-{name}", digest, build)
            r1cs, wasm = folder / f"{name}.r1cs", folder / f"{name}_js" / f"{name}.wasm"
            self._circuits[name] = CircuitFiles(name, r1cs, wasm)
        return self._circuits[name]

    def ptau(self) -> Path:
        """The prepared bls12381 powers of tau of ``2^PTAU_POWER``."""
        if self._ptau is None:

            def build(d: Path) -> None:
                powersoftau(PTAU_POWER, d)

            folder = cached_build(f"ptau{PTAU_POWER}", _digest(str(PTAU_POWER)), build)
            self._ptau = folder / f"pot{PTAU_POWER}_final.ptau"
        return self._ptau

    def snarkjs_key(self, name: str) -> SnarkjsKey:
        """snarkjs's Groth16 zkey (sections 1..10; its spec's contributions and beacon) and verification
        key for ``name``."""
        if name not in self._keys:
            spec = ALL_CIRCUITS[name]
            if not spec.snarkjs_setup:
                raise ValueError(f"{name} is too large for the 2^{PTAU_POWER} test ptau")
            files, ptau = self.circuit(name), self.ptau()

            def build(d: Path) -> None:
                zkey = groth16_setup(files.r1cs, ptau, d / f"{name}.zkey", spec.contributions, spec.beacon)
                export_vk(zkey, d / "vk.json")

            digest = _digest(files.r1cs.read_bytes(), ptau.parent.name, *spec.build_options)
            folder = cached_build(f"zkey-{name}", digest, build)
            self._keys[name] = SnarkjsKey(folder / f"{name}.zkey", folder / "vk.json")
        return self._keys[name]


_ORACLE = Oracle()


@pytest.fixture(scope="session")
def oracle() -> Oracle:
    """The session's :class:`Oracle`; skips the test if the node tools are not installed."""
    require_tools()
    return _ORACLE
