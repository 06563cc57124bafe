"""The engine's job bookkeeping without processes: order, retries, late proofs, failure, cancel."""

from __future__ import annotations

from cuzk_mp.pipeline.messages import CircuitRef
from cuzk_mp.pipeline.scheduler import Scheduler
from cuzk_mp.pipeline.types import JobSpec, PartitionInput, Priority

REF = CircuitRef("c", "/nonexistent.zkey")


def _job(job_id: str, n: int, priority: Priority = Priority.NORMAL) -> JobSpec:
    return JobSpec(job_id, "c", [PartitionInput("synthetic", seed=i) for i in range(n)], priority)


def _drain(s: Scheduler) -> list[tuple[str, int]]:
    order = []
    while (t := s.next_task()) is not None:
        order.append((t.job.spec.job_id, t.index))
    return order


def test_order_is_priority_then_fifo_then_partition() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 2), REF)
    s.add_job(_job("b", 2, Priority.LOW), REF)
    s.add_job(_job("c", 2, Priority.HIGH), REF)
    s.add_job(_job("d", 1), REF)
    assert _drain(s) == [("c", 0), ("c", 1), ("a", 0), ("a", 1), ("d", 0), ("b", 0), ("b", 1)]


def test_job_done_when_all_partitions_proved() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 2), REF)
    t0, t1 = s.next_task(), s.next_task()
    s.on_published(t0.task_id, 0, {"synthesis": 0.5, "shm_write": 0.25})
    s.on_taken(t0.task_id, "cuzk-prover-0", 0)
    out = s.on_proof(t0.task_id, "proof0", [5], {"device": 1.0}, 0)
    assert [r.index for _, r in out.partitions] == [0] and not out.jobs
    # stages reported by different processes merge into the one record (none is lost on the way)
    assert {"synthesis", "shm_write", "device", "total"} <= set(out.partitions[0][1].timings)
    assert out.partitions[0][1].timings["shm_write"] == 0.25
    out = s.on_proof(t1.task_id, "proof1", [6], {}, 1)
    assert len(out.jobs) == 1
    job = out.jobs[0]
    assert job.state == "done" and [p.proof for p in job.partitions] == ["proof0", "proof1"]
    assert [p.device for p in job.partitions] == [0, 1] and job.partitions[0].timings["total"] >= 0
    assert s.counters().jobs_finished["done"] == 1 and not s.jobs and not s.tasks


def test_lost_partition_is_retried_once_then_job_fails() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 2), REF)
    s.add_job(_job("b", 1), REF)
    t0 = s.next_task()
    assert not s.on_lost([t0.task_id], "cuzk-synth-0 (pid 1) died (killed by SIGKILL)").jobs
    retry = s.next_task()  # the retry keeps its place: job a, partition 0 comes first again
    assert (retry.job.spec.job_id, retry.index, retry.attempt) == ("a", 0, 2)
    out = s.on_lost([retry.task_id], "cuzk-prover-0 (pid 2) died (killed by SIGKILL)")
    assert len(out.jobs) == 1 and out.jobs[0].state == "failed"
    assert "partition 0" in out.jobs[0].error and "cuzk-prover-0" in out.jobs[0].error
    assert "2 of 2" in out.jobs[0].error
    assert out.jobs[0].partitions[0].error_kind == "WorkerDied"
    assert out.jobs[0].partitions[1].error_kind == "Cancelled"
    assert [t.index for t in out.cancel] == []  # partition 1 was still queued: nothing in a child
    assert _drain(s) == [("b", 0)]  # the other job carries on


def test_input_errors_are_not_retried() -> None:
    s = Scheduler(max_attempts=3)
    s.add_job(_job("a", 3), REF)
    t0, t1 = s.next_task(), s.next_task()
    out = s.on_failed(t1.task_id, "UnsatisfiedWitness", "witness does not satisfy constraint 7 of 900")
    assert out.jobs[0].state == "failed" and "constraint 7" in out.jobs[0].error
    assert {t.task_id for t in out.cancel} == {t0.task_id}  # the sibling in synthesis must be dropped
    assert s.next_task() is None


def test_late_proof_of_lost_attempt_wins() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 1), REF)
    t0 = s.next_task()
    s.on_lost([t0.task_id], "cuzk-synth-0 died")
    t1 = s.next_task()
    out = s.on_proof(t0.task_id, "late", [], {}, 0)
    assert out.jobs[0].state == "done" and out.jobs[0].partitions[0].proof == "late"
    assert [t.task_id for t in out.cancel] == [t1.task_id] and s.counters().late_proofs_used == 1
    assert not s.on_proof(t1.task_id, "second", [], {}, 0).jobs  # ignored


def test_cancel_and_drain_rules() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 2), REF)
    s.add_job(_job("b", 2), REF)
    started = s.next_task()  # job a started
    out = s.cancel("b")
    assert out.jobs[0].state == "cancelled" and s.cancel("b") is None and s.cancel("nope") is None
    s.add_job(_job("c", 1), REF)
    assert [j.spec.job_id for j in [r for r in s.jobs.values()]] == ["a", "c"]
    out = s.fail_all_unstarted("engine stopping")
    assert [j.job_id for j in out.jobs] == ["c"]
    nxt = s.next_task(started_only=True)
    assert (nxt.job.spec.job_id, nxt.index) == ("a", 1) and started.index == 0


def test_status_rows_and_failing_everything_with_a_cause() -> None:
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 2, Priority.HIGH), REF)
    t0 = s.next_task()
    s.on_published(t0.task_id, 1, {"witness": 0.1})
    rows = s.rows()
    assert [(r.job_id, r.priority, r.state) for r in rows] == [("a", "HIGH", "running")]
    assert [(p.index, p.state, p.timings) for p in rows[0].partitions] == [(0, "ready", {"witness": 0.1}),
                                                                           (1, "pending", {})]
    assert (s.queue().pending, s.queue().in_flight) == (1, 1)
    out = s.fail_all("the engine is degraded: no prover process is running", kind="WorkerDied")
    job = out.jobs[0]
    assert job.state == "failed" and "degraded" in job.error
    assert [p.error_kind for p in job.partitions] == ["WorkerDied", "WorkerDied"]
    assert [t.task_id for t in out.cancel] == [t0.task_id]  # the attempt in the ring is dropped
    assert s.counters().jobs_finished == {"done": 0, "failed": 1, "cancelled": 0}


def test_held_time_leaves_out_the_waits_for_a_ring_slot(monkeypatch) -> None:
    """The hung-process timer counts what a synthesis worker does with an attempt, not the time
    it waits for a free ring slot (every slot filling or waiting for a prover: the ring's wait)."""
    import cuzk_mp.pipeline.scheduler as sched

    clock = [1000.0]
    monkeypatch.setattr(sched.time, "monotonic", lambda: clock[0])
    s = Scheduler(max_attempts=2)
    s.add_job(_job("a", 1), REF)
    t = s.next_task()
    clock[0] += 2.0  # loading the circuit
    assert t.held_for(clock[0]) == 2.0
    s.on_ring_wait(t.task_id, True)
    clock[0] += 500.0  # the ring is full
    assert t.held_for(clock[0]) == 2.0
    s.on_ring_wait(t.task_id, True)  # a repeated start changes nothing
    s.on_ring_wait(t.task_id, False)
    clock[0] += 3.0  # synthesis
    assert t.held_for(clock[0]) == 5.0
    s.on_published(t.task_id, 0, {})
    assert t.held_for(clock[0]) is None  # in the ring: no process holds it
    s.on_taken(t.task_id, "cuzk-prover-0", 0)
    clock[0] += 7.0
    assert t.held_for(clock[0]) == 7.0  # the prover's time since it took the slot
    s.on_ring_wait(t.task_id, True)  # late or stray: a proving attempt is not the worker's
    assert t.held_for(clock[0]) == 7.0


def test_finished_jobs_keep_no_input_bytes() -> None:
    """The last KEEP_FINISHED jobs stay for the status, not their inputs: a witness or input JSON is up
    to max_frame_bytes a partition, and 200 finished jobs' inputs would otherwise stay in the engine
    after the daemon let them go, outside every budget. The caller's JobSpec is left as it was."""
    s = Scheduler(max_attempts=2)
    big = b"\1" * (1 << 20)
    specs = [JobSpec(job_id, "c", [PartitionInput("wtns", data=big) for _ in range(2)])
             for job_id in ("done", "failed", "cancelled", "queued-cancelled")]
    for spec in specs:
        s.add_job(spec, REF)
    tasks = [s.next_task() for _ in range(6)]  # every partition of the first three jobs dispatched
    for t in tasks[:2]:
        s.on_proof(t.task_id, "proof", [], {}, 0)
    s.on_failed(tasks[2].task_id, "UnsatisfiedWitness", "witness does not satisfy constraint 7")
    s.cancel("cancelled")
    s.cancel("queued-cancelled")  # its attempts are still in the queue's heap
    assert [j.state for j in s.finished] == ["done", "failed", "cancelled", "cancelled"]
    assert sum(len(p.data) for j in s.finished for p in j.spec.partitions) == 0
    assert sum(len(p.data) for _, t in s._queue for p in t.job.spec.partitions) == 0
    assert all(not j.tasks for j in s.finished)
    assert [p.kind for p in s.finished[0].spec.partitions] == ["wtns", "wtns"]  # what it was stays
    assert all(p.data == big for spec in specs for p in spec.partitions)
    assert [r.state for r in s.rows()] == ["done", "failed", "cancelled", "cancelled"]
