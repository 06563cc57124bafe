"""Job records and their conversions: engine results and journal rows to wire replies.

This module owns :class:`JobRecord` (one job as the daemon tracks it) and the pure functions
that turn the engine's :class:`PartitionResult` and the record into protocol messages. The proof
is snarkjs proof.json as the prover made it (passed through, never rebuilt), public signals
become decimal strings, so a client can write both to disk as they are. Partition inputs are
validated once, by the engine (``RunningEngine.submit``), not here.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from cuzk_mp.daemon.journal import JournalEntry
from cuzk_mp.daemon.protocol import JobReply, PartitionIn, PartitionOut, PartitionState
from cuzk_mp.formats.snarkjs_json import public_to_json
from cuzk_mp.pipeline.types import PartitionResult, Priority

JOB_STATES = ("queued", "running", "done", "failed", "cancelled")
TERMINAL = frozenset({"done", "failed", "cancelled"})


def on_monotonic(wall: float) -> float:
    """A past wall-clock instant (``time.time()``) placed on ``time.monotonic()`` by its age now: how an
    instant this run did not measure itself (read back from the journal, the only clock two runs share;
    a fleet job's submit) joins its durations. One "in the future" (the clock was set back since)
    counts as now."""
    return time.monotonic() - max(0.0, time.time() - wall)


def without_inputs(partitions: list[PartitionIn]) -> list[PartitionIn]:
    """A finished job's partitions as kept: their kinds and seeds, not their input bytes (a witness
    can be many MB; the reply and the request's digest are all a finished job needs)."""
    return [PartitionIn(kind=p.kind, seed=p.seed) for p in partitions]


@dataclass(eq=False)
class JobRecord:
    """One job: what was asked, where it is, what came back, and who waits for it."""

    job_id: str
    request_id: str
    circuit_id: str
    priority: Priority
    digest: str
    partitions: list[PartitionIn]
    submitted_at: float
    owner: str = ""  # the submitting client's identity (daemon.access); "" without tokens
    state: str = "queued"
    started_at: float | None = None
    finished_at: float | None = None
    # When the job ended on time.monotonic(): its age for result_ttl, which a step of the wall clock
    # (finished_at's) must not change; set with finished_at
    finished_mono: float | None = None
    error: str | None = None
    error_kind: str | None = None
    cancel_requested: bool = False
    key_digest: str | None = None  # the key file a done job's proofs were made with (JobReply.key_digest)
    results: dict[int, PartitionOut] = field(default_factory=dict)
    counted: set[int] = field(default_factory=set)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    accepted: asyncio.Future[None] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future())
    # submitted_at on time.monotonic(): where the job's latency starts (:attr:`latency_s`)
    submitted_mono: float = field(init=False)

    def __post_init__(self) -> None:
        self.submitted_mono = on_monotonic(self.submitted_at)

    @property
    def latency_s(self) -> float:
        """Submit to finish (to now while it runs), on the monotonic clock: never negative, nor a day
        long, because the wall clock stepped while the job ran."""
        end = time.monotonic() if self.finished_mono is None else self.finished_mono
        return end - self.submitted_mono

    @classmethod
    def from_entry(cls, e: JournalEntry) -> JobRecord:
        """A record rebuilt from the journal (finished ones carry their reply)."""
        rec = cls(job_id=e.job_id, request_id=e.request_id, circuit_id=e.circuit_id,
                  priority=Priority(e.priority), digest=e.digest, partitions=e.partitions,
                  submitted_at=e.submitted_at, owner=e.owner)
        rec.accepted.set_result(None)
        r = e.result
        if r is not None and r.state in TERMINAL:
            rec.state, rec.error, rec.error_kind = r.state, r.error, r.error_kind
            rec.started_at, rec.finished_at, rec.key_digest = r.started_at, r.finished_at, r.key_digest
            rec.finished_mono = None if r.finished_at is None else on_monotonic(r.finished_at)
            rec.results = {p.index: p for p in r.partitions}
            rec.counted = set(rec.results)
            rec.done.set()
        return rec


def to_partition_out(r: PartitionResult) -> PartitionOut:
    """The wire form of one engine partition result."""
    state: PartitionState
    if r.error_kind == "Cancelled":
        state = "cancelled"
    elif r.error is None and r.proof is not None:
        state = "done"
    else:
        state = "failed"
    return PartitionOut(
        index=r.index, state=state,
        proof=r.proof if state == "done" else None,
        public=public_to_json(r.public) if state == "done" else [],
        timings={k: float(v) for k, v in r.timings.items()}, device=r.device,
        attempts=r.attempts, error=r.error, error_kind=r.error_kind)


def pending_partitions(rec: JobRecord, fill: PartitionState = "pending") -> list[PartitionOut]:
    """All partitions of a job in order; those without a result get state ``fill``."""
    return [rec.results.get(i) or PartitionOut(index=i, state=fill)
            for i in range(len(rec.partitions))]


def reply_of(rec: JobRecord, id: int, timed_out: bool = False) -> JobReply:
    """The JobReply for a record (pending partitions of a cancelled job read ``cancelled``)."""
    fill: PartitionState = "cancelled" if rec.state == "cancelled" else "pending"
    return JobReply(
        id=id, job_id=rec.job_id, circuit_id=rec.circuit_id, state=rec.state,  # type: ignore[arg-type]
        priority=rec.priority.name, partitions=pending_partitions(rec, fill),  # type: ignore[arg-type]
        submitted_at=rec.submitted_at, started_at=rec.started_at,
        finished_at=rec.finished_at, error=rec.error, error_kind=rec.error_kind,
        timed_out=timed_out, key_digest=rec.key_digest if rec.state == "done" else None)
