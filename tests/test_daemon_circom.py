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
        # groth16 prove --connect: snarkjs's arguments, the daemon's resident key (found by its file)
        wtns, proof, public = tmp_path / "w.wtns", tmp_path / "proof.json", tmp_path / "public.json"
        subprocess.run([*PY, "wtns", "calculate", str(files.wasm), str(inputs[0]), str(wtns)], env=ENV, check=True)
        proc = subprocess.run([*PY, "groth16", "prove", "--connect", d.addr, str(key.zkey), str(wtns), str(proof),
                               str(public)], env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr + d.log()
        assert groth16_verify_many(key.vk, [(json.loads(public.read_text()), json.loads(proof.read_text()))]) == [True]
        other = tmp_path / "other.zkey"
        other.write_bytes(key.zkey.read_bytes())  # the same bytes, not the configured file
        proc = subprocess.run([*PY, "groth16", "prove", "--connect", d.addr, str(other), str(wtns), str(proof),
                               str(public)], env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "has no circuit with the key" in proc.stderr, proc.stderr
        short = tmp_path / "short.wtns"
        short.write_bytes(wtns.read_bytes()[:-32])  # the last witness value cut off
        proc = subprocess.run([*PY, "groth16", "prove", "--connect", d.addr, str(key.zkey), str(short), str(proof),
                               str(public)], env=ENV, capture_output=True, text=True, timeout=300)
        assert proc.returncode == 2 and "(.wtns), section 2 (witness): truncated" in proc.stderr, proc.stderr
        missing = {k: v for k, v in json.loads(inputs[0].read_text()).items()}
        missing.pop(next(iter(missing)))
        (tmp_path / "bad.json").write_text(json.dumps(missing))
        proc = subprocess.run([*PY, "client", "prove", "--connect", d.addr, "--circuit", "mimc",
                               "--out", str(tmp_path / "bad"), str(tmp_path / "bad.json")],
                              env=ENV, capture_output=True, text=True, timeout=300)
        summary = json.loads(proc.stdout)
        assert proc.returncode == 2 and summary["state"] == "failed"  # failed on its input: exit 2
        assert summary["partitions"][0]["error"] and summary["error_kind"] == "InputError", summary
        assert d.terminate() == 0
    finally:
        d.kill()
    assert shm_leftovers(prefix) == []
