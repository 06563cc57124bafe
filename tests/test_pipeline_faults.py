"""Memory bound and crash handling of the pipeline (CPU backend, one slow prover process).

One engine for the module: ring_slots = 2, one prover process with one worker
thread (the slow consumer) and two synthesis workers (fast producers). The
tests kill processes with SIGKILL mid-job and check that the job is retried and
completes (or, after the retry, fails with an error naming the process), that
the ring's slots and segments are reclaimed, and that nothing with the prefix
is left in /dev/shm after shutdown.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from cuzk_mp.pipeline.engine import Engine, RunningEngine
from cuzk_mp.pipeline.ring import live_segments, shm_entries
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput

from tests.helpers import KEY_CACHE, LOG_N, Collector, ProofChecker, prefix_for, status_of, wait_until

PREFIX = prefix_for("flt")


@pytest.fixture(scope="module")
def running(checker: ProofChecker):
    results = Collector()
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=2,
                          ring_slots=2, shm_prefix=PREFIX, param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
    engine.preload("porep")
    yield engine, results
    engine.stop(grace_s=10)
    assert shm_entries(PREFIX) == []


def _job(job_id: str, n: int, base: int = 0) -> JobSpec:
    return JobSpec(job_id, "porep", [PartitionInput("synthetic", seed=base + i) for i in range(n)])


def _process(engine: RunningEngine, name: str) -> dict:
    return next(p for p in status_of(engine)["processes"] if p["name"] == name)


def _partition_state(engine: RunningEngine, job_id: str, state: str, attempts: int = 1) -> dict | None:
    for job in status_of(engine)["jobs"]:
        if job["job_id"] == job_id:
            return next((p for p in job["partitions"] if p["state"] == state and p["attempts"] == attempts), None)
    return None


def _all_verify(result, checker: ProofChecker) -> bool:
    return result.state == "done" and all(checker.verifies(p.public, p.proof) for p in result.partitions)


def test_ring_bounds_memory_and_producers_block(running, checker: ProofChecker) -> None:
    engine, results = running
    seen: list[int] = []
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set():
            seen.append(live_segments(PREFIX))
            time.sleep(0.01)

    watcher = threading.Thread(target=watch)
    watcher.start()
    before = status_of(engine)["ring"]["stats"]
    engine.submit(_job("bounded", 6))
    result = results.wait("bounded")
    stop.set()
    watcher.join()
    after = status_of(engine)["ring"]["stats"]
    assert _all_verify(result, checker)
    assert max(seen) <= 2 and max(seen) >= 1, f"live segments seen: max {max(seen)}"
    assert after["peak_live"] <= 2
    assert after["free_waits"] > before["free_waits"], "producers never blocked on a free slot"
    assert after["live"] == 0 and live_segments(PREFIX) == 0


def test_kill_synthesis_worker_mid_job(running, checker: ProofChecker) -> None:
    engine, results = running
    # The prover is paused (SIGSTOP) so that no slot frees: once both slots are taken, a worker holding
    # a task is blocked on a free slot (or filling one), and stays so until it is killed.
    # (Without the pause a loaded machine let the victim publish between the check and the kill.)
    prover = _process(engine, "cuzk-prover-0")["pid"]
    os.kill(prover, signal.SIGSTOP)
    try:
        engine.submit(_job("kill-synth", 4, base=100))

        def blocked_worker() -> dict | None:
            status = status_of(engine)
            if status["ring"]["stats"]["live"] < 2:
                return None
            return next((p for p in status["processes"] if p["role"] == "synth" and p["busy_task"] is not None),
                        None)

        victim = wait_until(blocked_worker)
        os.kill(victim["pid"], signal.SIGKILL)
    finally:
        os.kill(prover, signal.SIGCONT)
    result = results.wait("kill-synth")
    assert _all_verify(result, checker)
    assert max(p.attempts for p in result.partitions) == 2
    wait_until(lambda: _process(engine, victim["name"])["ready"] and _process(engine, victim["name"])["restarts"] == 1)
    assert "SIGKILL" in _process(engine, victim["name"])["last_exit"]
    assert status_of(engine)["ring"]["stats"]["live"] == 0 and live_segments(PREFIX) == 0


def test_kill_prover_mid_job_then_retry_exhausted(running, checker: ProofChecker) -> None:
    engine, results = running
    engine.submit(_job("kill-prover", 3, base=200))
    wait_until(lambda: _partition_state(engine, "kill-prover", "proving"))
    pid = _process(engine, "cuzk-prover-0")["pid"]
    os.kill(pid, signal.SIGKILL)
    first = results.wait("kill-prover")
    assert _all_verify(first, checker) and max(p.attempts for p in first.partitions) == 2
    assert _process(engine, "cuzk-prover-0")["restarts"] == 1

    # now kill the prover twice on the same partition: its retry is used up and the job fails alone
    engine.submit(_job("doomed", 2, base=300))
    wait_until(lambda: _partition_state(engine, "doomed", "proving"))
    os.kill(_process(engine, "cuzk-prover-0")["pid"], signal.SIGKILL)
    wait_until(lambda: _partition_state(engine, "doomed", "proving", attempts=2))
    os.kill(_process(engine, "cuzk-prover-0")["pid"], signal.SIGKILL)
    engine.submit(_job("survivor", 2, base=400))
    doomed = results.wait("doomed")
    assert doomed.state == "failed"
    assert "cuzk-prover-0" in doomed.error and "SIGKILL" in doomed.error and "attempt 2 of 2" in doomed.error
    assert _all_verify(results.wait("survivor"), checker)
    wait_until(lambda: status_of(engine)["ring"]["stats"]["live"] == 0, timeout=30)
    assert live_segments(PREFIX) == 0


ORPHAN_SCRIPT = """
import sys, time
from pathlib import Path
from cuzk_mp.pipeline.engine import Engine, RunningEngine
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput
engine = Engine(EngineConfig(backend="cpu", devices=[0], partition_workers=1, ring_slots=2,
                             shm_prefix=sys.argv[1], param_cache=Path(sys.argv[2]))).start()
engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=int(sys.argv[3])))
engine.submit(JobSpec("long", "porep", [PartitionInput("synthetic", seed=i) for i in range(400)]))
print(" ".join(str(p.pid) for p in engine.status().processes), flush=True)
time.sleep(600)
"""


def test_killed_engine_leaves_nothing_behind(checker: ProofChecker) -> None:
    import subprocess
    import sys

    import psutil

    prefix = prefix_for("orphan")
    proc = subprocess.Popen([sys.executable, "-c", ORPHAN_SCRIPT, prefix, str(KEY_CACHE), str(LOG_N)],
                            stdout=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                                [str(KEY_CACHE.parent.parent), os.environ.get("PYTHONPATH", "")])})
    try:
        children = [psutil.Process(int(pid)) for pid in proc.stdout.readline().split()]
        assert len(children) == 2
        wait_until(lambda: live_segments(prefix) >= 1)  # the ring is in use
        os.kill(proc.pid, signal.SIGKILL)  # the engine dies without stopping anything
        proc.wait(10)
        wait_until(lambda: shm_entries(prefix) == [], timeout=30)  # the orphans removed the ring...
        wait_until(lambda: not any(c.is_running() and c.status() != psutil.STATUS_ZOMBIE for c in children),
                   timeout=30)  # ...and exited
    finally:
        if proc.poll() is None:
            proc.kill()
        from cuzk_mp.pipeline.ring import cleanup_stale

        cleanup_stale(prefix)


def test_crash_loop_degrades_then_recovers(checker: ProofChecker) -> None:
    """A prover that keeps dying before READY: restarted with backoff (never given up), the engine
    reports the role degraded with the cause, jobs that cannot progress fail naming it (no silent
    hang); once the process starts again the engine recovers and proves."""
    results = Collector()
    prefix = prefix_for("loop")
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=1,
                          ring_slots=2, shm_prefix=prefix, param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    try:
        engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
        prover = engine.sup.children["cuzk-prover-0"]
        real_module, prover.spec.module = prover.spec.module, "tests.crashing_role"  # every restart dies
        os.kill(prover.handle.pid, signal.SIGKILL)
        degraded = wait_until(engine.degraded, timeout=60)
        assert [d.role for d in degraded] == ["prover"]
        assert "cuzk-prover-0" in degraded[0].reason and "before READY" in degraded[0].reason
        assert "exit code 3" in degraded[0].reason
        status = engine.status()
        assert status.degraded == degraded or status.degraded[0].role == "prover"
        row = next(p for p in status.processes if p.name == "cuzk-prover-0")
        assert row.failed_starts >= 3 and row.restarts >= 3
        engine.submit(_job("stuck", 1, base=500))
        failed = results.wait("stuck", timeout=30)  # fails with the cause, not after a timeout
        assert failed.state == "failed" and "degraded" in failed.error and "cuzk-prover-0" in failed.error
        assert failed.partitions[0].error_kind == "WorkerDied"
        restarts = row.restarts
        wait_until(lambda: next(p for p in engine.status().processes if p.name == "cuzk-prover-0").restarts
                   > restarts + 1, timeout=60)  # still restarting (with backoff): never given up
        prover.spec.module = real_module
        wait_until(lambda: not engine.degraded() and engine.metrics().alive["prover"] == 1
                   and all(p.ready for p in engine.status().processes), timeout=120)
        engine.submit(_job("after", 2, base=600))
        assert _all_verify(results.wait("after"), checker)
    finally:
        engine.stop(grace_s=5)
    assert shm_entries(prefix) == []
