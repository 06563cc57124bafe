"""snarkjs's short verbs and ``groth16 fullprove`` against snarkjs, on the snarkjs-keyed test circuits.

Each circuit (tests/oracle.py: snarkjs ``groth16 setup`` + one contribution): ``wc`` computes the
witness, ``g16p`` proves it, ``g16f`` proves straight from the input JSON (and leaves no .wtns
behind), ``zkev`` exports what snarkjs exports; every proof passes ``snarkjs groth16 verify`` and
``g16v``, and a changed public signal fails both. The default file names are exercised as a
snarkjs user relies on them: the files laid out under snarkjs's names, the verbs given no paths.
"""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cuzk_mp.algebra.field import R_MOD
from tests.oracle import (
    CIRCUITS, SNARKJS_CIRCUITS, Oracle, groth16_verify, groth16_verify_many, snarkjs, write_json,
)
from tests.oracle import oracle  # noqa: F401  (the session fixture, for pytest to find)

pytestmark = pytest.mark.snarkjs
REPO = Path(__file__).resolve().parents[1]
SEED = 20261201


def cuzk(*args: object, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``python -m cuzk_mp ARGS`` in ``cwd``, as a user runs it."""
    env = {**os.environ, "PYTHONPATH": str(REPO) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run([sys.executable, "-m", "cuzk_mp", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def _ok(proc: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert proc.returncode == 0, f"{proc.args}:\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.parametrize("name", SNARKJS_CIRCUITS)
def test_aliases_and_fullprove_against_snarkjs(name: str, oracle: Oracle, tmp_path: Path) -> None:  # noqa: F811
    files, key = oracle.circuit(name), oracle.snarkjs_key(name)
    rng = random.Random(f"{SEED}-{name}")
    print(f"seed {SEED}-{name}")
    inputs = write_json(tmp_path / "in.json", CIRCUITS[name].sample_input(rng))
    # wc + g16p
    _ok(cuzk("wc", files.wasm, inputs, "w.wtns", cwd=tmp_path))
    _ok(cuzk("g16p", key.zkey, "w.wtns", "p1.json", "s1.json", "-v", cwd=tmp_path))
    # g16f: the witness never touches the disk
    before = set(tmp_path.iterdir())
    _ok(cuzk("g16f", inputs, files.wasm, key.zkey, "p2.json", "s2.json", cwd=tmp_path))
    assert set(tmp_path.iterdir()) - before == {tmp_path / "p2.json", tmp_path / "s2.json"}
    # the long form of fullprove too
    _ok(cuzk("groth16", "fullprove", inputs, files.wasm, key.zkey, "p3.json", "s3.json", cwd=tmp_path))
    # zkev equals snarkjs's export
    _ok(cuzk("zkev", key.zkey, "vk.json", cwd=tmp_path))
    assert json.loads((tmp_path / "vk.json").read_text()) == json.loads(key.vk.read_text())
    public = json.loads((tmp_path / "s1.json").read_text())
    proofs = [json.loads((tmp_path / f"p{i}.json").read_text()) for i in (1, 2, 3)]
    for i in (1, 2, 3):
        assert json.loads((tmp_path / f"s{i}.json").read_text()) == public  # one input, one set of public signals
    cases: list[tuple[object, object]] = [(public, proof) for proof in proofs]
    bumped = [str((int(public[0]) + 1) % R_MOD), *public[1:]] if public else None
    if bumped:
        cases.append((bumped, proofs[1]))
    assert groth16_verify_many(key.vk, cases) == [True, True, True] + ([False] if bumped else [])
    for i in (1, 2, 3):
        g16v = _ok(cuzk("g16v", key.vk, f"s{i}.json", f"p{i}.json", cwd=tmp_path))
        assert g16v.stdout.strip() == "OK!"
    if bumped:
        write_json(tmp_path / "bumped.json", bumped)
        assert cuzk("g16v", key.vk, "bumped.json", "p2.json", cwd=tmp_path).returncode == 1


def test_snarkjs_default_names_end_to_end(oracle: Oracle, tmp_path: Path) -> None:  # noqa: F811
    """In a folder laid out with snarkjs's default names, every verb runs without paths."""
    files, key = oracle.circuit("multiplier"), oracle.snarkjs_key("multiplier")
    (tmp_path / "circuit.wasm").symlink_to(files.wasm)
    (tmp_path / "circuit_final.zkey").symlink_to(key.zkey)
    write_json(tmp_path / "input.json", CIRCUITS["multiplier"].sample_input(random.Random(SEED)))
    _ok(cuzk("wc", cwd=tmp_path))  # -> witness.wtns
    _ok(cuzk("g16p", cwd=tmp_path))  # -> proof.json, public.json
    _ok(cuzk("zkev", cwd=tmp_path))  # -> circuit_vk.json, as snarkjs names it
    (tmp_path / "verification_key.json").symlink_to(tmp_path / "circuit_vk.json")
    assert _ok(cuzk("g16v", cwd=tmp_path)).stdout.strip() == "OK!"
    assert snarkjs("groth16", "verify", tmp_path / "verification_key.json", tmp_path / "public.json",
                   tmp_path / "proof.json").returncode == 0
    (tmp_path / "proof.json").unlink()
    _ok(cuzk("g16f", cwd=tmp_path))  # input.json + circuit.wasm + circuit_final.zkey -> proof.json
    assert groth16_verify(tmp_path / "verification_key.json", tmp_path / "public.json", tmp_path / "proof.json")


UNUSED_INPUT = """pragma circom 2.0.0;
template UnusedInput() {
    signal input a;
    signal input salt;  // in no constraint: circom drops its wire but counts it in nPrvIn
    signal output c;
    c <== a * a;
    log("c is", c);
}
component main {public [a]} = UnusedInput();
"""


def test_a_circuit_whose_unused_input_circom_dropped(oracle: Oracle, tmp_path: Path) -> None:  # noqa: F811
    """circom's r1cs counts an unused private input without a wire: ``setup`` and ``--r1cs`` take it
    as snarkjs does; the circuit's ``log()`` lines reach stdout as snarkjs prints them."""
    from tests.oracle import compile_circuit

    (tmp_path / "u.circom").write_text(UNUSED_INPUT)
    r1cs, wasm = compile_circuit(tmp_path / "u.circom", tmp_path)
    from cuzk_mp.formats.r1cs import read_r1cs
    head = read_r1cs(r1cs)
    assert head.n_wires < 1 + head.n_pub_out + head.n_pub_in + head.n_prv_in  # what the case is about
    _ok(cuzk("setup", "--backend", "cpu", r1cs, "u.zkey", cwd=tmp_path))
    write_json(tmp_path / "in.json", {"a": "3", "salt": "99"})
    res = _ok(cuzk("g16f", "in.json", wasm, "u.zkey", "p.json", "s.json", "--r1cs", r1cs, cwd=tmp_path))
    assert res.stdout.splitlines() == ["c is 9"]
    assert _ok(cuzk("wc", wasm, "in.json", "w.wtns", cwd=tmp_path)).stdout.splitlines() == ["c is 9"]
    _ok(cuzk("zkev", "u.zkey", "vk.json", cwd=tmp_path))
    assert json.loads((tmp_path / "s.json").read_text()) == ["9", "3"]
    assert groth16_verify(tmp_path / "vk.json", tmp_path / "s.json", tmp_path / "p.json")


def test_fullprove_bad_input_is_a_message(oracle: Oracle, tmp_path: Path) -> None:  # noqa: F811
    files, key = oracle.circuit("multiplier"), oracle.snarkjs_key("multiplier")
    write_json(tmp_path / "in.json", {"a": "3", "nope": "4"})
    proc = cuzk("groth16", "fullprove", "in.json", files.wasm, key.zkey, "p.json", "s.json", cwd=tmp_path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "'nope' is not an input signal" in proc.stderr and not (tmp_path / "p.json").exists()
    (tmp_path / "in.json").write_text("{not json")
    proc = cuzk("g16f", "in.json", files.wasm, key.zkey, cwd=tmp_path)
    assert proc.returncode == 2 and "in.json" in proc.stderr and "Traceback" not in proc.stderr


def test_fullprove_keep_warm_runs_the_wasm_in_the_warm_daemon(oracle: Oracle, tmp_path: Path,  # noqa: F811
                                                              short_tmp: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``fullprove --keep-warm``: the key's warm daemon (with the wasm) computes the witness and proves;
    the second call finds it running; a bad input fails its call alone, naming the file; snarkjs
    verifies the proofs. (The daemon side: tests/test_daemon_warm.py.)"""
    import shutil

    from cuzk_mp.daemon import warm

    files, key = oracle.circuit("multiplier"), oracle.snarkjs_key("multiplier")
    runtime = short_tmp  # the warm daemon's socket lives in $XDG_RUNTIME_DIR
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    zkey = shutil.copyfile(key.zkey, tmp_path / "m.zkey")  # its circuit-data cache lands in tmp_path
    try:
        write_json(tmp_path / "in.json", CIRCUITS["multiplier"].sample_input(random.Random(SEED)))
        for i in (1, 2):
            res = _ok(cuzk("-v", "g16f", "--keep-warm", "5", "--backend", "cpu", "in.json", files.wasm, zkey,
                           f"p{i}.json", f"s{i}.json", cwd=tmp_path))
            assert ("starting a warm daemon" in res.stderr) == (i == 1), res.stderr[-2000:]
            assert groth16_verify(key.vk, tmp_path / f"s{i}.json", tmp_path / f"p{i}.json")
        write_json(tmp_path / "bad.json", {"a": "3", "nope": "4"})
        res = cuzk("g16f", "--keep-warm", "5", "--backend", "cpu", "bad.json", files.wasm, zkey, "p3.json",
                   "s3.json", cwd=tmp_path)
        assert res.returncode == 2 and "bad.json" in res.stderr and not (tmp_path / "p3.json").exists(), res.stderr
        write_json(tmp_path / "null.json", {"a": None, "b": "4"})  # refused by the daemon's check at submit
        res = cuzk("g16f", "--keep-warm", "5", "--backend", "cpu", "null.json", files.wasm, zkey, "p3.json",
                   "s3.json", cwd=tmp_path)
        assert res.returncode == 2 and "error: null.json: signal a: a value must be" in res.stderr, res.stderr
        assert "partitions[" not in res.stderr
    finally:  # the daemon leaves by itself after 5 s idle: its socket first, its journal last
        monkeypatch.setattr(warm, "GONE_GRACE_S", 0.0)
        d, deadline = runtime / "cuzk-mp", time.monotonic() + 60
        while list(d.glob("*.sock")) and time.monotonic() < deadline:
            time.sleep(0.2)  # not asked meanwhile: a connection would keep it from idling
        while list(d.glob("*.toml")) and time.monotonic() < deadline:
            warm.remove_gone(d)  # its files, once its process has exited
            time.sleep(0.2)
