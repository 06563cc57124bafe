"""The daemon with a circom circuit: input JSON per partition goes through the circuit's wasm,
the proofs verify with snarkjs against the verification key *snarkjs* exported from its own
zkey, and an input that does not satisfy the circuit fails that job with a clear error."""

from __future__ import annotations

import json
import os
import random
import subprocess
from pathlib import Path

import pytest

from tests.oracle import CIRCUITS, Oracle, groth16_verify_many, oracle  # noqa: F401
from tests.helpers import ENV, PY, DaemonProcess, config_text, shm_leftovers

pytestmark = pytest.mark.snarkjs


def test_circom_inputs_prove_and_snarkjs_verifies(oracle: Oracle, tmp_path: Path) -> None:  # noqa: F811
    files, key = oracle.circuit("mimc_chain"), oracle.snarkjs_key("mimc_chain")
    extra = (f'[circuits.mimc]\nzkey = "{key.zkey}"\nr1cs = "{files.r1cs}"\n'
             f'wasm = "{files.wasm}"\npartitions = 2\n')
    prefix = f"cuzk-cc-{os.getpid()}"
    (tmp_path / "cuzk.toml").write_text(config_text(tmp_path, tmp_path / "keys", prefix=prefix,
                                                    extra=extra))
    seed = random.randrange(2**32)
    print("input seed", seed)
    rng = random.Random(seed)
    inputs = []
    for i in range(2):
        inputs.append(tmp_path / f"input{i}.json")
        inputs[-1].write_text(json.dumps(CIRCUITS["mimc_chain"].sample_input(rng)))
    d = DaemonProcess(tmp_path / "cuzk.toml", tmp_path)
    try:
        d.wait_ready()
        out = tmp_path / "out"
        proc = subprocess.run([*PY, "client", "prove", "--connect", d.addr, "--circuit", "mimc",
                               "--out", str(out), *map(str, inputs)], env=ENV,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stdout + proc.stderr + d.log()
        cases = [(json.loads((out / f"public_{i}.json").read_text()),
                  json.loads((out / f"proof_{i}.json").read_text())) for i in range(2)]
        assert groth16_verify_many(key.vk, cases) == [True, True]
        assert json.loads((out / "verification_key.json").read_text()) == json.loads(
            key.vk.read_text())
        missing = {k: v for k, v in json.loads(inputs[0].read_text()).items()}
        missing.pop(next(iter(missing)))
        (tmp_path / "bad.json").write_text(json.dumps(missing))
        proc = subprocess.run([*PY, "client", "prove", "--connect", d.addr, "--circuit", "mimc",
                               "--out", str(tmp_path / "bad"), str(tmp_path / "bad.json")],
                              env=ENV, capture_output=True, text=True, timeout=300)
        summary = json.loads(proc.stdout)
        assert proc.returncode == 1 and summary["state"] == "failed"
        assert summary["partitions"][0]["error"] and summary["error_kind"] == "InputError", summary
        assert d.terminate() == 0
    finally:
        d.kill()
    assert shm_leftovers(prefix) == []
