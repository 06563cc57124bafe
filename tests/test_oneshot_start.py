"""The one-shot ``groth16 prove`` start: what it imports and does before proving.

The snarkjs verbs build their parser without the engine's verbs (no pipeline or bench modules
imported for a one-shot prove), ``--help`` still lists every verb, and a one-shot prove on the CPU
backend (the backend started beside the key and witness reads, the key loaded for that proof
alone) writes a proof that verifies, logging the time of each step.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cuzk_mp.cli import LOCAL_VERBS, _verb, main
from tests.helpers import REFUSE_NUMPY

DATA = Path(__file__).parent / "data_formats"


def test_verb_is_found_after_global_options() -> None:
    assert _verb(["--log-level", "INFO", "-v", "groth16", "prove"]) == "groth16"
    assert _verb(["-vv"]) is None
    assert {"groth16", "g16p", "zkey", "wtns", "setup", "circuit"} <= LOCAL_VERBS
    assert not {"bench", "daemon", "client"} & LOCAL_VERBS


def test_snarkjs_verbs_do_not_import_the_engine() -> None:
    code = ("import sys; from cuzk_mp.cli import main; main(['groth16', 'verify', 'nope.json', 'nope.json', "
            "'nope.json']); print(sorted(m for m in sys.modules if m.startswith(('cuzk_mp.pipeline', 'cuzk_mp.daemon', "
            "'asyncio', 'multiprocessing'))))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert "cuzk_mp.pipeline.bench" not in out and "cuzk_mp.pipeline.engine" not in out
    # the exit codes live in cuzk_mp.exit_codes: no daemon module (nor asyncio) loads to learn a number
    assert "cuzk_mp.daemon" not in out and "asyncio" not in out and "multiprocessing" not in out, out
    helptext = subprocess.run([sys.executable, "-m", "cuzk_mp.cli", "--help"], capture_output=True, text=True,
                              check=True).stdout
    assert all(verb in helptext for verb in ("bench", "daemon", "client", "groth16"))


@pytest.fixture
def key(tmp_path: Path) -> Path:
    """A copy of the test key: the first proof writes the circuit-data cache beside it, and
    that must not land in the repository."""
    dest = tmp_path / "mul.zkey"
    shutil.copyfile(DATA / "mul.zkey", dest)
    return dest


def test_one_shot_prove_logs_its_steps_and_verifies(tmp_path: Path, key: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    from cuzk_mp.groth16.prover import steps_of

    proof, public, vk = tmp_path / "proof.json", tmp_path / "public.json", tmp_path / "vk.json"
    assert main(["--log-level", "INFO", "groth16", "prove", "--backend", "cpu", str(key),
                 str(DATA / "mul.wtns"), str(proof), str(public)]) == 0
    steps = [line for line in capfd.readouterr().err.splitlines() if "prove: witness_map" in line]
    assert steps and all(f"{k} " in steps[0] for k in ("load_key", "stage", "device", "finalize"))
    read = steps_of(steps[0])  # the perf tools' reader of the line
    assert list(read)[:1] == ["witness_map"] and {"load_key", "stage", "device", "finalize"} <= set(read)
    assert all(v >= 0 for v in read.values())
    assert main(["zkey", "export", "verificationkey", str(DATA / "mul.zkey"), str(vk)]) == 0
    assert main(["groth16", "verify", str(vk), str(public), str(proof)]) == 0
    assert json.loads(public.read_text()) == json.loads((DATA / "public.json").read_text())


def test_console_script_leaves_at_once_with_its_files_written(tmp_path: Path, key: Path) -> None:
    """``python -m cuzk_mp`` (:func:`cuzk_mp.cli.run`): after a one-shot verb the process skips the
    interpreter's teardown, yet its files are whole, its log lines out and its exit code right."""
    proof, public, vk = tmp_path / "proof.json", tmp_path / "public.json", tmp_path / "vk.json"
    cmd = [sys.executable, "-m", "cuzk_mp", "--log-level", "INFO"]
    res = subprocess.run([*cmd, "g16p", "--backend", "cpu", str(key), str(DATA / "mul.wtns"),
                          str(proof), str(public)], capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stderr
    assert "proved with the cpu backend" in res.stderr
    assert (tmp_path / "mul.zkey.synth-ab").is_file()  # the cache went beside the key, as built
    assert subprocess.run([*cmd, "zkev", str(DATA / "mul.zkey"), str(vk)], check=False).returncode == 0
    res = subprocess.run([*cmd, "g16v", str(vk), str(public), str(proof)], capture_output=True, text=True,
                         check=False)
    assert (res.returncode, res.stdout.strip()) == (0, "OK!")
    res = subprocess.run([*cmd, "g16p", str(tmp_path / "absent.zkey"), str(DATA / "mul.wtns"), str(proof),
                          str(public)], capture_output=True, text=True, check=False)
    assert res.returncode == 2 and "absent.zkey" in res.stderr


NO_NUMBA = r"""
import importlib.abc, sys

class Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("numba", "llvmlite"):
            raise ImportError(f"{name} imported on the one-shot GPU path")
        return None

sys.meta_path.insert(0, Refuse())
key, wtns = sys.argv[1], sys.argv[2]
import numpy as np
import cuzk_mp.cli
from cuzk_mp.errors import InputError
from cuzk_mp.algebra.field import FR
from cuzk_mp.formats.snarkjs_json import proof_to_json, public_to_json
from cuzk_mp.formats.wtns import read_wtns
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.groth16.keys import prepared_vk_of
from cuzk_mp.groth16.prover import header_points, prove
from cuzk_mp.groth16.synthesis import ConstraintEvaluator
from tests.gpu_emu.backend import load_backend

evaluator = ConstraintEvaluator.from_files(key, None)  # the cache's open and body hash
zkey = read_zkey(key, check_coefs=False)
w = evaluator.validate_witness(read_wtns(wtns))  # the witness's range check
bad = w.copy()
bad[1] = FR.limbs
try:
    evaluator.validate_witness(bad)
    raise SystemExit("a value >= r passed the range check")
except InputError as exc:
    assert "witness value 1" in str(exc), exc
header_points(zkey), prepared_vk_of(zkey)
load_backend()  # the GPU backend's modules (over the emulator's CuPy)
print("numba-free")
"""


def test_one_shot_gpu_path_loads_no_numba(tmp_path: Path, key: Path) -> None:
    """What a one-shot GPU proof does on the host, from the imports to the key, the cached circuit
    data (its body hash), the witness's range check, the proof's header points and the GPU
    backend's modules, runs with numba's import refused: numba's ~0.35 s import and its kernels'
    first loads are not paid by a one-shot GPU process (the device does the witness map)."""
    main(["groth16", "prove", "--backend", "cpu", str(key), str(DATA / "mul.wtns"), str(tmp_path / "p.json"),
          str(tmp_path / "q.json")])  # builds the circuit-data cache beside the key (numba: a build's own)
    res = subprocess.run([sys.executable, "-c", NO_NUMBA, str(key), str(DATA / "mul.wtns")], capture_output=True,
                         text=True, check=False, cwd=Path(__file__).parents[1])
    assert res.returncode == 0 and res.stdout.strip() == "numba-free", res.stderr


NO_NUMPY = REFUSE_NUMPY + r"""
import types
from pathlib import Path

import cuzk_mp.cli
from cuzk_mp.daemon.client import write_outputs

proof = {"pi_a": ["1", "2", "1"], "protocol": "groth16", "curve": "bls12381"}
part = types.SimpleNamespace(index=0, proof=proof, public=["33"])
out = Path(sys.argv[1])
write_outputs(types.SimpleNamespace(partitions=[part], key_digest=None), out,
              types.SimpleNamespace(vk={"vk": []}, key_digest=None))
print(sorted(p.name for p in out.iterdir()))
"""


def test_client_process_writes_proofs_without_numpy(tmp_path: Path) -> None:
    """``cuzk-mp client prove`` writes the proof it received with the standard library alone (no
    numpy, numba or curve arithmetic: ~0.3 s of imports a process), the bytes as snarkjs writes them."""
    from cuzk_mp.formats.snarkjs_json import write_json

    res = subprocess.run([sys.executable, "-c", NO_NUMPY, str(tmp_path / "out")], capture_output=True, text=True,
                         check=False, cwd=Path(__file__).parents[1])
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "['proof_0.json', 'public_0.json', 'verification_key.json']"
    write_json(tmp_path / "want.json", {"pi_a": ["1", "2", "1"], "protocol": "groth16", "curve": "bls12381"})
    assert (tmp_path / "out" / "proof_0.json").read_bytes() == (tmp_path / "want.json").read_bytes()


HANDOFF_CHILD = r"""
import os, sys, time
from cuzk_mp.backends.gpu.early_context import hand_off_teardown
held = int(sys.argv[1])  # stands for the driver's device files: open in this process
hand_off_teardown()
os.close(held)           # this process's own reference is gone ...
sys.stdout.write("bye\n")
sys.stdout.flush()
time.sleep(1.0)          # ... but it lives on for a second
os._exit(3)
"""


@pytest.mark.parametrize("handoff", [True, False])
def test_exit_hands_open_files_to_a_child_until_the_process_is_gone(handoff: bool) -> None:
    """hand_off_teardown: a forked child keeps the process's open files (the CUDA driver's, in a
    GPU process) until the process has exited, so their release happens after it; the process's
    exit status and output are its own, the child says nothing and closes stdout/stderr (the
    caller's read of them ends with the process). Env CUZK_GPU_EXIT_HANDOFF=0: no child."""
    import os
    import select
    import time

    r, w = os.pipe()
    env = {**os.environ, "CUZK_GPU_EXIT_HANDOFF": "1" if handoff else "0"}
    proc = subprocess.Popen([sys.executable, "-c", HANDOFF_CHILD, str(w)], pass_fds=(w,), env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    os.close(w)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"bye\n"
        t_closed = time.monotonic()  # the process has closed its own reference
        ready, _, _ = select.select([r], [], [], 30)
        assert ready, "the held file never closed"
        assert os.read(r, 1) == b""
        released = time.monotonic() - t_closed
        out, err = proc.communicate(timeout=30)
    finally:
        os.close(r)
        proc.kill()
    assert proc.returncode == 3 and out == b"" and err == b"", (proc.returncode, out, err)
    if handoff:
        assert released >= 0.8, f"released {released:.2f} s after the process closed it: before it was gone"
    else:
        assert released < 0.8, f"released {released:.2f} s after the process closed it: something else held it"


STARTS_BEFORE_NUMPY = r"""
import sys
import cuzk_mp.backends.gpu.early_context as early

real = early.start_primary_context
seen = []

def spy(*args, **kwargs):
    seen.append("numpy" in sys.modules)
    return real(*args, **kwargs)

early.start_primary_context = spy
from cuzk_mp.cli import main

code = main(["groth16", "prove", "--backend", "auto", *sys.argv[1:]])
print(code, seen)
"""


def test_one_shot_starts_the_device_before_numpy_loads(tmp_path: Path, key: Path) -> None:
    """The CUDA start (context thread, then the backend's thread) begins before the one-shot prove
    imports numpy: on an H200 box numpy's import alone takes ~0.3 s, which used to come first."""
    res = subprocess.run([sys.executable, "-c", STARTS_BEFORE_NUMPY, str(key), str(DATA / "mul.wtns"),
                          str(tmp_path / "p.json"), str(tmp_path / "q.json")], capture_output=True, text=True,
                         check=False, cwd=Path(__file__).parents[1])
    assert res.returncode == 0 and res.stdout.strip() == "0 [False]", (res.stdout, res.stderr)
    assert json.loads((tmp_path / "p.json").read_text())["protocol"] == "groth16"


CONNECTIONS = r"""
import json, os, sys
import cuzk_mp.backends.gpu.early_context as early

early._retain = lambda device: None  # no driver here: what matters is the variable the context would read
seen = {"package": os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")}
early.start_primary_context().join()
seen["one_shot"] = os.environ.get("CUDA_DEVICE_MAX_CONNECTIONS")
print(json.dumps(seen))
"""


@pytest.mark.parametrize("caller", [None, "4"])
def test_one_shot_context_takes_the_drivers_default_queues(caller: str | None) -> None:
    """A lasting GPU process (importing the package) asks for 32 hardware queues; a one-shot process's
    early context asks for the driver's default 8 (the context is on a one-shot's critical path:
    perf/results/oneshot-start-full-h100-2026-12-07.json); a caller's own setting wins in both."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "CUDA_DEVICE_MAX_CONNECTIONS"}
    if caller is not None:
        env["CUDA_DEVICE_MAX_CONNECTIONS"] = caller
    res = subprocess.run([sys.executable, "-c", CONNECTIONS], capture_output=True, text=True, env=env,
                         cwd=Path(__file__).parents[1], check=False)
    assert res.returncode == 0, res.stderr
    seen = json.loads(res.stdout.strip().splitlines()[-1])
    assert seen == ({"package": "32", "one_shot": "8"} if caller is None else {"package": caller, "one_shot": caller})
