"""The engine's child processes: which ones exist, their start-up, restarts with backoff, shutdown.

Owns the :class:`Child` of every synthesis worker (``cuzk-synth-<i>``) and prover
process (``cuzk-prover-<dev>``, the prover role on every backend): its spec, its
current process, its restart counters, and which task a synthesis worker holds.
It starts, reaps and restarts processes and renders their status rows
(:meth:`Supervisor.rows`); what a death *means* for jobs is the engine's business.

Restarts never stop. A child that dies after a long, healthy run is restarted at
once; one that keeps dying (before READY, or within ``MIN_UPTIME_S`` of it) waits
longer each time (``BACKOFF_BASE_S`` doubling up to ``BACKOFF_MAX_S``). A role
with no READY process while one of its children has died ``CRASH_LOOP`` times in
a row before READY is *degraded*: :meth:`Supervisor.degraded` says which role and
why, and the engine reports it and fails the jobs that cannot progress until a
child of that role is READY again. (A child killed while it works is not a crash
loop: its partitions are retried, and it is back within a start-up.)

Environment per child, set in the child before any heavy import:

* prover, GPU backend: ``CUDA_VISIBLE_DEVICES=<dev>`` (binds the process to
  its GPU; it sees it as device 0);
* prover, CPU backend: ``NUMBA_NUM_THREADS = cores // processes`` and no GPU;
* synthesis worker: ``NUMBA_NUM_THREADS = threads_per_partition``;
* both: ``OMP_WAIT_POLICY=PASSIVE`` (idle numba threads sleep instead of spinning on cores
  the other processes need: :func:`~cuzk_mp.algebra.threads.pool_environment`).

Shutdown (:meth:`Supervisor.stop_all`, of every child or of some): ``Stop`` message, a short
wait (``STOP_WAIT_S``; ``NO_GRACE_STOP_WAIT_S`` where the engine stops without grace), then
SIGTERM -> 5 s -> SIGKILL for whatever is still alive.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from multiprocessing.connection import wait as mp_wait
from dataclasses import dataclass, field
from typing import Any

import msgspec

from ..algebra.threads import pool_environment
from . import messages as msg
from .procs import ChildHandle, ChildSpec, describe_exit, spawn_child
from .prover_proc import ProverPayload
from .ring import RingHandle
from .synth import SynthPayload
from .types import EngineConfig

log = logging.getLogger("cuzk_mp.pipeline.supervisor")
ROLES = ("prover", "synth")
ROLE_MODULES = {"prover": "cuzk_mp.pipeline.prover_proc", "synth": "cuzk_mp.pipeline.synth"}
CRASH_LOOP = 3  # consecutive deaths before READY that make a role with no live process degraded
BACKOFF_BASE_S = 0.5
BACKOFF_MAX_S = 30.0
MIN_UPTIME_S = 10.0  # a READY child that dies sooner than this counts as a quick death
TERM_WAIT_S = 5.0
STOP_WAIT_S = 10.0  # a stop message's wait for a READY child to exit (a drain's end: it finishes what it holds)
# the same wait in a stop without grace (Ctrl-C to a bench): nothing a child finishes is wanted, and a
# child busy loading or generating a key reads no message until that ends (minutes for a large key)
NO_GRACE_STOP_WAIT_S = 1.0


class ProcessRow(msgspec.Struct):
    """One supervised process as the status shows it."""

    name: str
    role: str
    pid: int
    device: int | None  # the device id of a prover process
    alive: bool
    ready: bool
    restarts: int
    failed_starts: int  # consecutive deaths before READY (0 once READY)
    busy_task: int | None  # the task a synthesis worker holds
    last_exit: str | None
    restart_in_s: float | None  # a restart is scheduled (backoff)
    info: dict[str, str | int | float | None]  # what the process said in READY


class Degraded(msgspec.Struct):
    """A role with no live process that keeps dying: why, and since when (epoch seconds)."""

    role: str
    reason: str
    since: float


@dataclass
class Death:
    """What :meth:`Supervisor.reap` found: the process gone and what it held."""

    name: str
    role: str
    pid: int
    exit_text: str
    was_ready: bool
    busy: int | None


@dataclass
class Child:
    """One supervised process slot (survives restarts): its spec, current process and counters."""

    spec: ChildSpec
    handle: ChildHandle
    restarts: int = 0
    streak: int = 0  # consecutive quick deaths: the backoff
    failed_starts: int = 0  # consecutive deaths before READY: the crash loop
    busy: int | None = None  # synthesis worker: the task id in hand
    last_exit: str | None = None
    kill_reason: str | None = None  # why the engine killed the current process (joins its exit text)
    ready_at: float | None = None  # monotonic time of the current process's READY
    restart_at: float | None = None  # monotonic time of a scheduled restart
    down_since: float | None = None  # epoch time the role's last live process of this child died
    info: dict[str, object] = field(default_factory=dict)


def child_specs(config: EngineConfig, ring: RingHandle, backend: str, devices: list[int]) -> list[ChildSpec]:
    """The specs of every child the engine runs, provers first."""
    cpu_threads = max(1, (os.cpu_count() or 1) // len(devices))
    # children log at the engine's level unless CUZK_MP_LOG_LEVEL says otherwise
    level = os.environ.get("CUZK_MP_LOG_LEVEL") or logging.getLevelName(logging.getLogger().getEffectiveLevel())
    threads = config.threads_per_partition(len(devices) if backend == "cpu" else 0)
    specs = []
    for dev in devices:
        env = {"CUDA_VISIBLE_DEVICES": str(dev)} if backend == "gpu" else {
            **pool_environment(cpu_threads), "CUDA_VISIBLE_DEVICES": ""}
        payload = ProverPayload(ring, backend, dev, config.gpu_workers_per_device, config.verify_proofs,
                                config.srs_budget_bytes, config.prover_batch)
        specs.append(ChildSpec("prover", dev, ROLE_MODULES["prover"], {**env, "CUZK_MP_LOG_LEVEL": level}, payload,
                               ring.prefix))
    for i in range(config.partition_workers):
        env = {**pool_environment(threads), "CUDA_VISIBLE_DEVICES": ""}
        specs.append(ChildSpec("synth", i, ROLE_MODULES["synth"], {**env, "CUZK_MP_LOG_LEVEL": level},
                               SynthPayload(ring, threads), ring.prefix))
    return specs


def backoff_s(streak: int) -> float:
    """How long a restart waits after ``streak`` consecutive quick deaths (0 for the first)."""
    if streak <= 1:
        return 0.0
    return min(BACKOFF_MAX_S, BACKOFF_BASE_S * 2 ** (streak - 2))


class Supervisor:
    """Starts, restarts and stops the engine's children (see the module docstring)."""

    def __init__(self, children: dict[str, Child]) -> None:
        self.children = children

    @classmethod
    def start(cls, specs: list[ChildSpec]) -> Supervisor:
        """Spawn every child (no READY wait: READY arrives as a message)."""
        children: dict[str, Child] = {}
        try:
            for spec in specs:
                children[spec.name] = Child(spec, spawn_child(spec))
                log.info("[start] %s pid=%d", spec.name, children[spec.name].handle.pid)
        except BaseException:
            cls(children).stop_all(deadline_s=0)
            raise
        return cls(children)

    # ---- events
    def on_ready(self, name: str, m: msg.Ready) -> None:
        """The child finished its start-up."""
        child = self.children[name]
        child.handle.ready = True
        child.failed_starts = 0
        child.ready_at, child.restart_at, child.down_since = time.monotonic(), None, None
        child.info = dict(m.info)
        log.info("[start] %s pid=%d READY %s", name, m.pid, m.info)

    def reap(self, name: str) -> Death | None:
        """The child's sentinel fired: reap it and count the death; None if already reaped."""
        child = self.children[name]
        h = child.handle
        if h.reaped:
            return None
        h.proc.join(1.0)  # the sentinel fired: the process is gone, this reaps it
        h.reaped = True
        h.close()
        exit_text = describe_exit(h.proc.exitcode)
        if child.kill_reason is not None:
            exit_text, child.kill_reason = f"{exit_text}: {child.kill_reason}", None
        quick = not h.ready or child.ready_at is None or time.monotonic() - child.ready_at < MIN_UPTIME_S
        child.streak = child.streak + 1 if quick else 0
        child.failed_starts = 0 if h.ready else child.failed_starts + 1
        child.last_exit = exit_text
        if child.down_since is None:
            child.down_since = time.time()
        busy, child.busy = child.busy, None
        return Death(name, child.spec.role, h.pid, exit_text, h.ready, busy)

    def schedule_restart(self, name: str) -> float:
        """Restart the child after its backoff (now, after a healthy run); returns the delay."""
        child = self.children[name]
        delay = backoff_s(child.streak)
        child.restart_at = time.monotonic() + delay
        if delay:
            log.error("%s keeps dying (%d times in a row, last: %s): restarting it in %.1f s",
                      name, child.streak, child.last_exit, delay)
        return delay

    def restart_due(self) -> list[str]:
        """Spawn the children whose scheduled restart is due; their names."""
        now = time.monotonic()
        started = []
        for name, child in self.children.items():
            if child.restart_at is None or child.restart_at > now:
                continue
            child.restart_at = None
            child.ready_at = None
            try:
                handle = spawn_child(child.spec)
            except Exception as e:  # noqa: BLE001 - no process, no fd, no memory: a failed start, tried again
                child.failed_starts += 1
                child.streak += 1
                child.last_exit = f"could not be started: {type(e).__name__}: {e}"
                delay = self.schedule_restart(name)
                log.error("[start] %s %s; trying again in %.1f s", name, child.last_exit, delay)
                continue
            child.restarts += 1
            child.handle = handle
            log.warning("[start] %s restarted as pid=%d (restart %d)", name, child.handle.pid, child.restarts)
            started.append(name)
        return started

    def next_restart_in(self) -> float | None:
        """Seconds until the next scheduled restart (None when none is scheduled)."""
        due = [c.restart_at for c in self.children.values() if c.restart_at is not None]
        return max(0.0, min(due) - time.monotonic()) if due else None

    # ---- views
    def live(self, role: str | None = None) -> list[Child]:
        """Children with a running process (optionally of one role)."""
        return [c for c in self.children.values()
                if not c.handle.reaped and c.handle.proc.is_alive() and (role is None or c.spec.role == role)]

    def ready(self, role: str) -> list[Child]:
        """Children of ``role`` that sent READY and are alive."""
        return [c for c in self.live(role) if c.handle.ready]

    def all_ready(self) -> bool:
        """Whether every child is alive and READY."""
        return all(not c.handle.reaped and c.handle.ready for c in self.children.values())

    def degraded(self) -> list[Degraded]:
        """The roles with no READY process while one of their children keeps dying before READY."""
        out = []
        for role in ROLES:
            looping = [c for c in self.children.values() if c.spec.role == role and c.failed_starts >= CRASH_LOOP]
            if self.ready(role) or not looping:
                continue
            worst = max(looping, key=lambda c: c.failed_starts)
            wait = None if worst.restart_at is None else max(0.0, worst.restart_at - time.monotonic())
            retry = f"next restart in {wait:.1f} s" if wait is not None else "restarting it now"
            out.append(Degraded(role, f"no {role} process is running: {worst.spec.name} died {worst.failed_starts} "
                                      f"times in a row before READY (last: {worst.last_exit}); {retry}",
                                worst.down_since or time.time()))
        return out

    def rows(self) -> list[ProcessRow]:
        """One status row per child."""
        now = time.monotonic()
        return [ProcessRow(name=name, role=c.spec.role, pid=c.handle.pid,
                           device=c.spec.index if c.spec.role == "prover" else None,
                           alive=not c.handle.reaped and c.handle.proc.is_alive(), ready=c.handle.ready,
                           restarts=c.restarts, failed_starts=c.failed_starts, busy_task=c.busy, last_exit=c.last_exit,
                           restart_in_s=None if c.restart_at is None else max(0.0, c.restart_at - now),
                           info={k: v if isinstance(v, (str, int, float)) or v is None else str(v)
                                 for k, v in c.info.items()})
                for name, c in self.children.items()]

    def by_fd(self) -> dict[Any, tuple[str, str]]:
        """Waitable objects (pipes, sentinels) -> (child name, "conn" | "sentinel")."""
        table: dict[Any, tuple[str, str]] = {}
        for name, child in self.children.items():
            h = child.handle
            if h.reaped:
                continue
            if not h.conn.closed:
                table[h.conn] = (name, "conn")
            table[h.proc.sentinel] = (name, "sentinel")
        return table

    def broadcast(self, message: msg.ToChild, role: str | None = None) -> None:
        """Send one message to every live child (of ``role``)."""
        for child in self.live(role):
            child.handle.send(message)

    # ---- shutdown
    def stop_all(self, deadline_s: float = STOP_WAIT_S, only: Callable[[Child], bool] | None = None) -> None:
        """Stop message, wait up to ``deadline_s``, then terminate -> 5 s -> kill; ``only``: the children
        it selects, the others left running (the engine stops its children in two steps: :mod:`.engine`).
        No child is restarted after. A child still running after a wait shorter than ``STOP_WAIT_S`` (a
        stop without grace) was asked for no more than that: its SIGTERM is no warning.

        Whether a child still runs is read from its sentinel, never from ``is_alive()``: the
        engine's event thread reaps a child whose sentinel fires at the same moment, and the
        second ``waitpid`` of that pid fails as if the child were still running (a prover that
        takes a second to let go of its device then looked as if it ignored SIGTERM)."""
        for child in self.children.values():
            child.restart_at = None
        handles = [c.handle for c in self.children.values() if not c.handle.reaped and (only is None or only(c))]
        for h in handles:
            if h.ready:  # a child still starting reads no messages yet: it gets SIGTERM at once
                h.send(msg.Stop())
        running = _running([h for h in handles if h.ready], deadline_s)
        running += _running([h for h in handles if not h.ready], 0.0)
        for h in running:
            if h.ready:
                log.log(logging.WARNING if deadline_s >= STOP_WAIT_S else logging.INFO,
                        "[shutdown] %s pid=%d did not stop within %.1f s: SIGTERM", h.spec.name, h.pid, deadline_s)
            h.proc.terminate()
        for h in _running(running, TERM_WAIT_S):
            log.error("[shutdown] %s pid=%d ignored SIGTERM: SIGKILL", h.spec.name, h.pid)
            h.proc.kill()
            _running([h], TERM_WAIT_S)
        for h in handles:
            # reap: the sentinel fired, so this returns as soon as the exit status is there
            # (at once where the event thread reaped it first)
            h.proc.join(TERM_WAIT_S)

    def close_all(self) -> None:
        """Close the parent's pipe ends of every child (after the event thread has stopped)."""
        for child in self.children.values():
            child.handle.close()


def _running(handles: list[ChildHandle], timeout_s: float) -> list[ChildHandle]:
    """Wait up to ``timeout_s`` for the handles' processes to exit; those still running. A
    process has exited once its sentinel is readable, whoever reaps it."""
    end = time.monotonic() + timeout_s
    pending = {h.proc.sentinel: h for h in handles}
    while pending:
        left = end - time.monotonic()
        exited = set(mp_wait(list(pending), max(0.0, left)))
        pending = {s: h for s, h in pending.items() if s not in exited}
        if left <= 0:
            break
    return list(pending.values())
