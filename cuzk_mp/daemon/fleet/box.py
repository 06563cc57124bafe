"""A daemon as one box of a fleet: its clients' jobs go to the shared queue, its engine runs what it claims.

This module owns what a daemon with a ``[fleet]`` section does differently from one that runs
alone, so that the daemon's server only routes requests here:

* **Submit** (SubmitProof, Prove): the daemon's own door checks (:meth:`JobTable.admit`: not
  draining, a configured circuit, request_id bounds, a priority the client may ask: ``[daemon]
  max_client_priority``, give every box the same) and the engine's validation of every
  partition (the one the engine applies to a job it queues, without queueing it), then the
  partitions' msgpack is stored content-addressed in ``[fleet] inputs_dir`` (a directory every
  box reads at the same path) and the job enters the shared queue with that reference, its
  sha256 and the client's identity, in one transaction with its request_id. This daemon's
  ``[daemon]`` caps on unfinished jobs apply to the whole fleet's queue, counted in the database
  in that transaction (:mod:`cuzk_mp.daemon.queue_caps`); a submit beyond one is refused with
  Unavailable, as on a daemon alone, and is looked at once before its inputs are stored, so a
  refused submit leaves nothing in ``inputs_dir``.
* **Await, status, cancel** of any job from any box, by job id or by request_id; a client sees
  only its own jobs (its identity travels with the job), an admin every job. A cancel reaches
  the box that runs the job through the queue's abort NOTIFY.
* **Claiming**: a :class:`~.worker.FleetWorker` claims jobs of the circuits whose keys this box
  holds resident (``[srs] preload`` at start, then every preload, evict and key loaded for the
  fleet's backlog; least recently used first), as many as it has free slots (``[fleet]
  max_jobs``, else one per prover process; none while the engine is degraded). Each claimed job
  runs through :meth:`JobTable.run_claimed` under a per-claim engine job id
  (``<job_id>.<claim>``, so a job claimed here again never meets its previous run in the
  engine); its JobReply (every partition's proof and public signals) is the result written to
  the database, once.
* **Keys for the backlog**: when idle with free slots, the box asks :func:`.keys.plan_key_load`
  whether to load a key for jobs that wait elsewhere, evicting least recently used idle keys
  to fit the key budget; at most one load per ``stall_timeout``. The load is a task of the box
  beside the claim loop, which goes on claiming the jobs of the keys it holds meanwhile (the box's
  row shows them and its free slots, so other boxes leave those jobs to it) and is woken when the
  load ends.
* **The shared inputs folder**: its marker (:data:`.inputs.MARKER_NAME`) must hold the id the
  database records for it; the first box with ``inputs_dir`` writes both. While the marker is
  missing or unreadable here (the share not mounted on this box, a stale NFS handle) the box claims
  nothing, gives back a job it claimed to the queue rather than fail it (its inputs are only
  unreachable from here), and refuses submits; it checks again every heartbeat interval and claims
  again by itself once the share is back (one log line each way, ``paused`` in its status document,
  ``cuzk_fleet_inputs_ok`` 0). A job whose inputs file is missing from a healthy share fails once.
* **Retention**: finished jobs and their request ids are pruned after ``result_ttl``, and the
  stored inputs that no job names any more with them.

Errors: the fleet's database unreachable is a ResourceError for the request at hand, never the
end of the daemon; bad requests are InputErrors naming the field, as on a daemon alone.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.access import Identity
from cuzk_mp.daemon.config import DaemonConfig
from cuzk_mp.daemon.fleet import report
from cuzk_mp.daemon.fleet.inputs import (
    ShareUnavailable,
    StagedInputs,
    inputs_ref,
    load_inputs,
    read_marker,
    share_problem,
    stage_inputs,
    write_marker,
)
from cuzk_mp.daemon.fleet.keys import KeyView, backlog_by_circuit, holders_by_circuit, load_limit_s, plan_key_load
from cuzk_mp.daemon.fleet.models import Claimed, JobOutput, JobRef, JobStatus
from cuzk_mp.daemon.fleet.queue import Fleet
from cuzk_mp.daemon.fleet.waits import on_share
from cuzk_mp.daemon.threads import on_daemon_thread, wait_shared
from cuzk_mp.daemon.fleet.worker import FleetWorker
from cuzk_mp.daemon.job_records import JobRecord, reply_of
from cuzk_mp.daemon.jobs import JobTable, input_bytes
from cuzk_mp.daemon.metrics import Gauge
from cuzk_mp.errors import Cancelled, CuzkError, InputError, ResourceError, Unavailable, error_from_kind
from cuzk_mp.pipeline.types import JobSpec, PartitionInput

log = logging.getLogger("cuzk_mp.daemon.fleet")

_partitions = msgspec.msgpack.Decoder(list[P.PartitionIn])


class FleetBox:
    """This daemon's part in the fleet; :meth:`start` after the engine and the preloads, :meth:`stop`
    before the engine stops."""

    def __init__(self, cfg: DaemonConfig, engine: Any, jobs: JobTable) -> None:
        assert cfg.fleet is not None
        self.cfg, self.fcfg = cfg, cfg.fleet
        self.engine, self.jobs = engine, jobs
        self.fleet: Fleet | None = None
        self.worker: FleetWorker | None = None
        # Resident keys, least recently used first (a claim of the circuit's job moves it last).
        self._resident: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._provers = max(1, len(getattr(engine, "devices", None) or [0]))
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False  # stopping: no new claims, waiters answer that the job goes on elsewhere
        self._left = False
        self._next_idle_check = 0.0
        self._next_load = 0.0
        self._key_load: asyncio.Task[None] | None = None  # a key load for the backlog (one at a time)
        self._share_id: str | None = None  # the shared inputs folder's id, as the database records it
        self.paused: str | None = None  # why this box claims nothing now (its shared inputs folder)
        self._paused_folder: Path | None = None  # the folder found broken (checked again until it is back)
        self._share_task: asyncio.Task[None] | None = None
        self._share_reads: dict[tuple[Path, str], asyncio.Future[str | None]] = {}  # see _read_share
        self._marker_write: asyncio.Future[None] | None = None  # see _read_share_id

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self, resident: Sequence[str]) -> None:
        """Join the fleet with ``resident`` keys and start claiming (ResourceError if the
        database cannot be reached)."""
        self.fleet = await Fleet.from_config(self.fcfg)
        if self.fcfg.inputs_dir is not None:
            await self.check_share(self.fcfg.inputs_dir)
        self._share_task = asyncio.create_task(self._watch_share(), name="cuzk-fleet-share")
        for cid in resident:
            self._resident[cid] = None
        self.worker = FleetWorker(self.fleet, self._run, resident=self.resident, capacity=self.capacity,
                                  on_idle=self._load_for_backlog)
        self._task = asyncio.create_task(self._claim_loop(self.worker), name="cuzk-fleet-worker")
        log.info("[start] fleet: box %s claims jobs of %s, %d at once", self.fcfg.box,
                 ", ".join(self._resident) or "no circuit yet", self.capacity())

    async def _claim_loop(self, worker: FleetWorker) -> None:
        """Run the claim loop until the daemon stops; should it fail, it starts again (a box that
        silently stopped claiming would look alive to the fleet)."""
        while not self._stop.is_set():
            try:
                await worker.run(self._stop)
            except Exception:
                log.exception("fleet: the claim loop of box %s failed; it starts again in %g s", self.fcfg.box,
                              self.fcfg.heartbeat_interval_s)
                await asyncio.sleep(self.fcfg.heartbeat_interval_s)

    async def check_share(self, folder: Path) -> str | None:
        """Whether ``folder`` is the fleet's shared inputs folder on this box: None if it is, else why
        not (one line); this box claims nothing while it is not (:meth:`capacity`), and logs only when
        that changes.

        The database's id of the folder is made here by the first box that has an ``inputs_dir`` (its
        marker written first, so the id is never recorded without one), also after an operator deleted
        it to start over. A read that hangs (a hard NFS mount whose server is gone) counts as broken
        after :data:`SHARE_CHECK_S`."""
        fleet = self._need()
        try:
            if self._share_id is None or self.paused is not None:
                self._share_id = await self._read_share_id(fleet)
            problem = None if self._share_id is None else await wait_shared(
                self._read_share(folder, self._share_id), SHARE_CHECK_S)
        except asyncio.TimeoutError:
            problem = f"[fleet] inputs_dir {folder}: reading its marker took longer than {SHARE_CHECK_S:g} s"
        except CuzkError as e:  # the database: keep what was known; claims fail meanwhile anyway
            log.warning("fleet: box %s could not read the shared inputs folder's id: %s", self.fcfg.box, e)
            return self.paused
        if problem is not None and self.paused is None:
            log.error("fleet: box %s claims no jobs (and takes no submits) until its shared inputs folder is back: "
                      "%s", self.fcfg.box, problem)
        elif problem is None and self.paused is not None:
            log.info("fleet: box %s sees the shared inputs folder %s again; it claims jobs again", self.fcfg.box,
                     folder)
        self.paused, self._paused_folder = problem, folder if problem is not None else None
        fleet.paused = problem  # recorded at the next heartbeat: fleet status shows why this box claims nothing
        return problem

    def _read_share(self, folder: Path, share_id: str) -> asyncio.Future[str | None]:
        """The marker check of ``folder`` on a thread of its own (:func:`.waits.on_share`); while one has not
        returned (a hung mount), the same one: a new read per check would leave one more thread stuck each
        heartbeat, for as long as the mount hangs."""
        key = (folder, share_id)
        pending = self._share_reads.get(key)
        if pending is None or pending.done():
            pending = self._share_reads[key] = on_share(share_problem, folder, share_id)
        return pending

    async def _read_share_id(self, fleet: Fleet) -> str | None:
        """The database's id of the shared folder, made (marker first) if none is yet and this box has
        an ``inputs_dir``; where another box made one meanwhile, a marker this box wrote gets its id."""
        found = await fleet.share_id()
        folder = self.fcfg.inputs_dir
        if found is not None or folder is None:
            return found
        if self._marker_write is not None and not self._marker_write.done():
            return None  # the last write hangs (see _read_share): no second thread stuck beside it
        proposed = uuid.uuid4().hex
        self._marker_write = on_share(write_marker, folder, proposed)
        self._marker_write.add_done_callback(lambda f: f.cancelled() or f.exception())  # logged below if awaited
        try:
            await wait_shared(self._marker_write, SHARE_CHECK_S)
        except (OSError, asyncio.TimeoutError) as e:
            log.warning("fleet: box %s could not write the marker of [fleet] inputs_dir %s: %s", self.fcfg.box,
                        folder, e)
            return None
        found = await fleet.share_id(proposed)
        if found == proposed:
            log.info("fleet: box %s marked %s as the fleet's shared inputs folder", self.fcfg.box, folder)
        elif found is not None:
            with contextlib.suppress(OSError, InputError):  # the marker unreadable now: left as it is
                if await on_share(read_marker, folder) == proposed:
                    await on_share(write_marker, folder, found)
        return found

    async def _watch_share(self) -> None:
        """Check the shared inputs folder every heartbeat interval: a box notices a share lost between
        its claims, and claims again once a broken one is back. It ends once the box is stopping, also
        where a check in it swallowed the cancel of :meth:`stop`, which waits for it (none here does,
        :func:`cuzk_mp.daemon.threads.wait_shared`; code it calls may)."""
        while not (self._closing or self._stop.is_set()):
            await asyncio.sleep(self.fcfg.heartbeat_interval_s)
            folder = self._paused_folder or self.fcfg.inputs_dir
            if folder is not None and not self._closing:
                try:
                    await self.check_share(folder)
                except Exception:
                    log.exception("fleet: box %s could not check its shared inputs folder", self.fcfg.box)

    async def stop(self, grace_s: float) -> None:
        """Let running jobs finish for ``grace_s``, give the rest back to the queue, leave the fleet; a key
        load for the backlog in progress is waited for :data:`STOP_LOAD_WAIT_S` at most (:meth:`_preload`),
        and its ``loading`` cleared from the box's row before the box leaves."""
        self._closing = True
        if self._share_task is not None:
            self._share_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._share_task
        if self.worker is not None and self.worker.running and grace_s > 0:
            log.info("[shutdown] fleet: %d running jobs get %g s to finish", len(self.worker.running), grace_s)
            await asyncio.wait(list(self.worker.running.values()), timeout=grace_s)
        self._stop.set()
        if self._task is not None:
            with contextlib.suppress(Exception):
                await self._task  # the worker releases what still runs
        if self._key_load is not None:
            await self._key_load  # logs its own failure; ends within STOP_LOAD_WAIT_S of the stop
        if self.fleet is not None:
            await self.fleet.close()
        self._left = True

    def _need(self) -> Fleet:
        if self.fleet is None or self._left:
            raise Unavailable("the daemon has left the fleet")
        return self.fleet

    # -- keys and capacity ------------------------------------------------------------------

    def resident(self) -> tuple[str, ...]:
        """The circuits whose keys this box holds, least recently used first."""
        return tuple(self._resident)

    def capacity(self) -> int:
        """Jobs this box runs at once: ``[fleet] max_jobs``, else one per prover process; none
        while the engine is degraded (its jobs would only fail), the shared inputs folder is broken
        here (:meth:`check_share`) or the daemon is stopping."""
        if self._closing or self.paused is not None or self.engine.degraded():
            return 0
        return self.fcfg.max_jobs or self._provers

    def loaded(self, circuit_id: str) -> None:
        """A key became resident (PreloadSRS, or a load for the backlog): claim its jobs."""
        self._resident[circuit_id] = None
        self._resident.move_to_end(circuit_id)

    def evicted(self, circuit_id: str) -> None:
        """A key left (EvictSRS, or evicted to make room): claim its jobs no more."""
        self._resident.pop(circuit_id, None)

    def _key_bytes(self) -> dict[str, int]:
        """Each provable circuit's key size: its zkey file's (0 while a synthetic key is not made)."""
        from cuzk_mp.pipeline.keys import circuit_key_file
        out = {}
        for cid, cc in self.cfg.circuits.items():
            path = circuit_key_file(cc.spec, self.cfg.param_cache)
            try:
                out[cid] = path.stat().st_size if path is not None else 0
            except OSError:
                out[cid] = 0
        return out

    def _busy(self) -> frozenset[str]:
        """The circuits a job here uses: in the engine, or claimed and its inputs still being read."""
        held = {c.circuit_id for c in self.fleet.held()} if self.fleet is not None else set()
        return frozenset(cid for cid in self.cfg.circuits if cid in held or self.jobs.in_use(cid))

    async def _load_for_backlog(self) -> None:
        """The worker's idle hook: start a key load for jobs that wait elsewhere (see :mod:`.keys`) as a
        task of the box, unless one runs. Run inside the hook, a load would hold the claim loop for its
        whole length (minutes for a large key, for ever on a hung mount): the box would claim nothing, not
        even jobs of the keys it holds, while its row shows them and free slots, so other boxes leave those
        jobs to it."""
        now = time.monotonic()
        if (now < max(self._next_idle_check, self._next_load) or self.fleet is None or self._closing
                or (self._key_load is not None and not self._key_load.done())):
            return
        self._next_idle_check = now + self.fcfg.heartbeat_interval_s
        self._key_load = asyncio.create_task(self._backlog_load(self.fleet, now), name="cuzk-fleet-key-load")

    async def _backlog_load(self, fleet: Fleet, now: float) -> None:
        """:meth:`_plan_and_load`, its failure logged (tried again later); the claim loop is woken when it
        ends, to claim the jobs of a key it made resident (already queued: no NOTIFY comes for them)."""
        try:
            await self._plan_and_load(fleet, now)
        except CuzkError as e:
            log.warning("fleet: box %s could not load a key for the backlog: %s", self.fcfg.box, e)
        except Exception:
            log.exception("fleet: box %s failed in its key load for the backlog", self.fcfg.box)
        finally:
            if self.worker is not None:
                self.worker.wake()

    async def _plan_and_load(self, fleet: Fleet, now: float) -> None:
        """Decide (:meth:`.store.FleetStore.plan_load`) and load; the box's row shows the key as loading
        from the decision until the load ended, failed or was given up at the box's stop
        (:meth:`_preload`), then the keys it holds.

        The claim loop goes on meanwhile: the keys to evict leave :meth:`resident` as the decision
        returns, before the engine drops them, so no job of theirs is claimed in between; where one was
        claimed while the decision was taken, nothing is evicted or loaded (decided again later)."""
        busy = self._busy()
        budget, key_bytes = self.cfg.engine.srs_budget_bytes, self._key_bytes()
        view = KeyView(resident=self.resident(), busy=busy, provable=frozenset(self.cfg.circuits),
                       key_bytes=key_bytes, budget_bytes=NO_BUDGET if budget is None else budget)

        def limit_s(cid: str) -> float:
            return load_limit_s(key_bytes.get(cid, 0), self.fcfg.stall_timeout_s)

        decision = await fleet.plan_load(lambda depths, boxes: plan_key_load(
            view, backlog_by_circuit(depths), holders_by_circuit(boxes, exclude=self.fcfg.box)), limit_s)
        if decision.load is None:
            log.debug("fleet: box %s loads no key: %s", self.fcfg.box, decision.reason)
            return
        try:
            if taken := sorted(self._busy().intersection(decision.evict)):
                log.info("fleet: box %s loads no key now: a job of %s, a key it would evict, came meanwhile",
                         self.fcfg.box, ", ".join(taken))
                return
            for cid in decision.evict:
                self.evicted(cid)  # claimed no more from here on
            self._next_load = now + self.fcfg.stall_timeout_s
            log.info("fleet: box %s loads the key of %s%s: %s", self.fcfg.box, decision.load,
                     f" (evicting {', '.join(decision.evict)})" if decision.evict else "", decision.reason)
            kept = list(decision.evict)
            try:
                for cid in decision.evict:
                    if await asyncio.to_thread(self.engine.evict, cid):
                        kept.remove(cid)
            finally:
                for cid in kept:  # a job uses it, or the engine failed: it stays
                    self._resident[cid] = None
            t0 = time.perf_counter()
            if not await self._preload(decision.load, limit_s(decision.load)):
                return
            self.loaded(decision.load)
            log.info("fleet: box %s holds %s after %.2f s; it claims its jobs", self.fcfg.box, decision.load,
                     time.perf_counter() - t0)
        finally:
            try:
                await fleet.end_load(self.resident())
            except CuzkError as e:  # the next heartbeat writes the row
                log.warning("fleet: box %s could not record the end of its key load: %s", self.fcfg.box, e)

    async def _preload(self, circuit_id: str, limit_s: float) -> bool:
        """The engine's load of a key, on a thread of its own (:func:`on_daemon_thread`: one that
        never returns keeps no process from exiting); False where the box stopped first.

        A load that outlasts ``limit_s`` (:func:`.keys.load_limit_s`) is logged as an error: other boxes
        no longer count it as the key's holder, and it may hang (a read on a hard mount whose server is
        gone). It is still waited for, as it may end. The box's stop waits for it
        :data:`STOP_LOAD_WAIT_S` at most, then leaves it to the engine's thread (the engine's to end:
        a thread cannot be stopped from outside): a stop that waited for it never ended on a hung mount."""
        load = on_daemon_thread(self.engine.preload, circuit_id, name=f"cuzk-fleet-load-{circuit_id}")
        load.add_done_callback(lambda f: f.cancelled() or f.exception())  # a load given up on may end later
        stopping = asyncio.ensure_future(self._stop.wait())
        t0 = time.monotonic()
        try:
            if not (await asyncio.wait({load, stopping}, timeout=limit_s, return_when=asyncio.FIRST_COMPLETED))[0]:
                log.error("fleet: box %s has been loading the key of %s for %.0f s, past its %.0f s limit: other "
                          "boxes no longer count it as the key's holder and may load it too; does the read hang "
                          "(a hard mount whose server is gone)?", self.fcfg.box, circuit_id, time.monotonic() - t0,
                          limit_s)
                await asyncio.wait({load, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if not load.done() and not (await asyncio.wait({load}, timeout=STOP_LOAD_WAIT_S))[0]:
                log.warning("fleet: box %s stops without its load of the key of %s, still running after %.0f s "
                            "(left to the engine's thread)", self.fcfg.box, circuit_id, time.monotonic() - t0)
                return False
        finally:
            stopping.cancel()
        load.result()
        return True

    # -- running a claimed job ------------------------------------------------------------

    async def _run(self, c: Claimed) -> JobOutput:
        """Prove a claimed job in the engine; its JobReply as the fleet stores it (protocol.stored_reply)."""
        if c.circuit_id in self._resident:
            self._resident.move_to_end(c.circuit_id)
        cc = self.cfg.circuits.get(c.circuit_id)
        if cc is None:  # resident keys are configured circuits; a later config change may differ
            raise ResourceError(f"box {self.fcfg.box} has no circuit {c.circuit_id!r} configured")
        data = await self._load(c)
        try:
            partitions = _partitions.decode(data)
        except msgspec.MsgspecError as e:
            raise InputError(f"inputs of job {c.job_id} ({c.inputs_ref}): not a list of partitions: {e}") from None
        if len(partitions) != c.n_partitions:
            raise InputError(f"inputs of job {c.job_id}: {len(partitions)} partitions, the job says {c.n_partitions}")
        rec = JobRecord(job_id=f"{c.job_id}.{c.claims}", request_id=c.request_id or "", circuit_id=c.circuit_id,
                        priority=c.priority, digest=c.inputs_sha256, partitions=partitions,
                        submitted_at=c.submitted_here, owner=c.client)
        # latency from the submit as the claim placed it on the monotonic clock: a step of the wall clock
        # while the inputs loaded is no part of it, and the load is
        rec.submitted_mono = c.submitted_mono
        await self.jobs.run_claimed(rec)
        if rec.state == "done":
            return JobOutput(*P.stored_reply(msgspec.structs.replace(reply_of(rec, 0), job_id=c.job_id)))
        if rec.state == "cancelled":  # not asked by the fleet (that cancels this task): run it again
            raise Cancelled(f"job {c.job_id}: the engine cancelled it ({rec.error or 'no reason given'})")
        raise error_from_kind(rec.error_kind or "ProofError", rec.error or "the job failed")

    async def _load(self, c: Claimed) -> bytes:
        """The claimed job's inputs; ShareUnavailable (the job goes back to the queue) where the shared
        folder is broken here: the file missing or unreadable with the folder's marker, or a read still
        running after :data:`SHARE_CHECK_S` while the marker's read fails or hangs too.

        A read from a hard mount whose server is gone never returns: the job's claim, renewed at every
        heartbeat while its run goes on, was held by this box for as long as the mount hung, and no other
        box could run the job. The stuck read is left to its thread, as a hung marker read is."""
        folder = Path(c.inputs_ref).parent if c.inputs_ref.startswith("/") else None
        reading = on_share(load_inputs, c.inputs_ref, c.inputs_sha256)
        reading.add_done_callback(lambda f: f.cancelled() or f.exception())  # a read given up on may end later
        try:
            while not (await asyncio.wait({reading}, timeout=SHARE_CHECK_S))[0]:
                if folder is not None and (problem := await self.check_share(folder)):
                    raise ShareUnavailable(problem)
            return reading.result()
        except (InputError, ResourceError) as e:  # the file is gone, or the share is, here
            if isinstance(e, ShareUnavailable) or folder is None or not (problem := await self.check_share(folder)):
                raise
            raise ShareUnavailable(problem) from None

    # -- requests -------------------------------------------------------------------------

    async def submit(self, req: P.SubmitProof | P.Prove, caller: Identity) -> JobRef:
        """Queue a client's job in the fleet (the module docstring says what is checked)."""
        _, priority = self.jobs.admit(req, caller)
        owner = caller.owner
        fleet = self._need()
        if self.fcfg.inputs_dir is None:
            raise ResourceError(f"box {self.fcfg.box} takes no submits: [fleet] inputs_dir is not set "
                                "(a directory every box reads); submit to another box")
        spec = JobSpec(job_id="submit", circuit_id=req.circuit_id, priority=priority,
                       partitions=[PartitionInput(kind=p.kind, data=p.data, seed=p.seed) for p in req.partitions])
        check = self.engine.circuits.check_job
        if any(p.kind == "json" for p in req.partitions):
            await asyncio.to_thread(check, spec)
        else:
            check(spec)
        folder = self.fcfg.inputs_dir
        problem = await self.check_share(folder)
        if problem is not None:  # its inputs would be stored where no other box reads them
            raise ResourceError(f"box {self.fcfg.box} takes no submits now: {problem}; submit to another box")
        size, caps = input_bytes(req.partitions), self.jobs.caps
        await fleet.precheck(req.request_id or None, owner, size, caps)  # before the inputs take disk space
        data = msgspec.msgpack.encode(req.partitions)
        inp = await asyncio.to_thread(inputs_ref, data, folder)

        def stage() -> StagedInputs:  # before the submit's transaction, which puts them in place
            try:
                return stage_inputs(data, folder, inp)
            except OSError as e:
                raise ResourceError(f"[fleet] inputs_dir {folder}: cannot store the inputs: {e}") from None

        return await fleet.submit(req.request_id or None, req.circuit_id, inp.ref, inp.sha256, spec.priority,
                                  len(req.partitions), client=owner, input_bytes=size, caps=caps, stage=stage)

    async def wait(self, job_id: str, timeout_s: float | None, only: str | None, id: int) -> P.JobReply:
        """AwaitProof from any box: the job's reply once it ended, or where it is after ``timeout_s``."""
        if timeout_s is not None and timeout_s < 0:
            raise InputError(f"AwaitProof.timeout_s: must be >= 0, got {timeout_s}")
        st = await self._need().await_result(job_id, timeout_s, only)
        if not st.finished and self._closing:
            raise Unavailable(f"the daemon is shutting down; job {st.job_id} goes on in the fleet: "
                                "await it at another box")
        return job_reply(st, id, timed_out=not st.finished)

    async def cancel(self, job_id: str, only: str | None, id: int) -> P.CancelReply:
        """CancelProof from any box; the box that runs the job stops it."""
        fleet = self._need()
        st = await fleet.status(job_id, only)
        ok = await fleet.cancel(st.job_id, only)
        state = "cancelled" if ok else (await fleet.status(st.job_id)).state
        return P.CancelReply(id=id, job_id=st.job_id, cancelled=ok, state=state)

    # -- status, metrics, retention ---------------------------------------------------------

    async def document(self) -> dict[str, Any]:
        """The ``fleet`` part of the status document: this box, then every box and the queues."""
        doc: dict[str, Any] = {"box": self.fcfg.box, "resident": list(self._resident), "capacity": self.capacity(),
                               "running": len(self.worker.running) if self.worker else 0}
        if self.paused is not None:
            doc["paused"] = self.paused
        try:
            doc.update(report.document(*await self._fleet_figures()))
        except CuzkError as e:
            doc["error"] = str(e)
        return doc

    async def _fleet_figures(self) -> tuple[list[Any], list[Any]]:
        """Every box and the queue depths, read within :data:`OBSERVE_S`: a status call or a
        scrape during a database outage answers at once that the database is not answering,
        rather than after the pool's connect timeout (a monitor's own timeout may be shorter)."""
        fleet = self._need()
        try:
            return await asyncio.wait_for(asyncio.gather(fleet.boxes(), fleet.queue_depths()), OBSERVE_S)
        except asyncio.TimeoutError:
            raise ResourceError(f"fleet: the database did not answer within {OBSERVE_S:g} s") from None

    async def gauges(self) -> list[Gauge]:
        """The fleet's /metrics gauges (:mod:`.report`), and whether its database answered."""
        share = (*INPUTS_OK, 0.0 if self.paused is not None else 1.0)
        try:
            boxes, depths = await self._fleet_figures()
        except CuzkError as e:
            log.warning("fleet: no fleet figures for this scrape: %s", e)
            return [(*DATABASE_UP, 0.0), share]
        return [(*DATABASE_UP, 1.0), share, *report.gauges(boxes, depths)]

    def counters(self) -> list[Gauge]:
        """The fleet's /metrics counters: this box's failed runs (:func:`.report.failures`)."""
        return [report.failures(self.fcfg.box, self.worker.failures if self.worker is not None else {})]

    async def prune(self, result_ttl_s: float) -> int:
        """Prune finished jobs, their request ids and the inputs no job names any more (logged,
        never raised: the next round tries again).

        Stored inputs only where ``inputs_dir`` is the fleet's shared folder here (:meth:`check_share`):
        the shared folder of another fleet (a box configured with the wrong dsn or folder) holds files no
        job of this fleet names, and every one of them older than ``result_ttl`` went, the inputs of the
        other fleet's queued jobs with them."""
        try:
            fleet = self._need()
            n = await fleet.prune(result_ttl_s)
            removed = 0
            folder = self.fcfg.inputs_dir
            if folder is not None and await self.check_share(folder) is None:
                removed = await fleet.prune_inputs(folder, result_ttl_s)
        except CuzkError as e:
            log.warning("fleet: pruning failed (again at the next round): %s", e)
            return 0
        if n or removed:
            log.info("fleet: pruned %d finished jobs and %d stored inputs older than result_ttl", n, removed)
        return n


NO_BUDGET = 1 << 62  # no [memory] key budget: every key fits
OBSERVE_S = 2.0  # the most a status call or a scrape waits for the fleet's database
DATABASE_UP = ("cuzk_fleet_database_up", "1 if this scrape read the fleet's database, 0 if it could not.")
INPUTS_OK = ("cuzk_fleet_inputs_ok", "1 if this box sees the fleet's shared inputs folder, 0 while it claims "
             "no jobs because it does not (see the log and the status document's fleet.paused).")
SHARE_CHECK_S = 10.0  # the most a check of the shared inputs folder's marker may take
STOP_LOAD_WAIT_S = 2.0  # the most a box's stop waits for a key load in progress (FleetBox._preload)


def job_reply(st: JobStatus, id: int, timed_out: bool = False) -> P.JobReply:
    """The JobReply of a fleet job: the stored reply of a done job, else one built from its status.

    Its timestamps are the database's in every state, also those of a stored reply (written on
    the running box's clock): a client asking any box sees one clock, the one every queue
    decision uses, and never a job that finished before it was submitted. ``failed_on`` is the
    job's record's in every state (a stored reply never carries it: the run that wrote it succeeded)."""
    if st.state == "done" and st.result is not None:
        try:
            return msgspec.structs.replace(P.reply_from_store(st.result, st.key_digest), id=id, job_id=st.job_id,
                                           timed_out=False, failed_on=list(st.failed_on),
                                           submitted_at=st.submitted_at, started_at=st.started_at,
                                           finished_at=st.finished_at)
        except msgspec.MsgspecError as e:
            raise ResourceError(f"job {st.job_id}: its stored result cannot be read: {e}") from None
    fill: P.PartitionState = {"cancelled": "cancelled", "failed": "failed"}.get(st.state, "pending")  # type: ignore[assignment]
    return P.JobReply(id=id, job_id=st.job_id, circuit_id=st.circuit_id, state=st.state,
                      priority=st.priority.name,  # type: ignore[arg-type]
                      partitions=[P.PartitionOut(index=i, state=fill) for i in range(st.n_partitions)],
                      submitted_at=st.submitted_at, started_at=st.started_at, finished_at=st.finished_at,
                      error=st.error, error_kind=st.error_kind, timed_out=timed_out, failed_on=list(st.failed_on))

