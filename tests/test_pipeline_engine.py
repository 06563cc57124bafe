"""The engine end to end on the CPU backend: jobs of several partitions, two simulated devices,
an unsatisfied witness, cancellation, key management, status/metrics, clean shutdown."""

from __future__ import annotations

import json
import logging
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import msgspec
import psutil
import pytest

from cuzk_mp.errors import CuzkError, InputError
from cuzk_mp.pipeline.engine import Engine
from cuzk_mp.pipeline.shm_names import shm_entries
from cuzk_mp.pipeline.types import CircuitSpec, EngineConfig, JobSpec, PartitionInput, Priority

from tests.helpers import KEY_CACHE, LOG_N, Collector, ProofChecker, prefix_for, status_of, wait_until

SEED = 4242
PREFIX = prefix_for("eng")


@pytest.fixture(scope="module")
def running(test_key: tuple):
    results = Collector()
    config = EngineConfig(backend="cpu", devices=[0, 1], gpu_workers_per_device=2, partition_workers=2,
                          ring_slots=3, shm_prefix=PREFIX, param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N, partitions=3))
    yield engine, results
    children = [psutil.Process(p.pid) for p in engine.status().processes if p.alive]
    engine.stop(grace_s=10)
    assert engine.state == "stopped"
    assert shm_entries(PREFIX) == []  # every segment, the control block and both semaphores are gone
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    engine.stop()  # idempotent


def _synthetic_job(job_id: str, seeds: list[int], priority: Priority = Priority.NORMAL) -> JobSpec:
    return JobSpec(job_id, "porep", [PartitionInput("synthetic", seed=s) for s in seeds], priority)


def test_jobs_prove_and_verify_on_two_devices(running, checker: ProofChecker) -> None:
    engine, results = running
    print("seed", SEED)
    rng = random.Random(SEED)
    jobs = {f"e2e-{j}": [rng.randrange(1 << 30) for _ in range(3)] for j in range(3)}
    for job_id, seeds in jobs.items():
        engine.submit(_synthetic_job(job_id, seeds))
    devices = set()
    for job_id, seeds in jobs.items():
        result = results.wait(job_id)
        assert result.state == "done" and result.error is None and result.job_id == job_id
        assert [p.index for p in result.partitions] == [0, 1, 2]
        for p in result.partitions:
            want = checker.expected_public(seeds[p.index], p.index)
            assert p.public == want, f"{job_id} partition {p.index}: public signals differ"
            assert checker.verifies(p.public, p.proof)
            assert not checker.verifies([want[0] + 1, *want[1:]], p.proof)  # a wrong public input fails
            assert p.error is None and p.attempts == 1
            assert {"queue_wait", "synthesis", "ring_wait", "staging", "device", "finalize", "total"} <= set(p.timings)
            # every stage a process measured reaches the result: the synthesis worker's too
            assert {"shm_write", "witness", "device_wait"} <= set(p.timings), sorted(p.timings)
            assert all(v >= 0 for v in p.timings.values())
            devices.add(p.device)
        assert result.submitted_at <= result.started_at <= result.finished_at
    assert devices == {0, 1}, "both simulated devices (prover processes) must get work"
    done = [(j, r.index) for j, r in results.partitions if j in jobs]
    assert sorted(done) == sorted((j, i) for j in jobs for i in range(3))
    assert results.threads == {"cuzk-engine-events"}  # callbacks come from the engine thread


def test_unsatisfied_witness_fails_that_job_alone(running, checker: ProofChecker) -> None:
    from cuzk_mp.formats.wtns import wtns_bytes

    engine, results = running
    w = checker.circuit.witness(7, 1)
    w[checker.n_public + 40, 0] ^= 1  # one private wire off by one: some constraint must break
    bad = JobSpec("bad", "porep", [PartitionInput("synthetic", seed=7), PartitionInput("wtns", wtns_bytes(w))])
    engine.submit(bad)
    engine.submit(_synthetic_job("good-after-bad", [8, 9]))
    failed = results.wait("bad")
    assert failed.state == "failed" and "partition 1" in failed.error and "constraint" in failed.error
    assert failed.partitions[1].error_kind == "UnsatisfiedWitness" and failed.partitions[1].proof is None
    good = results.wait("good-after-bad")
    assert good.state == "done" and all(checker.verifies(p.public, p.proof) for p in good.partitions)


def test_submit_validation(running) -> None:
    engine, _ = running
    with pytest.raises(InputError, match="unknown circuit"):
        engine.submit(JobSpec("x1", "nope", [PartitionInput("synthetic")]))
    with pytest.raises(InputError, match="input kind"):
        engine.submit(JobSpec("x2", "porep", [PartitionInput("pickle", b"x")]))
    with pytest.raises(InputError, match="no wasm"):
        engine.submit(JobSpec("x3", "porep", [PartitionInput("json", b"{}")]))
    with pytest.raises(InputError, match="at least one partition"):
        engine.submit(JobSpec("x4", "porep", []))
    with pytest.raises(InputError, match="does not exist"):
        engine.register_circuit(CircuitSpec("ghost", zkey=KEY_CACHE / "ghost.zkey", r1cs=KEY_CACHE / "ghost.r1cs"))


def test_cancel_frees_everything(running, checker: ProofChecker) -> None:
    engine, results = running
    engine.submit(_synthetic_job("to-cancel", list(range(100, 140)), Priority.LOW))
    wait_until(lambda: any(j["job_id"] == "to-cancel" and any(p["state"] != "pending" for p in j["partitions"])
                           for j in status_of(engine)["jobs"]))
    assert engine.cancel("to-cancel") is True
    result = results.wait("to-cancel")
    assert result.state == "cancelled" and engine.cancel("to-cancel") is False
    assert sum(p.proof is None for p in result.partitions) >= 1
    wait_until(lambda: status_of(engine)["ring"]["stats"]["live"] == 0 and status_of(engine)["queue"]["in_flight"] == 0,
               timeout=60)
    engine.submit(_synthetic_job("after-cancel", [5]))
    assert results.wait("after-cancel").state == "done"


def test_keys_status_and_metrics(running) -> None:
    engine, results = running
    engine.evict("porep")
    wait_until(lambda: [(s["tier"], s["process"]) for s in status_of(engine)["srs"]] == [("disk", None)], timeout=30)
    engine.preload("porep")
    status = status_of(engine)
    json.dumps(status)  # JSON-able as the daemon serves it
    assert sorted((s["circuit"], s["process"], s["tier"]) for s in status["srs"]) == [
        ("porep", "cuzk-prover-0", "host"), ("porep", "cuzk-prover-1", "host")]
    assert {p["name"] for p in status["processes"]} == {"cuzk-prover-0", "cuzk-prover-1", "cuzk-synth-0",
                                                         "cuzk-synth-1"}
    assert all(p["alive"] and p["ready"] for p in status["processes"])
    assert len(status["ring"]["slots"]) == 3 and status["memory"]["host_rss_bytes"] > 0
    engine.submit(_synthetic_job("busy", [11, 12, 13]))
    assert engine.evict("porep") is False  # a job uses it
    results.wait("busy")
    assert engine.evict("porep") is True
    wait_until(lambda: [s["tier"] for s in status_of(engine)["srs"]] == ["disk"], timeout=30)
    metrics = engine.metrics()
    json.dumps(msgspec.to_builtins(metrics))
    assert metrics.counters.partitions_proved >= 3 and metrics.ring.published >= 3
    assert metrics.alive == {"prover": 2, "synth": 2} and metrics.degraded == []
    # per-partition stage timings reach the results (the daemon's one stage histogram observes them)
    assert all("device" in p.timings for p in results.wait("busy").partitions)


def test_priority_then_fifo_across_jobs(running) -> None:
    engine, results = running
    # 30 partitions are far more than the pipeline holds (2 synthesis + 3 slots + 2x2 prover workers), so
    # once the blocker runs, the jobs below all wait in the queue together and leave it in (priority, FIFO)
    engine.submit(_synthetic_job("blocker", list(range(20, 50))))
    wait_until(lambda: any(j.job_id == "blocker" and j.started_at for j in engine.status().jobs), interval=0.001)
    for job_id, prio in (("low", Priority.LOW), ("normal-1", Priority.NORMAL), ("critical", Priority.CRITICAL),
                         ("normal-2", Priority.NORMAL)):
        engine.submit(_synthetic_job(job_id, [1, 2], prio))
    with pytest.raises(InputError, match="already queued or running"):
        engine.submit(_synthetic_job("low", [3]))
    done = {j: results.wait(j) for j in ("blocker", "low", "normal-1", "critical", "normal-2")}
    assert all(r.state == "done" for r in done.values())
    t = {j: r.started_at for j, r in done.items()}
    assert t["blocker"] < t["critical"] <= t["normal-1"] <= t["normal-2"] <= t["low"] and t["critical"] < t["low"]


def test_children_get_their_device_before_any_import(monkeypatch: pytest.MonkeyPatch) -> None:
    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.procs import ChildSpec, spawn_child
    from cuzk_mp.pipeline.ring import RingHandle
    from cuzk_mp.pipeline.supervisor import child_specs

    config = EngineConfig(backend="gpu", devices=[3, 5], partition_workers=1, synthesis_threads=2)
    specs = child_specs(config, RingHandle("cuzk-x", 2), "gpu", [3, 5])
    assert [(s.name, s.env["CUDA_VISIBLE_DEVICES"]) for s in specs] == [
        ("cuzk-prover-3", "3"), ("cuzk-prover-5", "5"), ("cuzk-synth-0", "")]
    assert specs[2].env["NUMBA_NUM_THREADS"] == "2" and all(s.ring_prefix == "cuzk-x" for s in specs)
    # numba threads that wait sleep instead of spinning on cores other processes need; a set policy wins
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    cpu = child_specs(config, RingHandle("cuzk-x", 2), "cpu", [0])
    assert [s.env["OMP_WAIT_POLICY"] for s in cpu] == ["PASSIVE", "PASSIVE"]
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert child_specs(config, RingHandle("cuzk-x", 2), "cpu", [0])[1].env["OMP_WAIT_POLICY"] == "ACTIVE"
    assert specs[2].payload.threads == 2  # the evaluator gets threads_per_partition too
    # the bootstrap applies the environment before the role module is imported, and imports no cupy itself
    probe = ChildSpec("prover", 5, "tests.child_roles", {"CUDA_VISIBLE_DEVICES": "5"}, "hello")
    handle = spawn_child(probe)
    try:
        assert handle.conn.poll(60)
        ready = msg.decode_from_child(handle.conn.recv_bytes())
        assert isinstance(ready, msg.Ready) and ready.name == "cuzk-prover-5" and ready.pid == handle.pid
        assert ready.info == {"cuda_visible": "5", "numba_threads": None, "cupy_imported": 0, "payload": "hello"}
    finally:
        handle.send(msg.Stop())
        handle.proc.terminate()
        handle.proc.join(10)
        handle.close()


def test_a_child_outlives_a_hangup_its_engine_decides_about() -> None:
    """SIGHUP (a closed terminal's, sent to the whole process group, or ``systemctl kill``'s to the
    whole unit) leaves a child running, as Ctrl-C does: the engine decides what it means (a command
    stops its engine, the daemon ignores it), never a child that dies of it mid-partition."""
    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.procs import ChildSpec, spawn_child

    handle = spawn_child(ChildSpec("synth", 0, "tests.child_roles", {}, None))
    try:
        assert handle.conn.poll(60)  # READY: its signal dispositions are set
        assert isinstance(msg.decode_from_child(handle.conn.recv_bytes()), msg.Ready)
        for sig in (signal.SIGHUP, signal.SIGINT):
            os.kill(handle.pid, sig)
        handle.proc.join(0.5)
        assert handle.proc.exitcode is None, f"the child died of a hangup: exit {handle.proc.exitcode}"
    finally:
        handle.proc.terminate()
        handle.proc.join(10)
        handle.close()


@pytest.mark.snarkjs
def test_circom_json_partitions_verify_with_snarkjs(running, tmp_path) -> None:
    from cuzk_mp.formats.snarkjs_json import public_to_json, write_json

    from tests.oracle import CIRCUITS, _ORACLE, groth16_verify, require_tools

    require_tools()
    engine, results = running
    files, key = _ORACLE.circuit("multiplier"), _ORACLE.snarkjs_key("multiplier")
    engine.register_circuit(CircuitSpec("mult", zkey=key.zkey, wasm=files.wasm, r1cs=files.r1cs))
    rng = random.Random(SEED)
    inputs = [CIRCUITS["multiplier"].sample_input(rng) for _ in range(2)]
    engine.submit(JobSpec("circom", "mult", [PartitionInput("json", json.dumps(i).encode()) for i in inputs]))
    engine.submit(JobSpec("circom-bad", "mult", [PartitionInput("json", b'{"nope": 1}')]))
    result = results.wait("circom")
    assert result.state == "done"
    for i, p in enumerate(result.partitions):
        proof, public = tmp_path / f"p{i}.json", tmp_path / f"pub{i}.json"
        write_json(proof, p.proof)  # the proof is snarkjs proof.json as the prover made it
        write_json(public, public_to_json(p.public))
        assert groth16_verify(key.vk, public, proof)
    bad = results.wait("circom-bad")
    assert bad.state == "failed" and "nope" in bad.error and bad.partitions[0].error_kind == "InputError"


def test_failed_start_leaves_nothing() -> None:
    prefix = prefix_for("bad")
    engine = Engine(EngineConfig(backend="cpu", devices=[0], shm_prefix=prefix, start_timeout_s=0.01))
    with pytest.raises(CuzkError, match="failed to start"):
        engine.start()  # no child can import numba and answer READY in 10 ms
    assert engine.state == "failed" and shm_entries(prefix) == []
    again = Engine(EngineConfig(backend="cpu", devices=[0], shm_prefix=prefix))  # the prefix is free again
    again.stop()


def test_a_start_timeout_names_its_value_and_the_option_that_sets_it() -> None:
    """Under a second the limit is not "0 s", and the message names the knob: the caller's own name for
    it (the bench's option here), not the engine's field."""
    from cuzk_mp.pipeline.benchoptions import engine_option

    engine = Engine(EngineConfig(backend="cpu", devices=[0], shm_prefix=prefix_for("slow"), start_timeout_s=0.25),
                    key=engine_option)
    with pytest.raises(CuzkError, match=r"within 0\.25 s \(set by --start-timeout"):
        engine.start()


def test_a_gpu_engine_without_a_usable_gpu_says_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """backend gpu where the GPU backend cannot run: one InputError with the reason, before any
    process or shared memory is made (not a prover's traceback)."""
    from cuzk_mp import backends

    monkeypatch.setattr(backends, "gpu_unavailable_reason", lambda probe_device=True: "CuPy is not installed")
    prefix = prefix_for("nogpu")
    engine = Engine(EngineConfig(backend="gpu", devices=[0], shm_prefix=prefix))
    with pytest.raises(InputError, match="^backend gpu: CuPy is not installed$"):
        engine.start()
    assert engine.state == "failed" and shm_entries(prefix) == []


def test_a_child_whose_engine_is_gone_fails_its_task_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """The engine's end of the pipe closed (the engine was killed): a send is EngineGone, and a
    task failure (even one caused by that) is logged at INFO and raises nothing, so no thread of
    the orphan dies with a traceback on its way out."""
    import logging
    import multiprocessing as mp

    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.procs import ChildContext, ChildSpec, EngineGone

    child, engine = mp.Pipe()
    engine.close()
    ctx = ChildContext(ChildSpec("prover", 0, "cuzk_mp.pipeline.prover_proc", {}, None), child)
    with pytest.raises(EngineGone, match="the engine is gone"):
        ctx.send(msg.Stats({}))
    with caplog.at_level(logging.INFO):
        ctx.fail(7, RuntimeError("boom"))  # an internal error, whose report cannot leave
        ctx.fail(8, EngineGone("ProofDone not sent: the engine is gone"))
    assert "task 7's failure not reported" in caplog.text and "task 8 not finished" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "task 8" in r.getMessage()]


def test_a_task_cut_off_by_its_childs_signal_is_lost_with_the_child_not_an_internal_error(
        caplog: pytest.LogCaptureFixture) -> None:
    """A SIGTERM to a bench's whole process group (what ``timeout`` sends) stops each child where it
    stands: work its interpreter's exit refuses fails. That is the attempt lost with its process
    (WorkerDied, retried where the engine goes on), logged at INFO, not a bug's traceback."""
    import logging
    import multiprocessing as mp

    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.procs import ChildContext, ChildSpec

    child, engine = mp.Pipe()
    ctx = ChildContext(ChildSpec("prover", 0, "cuzk_mp.pipeline.prover_proc", {}, None), child)
    ctx.signalled = "SIGTERM"  # what the child's SIGTERM handler records before the process stops
    with caplog.at_level(logging.INFO):
        ctx.fail(9, RuntimeError("cannot schedule new futures after interpreter shutdown"))
    report = msg.decode_from_child(engine.recv_bytes())
    assert isinstance(report, msg.TaskFailed) and report.kind == "WorkerDied", report
    assert report.message == ("cuzk-prover-0 stopped on SIGTERM before the task finished (cannot schedule new "
                              "futures after interpreter shutdown)")
    assert "task 9 not finished" in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]


def test_child_messages_end_at_stop_and_at_eof() -> None:
    """ChildContext.messages, the roles' reader loop: engine messages in order, then a Stop (not
    yielded) or the pipe's EOF ends it with the stop flag set."""
    import multiprocessing as mp

    from cuzk_mp.pipeline import messages as msg
    from cuzk_mp.pipeline.procs import ChildContext, ChildSpec

    spec = ChildSpec("synth", 0, "cuzk_mp.pipeline.synth", {}, None)
    for end in ("stop", "eof"):
        child, engine = mp.Pipe()
        ctx = ChildContext(spec, child)
        engine.send_bytes(msg.encode(msg.CancelTasks([3, 4])))
        engine.send_bytes(msg.encode(msg.EvictKey("c1")))
        if end == "stop":
            engine.send_bytes(msg.encode(msg.Stop()))
        else:
            engine.close()
        got = list(ctx.messages())
        assert [type(m) for m in got] == [msg.CancelTasks, msg.EvictKey], end
        assert got[0].task_ids == [3, 4] and got[1].circuit_id == "c1"
        assert ctx.stopping.is_set()
        assert list(ctx.messages()) == []  # stopped: nothing more is read


def _stoppable(name: str, on_job: Any) -> Any:
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=1, partition_workers=1, ring_slots=2,
                          shm_prefix=prefix_for(name), param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=on_job).start()
    engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N))
    return engine


def test_the_rings_counters_outlive_the_stop(test_key: tuple) -> None:
    """The ring's counters (``cuzk_engine_ring_*_total``, the peak) are read while the daemon still
    answers scrapes after its engine stopped: they keep their figures, not 0, as a counter never goes
    down while the daemon lives."""
    results = Collector()
    engine = _stoppable("ringctr", results.job)
    try:
        engine.submit(_synthetic_job("one", [1]))
        assert results.wait("one").state == "done"
        before = engine.metrics().ring
        assert before.published == before.released == 1 and before.peak_live >= 1
    finally:
        engine.stop(grace_s=5)
    after = engine.metrics().ring
    assert (after.published, after.released, after.peak_live, after.free_waits, after.ready_waits) == \
        (before.published, before.released, before.peak_live, before.free_waits, before.ready_waits)
    assert after.live == 0 and engine.status().ring.slots == []


def test_stop_while_a_callback_runs_and_from_two_threads_loses_no_callback(test_key: tuple) -> None:
    """stop() while the event thread is inside a (slow) job callback still reports every job it fails;
    a second stop() from another thread waits for the first to end instead of stopping twice."""
    results = Collector()
    in_callback = threading.Event()

    def on_job(result: Any) -> None:
        results.job(result)
        if result.job_id == "quick":
            in_callback.set()
            time.sleep(2.0)

    engine = _stoppable("stopcb", on_job)
    engine.submit(_synthetic_job("quick", [1], Priority.HIGH))
    engine.submit(_synthetic_job("long", list(range(100, 300))))
    assert in_callback.wait(120)
    ended: dict[str, float] = {}

    def stop(name: str) -> None:
        engine.stop(grace_s=0)
        ended[name] = time.monotonic()

    first = threading.Thread(target=stop, args=("first",))
    first.start()
    time.sleep(0.2)
    stop("second")
    first.join(60)
    assert set(ended) == {"first", "second"} and ended["second"] >= ended["first"] - 0.05
    assert results.wait("long", timeout=10).state == "failed"  # its callback came, though the loop had ended
    assert engine.state == "stopped" and shm_entries(prefix_for("stopcb")) == []


def test_stop_from_a_job_callback_ends_without_waiting_on_itself(test_key: tuple) -> None:
    """A callback that stops the engine: no drain grace (the drain would wait on the thread running the
    callback), every other job reported failed, the engine stopped."""
    results = Collector()
    took: list[float] = []
    holder: list[Any] = []

    def on_job(result: Any) -> None:
        results.job(result)
        if result.job_id == "first":
            t0 = time.monotonic()
            holder[0].stop(grace_s=60)
            took.append(time.monotonic() - t0)

    engine = _stoppable("stopself", on_job)
    holder.append(engine)
    engine.submit(_synthetic_job("first", [1], Priority.HIGH))
    engine.submit(_synthetic_job("second", list(range(100, 200))))
    assert results.wait("second", timeout=120).state == "failed"
    assert took and took[0] < 30 and engine.state == "stopped"
    assert shm_entries(prefix_for("stopself")) == []


def test_an_interrupted_stop_kills_the_children_and_restarts_none(test_key: tuple, monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    """A second Ctrl-C lands in stop() before the children are stopped: the interrupt goes on up, and
    the children are killed and the event thread ends the stop: none taken for a crash, none restarted."""
    engine = _stoppable("intr", None)
    engine.submit(_synthetic_job("long", list(range(100, 300))))
    children = [psutil.Process(c.handle.pid) for c in engine.sup.children.values()]

    def interrupted(*_: Any) -> Any:
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.sched, "fail_all_unstarted", interrupted)
    with caplog.at_level(logging.INFO, logger="cuzk_mp.pipeline"), pytest.raises(KeyboardInterrupt):
        engine.stop(grace_s=0)
    assert engine.state in ("stopping", "stopped")  # the event thread may have ended the stop already
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    wait_until(lambda: engine.state == "stopped", timeout=10)  # the event thread ends the stop
    assert sum(c.restarts for c in engine.sup.children.values()) == 0
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert shm_entries(prefix_for("intr")) == []


def test_a_child_that_exits_cleanly_during_a_drain_is_no_crash_and_is_not_restarted(
        test_key: tuple, caplog: pytest.LogCaptureFixture) -> None:
    """SIGTERM to a synthesis worker while the engine drains (a signal to the whole process group): its
    clean exit is logged as such, not as a death, and no process is restarted during the stop."""
    engine = _stoppable("drainterm", None)
    engine.submit(_synthetic_job("long", list(range(100, 300))))
    wait_until(lambda: engine.sched.counters().partitions_proved >= 1, timeout=60)  # started: the drain keeps it
    stopper = threading.Thread(target=engine.stop, kwargs={"grace_s": 5.0})
    with caplog.at_level(logging.INFO, logger="cuzk_mp.pipeline.engine"):
        stopper.start()
        wait_until(lambda: engine.state == "draining", timeout=10)
        worker = engine.sup.children["cuzk-synth-0"]
        pid = worker.handle.pid
        os.kill(pid, signal.SIGTERM)
        wait_until(lambda: worker.handle.reaped, timeout=15)
        stopper.join(60)
    assert engine.state == "stopped"
    assert worker.restarts == 0 and worker.handle.pid == pid
    assert any("draining: 1 started job(s) may finish within 5.0 s" in r.getMessage() for r in caplog.records)
    mine = [r for r in caplog.records if f"pid={pid}" in r.getMessage()]
    assert mine and all(r.levelno == logging.INFO for r in mine), [r.getMessage() for r in mine]


def test_a_stop_interrupted_after_the_children_stopped_ends_stopped(test_key: tuple,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """An interrupt that lands once the stop has stopped every child and the event thread (while the
    pipes close): the engine stays ``stopped``, not ``stopping`` for good, and its ring is removed."""
    engine = _stoppable("intrlate", None)
    close_all = engine.sup.close_all

    def interrupted() -> None:
        monkeypatch.setattr(engine.sup, "close_all", close_all)
        raise KeyboardInterrupt

    monkeypatch.setattr(engine.sup, "close_all", interrupted)
    with pytest.raises(KeyboardInterrupt):
        engine.stop(grace_s=0)
    assert engine.state == "stopped"
    assert not engine._thread.is_alive()
    assert shm_entries(prefix_for("intrlate")) == []


def test_a_cancel_after_stop_writes_nothing_into_a_reused_descriptor(test_key: tuple, tmp_path: Path) -> None:
    """A cancel (or any wake of the event thread) after the engine stopped: the wake-up pipe is closed,
    and its descriptor numbers may already be another file's; nothing is written there."""
    engine = _stoppable("wakeclosed", Collector().job)
    engine.stop(grace_s=5)
    files = []
    try:
        for _ in range(8):  # the lowest free numbers: the pipe's, reused
            files.append(open(tmp_path / f"f{len(files)}", "wb"))  # noqa: SIM115 - closed below
        engine.cancel("no-such-job")
        engine._wake()
    finally:
        for f in files:
            f.close()
    assert all((tmp_path / f"f{i}").read_bytes() == b"" for i in range(len(files)))


def test_a_child_restarted_as_a_stop_is_abandoned_is_killed_too(test_key: tuple) -> None:
    """The event thread may be restarting a child (it read the engine as running) just as an interrupted
    stop kills the children: that new child is killed as well, and the stop still ends, ring removed."""
    engine = _stoppable("abandonrace", None)
    name = next(iter(engine.sup.children))
    with engine._cond:  # the event thread is held where it restarts children
        engine._abandon()
        engine.sup.children[name].restart_at = 0.0  # a restart due, made after the kill
        engine.sup.restart_due()
        late = psutil.Process(engine.sup.children[name].handle.pid)
    wait_until(lambda: engine.state == "stopped", timeout=15)
    psutil.wait_procs([late], timeout=10)
    assert not late.is_running() or late.status() == psutil.STATUS_ZOMBIE
    assert shm_entries(prefix_for("abandonrace")) == []


def test_a_stop_without_grace_ends_promptly_while_a_prover_loads_its_key(test_key: tuple,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Ctrl-C to a bench while its prover loads (or generates) the key: the prover reads no message
    until the load ends, so the stop does not wait for it to answer the stop message as a drain does;
    it ends within seconds, no process and nothing of the ring left behind."""
    from cuzk_mp.pipeline import supervisor

    monkeypatch.setitem(supervisor.ROLE_MODULES, "prover", "tests.slow_key_role")
    engine = _stoppable("nograce", None)
    children = [psutil.Process(c.handle.pid) for c in engine.sup.children.values()]
    ended: list[BaseException | None] = []

    def preload() -> None:
        try:
            engine.preload("porep")
            ended.append(None)
        except BaseException as exc:  # noqa: BLE001 - what ended it is asserted below
            ended.append(exc)

    loading = threading.Thread(target=preload, daemon=True)
    loading.start()
    time.sleep(0.5)  # the load message has reached the prover
    t0 = time.monotonic()
    engine.stop(grace_s=0)
    took = time.monotonic() - t0
    assert engine.state == "stopped"
    assert took < 5, f"a stop without grace took {took:.1f} s"
    gone, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert shm_entries(prefix_for("nograce")) == []
    loading.join(10)
    assert len(ended) == 1 and isinstance(ended[0], CuzkError), ended  # the waiting preload is told of the stop
