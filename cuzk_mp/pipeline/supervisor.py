"""The engine's child processes: which ones exist, their start-up, restarts and shutdown.

Owns the :class:`~cuzk_mp.pipeline.procs.ChildHandle` of every synthesis
worker (``cuzk-synth-<i>``) and prover process (``cuzk-gpu-<dev>``), their
restart counters and which synthesis worker holds which task. It starts and
stops processes; what a death *means* for jobs is the engine's business.

Environment per child, set in the child before any heavy import:

* prover, GPU backend: ``CUDA_VISIBLE_DEVICES=<dev>`` (binds the process to
  its GPU; it sees it as device 0);
* prover, CPU backend: ``NUMBA_NUM_THREADS = cores // processes`` and no GPU;
* synthesis worker: ``NUMBA_NUM_THREADS = synthesis_threads``.

Shutdown (:meth:`Supervisor.stop_all`): ``Stop`` message, a short wait,
then SIGTERM -> 5 s -> SIGKILL for whatever is still alive.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass, field

from .procs import ChildHandle, ChildSpec, spawn_child
from .prover_proc import ProverPayload
from .ring import RingHandle
from .synth import SynthPayload
from . import messages as msg
from .types import EngineConfig

log = logging.getLogger("cuzk_mp.pipeline.supervisor")
MAX_FAILED_STARTS = 3  # consecutive deaths before READY, then the supervisor gives up on that child
TERM_WAIT_S = 5.0


@dataclass
class ChildSlot:
    """One logical child (survives restarts): its spec, current handle and counters."""

    spec: ChildSpec
    handle: ChildHandle | None = None
    restarts: int = 0
    failed_starts: int = 0
    given_up: bool = False
    busy: int | None = None  # synthesis worker: the task id in hand
    last_exit: str | None = None
    info: dict[str, object] = field(default_factory=dict)


def child_specs(config: EngineConfig, ring: RingHandle, backend: str, devices: list[int]) -> list[ChildSpec]:
    """The specs of every child the engine runs, provers first."""
    cpu_threads = max(1, (os.cpu_count() or 1) // len(devices))
    # children log at the engine's level unless CUZK_MP_LOG_LEVEL says otherwise
    level = os.environ.get("CUZK_MP_LOG_LEVEL") or logging.getLevelName(logging.getLogger().getEffectiveLevel())
    specs = []
    for dev in devices:
        env = {"CUDA_VISIBLE_DEVICES": str(dev)} if backend == "gpu" else {
            "NUMBA_NUM_THREADS": str(cpu_threads), "CUDA_VISIBLE_DEVICES": ""}
        payload = ProverPayload(ring, backend, dev, config.gpu_workers_per_device, config.verify_proofs,
                                config.srs_budget_bytes)
        specs.append(ChildSpec("gpu", dev, "cuzk_mp.pipeline.prover_proc", {**env, "CUZK_MP_LOG_LEVEL": level}, payload,
                               ring.prefix))
    for i in range(config.partition_workers):
        env = {"NUMBA_NUM_THREADS": str(config.synthesis_threads), "CUDA_VISIBLE_DEVICES": ""}
        specs.append(ChildSpec("synth", i, "cuzk_mp.pipeline.synth", {**env, "CUZK_MP_LOG_LEVEL": level},
                               SynthPayload(ring), ring.prefix))
    return specs


class Supervisor:
    """Starts, restarts and stops the engine's children."""

    def __init__(self, specs: list[ChildSpec]) -> None:
        self.slots: dict[str, ChildSlot] = {s.name: ChildSlot(s) for s in specs}

    def spawn_all(self) -> None:
        """Start every child (no READY wait: READY arrives as a message)."""
        for slot in self.slots.values():
            slot.handle = spawn_child(slot.spec)
            log.info("[start] %s pid=%d", slot.spec.name, slot.handle.pid)

    def respawn(self, name: str) -> bool:
        """Start a replacement for a dead child; False if it failed to start too often."""
        slot = self.slots[name]
        if slot.failed_starts >= MAX_FAILED_STARTS:
            if not slot.given_up:
                log.error("%s died %d times before READY; not restarting it (last: %s)",
                          name, slot.failed_starts, slot.last_exit)
            slot.given_up = True
            return False
        slot.restarts += 1
        slot.busy = None
        slot.handle = spawn_child(slot.spec)
        log.warning("[start] %s restarted as pid=%d (restart %d)", name, slot.handle.pid, slot.restarts)
        return True

    def live(self, role: str | None = None) -> list[ChildSlot]:
        """Children with a running process (optionally of one role)."""
        return [s for s in self.slots.values()
                if s.handle is not None and s.handle.proc.is_alive() and (role is None or s.spec.role == role)]

    def ready(self, role: str) -> list[ChildSlot]:
        """Children of ``role`` that sent READY and are alive."""
        return [s for s in self.live(role) if s.handle is not None and s.handle.ready]

    def usable(self, role: str) -> bool:
        """True while at least one child of ``role`` is alive or can still be restarted."""
        return any(not s.given_up for s in self.slots.values() if s.spec.role == role)

    def by_fd(self) -> dict[object, tuple[str, str]]:
        """Waitable objects -> (child name, "conn" | "sentinel")."""
        table: dict[object, tuple[str, str]] = {}
        for name, slot in self.slots.items():
            h = slot.handle
            if h is None or h.reaped:
                continue
            if not h.conn.closed:
                table[h.conn] = (name, "conn")
            table[h.proc.sentinel] = (name, "sentinel")
        return table

    def broadcast(self, message: msg.ToChild, role: str | None = None) -> None:
        """Send one message to every live child (of ``role``)."""
        for slot in self.live(role):
            slot.handle.send(message)  # type: ignore[union-attr]

    def stop_all(self, deadline_s: float = 10.0) -> None:
        """Stop message, wait up to ``deadline_s``, then terminate -> 5 s -> kill."""
        handles = [s.handle for s in self.slots.values() if s.handle is not None]
        for h in handles:
            if h.ready:  # a child still starting reads no messages yet: it gets SIGTERM at once
                h.send(msg.Stop())
        _join_all([h for h in handles if h.ready], deadline_s)
        alive = [h for h in handles if h.proc.is_alive()]
        for h in alive:
            if h.ready:
                log.warning("[shutdown] %s pid=%d did not stop: SIGTERM", h.spec.name, h.pid)
            h.proc.terminate()
        _join_all(alive, TERM_WAIT_S)
        for h in alive:
            if h.proc.is_alive():
                log.error("[shutdown] %s pid=%d ignored SIGTERM: SIGKILL", h.spec.name, h.pid)
                h.proc.kill()
                h.proc.join(TERM_WAIT_S)

    def close_all(self) -> None:
        """Close the parent's pipe ends of every child (after the event thread has stopped)."""
        for slot in self.slots.values():
            if slot.handle is not None:
                slot.handle.close()


def _join_all(handles: list[ChildHandle], timeout_s: float) -> None:
    end = time.monotonic() + timeout_s
    for h in handles:
        h.proc.join(max(0.0, end - time.monotonic()))
