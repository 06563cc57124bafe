"""A box's claim loop: claim while there are free slots, run each job, settle it, stop on abort.

This module owns the loop the daemon runs beside its engine when a fleet is configured. It has
no policy about proving: ``run_job(claimed)`` does the work and returns its
:class:`.models.JobOutput` (the daemon's: load the inputs, submit to the engine, wait for the
JobResult, encode it). The loop:

* claims ``capacity() - running`` jobs of ``resident()`` circuits whenever that is positive,
  and otherwise sleeps until a NOTIFY says a job may be claimable, a job of its own ends, or
  ``poll_s`` passes (stalled claims and delayed retries have no NOTIFY; the poll finds them);
* when idle with free slots, calls ``on_idle()`` (where the daemon starts a key load for the
  backlog, :mod:`.keys`), at most once per poll; where it made a key resident, claims that
  key's jobs at once rather than after the poll (no NOTIFY comes for jobs already queued), as it
  does when woken (:meth:`FleetWorker.wake`: the daemon's key load, a task of its own, ended);
* settles each job: a result -> ``complete``; InputError -> ``fail`` without retry (the inputs
  will not get better); any other error -> ``fail`` with retry (another attempt, on another
  box where one can take it, :mod:`.retries`), each recorded failure counted in
  :attr:`FleetWorker.failures` by circuit and error kind (the box's
  ``cuzk_fleet_job_failures_total``); :class:`.inputs.ShareUnavailable` (the shared inputs
  folder is broken on this box, not the job) -> ``release``, no attempt counted; an abort
  (cancel, finished elsewhere, claim taken over) -> the task running the job is cancelled and
  nothing is written. While the database is unreachable, settling is retried a few times (a try
  that finds its earlier try's write committed, its answer lost, counts it once: :mod:`.settles`); then
  the claim is let go (another box runs the job after the stall timeout) rather than renewed
  forever for a result that cannot be written;
* on stop, gives running jobs ``grace_s`` to finish and releases the rest to the queue.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from cuzk_mp.daemon.fleet.inputs import ShareUnavailable
from cuzk_mp.daemon.fleet.models import Claimed, JobOutput
from cuzk_mp.daemon.fleet.queue import Fleet
from cuzk_mp.errors import CuzkError, InputError, ResourceError, error_kind

log = logging.getLogger("cuzk_mp.daemon.fleet")

RunJob = Callable[[Claimed], Awaitable[JobOutput]]
SETTLE_RETRY_DELAYS_S = (0.5, 2.0, 5.0)


class FleetWorker:
    """Runs claimed jobs with ``run_job``; ``await worker.run(stop)`` until ``stop`` is set."""

    def __init__(self, fleet: Fleet, run_job: RunJob, *, resident: Callable[[], Sequence[str]],
                 capacity: Callable[[], int], poll_s: float | None = None,
                 on_idle: Callable[[], Awaitable[None]] | None = None) -> None:
        self.fleet, self.run_job = fleet, run_job
        self.resident, self.capacity, self.on_idle = resident, capacity, on_idle
        self.poll_s = fleet.cfg.heartbeat_interval_s if poll_s is None else poll_s
        self.running: dict[str, asyncio.Task[None]] = {}
        self._woken = asyncio.Event()  # a slot freed, or wake()
        self.completed = 0
        self.failed = 0  # runs that failed here, each once however many tries settling it took
        self._failed_now: set[str] = set()  # jobs whose failure is being settled and is counted already
        self.failures: collections.Counter[tuple[str, str]] = collections.Counter()  # (circuit, kind): recorded
        self.aborted = 0
        self.released = 0

    async def run(self, stop: asyncio.Event, grace_s: float = 0.0) -> None:
        """Claim and run jobs until ``stop`` is set, then drain for ``grace_s`` and release the rest."""
        stopper = asyncio.ensure_future(stop.wait())
        try:
            while not stop.is_set():
                self._woken.clear()  # here, not before the sleep: a wake during this round's claim counts
                free = self.capacity() - len(self.running)
                claimed = await self._claim(free)
                for c in claimed:
                    self.running[c.job_id] = asyncio.create_task(self._run_one(c), name=f"cuzk-fleet-job-{c.job_id}")
                if claimed:
                    continue
                if free > 0 and self.on_idle is not None and await self._idle():
                    continue  # a key was loaded: its waiting jobs (no NOTIFY comes for them) are claimed now
                await self._sleep(stopper)
        finally:
            stopper.cancel()
            await self._drain(grace_s)

    def wake(self) -> None:
        """Claim again now rather than after the poll: work the daemon started beside the loop (a key
        load) ended, and jobs already queued (no NOTIFY comes for them) may be claimable here now."""
        self._woken.set()

    async def _idle(self) -> bool:
        """The daemon's idle hook (key loading); whether a key became resident. Its failure is logged,
        the loop goes on."""
        assert self.on_idle is not None
        before = set(self.resident())
        try:
            await self.on_idle()
        except Exception:
            log.exception("fleet: the idle hook of box %s failed", self.fleet.box)
        return not set(self.resident()) <= before

    async def _claim(self, free: int) -> list[Claimed]:
        try:  # with no free slot this only records resident keys and free slots for the heartbeat
            return await self.fleet.claim(self.resident(), free)
        except CuzkError as e:
            log.warning("fleet: claim failed on box %s: %s", self.fleet.box, e)
            return []

    async def _sleep(self, stopper: asyncio.Future[Any]) -> None:
        """Until work may be claimable, a slot frees, :meth:`wake`, stop, or the poll interval passes."""
        waits = {asyncio.ensure_future(self.fleet.wait_for_work(self.poll_s)),
                 asyncio.ensure_future(self._woken.wait())}
        try:
            await asyncio.wait(waits | {stopper}, timeout=self.poll_s, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for w in waits:
                w.cancel()

    async def _run_one(self, c: Claimed) -> None:
        work = asyncio.ensure_future(self.run_job(c))
        abort = asyncio.ensure_future(c.aborted.wait())
        try:
            await asyncio.wait({work, abort}, return_when=asyncio.FIRST_COMPLETED)
            if c.aborted.is_set():
                work.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await work
                self.aborted += 1
                log.info("fleet: job %s stopped on box %s: %s", c.job_id, self.fleet.box, c.abort_reason)
                return
            await self._settle_retrying(c, work)
        except asyncio.CancelledError:
            work.cancel()
            raise
        finally:
            abort.cancel()
            self.running.pop(c.job_id, None)
            self._woken.set()

    async def _settle_retrying(self, c: Claimed, work: asyncio.Future[JobOutput]) -> None:
        """Settle, retrying while the database is unreachable; then let the claim lapse."""
        try:
            for delay in (*SETTLE_RETRY_DELAYS_S, None):
                try:
                    await self._settle(c, work)
                    return
                except ResourceError as e:
                    if delay is None:
                        log.error("fleet: could not settle job %s on box %s: %s; its claim lapses and it runs "
                                  "again elsewhere after the stall timeout", c.job_id, self.fleet.box, e)
                        self.fleet.forget(c.job_id)
                        return
                    log.warning("fleet: settling job %s failed (%s); again in %g s", c.job_id, e, delay)
                    await asyncio.sleep(delay)
        finally:
            self._failed_now.discard(c.job_id)

    async def _settle(self, c: Claimed, work: asyncio.Future[JobOutput]) -> None:
        exc = work.exception()
        if exc is None:
            out = work.result()
            try:
                if await self.fleet.complete(c.job_id, out.result, out.key_digest):
                    self.completed += 1
                return
            except InputError as e:  # a result the database does not take (too large)
                exc = e
        if isinstance(exc, ShareUnavailable):  # this box cannot read the shared folder: another box can
            await self.fleet.release(c.job_id)
            self.released += 1
            log.info("fleet: job %s goes back to the queue from box %s: %s", c.job_id, self.fleet.box, exc)
            return
        if c.job_id not in self._failed_now:  # counted (and logged) at the first try to settle it only
            self._failed_now.add(c.job_id)
            self.failed += 1
            if not isinstance(exc, CuzkError):
                log.error("fleet: job %s raised %s on box %s", c.job_id, type(exc).__name__, self.fleet.box,
                          exc_info=exc)
        kind = error_kind(exc)
        failed = await self.fleet.fail(c.job_id, str(exc) or type(exc).__name__, error_kind=kind,
                                       retry=not isinstance(exc, InputError))
        if failed.recorded:  # not where its claim lapsed and another box settled the job
            self.failures[(c.circuit_id, kind)] += 1

    async def _drain(self, grace_s: float) -> None:
        """Give running jobs ``grace_s``, then stop the rest and give them back to the queue, all at
        once: during a database outage each release waits the connect timeout, and one after another
        a box with a job per GPU took that once per job before it could stop."""
        if self.running and grace_s > 0:
            await asyncio.wait(list(self.running.values()), timeout=grace_s)
        left = list(self.running.items())
        for _, task in left:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        await asyncio.gather(*(self._release(job_id) for job_id, _ in left))

    async def _release(self, job_id: str) -> None:
        """Give a job back to the queue; where the database does not answer, its claim lapses instead."""
        with contextlib.suppress(CuzkError):
            await self.fleet.release(job_id)
