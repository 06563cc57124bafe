"""The daemon's connections and request handlers: frames in, one task per request, replies out.

Why a module of its own: the lifecycle (:mod:`.server`: start, drain, stop) and what the daemon
answers are read and changed apart. Layers follow dask: :mod:`.transport` moves frames,
:mod:`.protocol` defines messages, and here a table maps each request type to a handler that
returns a reply and never touches a socket. :class:`DaemonHandlers` is the part of
:class:`~.server.Daemon` that serves: the daemon owns the state it reads (the job table, the
engine, the fleet box, the access tokens), set up by its lifecycle.

A request's caller (its token's identity) rides in a context variable, each request running in its
own task; a caller without an admin token sees error texts with the daemon's paths cut to their
last component and no traceback. A status reply larger than ``max_frame_bytes`` is cut to the jobs
that fit, never dropped. What may read a file (a key load, a verification key, the engine's status) runs
on a daemon thread of its own (:mod:`.threads`): a file on a dead mount holds that request alone.
"""

from __future__ import annotations

import asyncio
import contextvars
import enum
import logging
import os
import time
import traceback
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon import storage_waits
from cuzk_mp.daemon.access import OPEN, Access, Identity, redact_text, status_view
from cuzk_mp.daemon.config import DaemonConfig
from cuzk_mp.daemon.jobs import JobTable
from cuzk_mp.daemon.journal import Journal
from cuzk_mp.daemon.metrics import DaemonMetrics, Scrape
from cuzk_mp.daemon.status import StatusView
from cuzk_mp.daemon.threads import on_daemon_thread, wait_shared
from cuzk_mp.daemon.transport import Comm, CommClosedError, FrameTimeout, FrameTooLarge
from cuzk_mp.errors import AuthError, CuzkError, InputError, Unavailable, error_kind

if TYPE_CHECKING:
    from cuzk_mp.daemon.fleet.box import FleetBox

log = logging.getLogger("cuzk_mp.daemon")

MAX_IN_FLIGHT_PER_CONN = 1024
# The caller of the request being handled (each request runs in its own task, so its own context).
_CALLER: contextvars.ContextVar[Identity] = contextvars.ContextVar("cuzk_caller", default=OPEN)


class DaemonState(enum.Enum):
    """Where the daemon is in its life (dask ``Status``)."""

    CREATED = "created"
    STARTING = "starting"
    RUNNING = "running"
    DRAINING = "draining"
    STOPPED = "stopped"
    FAILED = "failed"


class DaemonHandlers:
    """The serving half of :class:`~.server.Daemon`: its connections, the request table's handlers
    (pure: request in, reply out), and the status and metrics documents. The daemon sets every
    attribute below (:meth:`.server.Daemon.__init__`) and keeps them through its lifecycle."""

    cfg: DaemonConfig
    state: DaemonState
    metrics: DaemonMetrics
    started_at: float
    engine: Any
    journal: Journal | None
    jobs: JobTable | None
    view: StatusView | None
    fleet: FleetBox | None
    access: Access
    handlers: dict[type, Callable[[Any], Any]]
    _comms: set[Comm]
    _last_active: float

    # -- connections ----------------------------------------------------------------------

    async def handle_comm(self, comm: Comm) -> None:
        """Serve one connection: read frames, run each request as its own task (pipelining).

        Where tokens are required, a connection that has not shown a valid one yet is closed after
        answering a frame that is no request (no token can be read from it): else a peer without a
        token would hold its connection slot by sending such frames, or one and then nothing."""
        self._comms.add(comm)
        lock = asyncio.Lock()
        tasks: set[asyncio.Task[None]] = set()
        known = not self.access.required  # whether the peer has shown a valid token
        try:
            while True:
                try:
                    data = await comm.read()
                except (FrameTooLarge, FrameTimeout) as e:
                    # The rest of that frame was not read: the stream cannot be resynced. Its refusal
                    # names its request where the frame's first bytes do; the requests read before it
                    # are answered, then the connection closes.
                    head = e.head if isinstance(e, FrameTooLarge) else b""
                    request_id = P.scan_frame(head, P.MAX_REQUEST_DEPTH, P.MAX_REQUEST_ITEMS)[0]
                    self.metrics.observe_request("malformed", 0.0, "InputError")  # a frame read as no request
                    await self._send(comm, lock, P.error_reply(request_id, "InputError", str(e), closing=True))
                    await _answer_read(comm, tasks)
                    break
                except CommClosedError:
                    break
                reply_now = self._admit(data, len(tasks))
                if isinstance(reply_now, P.ErrorReply):
                    await self._send(comm, lock, reply_now)
                    if not known:
                        break
                    continue
                try:
                    self.access.identify(reply_now.token)
                except AuthError as e:  # a peer without a token holds no connection slot: answered, closed
                    self.metrics.observe_request(type(reply_now).__name__, 0.0, "AuthError")
                    await self._send(comm, lock, P.error_reply(reply_now.id, "AuthError", str(e)))
                    break
                known = True
                task = asyncio.ensure_future(self._serve_one(comm, lock, reply_now))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
        finally:
            self._comms.discard(comm)
            self._last_active = time.monotonic()
            for t in tasks:
                t.cancel()  # abandoned waits; submits inside are shielded and complete

    def _admit(self, data: bytes, in_flight: int) -> Any:
        """The decoded request, or the ErrorReply that answers it at once."""
        try:
            msg = P.decode_request(data)
        except P.MalformedRequest as e:
            self.metrics.observe_request("malformed", 0.0, "InputError")
            return P.error_reply(e.request_id, "InputError", str(e))
        if in_flight >= MAX_IN_FLIGHT_PER_CONN:
            self.metrics.observe_request(type(msg).__name__, 0.0, "ResourceError")
            return P.error_reply(msg.id, "ResourceError", f"more than {MAX_IN_FLIGHT_PER_CONN} "
                                 "requests in flight on one connection")
        return msg

    async def _send(self, comm: Comm, lock: asyncio.Lock, msg: P.Message) -> None:
        try:
            data = P.encode(msg)
        except (TypeError, ValueError, OverflowError) as e:  # never leave a caller waiting
            log.exception("%s reply (id %d) cannot be encoded", type(msg).__name__, msg.id)
            data = P.encode(P.error_reply(msg.id, "InternalError", f"the reply cannot be encoded: {e}"))
        if len(data) > comm.max_frame_bytes and isinstance(msg, P.StatusReply):
            data = _fitted_status(msg, comm.max_frame_bytes)
        if len(data) > comm.max_frame_bytes:  # never leave a caller waiting for a lost reply
            log.warning("%s reply of %d bytes exceeds max_frame_bytes", type(msg).__name__,
                        len(data))
            data = P.encode(P.error_reply(msg.id, "ResourceError", (
                f"the {type(msg).__name__} reply is {len(data)} bytes, more than "
                f"[daemon] max_frame_bytes = {comm.max_frame_bytes}")))
        try:
            async with lock:
                await comm.write(data)
        except CommClosedError as e:
            log.debug("reply %s not delivered: %s", type(msg).__name__, e)

    async def _serve_one(self, comm: Comm, lock: asyncio.Lock, msg: Any) -> None:
        await self._send(comm, lock, await self.handle(msg))

    async def handle(self, msg: Any) -> P.Message:
        """Run the handler for one request; exceptions become ErrorReply (errors are data)."""
        op = type(msg).__name__
        t0 = time.perf_counter()
        kind = None
        caller = OPEN
        try:
            caller = self.access.identify(msg.token)
            _CALLER.set(caller)
            reply: P.Message = await self.handlers[type(msg)](msg)
        except CuzkError as e:
            kind = error_kind(e)
            reply = P.error_reply(msg.id, kind, str(e))
        except Exception as e:
            kind = "InternalError"
            log.exception("%s (id %d) failed", op, msg.id)
            reply = P.error_reply(msg.id, kind, f"{type(e).__name__}: {e}",
                                  traceback.format_exc())
        self.metrics.observe_request(op, time.perf_counter() - t0, kind)
        return reply if caller.admin else _as_seen_by_a_tenant(reply)

    # -- handlers (pure: request in, reply out) -------------------------------------------

    def _need_running(self) -> JobTable:
        if self.state is not DaemonState.RUNNING or self.jobs is None:
            raise Unavailable(f"the daemon is {self.state.value}")
        return self.jobs

    def _in_fleet(self, job_id: str) -> FleetBox | None:
        """The fleet box when ``job_id`` is a fleet job (any job but those this daemon journaled)."""
        if self.fleet is None or (self.jobs is not None and self.jobs.journaled(job_id)):
            return None
        return self.fleet

    def _reply_must_fit(self, m: P.SubmitProof | P.Prove) -> None:
        """Refuse a job whose finished reply could not be sent within ``max_frame_bytes``: its
        proofs would be made and then be out of every client's reach."""
        need = P.job_reply_bytes(len(m.partitions))
        limit = self.cfg.max_frame_bytes
        if need > limit:
            most = P.max_job_partitions(limit)
            raise InputError(f"a job of {len(m.partitions)} partitions has a reply of at least {need} bytes (its "
                             f"proofs), more than [daemon] max_frame_bytes = {limit}: submit at most {most} "
                             "partitions a job, or raise max_frame_bytes")

    async def _submit(self, m: P.SubmitProof) -> P.Submitted:
        jobs = self._need_running()
        self._reply_must_fit(m)
        if self.fleet is not None:
            ref = await asyncio.shield(self.fleet.submit(m, _CALLER.get()))
            return P.Submitted(id=m.id, job_id=ref.job_id, state=ref.state, duplicate=ref.duplicate)
        rec, dup = await asyncio.shield(jobs.submit(m, _CALLER.get()))
        return P.Submitted(id=m.id, job_id=rec.job_id, state=rec.state,  # type: ignore[arg-type]
                           duplicate=dup)

    async def _await(self, m: P.AwaitProof) -> P.JobReply:
        assert self.jobs is not None
        if (fleet := self._in_fleet(m.job_id)) is not None:
            return await fleet.wait(m.job_id, m.timeout_s, _CALLER.get().only, m.id)
        rec, timed_out = await self.jobs.wait(m.job_id, m.timeout_s, _CALLER.get().only)
        return self.jobs.reply(rec, m.id, timed_out)

    async def _prove(self, m: P.Prove) -> P.JobReply:
        jobs = self._need_running()
        self._reply_must_fit(m)
        caller = _CALLER.get()
        if self.fleet is not None:
            ref = await asyncio.shield(self.fleet.submit(m, caller))
            return await self.fleet.wait(ref.job_id, m.timeout_s, caller.only, m.id)
        rec, _ = await asyncio.shield(jobs.submit(m, caller))
        rec, timed_out = await jobs.wait(rec.job_id, m.timeout_s, caller.only)
        return jobs.reply(rec, m.id, timed_out)

    async def _cancel(self, m: P.CancelProof) -> P.CancelReply:
        jobs = self._need_running()
        if (fleet := self._in_fleet(m.job_id)) is not None:
            return await fleet.cancel(m.job_id, _CALLER.get().only, m.id)
        rec, ok = jobs.cancel(m.job_id, _CALLER.get().only)
        return P.CancelReply(id=m.id, job_id=rec.job_id, cancelled=ok,
                             state=rec.state)  # type: ignore[arg-type]

    async def _status(self, m: P.GetStatus) -> P.StatusReply:
        return P.StatusReply(id=m.id, status=await self.status_doc(_CALLER.get(), m.detail))

    async def _metrics(self, m: P.GetMetrics) -> P.MetricsReply:
        return P.MetricsReply(id=m.id, text=await self.metrics_text())

    def _circuit(self, circuit_id: str) -> None:
        if circuit_id not in self.cfg.circuits:
            raise InputError(f"circuit_id: unknown circuit {circuit_id!r} "
                             f"(configured: {', '.join(sorted(self.cfg.circuits)) or 'none'})")

    async def _preload(self, m: P.PreloadSRS) -> P.PreloadReply:
        self._need_running()
        self.access.need_admin(_CALLER.get(), "PreloadSRS")
        self._circuit(m.circuit_id)
        t0 = time.perf_counter()
        await on_daemon_thread(self.engine.preload, m.circuit_id, name=f"cuzk-preload-{m.circuit_id}")
        if self.fleet is not None:
            self.fleet.loaded(m.circuit_id)
        return P.PreloadReply(id=m.id, circuit_id=m.circuit_id, seconds=time.perf_counter() - t0)

    async def _evict(self, m: P.EvictSRS) -> P.EvictReply:
        jobs = self._need_running()
        self.access.need_admin(_CALLER.get(), "EvictSRS")
        self._circuit(m.circuit_id)
        if jobs.in_use(m.circuit_id):
            return P.EvictReply(id=m.id, circuit_id=m.circuit_id, evicted=False,
                                reason="a queued or running job uses this circuit")
        ok = await on_daemon_thread(self.engine.evict, m.circuit_id, name=f"cuzk-evict-{m.circuit_id}")
        if ok and self.fleet is not None:
            self.fleet.evicted(m.circuit_id)
        return P.EvictReply(id=m.id, circuit_id=m.circuit_id, evicted=ok,
                            reason="" if ok else "the engine still uses this key")

    def _generated_vk(self, circuit_id: str) -> bytes | None:
        """The vk of a key the provers generate (key_source "device"): resident first, then as reported."""
        assert self.engine is not None
        self.engine.preload(circuit_id)
        return self.engine.circuits.vk(circuit_id)

    async def _vk(self, m: P.GetVerificationKey) -> P.VkReply:
        """The circuit's vk, read on a thread of its own: from its key file, waited for as a submit waits for it
        (:mod:`.storage_waits`: a file on a mount that hangs is an Unavailable after the wait, where a client's
        ``await --out`` waited for ever); a key the provers generate is waited for as long as it is made."""
        self._circuit(m.circuit_id)
        assert self.view is not None
        read = on_daemon_thread(self.view.verification_key, m.circuit_id, name=f"cuzk-vk-{m.circuit_id}")
        if self.cfg.circuits[m.circuit_id].spec.key_source == "device":
            vk, digest = await read
        else:
            try:
                vk, digest = await wait_shared(read, storage_waits.ACCEPT_WAIT_S)
            except TimeoutError:
                raise Unavailable(f"circuit {m.circuit_id}: its key file did not answer within "
                                  f"{storage_waits.ACCEPT_WAIT_S:g} s as its verification key was read (its storage "
                                  "hangs?); ask again later") from None
        return P.VkReply(id=m.id, circuit_id=m.circuit_id, vk=vk, key_digest=digest)

    # -- status and metrics ---------------------------------------------------------------

    async def status_doc(self, caller: Identity = OPEN, detail: bool = False) -> dict[str, Any]:
        """The /status document as ``caller`` may see it (paths and pids only with ``detail``;
        see :mod:`.access`); the engine state is read on a worker thread."""
        engine_status = None
        if self.engine is not None and self.state is not DaemonState.STARTING:
            engine_status = await on_daemon_thread(self.engine.status, name="cuzk-engine-status")
        if self.view is None:
            doc: dict[str, Any] = {"daemon": {"state": self.state.value, "pid": os.getpid()}}
        else:
            doc = self.view.document(self.state.value, engine_status)
            if not caller.admin:  # a tenant counts its own jobs, as its job list shows only those
                doc["job_counts"] = self.view.job_counts(engine_status, owner=caller.owner)
                doc["queue"] = self.view.queue(owner=caller.owner)
        if self.journal is not None:
            doc["journal"] = await self.journal.report()
        if self.fleet is not None:
            doc["fleet"] = await self.fleet.document()
        jobs = self.jobs.jobs if self.jobs is not None else {}
        return status_view(doc, caller, detail, lambda j: jobs[j].owner if j in jobs else None)

    async def http_status(self, detail: bool, token: str) -> dict[str, Any]:
        """GET /status: the caller is the bearer token's identity (AuthError without one)."""
        return await self.status_doc(self.access.identify(token), detail)

    async def metrics_text(self) -> str:
        """The /metrics text (engine status and metrics read on a worker thread)."""
        status = em = None
        if self.engine is not None and self.state is not DaemonState.STARTING:
            status, em = await on_daemon_thread(lambda: (self.engine.status(), self.engine.metrics()),
                                                name="cuzk-engine-metrics")
        view = self.view
        return self.metrics.render(Scrape(
            started_at=self.started_at, state=self.state.value, states=[s.value for s in DaemonState],
            queue_depth=view.queue_depth() if view else 0,
            job_counts=view.job_counts(status) if view else {}, memory_budget=view.budget if view else {},
            queued_input_bytes=self.jobs.queued().input_bytes if self.jobs is not None else 0,
            connections=len(self._comms), max_connections=self.cfg.max_connections,
            engine=status, engine_metrics=em, extra=await self.fleet.gauges() if self.fleet is not None else (),
            counts=self.fleet.counters() if self.fleet is not None else ()))


def _as_seen_by_a_tenant(reply: P.Message) -> P.Message:
    """A reply for a caller without an admin token: error texts with the daemon's paths cut to
    their last component (as the status document shows them), no traceback."""
    if isinstance(reply, P.ErrorReply):
        return msgspec.structs.replace(reply, message=redact_text(reply.message), traceback_text="")
    if isinstance(reply, P.JobReply):
        parts = [msgspec.structs.replace(p, error=redact_text(p.error)) if p.error else p for p in reply.partitions]
        return msgspec.structs.replace(reply, error=redact_text(reply.error) if reply.error else None, partitions=parts)
    return reply


async def _answer_read(comm: Comm, tasks: set[asyncio.Task[None]]) -> None:
    """Let the requests read on a connection that reads no more answer (a Prove of a job submitted
    just before a refused frame gets its proofs, not a lost connection while its job is proved),
    dropping what the peer still sends; a peer that closes first abandons them."""
    if not tasks:
        return
    gone = asyncio.ensure_future(comm.discard())
    answered = asyncio.ensure_future(asyncio.wait(set(tasks)))
    try:
        await asyncio.wait([gone, answered], return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
        answered.cancel()


def _fitted_status(msg: P.StatusReply, limit: int) -> bytes:
    """A status reply cut to ``limit`` bytes: the jobs that fit (running ones first, then the
    newest finished), the number left out in ``jobs_left_out``; where not even the document
    without jobs fits, the daemon's state and the job counts alone (what ``client ready`` and a
    monitor need)."""
    doc = msg.status
    jobs = list(doc.get("jobs") or [])
    running = [j for j in jobs if j.get("state") in ("queued", "running")]
    order = running + [j for j in reversed(jobs) if j.get("state") not in ("queued", "running")]

    def encoded(k: int) -> bytes:
        return P.encode(P.StatusReply(id=msg.id, status={**doc, "jobs": order[:k], "jobs_left_out": len(order) - k}))

    if len(encoded(0)) > limit:
        return P.encode(P.StatusReply(id=msg.id, status={
            "daemon": {"state": doc.get("daemon", {}).get("state")}, "job_counts": doc.get("job_counts"),
            "left_out": "the status document is larger than [daemon] max_frame_bytes: only the state and the "
                        "job counts are sent"}))
    lo, hi = 0, len(order)  # the most jobs that fit: encoded(lo) fits
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if len(encoded(mid)) <= limit else (lo, mid - 1)
    return encoded(lo)
