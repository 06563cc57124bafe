"""Memory bound and crash handling of the pipeline (CPU backend, one slow prover process).

One engine for the module: ring_slots = 2, one prover process with one worker
thread (the slow consumer) and two synthesis workers (fast producers). The
tests kill processes with SIGKILL mid-job, among them a worker caught while its
slot is FILLING, and check that the job is retried and completes (or, after the
retry, fails with an error naming the process), that the ring's slots are
reclaimed, that a cancelled or unsatisfied partition gives its FILLING slot
back, that every segment left belongs to a free slot (kept for reuse, never
more than the slots) and goes when the ring is trimmed, and that nothing with
the prefix is left in /dev/shm after shutdown. A prover that keeps dying before
READY degrades its own engine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from cuzk_mp.pipeline.engine import Engine, RunningEngine
from cuzk_mp.pipeline.keys import synthetic_key_paths
from cuzk_mp.pipeline.ring import Ring, SlotRecord
from cuzk_mp.pipeline.shm_names import live_segments, shm_entries
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


def _ring_idle_then_trimmed(engine: RunningEngine) -> None:
    """Every slot free, at most one kept segment a slot, and none once the idle ring is trimmed: no
    segment outlives its slot's record (what a leak would look like)."""
    wait_until(lambda: status_of(engine)["ring"]["stats"]["live"] == 0, timeout=30)
    assert live_segments(PREFIX) <= 2
    engine.ring.trim(idle_s=0)
    assert live_segments(PREFIX) == 0 and engine.ring.stats().held == 0


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
    assert after["segments_made"] - before["segments_made"] <= 2  # the kept segments were reused
    _ring_idle_then_trimmed(engine)


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
    _ring_idle_then_trimmed(engine)


FILL_LOG_N = 16  # a partition whose synthesis takes long enough to be caught FILLING on a loaded machine


def _big_job(engine: RunningEngine, job_id: str, seed: int) -> JobSpec:
    engine.register_circuit(CircuitSpec("porep16", synthetic="porep-like", log_n=FILL_LOG_N))
    return JobSpec(job_id, "porep16", [PartitionInput("synthetic", seed=seed)])


def _kill_prover_holding(engine: RunningEngine, job_id: str, attempts: int) -> None:
    """SIGKILL the prover while it holds an attempt of ``job_id`` it has not finished.

    It is stopped first and the engine given a moment to read anything it sent: only if the
    attempt is still "proving" then (no proof can leave a stopped process) is it killed.
    """
    while True:
        wait_until(lambda: _partition_state(engine, job_id, "proving", attempts))
        pid = _process(engine, "cuzk-prover-0")["pid"]
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.5)
        if _partition_state(engine, job_id, "proving", attempts) is not None:
            os.kill(pid, signal.SIGKILL)
            return
        os.kill(pid, signal.SIGCONT)


def test_kill_prover_mid_job_then_retry_exhausted(running, checker: ProofChecker) -> None:
    engine, results = running
    engine.submit(_big_job(engine, "kill-prover", 200))  # a 2^16 partition: seconds in the prover
    big = ProofChecker(synthetic_key_paths("porep-like", FILL_LOG_N, KEY_CACHE)[0], FILL_LOG_N)
    _kill_prover_holding(engine, "kill-prover", attempts=1)
    first = results.wait("kill-prover")
    assert _all_verify(first, big) and max(p.attempts for p in first.partitions) == 2
    assert _process(engine, "cuzk-prover-0")["restarts"] == 1

    # now kill the prover twice on the same partition: its retry is used up and the job fails alone
    engine.submit(_big_job(engine, "doomed", 300))
    _kill_prover_holding(engine, "doomed", attempts=1)
    _kill_prover_holding(engine, "doomed", attempts=2)
    engine.submit(_job("survivor", 2, base=400))
    doomed = results.wait("doomed")
    assert doomed.state == "failed"
    assert "cuzk-prover-0" in doomed.error and "SIGKILL" in doomed.error and "attempt 2 of 2" in doomed.error
    assert _all_verify(results.wait("survivor"), checker)
    _ring_idle_then_trimmed(engine)


ORPHAN_SCRIPT = """
import sys, time
from pathlib import Path
from cuzk_mp.pipeline.engine import Engine
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
        from cuzk_mp.pipeline.shm_names import cleanup_stale

        cleanup_stale(prefix)


def test_backoff_doubles_to_its_cap() -> None:
    """A child that keeps dying quickly is restarted at once the first time, then after
    BACKOFF_BASE_S doubling each time, never longer than BACKOFF_MAX_S."""
    from cuzk_mp.pipeline.supervisor import BACKOFF_BASE_S, BACKOFF_MAX_S, backoff_s

    delays = [backoff_s(streak) for streak in range(0, 40)]
    assert delays[:4] == [0.0, 0.0, BACKOFF_BASE_S, 2 * BACKOFF_BASE_S]
    assert all(b == min(2 * a, BACKOFF_MAX_S) for a, b in zip(delays[2:], delays[3:], strict=False))
    assert delays[-1] == BACKOFF_MAX_S


def test_a_provers_busy_seconds_never_go_down_when_it_is_restarted() -> None:
    """A prover's kernel-busy seconds (the counter ``cuzk_engine_prover_busy_seconds_total``) count
    from 0 in each process; a restarted prover of the same name adds to what its predecessor counted,
    so the engine's figure never goes down while the engine runs."""
    from types import SimpleNamespace

    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.engine_events import EngineEvents

    child = SimpleNamespace(handle=SimpleNamespace(pid=100))
    engine = EngineEvents()  # the event thread's work alone: the attributes it reads here
    engine.sup = SimpleNamespace(children={"cuzk-prover-0": child})  # type: ignore[assignment]
    engine.provers, engine._busy_before = {}, {}

    def report(busy: float) -> float:
        engine._on_message("cuzk-prover-0", msg.Stats(values={"busy_seconds": busy}))
        return float(engine.provers["cuzk-prover-0"].busy_seconds)

    assert [report(2.0), report(5.0)] == [2.0, 5.0]
    child.handle = SimpleNamespace(pid=101)  # died and was restarted: the new process counts from 0
    assert [report(0.5), report(1.0)] == [5.5, 6.0]


def test_crash_loop_degrades_then_recovers(checker: ProofChecker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A prover that keeps dying before READY: restarted with backoff (never given up), the engine
    reports the role degraded with the cause, jobs that cannot progress fail naming it (no silent
    hang); once the process starts again the engine recovers and proves. The backoff's base is cut
    to a tenth (the same doubling; the delays themselves: ``test_backoff_doubles_to_its_cap``)."""
    from cuzk_mp.pipeline import supervisor

    monkeypatch.setattr(supervisor, "BACKOFF_BASE_S", supervisor.BACKOFF_BASE_S / 10)
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
        # the same role and process (the reason's counts may have grown since)
        assert [d.role for d in status.degraded] == ["prover"] and "cuzk-prover-0" in status.degraded[0].reason
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


def _stop_a_filling_worker(ring: Ring, workers: set[int], timeout: float = 120.0) -> SlotRecord:
    """SIGSTOP a synthesis worker caught while its slot is FILLING; the slot's record.

    A worker stopped just as it published (or inside the ring's lock, which would block this
    check) is let go again and another one caught.
    """
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        rec = next((r for r in ring.snapshot() if r.state == "filling" and r.owner_pid in workers), None)
        if rec is None:
            continue
        os.kill(rec.owner_pid, signal.SIGSTOP)
        got: list[SlotRecord] = []
        check = threading.Thread(target=lambda: got.append(ring.record(rec.slot)), daemon=True)
        check.start()
        check.join(1.0)
        if got and got[0].state == "filling" and got[0].owner_pid == rec.owner_pid:
            return got[0]
        os.kill(rec.owner_pid, signal.SIGCONT)
        check.join()
    raise AssertionError("no synthesis worker caught with a FILLING slot")


@pytest.fixture
def ring_view(running):
    view = Ring.attach(running[0].ring.handle)
    yield view
    view.close()


def _synth_pids(engine: RunningEngine) -> set[int]:
    return {p.pid for p in engine.status().processes if p.role == "synth" and p.alive}


def test_worker_death_while_filling_reclaims_the_slot(running, ring_view: Ring) -> None:
    engine, results = running
    engine.submit(_big_job(engine, "fill-kill", 700))
    rec = _stop_a_filling_worker(ring_view, _synth_pids(engine))
    os.kill(rec.owner_pid, signal.SIGKILL)
    result = results.wait("fill-kill")
    assert result.state == "done" and result.partitions[0].attempts == 2  # tried again, proved
    assert ring_view.stats().reclaimed >= 1
    _ring_idle_then_trimmed(engine)


def test_cancel_while_filling_gives_the_slot_back(running, ring_view: Ring) -> None:
    engine, results = running
    engine.submit(_big_job(engine, "fill-cancel", 800))
    rec = _stop_a_filling_worker(ring_view, _synth_pids(engine))
    try:
        assert engine.cancel("fill-cancel")
    finally:
        os.kill(rec.owner_pid, signal.SIGCONT)  # it sees the cancel at its next boundary
    assert results.wait("fill-cancel").state == "cancelled"
    wait_until(lambda: status_of(engine)["ring"]["stats"]["live"] == 0
               and status_of(engine)["queue"]["in_flight"] == 0, timeout=30)
    _ring_idle_then_trimmed(engine)
    worker = next(p for p in status_of(engine)["processes"] if p["pid"] == rec.owner_pid)
    assert worker["alive"] and worker["ready"]  # the same process carried on: a cancel is not a death


def test_unsatisfied_witness_abandons_its_slot(running, checker: ProofChecker,
                                               caplog: pytest.LogCaptureFixture) -> None:
    from cuzk_mp.formats.wtns import wtns_bytes

    engine, results = running
    w = checker.circuit.witness(9, 0)
    w[checker.n_public + 40, 0] ^= 1
    before = engine.status().ring.stats
    engine.submit(JobSpec("unsat", "porep", [PartitionInput("wtns", wtns_bytes(w))]))
    failed = results.wait("unsat")
    assert failed.state == "failed" and failed.partitions[0].error_kind == "UnsatisfiedWitness"
    assert "(job unsat partition 0) failed: UnsatisfiedWitness" in caplog.text  # the log names the job
    after = engine.status().ring.stats
    # the slot was FILLING (taken, segment created, synthesised into) and given back, never published
    assert after.published == before.published and after.released == before.released + 1
    _ring_idle_then_trimmed(engine)


@contextlib.contextmanager
def _small_engine(name: str, **config: Any) -> Iterator[tuple[RunningEngine, Collector]]:
    """A one-worker, one-prover CPU engine of its own (``config``: more EngineConfig fields), the test
    circuit registered; stopped after, with nothing of its prefix left in /dev/shm."""
    prefix = prefix_for(name)
    results = Collector()
    fields = {"backend": "cpu", "devices": [0], "gpu_workers_per_device": 1, "partition_workers": 1,
              "ring_slots": 2, "shm_prefix": prefix, "param_cache": KEY_CACHE, "start_timeout_s": 120, **config}
    engine = Engine(EngineConfig(**fields), on_job_done=results.job, on_partition_done=results.partition).start()
    try:
        engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
        yield engine, results
    finally:
        engine.stop(grace_s=10)
    assert shm_entries(prefix) == []


def test_a_worker_waiting_for_a_ring_slot_is_not_taken_as_hung(checker: ProofChecker) -> None:
    """A synthesis worker that waits for a free ring slot longer than task_timeout (the one slot
    published, its prover stopped between attempts) is not killed: the wait is the ring's. Once the
    prover goes on, both partitions prove at their first attempt and no process was restarted."""
    with _small_engine("slotwait", partition_workers=2, ring_slots=1, task_timeout_s=3) as (engine, results):
        engine.preload("porep")
        prover = _process(engine, "cuzk-prover-0")["pid"]
        os.kill(prover, signal.SIGSTOP)  # idle: it holds no attempt, so no timer of its own runs
        try:
            engine.submit(_job("slotwait", 2))
            wait_until(lambda: _partition_state(engine, "slotwait", "ready") is not None
                       and _partition_state(engine, "slotwait", "synthesizing") is not None, timeout=60)
            time.sleep(2 * engine.config.task_timeout_s + 1)  # the second worker waits for the slot all along
            assert _partition_state(engine, "slotwait", "synthesizing") is not None
        finally:
            os.kill(prover, signal.SIGCONT)
        result = results.wait("slotwait")
        assert _all_verify(result, checker) and [p.attempts for p in result.partitions] == [1, 1]
        assert all(p["restarts"] == 0 for p in status_of(engine)["processes"]), status_of(engine)["processes"]


def test_a_hung_prover_is_killed_and_its_partition_retried(checker: ProofChecker) -> None:
    """A prover stopped (SIGSTOP) while it holds an attempt never dies by itself: after
    task_timeout the engine kills it, says why, restarts it and retries the attempt, which
    then verifies."""
    prefix = prefix_for("hung")
    results = Collector()
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=1,
                          ring_slots=2, shm_prefix=prefix, param_cache=KEY_CACHE, start_timeout_s=120,
                          task_timeout_s=8)  # a proof of this size takes ~1-3 s; more under load
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    try:
        engine.submit(_big_job(engine, "hung", 500))
        big = ProofChecker(synthetic_key_paths("porep-like", FILL_LOG_N, KEY_CACHE)[0], FILL_LOG_N)
        while True:  # stop the prover while it proves the attempt (not between two)
            wait_until(lambda: _partition_state(engine, "hung", "proving") is not None, timeout=120)
            pid = _process(engine, "cuzk-prover-0")["pid"]
            os.kill(pid, signal.SIGSTOP)
            time.sleep(0.5)
            if _partition_state(engine, "hung", "proving") is not None:
                break
            os.kill(pid, signal.SIGCONT)
        result = results.wait("hung")
        assert _all_verify(result, big) and result.partitions[0].attempts == 2
        prover = _process(engine, "cuzk-prover-0")
        assert prover["restarts"] == 1 and "more than task_timeout (8 s)" in prover["last_exit"], prover
    finally:
        engine.stop(grace_s=10)
    assert shm_entries(prefix) == []


def test_a_child_that_reads_nothing_does_not_hold_up_the_engine(checker: ProofChecker) -> None:
    """The engine sends to its children while it holds its lock. A prover that stops reading (stopped
    here; a long key load on its reader thread does the same) fills its pipe: the messages wait in its
    outbox, and status, submit and the other calls go on; once it reads again, all of them arrive."""
    with _small_engine("noread") as (engine, results):
        prover = _process(engine, "cuzk-prover-0")["pid"]
        os.kill(prover, signal.SIGSTOP)
        try:
            done = threading.Event()

            def flood() -> None:  # ~300 of these fill a pipe: each an EvictKey to every prover
                for _ in range(3000):
                    engine.evict("porep")
                done.set()

            threading.Thread(target=flood, daemon=True).start()
            assert done.wait(30), "evict() blocked on a child that reads nothing"
            engine.submit(_job("noread", 1))
            queue = engine.status().queue
            assert queue.pending + queue.in_flight == 1
        finally:
            os.kill(prover, signal.SIGCONT)
        result = results.wait("noread")
        assert _all_verify(result, checker) and result.partitions[0].attempts == 1


def test_a_restart_that_cannot_spawn_is_tried_again(checker: ProofChecker, monkeypatch: pytest.MonkeyPatch) -> None:
    """A dead worker whose restart fails to spawn (too many open files, no memory) is a failed start,
    scheduled again with backoff, not a child the engine forgets: a job submitted then still proves."""
    import cuzk_mp.pipeline.supervisor as supervisor

    with _small_engine("respawn") as (engine, results):
        real, fails = supervisor.spawn_child, [1]

        def flaky(spec: Any) -> Any:
            if spec.role == "synth" and fails[0]:
                fails[0] -= 1
                raise OSError(24, "Too many open files")
            return real(spec)

        monkeypatch.setattr(supervisor, "spawn_child", flaky)
        os.kill(_process(engine, "cuzk-synth-0")["pid"], signal.SIGKILL)
        wait_until(lambda: fails[0] == 0, timeout=30)
        engine.submit(_job("respawn", 2))
        result = results.wait("respawn", timeout=120)
        assert _all_verify(result, checker)
        worker = _process(engine, "cuzk-synth-0")
        assert worker["alive"] and "could not be started: OSError" in worker["last_exit"], worker


def test_a_prover_dying_during_a_preload_ends_the_preload(checker: ProofChecker) -> None:
    """preload waits for the provers it asked; one that dies before it answers ends the wait at once
    (WorkerDied naming it) instead of after start_timeout, and its restart proves jobs as usual."""
    from cuzk_mp.errors import WorkerDied

    with _small_engine("predeath", start_timeout_s=60) as (engine, results):
        pid = _process(engine, "cuzk-prover-0")["pid"]
        os.kill(pid, signal.SIGSTOP)  # it cannot answer the LoadKey
        outcome: list[BaseException | None] = []

        def preload() -> None:
            try:
                engine.preload("porep")
                outcome.append(None)
            except BaseException as e:  # noqa: BLE001 - what the caller would get
                outcome.append(e)

        t0 = time.monotonic()
        waiter = threading.Thread(target=preload)
        waiter.start()
        time.sleep(0.5)
        os.kill(pid, signal.SIGKILL)
        waiter.join(50)
        assert time.monotonic() - t0 < 30 and len(outcome) == 1
        assert isinstance(outcome[0], WorkerDied) and "cuzk-prover-0 died while loading" in str(outcome[0])
        engine.submit(_job("predeath", 1))
        assert _all_verify(results.wait("predeath"), checker)


def test_a_process_stuck_in_the_rings_lock_does_not_hold_the_engines(checker: ProofChecker) -> None:
    """A child stopped inside the ring's (fcntl) lock holds it until it is killed. A status read waits for
    it, but never while holding the engine's lock: cancel, submit and the event thread (which kills hung
    children) go on."""
    import subprocess
    import sys

    with _small_engine("ringlock") as (engine, _):
        ctl = f"/dev/shm/{engine.ring.handle.prefix}-ctl"
        holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time\n"
                                   f"fd = os.open({ctl!r}, os.O_RDWR)\nfcntl.lockf(fd, fcntl.LOCK_EX)\n"
                                   "print('locked', flush=True)\ntime.sleep(6)\n"],
                                  stdout=subprocess.PIPE, text=True)
        try:
            assert holder.stdout is not None and holder.stdout.readline().strip() == "locked"
            reader = threading.Thread(target=engine.status, daemon=True)
            reader.start()
            time.sleep(0.5)
            t0 = time.monotonic()
            assert engine.cancel("no-such-job") is False
            assert time.monotonic() - t0 < 2.0 and reader.is_alive()  # the status read still waits
        finally:
            holder.wait(30)
        reader.join(10)
        assert not reader.is_alive()
