"""A circuit's key file on a hard NFS mount whose server went away: its stat and its header read never
return. The engine reads that header as it accepts a job or a preload (it pins the job to the key) and
looked at the file's size for its status; none of it may hold the engine's lock, which its event thread
(every child's messages, deaths, the hung-task timer), its status, its stop and every other circuit's
jobs need."""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from cuzk_mp.errors import CuzkError
from cuzk_mp.pipeline import circuits as circuits_module
from cuzk_mp.pipeline import engine_events
from cuzk_mp.pipeline.engine import Engine
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput

from tests.helpers import KEY_CACHE, LOG_N, Collector, prefix_for


def _calls(what: str, engine: Any) -> Any:
    """The engine call that reads the hung key file; once the mount is back the engine has stopped, which it
    refuses."""
    def call() -> None:
        with contextlib.suppress(CuzkError):
            if what == "submit":
                engine.submit(JobSpec("on-the-dead-mount", "hung", [PartitionInput("wtns", data=b"wtns")]))
            else:
                engine.preload("hung")
    return call


def _meanwhile(others: Callable[[], None]) -> None:
    """``others()`` on a thread named "others" while the key read hangs: it must end (the status answered, the
    other circuit's job was proved), not wait on that read."""
    other = threading.Thread(target=others, name="others", daemon=True)
    other.start()
    other.join(180)
    assert not other.is_alive(), "the engine's status or another circuit's job waited on the hung key read"


@pytest.mark.parametrize("what", ["submit", "preload"])
def test_a_key_read_that_never_returns_holds_no_lock_another_circuit_needs(
        test_key: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, what: str) -> None:
    """A submit (or a preload) of the circuit whose key hangs waits alone: meanwhile the engine's status
    answers, including that circuit's key row, and another circuit's job is accepted and proved."""
    hung_key = tmp_path / "hung.zkey"
    shutil.copyfile(test_key[0], hung_key)
    results = Collector()
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=1, ring_slots=2,
                          shm_prefix=prefix_for("hungkey"), param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    released, entered = threading.Event(), threading.Event()
    try:
        engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
        engine.register_circuit(CircuitSpec("hung", zkey=str(hung_key)))

        def on_the_dead_mount(real: Any) -> Any:
            def call(path: Any, *args: Any) -> Any:
                if Path(path) == hung_key:
                    entered.set()
                    released.wait()
                return real(path, *args)
            return call

        monkeypatch.setattr(circuits_module, "key_identity", on_the_dead_mount(circuits_module.key_identity))
        monkeypatch.setattr(os.path, "exists", on_the_dead_mount(os.path.exists))
        monkeypatch.setattr(os.path, "getsize", on_the_dead_mount(os.path.getsize))
        stuck = threading.Thread(target=_calls(what, engine), name="on-the-dead-mount", daemon=True)
        stuck.start()
        assert entered.wait(60)
        seen: dict[str, Any] = {}

        def others() -> None:
            seen["srs"] = {(row.circuit, row.tier) for row in engine.status().srs}
            engine.submit(JobSpec("fine", "porep", [PartitionInput("synthetic", seed=7)]))
            seen["fine"] = results.wait("fine", timeout=120).state

        _meanwhile(others)
        assert ("hung", "disk") in seen["srs"] and seen["fine"] == "done"
    finally:
        released.set()
        engine.stop(grace_s=0)


@pytest.mark.parametrize("ends", ["stop", "wait"])
def test_the_key_read_after_a_jobs_last_proof_holds_no_lock_when_it_never_returns(
        test_key: tuple, monkeypatch: pytest.MonkeyPatch, ends: str) -> None:
    """A job is done only if its key file is still its key once its last proof came, a read of that file:
    where it never returns, that job waits alone; the engine's status answers and another circuit's job
    (a key the provers generate: no file) is proved. The job fails, naming the file, once the read has not
    returned within KEY_CHECK_WAIT_S (``wait``), or at the stop where that comes first (``stop``)."""
    monkeypatch.setattr(engine_events, "KEY_CHECK_WAIT_S", 600.0 if ends == "stop" else 2.0)
    results = Collector()
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=1, ring_slots=2,
                          shm_prefix=prefix_for("hungproof"), param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    released, entered = threading.Event(), threading.Event()
    callers = {threading.current_thread().name, "others"}  # the test's threads; the engine's own read hangs
    try:
        engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
        engine.register_circuit(CircuitSpec("gen", synthetic="porep-like", log_n=LOG_N, key_source="device"))
        real = circuits_module.key_identity

        def on_the_dead_mount(path: Any) -> Any:
            if threading.current_thread().name not in callers:
                entered.set()
                released.wait()
            return real(path)

        monkeypatch.setattr(circuits_module, "key_identity", on_the_dead_mount)
        engine.submit(JobSpec("stuck", "porep", [PartitionInput("synthetic", seed=3)]))
        assert entered.wait(120)
        seen: dict[str, Any] = {}

        def others() -> None:
            seen["state"] = engine.status().state
            engine.submit(JobSpec("fine", "gen", [PartitionInput("synthetic", seed=7)]))
            seen["fine"] = results.wait("fine", timeout=120).state

        _meanwhile(others)
        assert seen == {"state": "running", "fine": "done"}
        if ends == "stop":
            engine.stop(grace_s=0)
        stuck = results.wait("stuck", timeout=60)
        assert stuck.state == "failed" and released.is_set() is False
        if ends == "wait":
            [part] = stuck.partitions
            assert part.error_kind == "ResourceError" and "did not answer within 2 s" in (part.error or "")
            assert engine.status().state == "running"
    finally:
        released.set()
        engine.stop(grace_s=0)
