"""The proving daemon: its lifecycle, from start-up to the drain.

This module owns the daemon process's asyncio side: the engine instance, the job table, the
journal, the protocol listener (unix socket or TCP) and the HTTP status listener, and the
shutdown state machine. What the daemon answers on its connections (the request table and its
handlers, the status and metrics documents) is :mod:`.handlers`'s :class:`~.handlers.DaemonHandlers`,
the serving half of :class:`Daemon`.

Lifecycle (``DaemonState``)::

    CREATED -> STARTING -> RUNNING -> DRAINING -> STOPPED      (FAILED if start-up fails)

STARTING first takes the instance lock (:mod:`.instance_lock`: a second daemon with the same
journal or socket exits here, having touched nothing), then opens the journal (refusing a
damaged one: :mod:`.journal`; on a worker thread, so the status listener already started answers
meanwhile), starts the engine (READY handshake of its processes), registers
the circuits, resubmits unfinished journaled jobs, preloads ``[srs] preload`` keys, then listens
and tells systemd READY=1. While RUNNING, the engine may be *degraded* (a role has no live
process and keeps dying): ``/healthz`` answers 503 naming the cause, GetStatus and the metrics
say why, and the jobs that cannot progress fail with that cause.

With a ``[fleet]`` section the daemon is one box of a fleet (:mod:`.fleet.box`): after the
preloads it joins the shared PostgreSQL queue, its submits go there (the database, not the
journal, keeps them), await, cancel and status reach any job of the fleet, and its engine also
runs the jobs it claims. On the drain its running fleet jobs get the grace period, the rest go
back to the queue for other boxes, and it leaves the fleet before the engine stops.

SIGTERM or SIGINT moves to DRAINING: the listener closes (and its socket file is removed), new
submits are refused, the engine finishes in-flight partitions within the grace period and stops
its processes (removing every shm segment and semaphore); jobs it did not finish stay in the
journal; then the journal is closed and the process exits 0. A second signal is logged and
ignored: the drain is already bounded by ``shutdown_grace``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cuzk_mp import __version__
from cuzk_mp.daemon import protocol as P
from cuzk_mp.daemon.accept import AcceptServer
from cuzk_mp.daemon.access import Access, check_socket_places
from cuzk_mp.daemon.config import ENGINE_STOP_RESERVE_S, JOURNAL_STOP_WAIT_S, DaemonConfig
from cuzk_mp.daemon.handlers import DaemonHandlers, DaemonState
from cuzk_mp.daemon.instance_lock import InstanceLock, lock_paths
from cuzk_mp.daemon.jobs import JOURNAL, JobTable, QueueCaps
from cuzk_mp.daemon.journal import Journal
from cuzk_mp.daemon.metrics import DaemonMetrics
from cuzk_mp.daemon.notify import STATUS_INTERVAL_S, read_budget_s, setup_budget_s, starting, watchdog_interval_s
from cuzk_mp.daemon.ops import sd_notify
from cuzk_mp.daemon.status import StatusView
from cuzk_mp.daemon.status_http import StatusHandlers, start_status_server
from cuzk_mp.daemon.threads import on_daemon_thread, wait_shared, within
from cuzk_mp.daemon.transport import Comm, Listener, listen, remove_socket
from cuzk_mp.errors import ConfigError, ResourceError

if TYPE_CHECKING:
    from cuzk_mp.daemon.fleet.box import FleetBox

log = logging.getLogger("cuzk_mp.daemon")

PRUNE_INTERVAL_MAX_S = 60.0
ENGINE_START_SLACK_S = 60.0  # systemd's allowance for the engine's start beyond its own start_timeout

EngineFactory = Callable[..., Any]


def _default_engine(config: Any, on_job_done: Any, on_partition_done: Any) -> Any:
    """A configured :class:`~cuzk_mp.pipeline.engine.Engine`; the daemon starts it. Its messages name the
    config file's keys (a start timeout names ``[pipeline] start_timeout``)."""
    from cuzk_mp.daemon.config import ENGINE_KEYS
    from cuzk_mp.pipeline.engine import Engine
    from cuzk_mp.pipeline.types import field_key

    return Engine(config, on_job_done=on_job_done, on_partition_done=on_partition_done, key=field_key(ENGINE_KEYS))


class Daemon(DaemonHandlers):
    """One proving daemon; ``await Daemon(cfg).run()`` serves until SIGTERM/SIGINT."""

    def __init__(self, cfg: DaemonConfig, engine_factory: EngineFactory = _default_engine) -> None:
        self.cfg = cfg
        self.state = DaemonState.CREATED
        self.metrics = DaemonMetrics()
        self.started_at = time.time()
        self._engine_factory = engine_factory
        self.engine: Any = None
        self.journal: Journal | None = None
        self.jobs: JobTable | None = None
        self.listener: Listener | None = None
        self.http: AcceptServer | None = None
        self.view: StatusView | None = None
        self.fleet: FleetBox | None = None  # [fleet]: this daemon is one box of a fleet
        self.access = Access(cfg.tokens, cfg.admin_tokens)
        self.lock = InstanceLock(lock_paths(cfg.journal_path, [
            a.path for a in (cfg.listen, cfg.status_listen) if a is not None and a.kind == "unix"]),
            cfg.engine.shm_prefix)
        self._comms: set[Comm] = set()
        self._last_active = time.monotonic()  # when the daemon was last seen busy (exit_when_idle)
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[Any]] = set()
        self.handlers: dict[type, Callable[[Any], Any]] = {
            P.SubmitProof: self._submit, P.AwaitProof: self._await, P.Prove: self._prove,
            P.CancelProof: self._cancel, P.GetStatus: self._status, P.GetMetrics: self._metrics,
            P.PreloadSRS: self._preload, P.EvictSRS: self._evict,
            P.GetVerificationKey: self._vk,
        }

    # -- lifecycle ------------------------------------------------------------------------

    async def start(self) -> None:
        """STARTING -> RUNNING; on any failure everything started is stopped and it re-raises."""
        self.state = DaemonState.STARTING
        loop = asyncio.get_running_loop()
        try:
            check_socket_places(self.cfg)  # before the lock file beside the socket is made
            # before anything another daemon could be using; on a thread, as the journal's load below: the lock
            # files lie beside the journal, and on a folder whose storage hangs their open never returns
            await on_daemon_thread(self.lock.acquire, name="cuzk-instance-lock")
            if self.cfg.fleet is not None:  # a dsn or role the database refuses fails before the engine's long start
                from cuzk_mp.daemon.fleet.store import check_joinable
                await check_joinable(self.cfg.fleet)
            if self.cfg.status_listen is not None:
                self.http = await _bound("daemon.status_listen", self.cfg.status_listen,
                                         start_status_server(self.cfg.status_listen, StatusHandlers(
                                             self.http_status, self.metrics_text, self.health),
                                             self.cfg.socket_mode))
            # off the loop: the status server above answers /healthz ("starting") while the WAL is checked
            self.journal = await on_daemon_thread(Journal.open, self.cfg.journal_path, name="cuzk-journal-open")
            configured = self._engine_factory(
                self.cfg.engine,
                lambda r: self._forward(loop, self._job_done, r),
                lambda j, r: self._forward(loop, self._partition_done, j, r))
            log.info("[start] engine starting (%s backend)", self.cfg.engine.backend)
            starting("starting the engine's processes (a first start compiles kernels)",
                     self.cfg.engine.start_timeout_s + ENGINE_START_SLACK_S)
            self.engine = await asyncio.to_thread(configured.start)  # a failed start leaves nothing behind
            self.jobs = JobTable(self.engine, self.journal, self.cfg.circuits, self.metrics,
                                 self.cfg.result_ttl_s, QueueCaps(self.cfg.max_queued_jobs,
                                                                  self.cfg.max_queued_input_bytes,
                                                                  self.cfg.max_jobs_per_owner),
                                 self.cfg.max_client_priority)
            self.view = StatusView(self.cfg, self.jobs, self.started_at, self._generated_vk)
            for cc in self.cfg.circuits.values():  # synthetic: may run the dev setup once
                await on_daemon_thread(self._register, cc.spec, name=f"cuzk-register-{cc.spec.circuit_id}")
            kept, again = await self.jobs.restore(await on_daemon_thread(self.journal.load, name="cuzk-journal-load"))
            log.info("[start] journal %s: %d finished results kept, %d jobs resubmitted",
                     self.cfg.journal_path, kept, again)
            for cid in self.cfg.preload:
                t0 = time.perf_counter()
                await on_daemon_thread(self._preload_at_start, cid, name=f"cuzk-preload-{cid}")
                log.info("[start] preloaded %s in %.2f s", cid, time.perf_counter() - t0)
            if self.cfg.fleet is not None:  # the queue library loads only when a fleet is configured
                from cuzk_mp.daemon.fleet.box import FleetBox
                self.fleet = FleetBox(self.cfg, self.engine, self.jobs)
                await self.fleet.start(self.cfg.preload)
            self.listener = await _bound("daemon.listen", self.cfg.listen, listen(
                self.cfg.listen, self.handle_comm, max_frame_bytes=self.cfg.max_frame_bytes,
                socket_mode=self.cfg.socket_mode, frame_timeout_s=self.cfg.frame_timeout_s,
                max_connections=self.cfg.max_connections, refusal=P.encode(P.error_reply(
                    0, "Unavailable", f"the daemon serves at most {self.cfg.max_connections} "
                    "connections at once ([daemon] max_connections); try again later", closing=True)),
                on_refused=self.metrics.connections_refused.inc))
        except BaseException:
            self.state = DaemonState.FAILED
            await self._teardown(grace_s=0.0)
            raise
        self._spawn(self._prune_loop())
        if self.cfg.exit_when_idle_s:
            self._last_active = time.monotonic()  # the start (engine, preloads) is no idle time
            self._spawn(self._idle_loop(self.cfg.exit_when_idle_s))
        self.state = DaemonState.RUNNING
        sd_notify(f"READY=1\nSTATUS=serving on {self.cfg.listen}\nMAINPID={os.getpid()}")
        if os.environ.get("NOTIFY_SOCKET"):
            self._spawn(self._systemd_loop(watchdog_interval_s()))
        log.info("[start] cuzk-mp %s daemon pid=%d serving on %s%s", __version__, os.getpid(),
                 self.cfg.listen, f" (status on http://{self.cfg.status_listen})"
                 if self.cfg.status_listen else "")

    def _register(self, spec: Any) -> None:
        """On a thread of its own: a circuit's registration (its files looked at, a synthetic one's dev key
        made once), announced to systemd first."""
        _announce_setup(spec, self.cfg.param_cache)
        self.engine.register_circuit(spec)

    def _preload_at_start(self, circuit_id: str) -> None:
        """On a thread of its own: ``[srs] preload``'s load of a key, announced to systemd with its size."""
        from cuzk_mp.pipeline.keys import circuit_key_file

        key = circuit_key_file(self.cfg.circuits[circuit_id].spec, self.cfg.param_cache)
        size = key.stat().st_size if key is not None and key.is_file() else 0
        starting(f"loading the proving key of {circuit_id} ({size / 2**30:.2f} GiB)", read_budget_s(size))
        self.engine.preload(circuit_id)

    async def run(self) -> int:
        """Start, serve until SIGTERM/SIGINT, drain and stop; the process exit code."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.request_stop, sig.name)
        loop.add_signal_handler(signal.SIGHUP, _hangup)  # not a silent death: nothing to reload
        if not await self._started_unless_stopped():
            return 0
        await self._stop.wait()
        await self.stop()
        return 0

    async def _started_unless_stopped(self) -> bool:
        """:meth:`start`, given up where a stop is asked for first (False): a start step may never end (a
        key read on a hard mount whose server is gone), and SIGTERM must stop the daemon all the same. The
        cancelled start stops what it started (its own failure path); the stuck call is left to its
        daemon thread (:mod:`.threads`), which keeps no process from exiting."""
        start = asyncio.ensure_future(self.start())
        stop = asyncio.ensure_future(self._stop.wait())
        try:
            await asyncio.wait({start, stop}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop.cancel()
            if not start.done():
                start.cancel()
                await asyncio.wait({start})  # its teardown runs
        if not start.cancelled():
            start.result()  # a failed start raises here
            return True
        self.state = DaemonState.STOPPED
        log.info("[shutdown] stopped before the start ended")
        return False

    def request_stop(self, reason: str = "request") -> None:
        """Begin the drain (idempotent; signal handlers call this)."""
        if self._stop.is_set():
            log.warning("[shutdown] %s received while already stopping; the drain is bounded "
                        "by shutdown_grace = %g s", reason, self.cfg.shutdown_grace_s)
            return
        log.info("[shutdown] %s: draining (grace %g s)", reason, self.cfg.shutdown_grace_s)
        self._stop.set()

    async def stop(self) -> None:
        """RUNNING -> DRAINING -> STOPPED (idempotent)."""
        if self.state in (DaemonState.DRAINING, DaemonState.STOPPED):
            return
        self.state = DaemonState.DRAINING
        sd_notify("STOPPING=1")
        await self._teardown(self.cfg.shutdown_grace_s)
        self.state = DaemonState.STOPPED
        log.info("[shutdown] stopped")

    async def _teardown(self, grace_s: float) -> None:
        """Release everything that was started, in dependency order."""
        if self.jobs is not None:
            self.jobs.draining = True
        if self.listener is not None:
            await self.listener.close()
        t0 = time.monotonic()
        if self.fleet is not None:  # its jobs finish or go back to the queue while the engine runs
            await self.fleet.stop(max(grace_s - ENGINE_STOP_RESERVE_S, 0.0))
        if self.engine is not None:
            await asyncio.to_thread(self.engine.stop,
                                    max(grace_s - (time.monotonic() - t0) - ENGINE_STOP_RESERVE_S, 0.0))
        for _ in range(3):  # let callbacks forwarded by the engine before it stopped run
            await asyncio.sleep(0)
        journal_by = time.monotonic() + JOURNAL_STOP_WAIT_S  # a journal whose storage hangs holds the stop no longer
        if self.jobs is not None:
            await self._flush_until(journal_by)  # jobs that ended are journaled, and their waiters get the result,
            self.jobs.closing.set()  # before the waiters of unfinished ones hear "shutting down"
            await asyncio.sleep(0.05)  # waiters answer before their connections close
            await self._flush_until(journal_by)
            self.jobs.close()
        for comm in list(self._comms):
            comm.close()
        for t in list(self._tasks):
            t.cancel()
        if self.journal is not None:
            self.journal.close(max(journal_by - time.monotonic(), 0.0))
        if self.http is not None:
            self.http.close()
            if self.cfg.status_listen is not None and self.cfg.status_listen.kind == "unix":
                remove_socket(self.cfg.status_listen.path)
        # the lock files lie beside the journal: on a folder whose storage hangs their close never returns,
        # and the process's exit drops its locks all the same
        try:
            await wait_shared(on_daemon_thread(self.lock.release, name="cuzk-instance-unlock"),
                              max(journal_by - time.monotonic(), 0.0))
        except TimeoutError:
            log.error("[shutdown] the daemon's lock files beside %s did not close (their storage does not answer?); "
                      "the process's exit releases them", self.cfg.journal_path)

    async def _flush_until(self, by: float) -> None:
        """The job table's journal writes (:meth:`.jobs.JobTable.flush`), waited for until ``by`` (monotonic)
        at most: a write on a folder whose storage hangs never ends. Those jobs run again after a restart."""
        assert self.jobs is not None
        try:
            await within(self.jobs.flush(), max(by - time.monotonic(), 0.0))
        except TimeoutError:
            log.error("[shutdown] the journal %s took no write for %g s (its storage does not answer?): the daemon "
                      "stops without the finished jobs' states; those jobs run again after a restart",
                      self.cfg.journal_path, JOURNAL_STOP_WAIT_S)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _prune_loop(self) -> None:
        interval = min(max(self.cfg.result_ttl_s / 4, 1.0), PRUNE_INTERVAL_MAX_S)
        while True:
            await asyncio.sleep(interval)
            assert self.jobs is not None
            try:
                n = await self.jobs.prune()
            except ResourceError as e:  # a full disk: nothing is dropped; the next round tries again
                log.warning("pruning waits for the journal: %s", e)
                continue
            except Exception:  # noqa: BLE001 - a bug here must not end pruning for the daemon's life
                log.exception("pruning failed; it runs again in %g s", interval)
                continue
            if n:
                log.info("pruned %d finished jobs older than result_ttl", n)
            if self.fleet is not None:
                await self.fleet.prune(self.cfg.result_ttl_s)

    async def _systemd_loop(self, watchdog_s: float | None) -> None:
        """Under systemd (:mod:`.notify`): the status line (``systemctl status``) every STATUS_INTERVAL_S, and
        with ``WatchdogSec=`` a ``WATCHDOG=1`` every ``watchdog_s``, both from this loop, so that a loop that
        hangs stops them and systemd restarts the daemon. The drain keeps them going until its end."""
        interval = min(STATUS_INTERVAL_S, watchdog_s or STATUS_INTERVAL_S)
        while True:
            await asyncio.sleep(interval)
            try:
                status = f"STATUS={self._status_line()}"
            except Exception as e:  # noqa: BLE001 - the loop runs: the ping goes, whatever the line's bug
                status = f"STATUS=serving on {self.cfg.listen} (status line failed: {type(e).__name__})"
            sd_notify(("WATCHDOG=1\n" if watchdog_s else "") + status)

    def _status_line(self) -> str:
        """What the daemon is doing, in one line: its state, its jobs, and what is wrong (:meth:`health`)."""
        counts = self.jobs.counts() if self.jobs is not None else {}
        line = (f"{self.state.value} on {self.cfg.listen}: {counts.get('queued', 0)} job(s) queued, "
                f"{counts.get('running', 0)} running")
        healthy, why = self.health()
        return line if healthy or why == self.state.value else f"{line}; {why}"

    def idle(self) -> bool:
        """No open connection and no queued or running job: nothing would notice a stop."""
        if self._comms or self.jobs is None:
            return False
        counts = self.jobs.counts()
        return not counts["queued"] and not counts["running"]

    async def _idle_loop(self, limit_s: float) -> None:
        """``[daemon] exit_when_idle``: drain and stop once :meth:`idle` has held for ``limit_s``
        (a daemon started on demand for one user's proofs goes away when they stop coming)."""
        while not self._stop.is_set():
            if not self.idle():
                self._last_active = time.monotonic()
            left = self._last_active + limit_s - time.monotonic()
            if left <= 0:
                self.request_stop(f"idle for {limit_s:g} s (exit_when_idle)")
                return
            await asyncio.sleep(min(left, 1.0))

    @staticmethod
    def _forward(loop: asyncio.AbstractEventLoop, fn: Callable[..., None], *args: Any) -> None:
        """Engine thread -> loop thread."""
        try:
            loop.call_soon_threadsafe(fn, *args)
        except RuntimeError:
            log.warning("engine callback after the loop closed; the journal keeps the job")

    def _job_done(self, result: Any) -> None:
        assert self.jobs is not None
        self.jobs.on_job_done(result)

    def _partition_done(self, job_id: str, result: Any) -> None:
        assert self.jobs is not None
        self.jobs.on_partition_done(job_id, result)

    def health(self) -> tuple[bool, str]:
        """(healthy, what is wrong) for /healthz: running, the engine not degraded, and the journal answering
        (while a write of it hangs no submit is taken: :mod:`.storage_waits`)."""
        if self.state is not DaemonState.RUNNING:
            return False, self.state.value
        degraded = self.engine.degraded()
        if degraded:
            return False, "degraded: " + "; ".join(d.reason for d in degraded)
        hung = self.jobs.storage.hung_for(JOURNAL) if self.jobs is not None else None
        if hung is not None:
            return False, f"the journal has not answered for {hung:.0f} s (its storage hangs?): no job is accepted"
        return True, "ok"


def _hangup() -> None:
    log.warning("SIGHUP: ignored; the daemon keeps serving (a changed config takes effect at a restart: "
                "`systemctl restart`, which drains first)")


def _announce_setup(spec: Any, param_cache: Any) -> None:
    """Before a synthetic circuit's registration: tell systemd (and allow for) its dev setup, made
    once when its key is not in the param cache yet."""
    if spec.synthetic is None:
        return
    from cuzk_mp.pipeline.keys import circuit_key_file

    key = circuit_key_file(spec, param_cache)
    if key is None:
        starting(f"the circuit data of {spec.circuit_id} ({spec.synthetic} 2^{spec.log_n}; its INSECURE dev key "
                 "is generated in the provers)", setup_budget_s(spec.log_n))
        return
    what = "checking the" if key.is_file() else "making (once) the INSECURE"
    starting(f"{what} development key of {spec.circuit_id} ({spec.synthetic} 2^{spec.log_n})",
             setup_budget_s(spec.log_n))


async def _bound(key: str, addr: Any, bind: Any) -> Any:
    """Await a listener's bind; an address in use (or not bindable) is a ConfigError naming the
    config key, not an OSError traceback."""
    try:
        return await bind
    except OSError as e:
        raise ConfigError(f"{key} = {str(addr)!r}: cannot listen there: {e.strerror or e}") from None


async def serve(cfg: DaemonConfig) -> int:
    """Run a daemon for ``cfg`` in the current loop until it is stopped; the exit code."""
    from cuzk_mp import stackprof

    daemon = Daemon(cfg)
    sampler = stackprof.start_from_env()  # CUZK_MP_STACK_PROFILE: the daemon's threads (its children: theirs)
    try:
        with contextlib.suppress(asyncio.CancelledError):
            return await daemon.run()
        return 0
    finally:
        stackprof.finish(sampler, "daemon")
