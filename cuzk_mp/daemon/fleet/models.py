"""The values the fleet layer hands to the daemon: job references, claims, statuses, boxes, depths.

Plain dataclasses with no behaviour beyond small conveniences; the queue itself lives in
:mod:`.queue`. Priorities are the engine's (:class:`cuzk_mp.pipeline.types.Priority`, lower runs
first); the mapping onto the queue library's "higher runs first" integers is :func:`queue_priority`.

Job states::

    queued -> running -> done | failed | cancelled
      ^          |
      +----------+   a failed attempt with retries left, or a stalled box's claim taken over
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field
from typing import Any, Literal

from cuzk_mp.pipeline.types import Priority

JobState = Literal["queued", "running", "done", "failed", "cancelled"]
FINAL_STATES: tuple[JobState, ...] = ("done", "failed", "cancelled")
BoxState = Literal["up", "stale", "left"]

ENTRYPOINT_PREFIX = "prove:"


def entrypoint(circuit_id: str) -> str:
    """The queue library's entrypoint of a circuit: one queue per circuit is key affinity."""
    return ENTRYPOINT_PREFIX + circuit_id


def circuit_of(entrypoint_name: str) -> str | None:
    """The circuit id of an entrypoint, None for entrypoints this layer did not make."""
    if entrypoint_name.startswith(ENTRYPOINT_PREFIX):
        return entrypoint_name[len(ENTRYPOINT_PREFIX):]
    return None


def queue_priority(priority: Priority) -> int:
    """The library claims the highest number first; the engine runs the lowest Priority first."""
    return -int(priority)


@dataclass(frozen=True)
class JobRef:
    """What submit returns: the job's id, its state, and whether the request_id named it already."""

    job_id: str
    state: JobState
    duplicate: bool = False


@dataclass
class Claimed:
    """A job this box claimed and must run: complete, fail, or stop when ``aborted`` is set.

    ``aborted`` is set when the job is cancelled from any box, finished by another box, or its
    claim was taken over after this box's heartbeat stalled; ``abort_reason`` says which.
    ``claims`` counts how many times the job was claimed (1 on its first run); ``client`` is the
    identity of the client that submitted it and ``submitted_at`` when (epoch seconds, the
    database's clock). ``queued_s`` is how long the job had waited when it was claimed, as the
    database measured it, and ``claimed_at`` when the claim returned on this box's own clock: the
    box's clock may be off the database's, so a time shown by the box starts from
    :attr:`submitted_here`, never from ``submitted_at``. ``claimed_mono`` is the same moment on
    ``time.monotonic()``: a latency measured on the box starts from :attr:`submitted_mono`, so a step
    of the box's wall clock after the claim (while its inputs load, while it runs) is no part of it.
    """

    job_id: str
    circuit_id: str
    priority: Priority
    inputs_ref: str
    inputs_sha256: str
    n_partitions: int
    attempts: int
    claims: int
    request_id: str | None
    client: str = ""
    submitted_at: float = 0.0
    queued_s: float = 0.0
    claimed_at: float = 0.0
    claimed_mono: float = 0.0
    aborted: asyncio.Event = field(default_factory=asyncio.Event, repr=False)
    abort_reason: str = ""

    @property
    def submitted_here(self) -> float:
        """When the job was submitted, on this box's clock: the claim's time here less the wait
        the database measured, so durations on the box never mix two clocks."""
        return self.claimed_at - self.queued_s

    @property
    def submitted_mono(self) -> float:
        """When the job was submitted, on this box's ``time.monotonic()``: the claim's monotonic time less
        the wait the database measured (what :attr:`.job_records.JobRecord.latency_s` starts from)."""
        return self.claimed_mono - self.queued_s


@dataclass(frozen=True)
class JobOutput:
    """What a box's run of a job gives the fleet to keep as its result: ``result``, the bytes every
    box reads back (at most ``schema.MAX_RESULT_BYTES``), and ``key_digest``, the key the proofs were
    made with, kept in a column of its own (see :func:`cuzk_mp.daemon.protocol.stored_reply`)."""

    result: bytes
    key_digest: str | None = None


@dataclass(frozen=True)
class Failed:
    """What :meth:`.settles.FleetSettles.fail` did: the job's ``state`` after it, and whether this box
    ``recorded`` the failure (by this call, or by an earlier try of it whose commit went unanswered).
    A box whose claim lapsed finds the job queued or failed by another box: ``recorded`` is False, so
    the failure is not counted here a second time (``cuzk_fleet_job_failures_total``)."""

    state: JobState
    recorded: bool


@dataclass(frozen=True)
class JobStatus:
    """A job as the shared tables record it; ``result`` is set once the job is ``done``.

    ``submitted_by`` is the box that accepted the job, ``client`` the identity of the client that
    submitted it (the daemon's access identity; "" without tokens), ``box`` the box that ran it,
    ``key_digest`` what the run that completed it gave with its result (:class:`JobOutput`),
    ``failed_on`` the boxes where a run of it failed (or stopped renewing its claim), first first.
    """

    job_id: str
    request_id: str | None
    circuit_id: str
    state: JobState
    priority: Priority
    n_partitions: int
    inputs_ref: str
    inputs_sha256: str
    submitted_by: str
    client: str
    box: str | None
    claims: int
    attempts: int
    submitted_at: float
    started_at: float | None
    finished_at: float | None
    result: bytes | None
    error: str | None
    error_kind: str | None
    key_digest: str | None = None
    failed_on: tuple[str, ...] = ()

    @property
    def finished(self) -> bool:
        """True once the job is done, failed or cancelled."""
        return self.state in FINAL_STATES


@dataclass(frozen=True)
class BoxInfo:
    """One box of the fleet as its last heartbeat described it; ``loading``: the keys it began loading
    for the backlog and has not finished (written when the load starts, cleared when it ends),
    ``loading_s`` since when (the database's clock; None where no load, or a box of schema 9 whose row
    records no start) and ``load_limit_s`` for how long it counts as holding them
    (:func:`.keys.load_limit_s`)."""

    box: str
    state: BoxState
    host: str
    pid: int
    resident: tuple[str, ...]
    free_slots: int
    running: int
    started_at: float
    heartbeat_age_s: float
    paused: str | None = None  # why the box claims nothing (its shared inputs folder), as it last said
    loading: tuple[str, ...] = ()
    loading_s: float | None = None
    load_limit_s: float | None = None

    @property
    def load_overdue(self) -> bool:
        """Whether its load has outlasted its limit: it may hang, and holds its key no longer."""
        return bool(self.loading) and self.loading_s is not None and self.load_limit_s is not None \
            and self.loading_s > self.load_limit_s


@dataclass(frozen=True)
class QueueDepth:
    """Jobs of one circuit and priority: waiting, running, and running on a stalled box."""

    circuit_id: str
    priority: Priority
    queued: int
    running: int
    stalled: int

    @property
    def backlog(self) -> int:
        """Jobs waiting for a box: queued plus those whose box stopped renewing its claim."""
        return self.queued + self.stalled


def lost_reason(row: tuple[Any, ...] | None, instance: uuid.UUID) -> str:
    """Why a held claim is no longer this process's ('' if it still is)."""
    if row is None:
        return "the job was removed"
    _, state, owner, box = row
    if state == "cancelled":
        return "cancelled"
    if state in FINAL_STATES:
        return f"{state} on box {box}"
    if owner != instance:
        return f"claimed again by box {box}" if owner is not None else "returned to the queue"
    return ""
