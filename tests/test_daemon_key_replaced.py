"""A circuit's zkey replaced on disk while the daemon runs (``cuzk-mp setup`` again to the same path:
a new random key of the same circuit): every proof the daemon reports done verifies with the
verification key the daemon reports for that circuit right after, and that key follows the file."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.backends import get_backend
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import Client, write_outputs
from cuzk_mp.errors import CuzkError, OutputError
from cuzk_mp.formats.snarkjs_json import proof_from_json, public_from_json, vk_from_json, vk_to_json
from cuzk_mp.formats.zkey import read_zkey
from cuzk_mp.groth16.keys import vk_from_zkey
from cuzk_mp.groth16.setup import setup_file
from cuzk_mp.groth16.verifier import verify
from tests.helpers import SNARKJS_FILES, DaemonProcess, config_text, shm_leftovers


def _vk_of(zkey: Path) -> dict[str, Any]:
    with read_zkey(zkey) as z:
        return vk_to_json(vk_from_zkey(z))


def _verifies(vk: dict[str, Any], reply: P.JobReply) -> bool:
    key = vk_from_json(vk)
    return all(p.state == "done" and verify(key, public_from_json(p.public), proof_from_json(p.proof))
               for p in reply.partitions)


def _new_key(r1cs: Path, zkey: Path, tmp: Path, in_place: bool) -> dict[str, Any]:
    """A new random key of the same circuit at ``zkey``: renamed over it (what ``cuzk-mp setup`` does)
    or, ``in_place``, its bytes copied into the same file (what ``cp`` does); its vk."""
    made = tmp / f"new-{os.urandom(4).hex()}.zkey"
    setup_file(str(r1cs), str(made), get_backend("cpu"))
    if in_place:
        shutil.copyfile(made, zkey)  # the same inode, rewritten
        made.unlink()
    else:
        os.replace(made, zkey)
    return _vk_of(zkey)


def _prove(c: Client, wtns: bytes) -> P.JobReply:
    reply = c.prove("mul", [P.PartitionIn(kind="wtns", data=wtns)], timeout_s=300)
    assert not reply.timed_out
    return reply


def test_replaced_key_is_followed(tmp_path: Path) -> None:
    zkey, r1cs = tmp_path / "mul.zkey", tmp_path / "mul.r1cs"
    shutil.copyfile(SNARKJS_FILES / "mul.r1cs", r1cs)
    setup_file(str(r1cs), str(zkey), get_backend("cpu"))
    wtns = (SNARKJS_FILES / "mul.wtns").read_bytes()
    circuits = f'[circuits.mul]\nzkey = "{zkey}"\nr1cs = "{r1cs}"\npartitions = 1\n'
    prefix = f"cuzk-kr-{os.getpid()}"
    (tmp_path / "cuzk.toml").write_text(config_text(tmp_path, tmp_path / "cache", prefix=prefix,
                                                    circuits=circuits))
    d = DaemonProcess(tmp_path / "cuzk.toml", tmp_path)
    try:
        d.wait_ready()
        with d.client() as c:
            first = _prove(c, wtns)
            vk1 = c.vk_reply("mul")
            assert vk1.vk == _vk_of(zkey) and _verifies(vk1.vk, first)
            assert first.key_digest is not None and first.key_digest == vk1.key_digest
            for step, in_place in (("renamed over, key resident", False), ("rewritten in place, key resident", True)):
                vk_file = _new_key(r1cs, zkey, tmp_path, in_place)
                reply = _prove(c, wtns)  # the old key is still resident in the prover
                vk = c.verification_key("mul")
                assert reply.state == "done", (step, reply)
                assert vk == vk_file, f"{step}: the reported vk is not the file's"
                assert _verifies(vk, reply), f"{step}: a done proof does not verify with the reported vk"
                assert reply.key_digest == c.vk_reply("mul").key_digest != first.key_digest, step
            out = tmp_path / "first-out"  # the first job's files after its key was replaced: no vk of another key
            try:
                write_outputs(c.await_proof(first.job_id), out, c.vk_reply("mul"))
                raise AssertionError("the vk of a replaced key written beside the older key's proofs")
            except OutputError as exc:
                assert "replaced after job" in str(exc) and first.key_digest in str(exc), exc
            assert sorted(p.name for p in out.iterdir()) == ["proof_0.json", "public_0.json"]
            for step, in_place in (("renamed over, key evicted", False), ("rewritten in place, key evicted", True)):
                assert c.evict("mul").evicted
                vk_file = _new_key(r1cs, zkey, tmp_path, in_place)
                reply = _prove(c, wtns)
                vk = c.verification_key("mul")
                assert reply.state == "done", (step, reply)
                assert vk == vk_file, f"{step}: the reported vk is not the file's"
                assert _verifies(vk, reply), f"{step}: a done proof does not verify with the reported vk"
            assert c.evict("mul").evicted  # a key file cut short: the preload's error names it, the daemon goes on
            good = zkey.read_bytes()
            zkey.write_bytes(good[: len(good) * 3 // 4])
            try:
                c.preload("mul")
                raise AssertionError("a truncated key file preloaded")
            except CuzkError as exc:
                assert str(zkey) in str(exc) and "truncated" in str(exc), exc
            zkey.write_bytes(good)
            assert c.preload("mul").seconds >= 0 and _verifies(c.verification_key("mul"), _prove(c, wtns))
        assert "changed on disk" in d.log()
        assert d.terminate() == 0
    finally:
        d.kill()
    assert shm_leftovers(prefix) == []


def test_job_straddling_a_key_change_fails_naming_the_file(tmp_path: Path) -> None:
    """A job accepted with one key file whose last proof arrives after the file was replaced is not
    reported done (its proofs are of the old key): every partition fails naming the file; and a
    prover or synthesis worker asked for a partition of it refuses the new file."""
    from cuzk_mp.errors import InputError
    from cuzk_mp.pipeline.circuits import check_pinned, key_changed, pinned
    from cuzk_mp.pipeline.messages import CircuitRef
    from cuzk_mp.pipeline.scheduler import Scheduler
    from cuzk_mp.pipeline.types import JobSpec, PartitionInput

    zkey, r1cs = tmp_path / "mul.zkey", tmp_path / "mul.r1cs"
    shutil.copyfile(SNARKJS_FILES / "mul.r1cs", r1cs)
    setup_file(str(r1cs), str(zkey), get_backend("cpu"))
    ref = pinned(CircuitRef("mul", str(zkey), str(r1cs)))
    assert ref.zkey_id is not None and key_changed(ref) is None
    s = Scheduler(max_attempts=2)
    s.add_job(JobSpec("j", "mul", [PartitionInput("wtns", b"wtns"), PartitionInput("wtns", b"wtns")]), ref)
    t0, t1 = s.next_task(), s.next_task()
    assert not s.on_proof(t0.task_id, "p0", [1], {}, None).jobs
    _new_key(r1cs, zkey, tmp_path, in_place=True)
    out = s.on_proof(t1.task_id, "p1", [1], {}, None)
    assert not out.jobs and not out.partitions and [j.spec.job_id for j in out.check_key] == ["j"]
    out = s.on_key_checked("j", key_changed(ref))  # the engine's read of the file, outside its lock
    (job,) = out.jobs
    assert job.state == "failed" and f"zkey {zkey} changed on disk" in (job.error or "")
    assert [p.proof for p in job.partitions] == [None, None]
    assert all(p.error_kind == "InputError" and str(zkey) in (p.error or "") for p in job.partitions)
    counts = s.counters()  # both were proved, neither delivered: counted apart, so proved - discarded is what left
    assert (counts.partitions_proved, counts.partitions_discarded, counts.jobs_finished["failed"]) == (2, 2, 1)
    try:
        check_pinned(ref)
        raise AssertionError("a prover would load the replaced file for the old job")
    except InputError as exc:
        assert "changed on disk since the job was accepted" in str(exc)
    assert key_changed(pinned(ref)) is None  # a job accepted now is pinned to the new file


def test_a_synthesis_task_of_a_job_pinned_to_a_replaced_key_keeps_the_files_current_circuit_data(
        tmp_path: Path) -> None:
    """A synthesis worker asked for a partition of a job accepted before the zkey was replaced, after it
    opened the new file's circuit data for a newer job: that task fails naming the file, and the worker
    keeps the current circuit data (not closed, not opened again by the newer job's next task)."""
    from cuzk_mp.errors import InputError
    from cuzk_mp.pipeline.circuits import pinned
    from cuzk_mp.pipeline.messages import CircuitRef
    from cuzk_mp.pipeline.synth import SynthWorker

    zkey, r1cs = tmp_path / "mul.zkey", tmp_path / "mul.r1cs"
    shutil.copyfile(SNARKJS_FILES / "mul.r1cs", r1cs)
    setup_file(str(r1cs), str(zkey), get_backend("cpu"))
    old = pinned(CircuitRef("mul", str(zkey), str(r1cs)))
    _new_key(r1cs, zkey, tmp_path, in_place=False)
    new = pinned(CircuitRef("mul", str(zkey), str(r1cs)))
    worker = SynthWorker(None, None, 1)  # type: ignore[arg-type]
    current = worker._circuit(new)
    try:
        try:
            worker._circuit(old)
            raise AssertionError("a partition of the old job was synthesized with the new key's data")
        except InputError as exc:
            assert f"zkey {zkey} changed on disk" in str(exc)
        assert worker.circuits.get("mul") is current and worker._circuit(new) is current
    finally:
        for c in worker.circuits.values():
            c.evaluator.close()


def test_the_same_key_touched_or_copied_is_not_a_change(tmp_path: Path) -> None:
    """A ``touch`` or a copy of the same bytes (a backup restored, an rsync) keeps the key: a job pinned
    before it is still the file's, and only another setup's key is a change."""
    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.circuits import key_changed, pinned

    zkey, r1cs = tmp_path / "mul.zkey", tmp_path / "mul.r1cs"
    shutil.copyfile(SNARKJS_FILES / "mul.r1cs", r1cs)
    setup_file(str(r1cs), str(zkey), get_backend("cpu"))
    ref = pinned(msg.CircuitRef("mul", str(zkey), str(r1cs), None))
    os.utime(zkey, ns=(1_000_000_000, 1_000_000_000))
    assert key_changed(ref) is None
    copy = tmp_path / "copy.zkey"
    shutil.copyfile(zkey, copy)
    os.replace(copy, zkey)  # the same bytes, another inode and mtime
    assert key_changed(ref) is None
    assert pinned(msg.CircuitRef("mul", str(zkey), str(r1cs), None)) == ref
    _new_key(r1cs, zkey, tmp_path, in_place=True)
    changed = key_changed(ref)
    assert changed is not None and str(zkey) in changed and "header digest" in changed


def test_a_vk_read_while_its_key_file_is_replaced_is_read_again(tmp_path: Path) -> None:
    """GetVerificationKey serves the vk with the digest of the file it was read from: where the file is
    replaced while the vk is read, the vk read is of either key, so it is read again."""
    import threading
    from types import SimpleNamespace

    from cuzk_mp.daemon.status import StatusView
    from cuzk_mp.pipeline.circuits import key_digest, key_identity

    zkey, r1cs = tmp_path / "mul.zkey", tmp_path / "mul.r1cs"
    shutil.copyfile(SNARKJS_FILES / "mul.r1cs", r1cs)
    setup_file(str(r1cs), str(zkey), get_backend("cpu"))
    view = object.__new__(StatusView)  # its vk part alone: a config of one circuit
    spec = SimpleNamespace(key_source="file", zkey=str(zkey), synthetic=None, log_n=None)
    view.cfg = SimpleNamespace(circuits={"mul": SimpleNamespace(spec=spec)}, param_cache=tmp_path)  # type: ignore[assignment]
    view._vks, view._vk_locks, view._vk_locks_lock, view.generated_vk = {}, {}, threading.Lock(), None
    make, reads = view._make_vk, []

    def replaced_while_read(circuit_id: str) -> dict[str, Any]:
        vk = make(circuit_id)
        if not reads:
            _new_key(r1cs, zkey, tmp_path, in_place=False)
        reads.append(vk)
        return vk

    view._make_vk = replaced_while_read  # type: ignore[method-assign]
    vk, digest = view.verification_key("mul")
    assert len(reads) == 2 and vk == _vk_of(zkey) != reads[0]
    assert digest == key_digest(key_identity(zkey))
    assert view.verification_key("mul") == (vk, digest) and len(reads) == 2  # kept: the file has not changed since
    from cuzk_mp.daemon.status import VK_READS

    reads.clear()
    replaced = VK_READS - 1  # replaced under every read but the last one allowed, which is served

    def replaced_while_read_but_the_last(circuit_id: str) -> dict[str, Any]:
        vk = make(circuit_id)
        if len(reads) < replaced:
            _new_key(r1cs, zkey, tmp_path, in_place=False)
        reads.append(vk)
        return vk

    _new_key(r1cs, zkey, tmp_path, in_place=False)
    view._make_vk = replaced_while_read_but_the_last  # type: ignore[method-assign]
    vk, digest = view.verification_key("mul")
    assert len(reads) == VK_READS and vk == _vk_of(zkey) == reads[-1] and digest == key_digest(key_identity(zkey))


def test_a_wasm_replaced_by_a_fifo_fails_its_job_and_holds_up_no_other(tmp_path: Path) -> None:
    """A circuit's wasm that became a FIFO (or a device) after the daemon checked its config fails the job
    that needs it, naming the file, at once; the synthesis worker goes on with the other circuits' jobs,
    and once the file is back a job proves. The worker opened it as a file to read to its end: a FIFO
    that no process writes held that job, every job queued behind it (another circuit's too) and the
    daemon's shutdown (the worker, deaf to SIGTERM in its open, was killed)."""
    import json

    from tests.helpers import circom_generator, small_circom_key

    zkey, r1cs = small_circom_key(tmp_path, "mul")
    wasm = circom_generator(tmp_path, "mul", inputs=6)  # 7 wires, as the key's circuit
    good = wasm.read_bytes()
    circuits = (f'[circuits.mul]\nzkey = "{zkey}"\nr1cs = "{r1cs}"\nwasm = "{wasm}"\npartitions = 1\n'
                '[circuits.syn]\nsynthetic = "porep-like"\nlog_n = 10\npartitions = 1\n')
    prefix = f"cuzk-wf-{os.getpid()}"
    (tmp_path / "cuzk.toml").write_text(config_text(tmp_path, tmp_path / "cache", prefix=prefix, circuits=circuits))
    one = [P.PartitionIn(kind="json", data=json.dumps({"a": [1, 2, 3, 4, 5, 6]}).encode())]
    d = DaemonProcess(tmp_path / "cuzk.toml", tmp_path)
    try:
        d.wait_ready()
        with d.client() as c:
            wasm.unlink()
            os.mkfifo(wasm)
            reply = c.prove("mul", one, timeout_s=30)
            assert reply.state == "failed" and not reply.timed_out, reply
            assert f"{wasm}: cannot read it in place: a FIFO" in (reply.error or ""), reply.error
            assert reply.error_kind == "InputError", reply
            other = c.prove("syn", [P.PartitionIn(kind="synthetic", seed=1)], timeout_s=60)
            assert other.state == "done", other
            wasm.unlink()
            wasm.write_bytes(good)
            again = c.prove("mul", one, timeout_s=60)
            assert not again.timed_out and "cannot read" not in (again.error or ""), again  # the wasm ran
        assert d.terminate() == 0
        assert "ignored SIGTERM" not in d.log()
    finally:
        d.kill()
    assert shm_leftovers(prefix) == []


def test_a_synthetic_circuits_key_gone_from_the_param_cache_says_how_to_make_it_again(tmp_path: Path) -> None:
    """The dev key of a synthetic circuit is made in the param cache at the daemon's start; a cache
    removed under the running daemon (a cleaner of ~/.cache) fails every job of the circuit. The
    message says which key it is and that a restart makes it again, where it said only "No such file
    or directory" of a file the operator never named."""
    from cuzk_mp.errors import InputError
    from cuzk_mp.pipeline.circuits import pinned
    from cuzk_mp.pipeline.messages import CircuitRef

    gone = tmp_path / "cache" / "porep-like-10.zkey"
    with pytest.raises(InputError) as info:
        pinned(CircuitRef("syn", str(gone), synthetic="porep-like", log_n=10))
    text = str(info.value)
    assert str(gone) in text and "No such file or directory" in text, text
    assert "synthetic circuit syn" in text and "param_cache" in text and "restart the daemon" in text, text
    zkey, r1cs = tmp_path / "mul.zkey", tmp_path / "mul.r1cs"
    with pytest.raises(InputError) as info:  # a circom circuit's key is the operator's own file: named alone
        pinned(CircuitRef("mul", str(zkey), str(r1cs)))
    assert "restart" not in str(info.value), info.value
