"""The product under a stepped system clock: an NTP correction, an operator setting the date or a VM
resumed from suspend moves ``time.time()`` by hours, forward or back, at any moment.

Durations and deadlines within a process are measured on ``time.monotonic()``; wall time is what is
shown to people and persisted. Each test steps ``time.time`` where the code reads it and checks that
no deadline, age or duration moves with it.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from cuzk_mp.backends.cpu import CpuBackend
from cuzk_mp.daemon import journal, status
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.client import AsyncClient, synthetic_partitions
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.pipeline.engine import Engine
from cuzk_mp.pipeline.engine_events import EngineEvents
from cuzk_mp.pipeline.messages import CircuitRef, ProofDone, Published, SynthTask, TaskFailed
from cuzk_mp.pipeline.prover_proc import Prover, ProverPayload
from cuzk_mp.pipeline.ring import Ring, SlotClaim
from cuzk_mp.pipeline.scheduler import Scheduler
from cuzk_mp.pipeline.synth import SynthWorker
from cuzk_mp.pipeline.types import STAGES, CircuitSpec, EngineConfig, JobSpec, PartitionInput, PartitionResult
from tests.fake_engine import run_daemon
from tests.helpers import KEY_CACHE, LOG_N, Collector, parse_prometheus, prefix_for
from tests.test_journal_integrity import _entry, _fill
from tests.test_prover_batching import _Ctx, run_until_answered

DAY_S = 86400.0
HOUR_S = 3600.0


def clock_stepping(monkeypatch: pytest.MonkeyPatch, by_s: float = -HOUR_S) -> None:
    """A system clock moved by ``by_s`` seconds between any two reads of it (set back an hour unless told)."""
    real, steps = time.time, itertools.count(1)
    monkeypatch.setattr(time, "time", lambda: real() + by_s * next(steps))


def step_clock(monkeypatch: pytest.MonkeyPatch, by_s: float) -> None:
    """Move the system clock by ``by_s`` seconds from now on (``time.time`` only: the monotonic clock
    does not step)."""
    real = time.time
    monkeypatch.setattr(time, "time", lambda: real() + by_s)


def test_a_clock_a_day_ahead_does_not_expire_results_early(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A result is kept ``result_ttl`` after its job ended, however the wall clock moves meanwhile."""
    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            r = await c.prove("syn", synthetic_partitions(1), request_id="r1", timeout_s=10)
            assert r.state == "done"
            step_clock(monkeypatch, DAY_S)
            assert await d.jobs.prune() == 0
            assert (await c.await_proof("r1", timeout_s=1)).state == "done"
            assert await d.jobs.prune(now=time.monotonic() + 61) == 1

    run_daemon(tmp_path, body, result_ttl="60s")


def test_a_result_restored_after_the_clock_went_back_still_expires(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A job journaled as finished an hour "in the future" (the clock was set back between two runs)
    is kept ``result_ttl`` from the restart, not for an hour more."""
    async def first(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            assert (await c.prove("syn", synthetic_partitions(1), request_id="r1", timeout_s=10)).state == "done"

    run_daemon(tmp_path, first, result_ttl="60s")
    step_clock(monkeypatch, -HOUR_S)

    async def second(d: Daemon, addr: str) -> None:
        assert await d.jobs.prune() == 0
        assert await d.jobs.prune(now=time.monotonic() + 61) == 1

    run_daemon(tmp_path, second, result_ttl="60s")


def test_a_clock_set_back_while_a_job_runs_gives_no_negative_latency(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """The submit-to-finish histogram and the job's log line take the time the job took, whatever the
    wall clock did meanwhile."""
    async def body(d: Daemon, addr: str) -> None:
        d.engine.gate.clear()
        async with await AsyncClient.connect(addr) as c:
            job_id = (await c.submit("syn", synthetic_partitions(1))).job_id
            step_clock(monkeypatch, -HOUR_S)
            d.engine.gate.set()
            assert (await c.await_proof(job_id, timeout_s=10)).state == "done"
        samples = parse_prometheus(await d.metrics_text())
        took = samples[("cuzk_job_duration_seconds_sum", (("circuit", "syn"),))]
        assert took >= 0.0

    run_daemon(tmp_path, body)


def test_the_status_shows_a_positive_uptime_and_the_latest_finished_jobs(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """After the clock was set back an hour the daemon's uptime is still the time it has run, and the
    status's finished jobs are the last ones to finish, not the last by their (stepped) finished_at."""
    monkeypatch.setattr(status, "MAX_FINISHED_IN_STATUS", 1)

    async def body(d: Daemon, addr: str) -> None:
        async with await AsyncClient.connect(addr) as c:
            assert (await c.prove("syn", synthetic_partitions(1), request_id="before", timeout_s=10)).state == "done"
            step_clock(monkeypatch, -HOUR_S)
            assert (await c.prove("syn", synthetic_partitions(1), request_id="after", timeout_s=10)).state == "done"
            doc = await c.status()
        assert doc["daemon"]["uptime_s"] >= 0.0
        assert [j["request_id"] for j in doc["jobs"]] == ["after"]

    run_daemon(tmp_path, body)

def test_the_journal_reports_the_rows_quarantined_last_first(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The status's latest quarantined rows are those quarantined last, also when the clock was set back
    in between (their quarantined_at is then the older)."""
    monkeypatch.setattr(journal, "QUARANTINE_IN_STATUS", 1)
    j = _fill(tmp_path / "journal.sqlite", 2)
    try:
        for i in range(2):
            reply = P.JobReply(id=0, job_id="someone-else", circuit_id="syn", state="done", priority="NORMAL",
                               partitions=[P.PartitionOut(index=0, state="done")], submitted_at=1.0)
            asyncio.run(j.finish(f"job-{i}", reply, _entry(i).partitions))
            j.load()  # reading it back quarantines the row
            step_clock(monkeypatch, -HOUR_S)
        report = asyncio.run(j.report())
        assert report["quarantined"] == 2 and [q["job_id"] for q in report["quarantine"]] == ["job-1"]
    finally:
        j.close()

def test_the_engine_times_a_partition_on_the_monotonic_clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A partition's queue wait (sent to the synthesis worker) and its submit-to-proof total are never
    negative because the clock was set back an hour between the job's submit and its proof."""
    s = Scheduler(max_attempts=2)
    s.add_job(JobSpec("a", "c", [PartitionInput("synthetic", seed=0)]), CircuitRef("c", "/nonexistent.zkey"))
    step_clock(monkeypatch, -HOUR_S)
    task = s.next_task()
    assert task is not None
    sent: list[SynthTask] = []
    worker = SimpleNamespace(handle=SimpleNamespace(send=sent.append))
    engine = SimpleNamespace(sup=SimpleNamespace(children={"w": worker}))
    EngineEvents._send_task(engine, "w", task)  # type: ignore[arg-type]
    assert sent[0].t_dispatch - sent[0].t_submit >= 0.0
    s.on_published(task.task_id, 0, {})
    s.on_taken(task.task_id, "cuzk-prover-0", 0)
    out = s.on_proof(task.task_id, "proof", [1], {}, 0)
    assert out.partitions[0][1].timings["total"] >= 0.0


def test_a_synthesis_workers_stage_times_are_never_negative(test_key: tuple[Path, Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The stage times a synthesis worker reports with its published slot (the engine's stage
    histogram, a partition's timings) are durations: a clock set back while it works leaves them >= 0."""
    ring = Ring.create(prefix_for("clk"), 2)
    ctx = _Ctx()
    try:
        worker = SynthWorker(ctx, ring, 1)  # type: ignore[arg-type]
        clock_stepping(monkeypatch)
        ref = CircuitRef("syn", str(test_key[0]), synthetic="porep-like", log_n=LOG_N)
        now = time.monotonic()
        worker.run_task(SynthTask(1, "job-1", 1, 0, 0, 1, ref, "synthetic", b"", 5, now, now))
        timings = ctx.done((Published,))[0].timings
        assert {"queue_wait", "ring_wait", "shm_write", "witness", "synthesis"} <= set(timings)
        assert all(v >= 0.0 for v in timings.values()), timings
    finally:
        ring.destroy()


def _used_slot(ring: Ring, task_id: int) -> int:
    """A slot a partition went through (claimed, written, published, taken, released): FREE, its segment kept."""
    slot = ring.acquire_free(SlotClaim(task_id, 0, 0, 0), lambda: False)
    assert slot is not None
    ring.publish(slot, ring.writable_segment(slot, [(256, 4)]), b"")
    taken = ring.take_ready(lambda: False, timeout_s=1.0)
    assert taken is not None and taken.slot == slot
    ring.release(slot)
    return slot


def test_a_clock_set_back_does_not_keep_an_idle_rings_memory(monkeypatch: pytest.MonkeyPatch) -> None:
    """A slot that has idled ``idle_s`` is trimmed (its segment's memory returns to the system) even when
    the clock was set back an hour since it was freed; one a day ahead trims nothing that has not idled."""
    ring = Ring.create(prefix_for("clktrim"), 2)
    try:
        slot = _used_slot(ring, 1)
        step_clock(monkeypatch, DAY_S)
        assert ring.trim(idle_s=HOUR_S) == []
        monkeypatch.undo()
        step_clock(monkeypatch, -HOUR_S)
        assert ring.trim(idle_s=0.0) == [slot]
    finally:
        ring.destroy()


def test_the_most_recently_freed_slot_is_reused_first_across_a_clock_step(monkeypatch: pytest.MonkeyPatch) -> None:
    """Producers take the warm slot freed last (the others idle into trimming), whatever the clock did
    between the two frees."""
    ring = Ring.create(prefix_for("clkwarm"), 2)
    try:
        first = ring.acquire_free(SlotClaim(1, 0, 0, 0), lambda: False)
        second = _used_slot(ring, 2)
        assert first is not None and first != second
        ring.publish(first, ring.writable_segment(first, [(256, 4)]), b"")
        step_clock(monkeypatch, -HOUR_S)
        taken = ring.take_ready(lambda: False, timeout_s=1.0)
        assert taken is not None and taken.slot == first
        ring.release(first)  # freed after second, on a clock an hour behind
        assert ring.acquire_free(SlotClaim(3, 0, 0, 0), lambda: False, nbytes=ring.record(first).nbytes) == first
    finally:
        ring.destroy()


def test_a_partitions_wait_in_the_ring_is_never_negative(test_key: tuple[Path, Path],
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The prover adds the time a partition waited READY in the ring to its ring_wait: the synthesis
    worker's clock reading and the prover's are a duration apart, even with the clock set back between."""
    ring = Ring.create(prefix_for("clkwait"), 2)
    ctx = _Ctx()
    backend = CpuBackend(threads=1)
    try:
        ref = CircuitRef("syn", str(test_key[0]), synthetic="porep-like", log_n=LOG_N)
        now = time.monotonic()
        SynthWorker(ctx, ring, 1).run_task(SynthTask(1, "job-1", 1, 0, 0, 1, ref, "synthetic", b"", 5, now, now))  # type: ignore[arg-type]
        step_clock(monkeypatch, -HOUR_S)
        prover = Prover(ctx, ring, backend, ProverPayload(ring.handle, "cpu", 0, 1, True, None, 1))  # type: ignore[arg-type]
        run_until_answered(ctx, prover, 1, 300)
        done = ctx.done((ProofDone,))
        assert done, ctx.done((TaskFailed,))
        assert done[0].timings["ring_wait"] >= 0.0
    finally:
        backend.close()
        ring.destroy()


def test_a_bench_under_a_clock_set_back_reports_the_time_its_runs_took(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """``cuzk-mp bench`` times its runs, jobs and partitions on the monotonic clock: with the wall clock
    set back an hour between any two reads of it, every span it reports lies within the time the bench
    took (as the monotonic clock measured it around the run), the device-busy fractions within (0, 1],
    and each job's memory window has its samples."""
    import json

    from tests.helpers import KEY_CACHE
    from tests.test_pipeline_bench import _parse

    out = tmp_path / "bench.json"
    args = _parse("--backend", "cpu", "--log-n", str(LOG_N), "--partitions", "2", "--jobs", "3", "--in-flight", "2",
                  "--partition-workers", "1", "--quiet", "--cache", str(KEY_CACHE), "--json", str(out))
    began = time.monotonic()
    clock_stepping(monkeypatch)
    assert args.func(args) == 0
    monkeypatch.undo()
    took = time.monotonic() - began
    result = json.loads(out.read_text())
    assert result["proofs_verified"] == 6
    spans = [result["first_job_s"], *result["s_per_partition_runs"], *result["s_per_job_runs"]]
    assert all(0.0 < s <= took for s in spans), (spans, took)
    busy = result["device_busy_fraction_by_device"]
    assert busy and all(0.0 < f <= 1.0 for f in busy.values()), busy
    by_job = result["memory_bound"]["peak_host_bytes_by_job"]
    assert len(by_job) == 3 and all(b is not None for b in by_job), by_job


# How late the engine may place a span (pipeline/timeline.py): by the time it takes to hear of a proof,
# which a partition that waited for the device lock inherits from the one before it. Nothing near the
# hour or day a stepped wall clock would put between a span and its partition.
SPAN_LATE_S = 1.0


def _check_spans(parts: list[PartitionResult], began: float, ended: float) -> None:
    """Every span of every partition lies within [began, ended] (the monotonic clock; ``SPAN_LATE_S``
    late at most), no stage lasts longer than its partition's submit-to-proof total, and a prover's
    device stages never overlap."""
    device: dict[str, list[tuple[float, float]]] = {}
    for p in parts:
        total = p.timings["total"]
        assert p.spans and 0.0 <= total <= ended - began, (p.index, p.timings)
        assert all(0.0 <= p.timings[k] <= total for k in STAGES if k in p.timings), p.timings
        for s in p.spans:
            assert began <= s.start <= s.end <= ended + SPAN_LATE_S, (s, began, ended)
            assert s.end - s.start <= total, (s, total)
            if s.stage == "device":
                device.setdefault(s.process, []).append((s.start, s.end))
    for spans in device.values():
        spans.sort()
        assert all(a_end <= b_start + 1e-3 for (_, a_end), (b_start, _) in zip(spans, spans[1:])), spans


def test_the_engine_places_a_partitions_stages_on_the_monotonic_clock(test_key: tuple[Path, Path],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """The spans of a partition's stages (the bench's picture and made-at times) are placed on the
    monotonic clock: with the wall clock set back an hour between any two reads of it while one job
    runs, and a day ahead while the next one does, every span lies within the time the jobs took, no
    span is an hour (or a day) away from its partition, and one prover's device stages stay serial."""
    results = Collector()
    prefix = prefix_for("clkspans")
    config = EngineConfig(backend="cpu", devices=[0], gpu_workers_per_device=2, partition_workers=2, ring_slots=2,
                          shm_prefix=prefix, param_cache=KEY_CACHE, start_timeout_s=120)
    engine = Engine(config, on_job_done=results.job, on_partition_done=results.partition).start()
    try:
        engine.register_circuit(CircuitSpec("porep", synthetic="porep-like", log_n=LOG_N, partitions=3))
        began = time.monotonic()
        for job_id, by_s in (("back", -HOUR_S), ("ahead", DAY_S)):
            clock_stepping(monkeypatch, by_s)
            engine.submit(JobSpec(job_id, "porep", [PartitionInput("synthetic", seed=s) for s in range(3)]))
            assert results.wait(job_id).state == "done"
            monkeypatch.undo()
        ended = time.monotonic()
    finally:
        monkeypatch.undo()
        engine.stop(grace_s=10)
    _check_spans([p for _, p in results.partitions], began, ended)
