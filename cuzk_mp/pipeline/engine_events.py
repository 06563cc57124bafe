"""What the engine's event thread does with each child message and each child death.

Owns no state of its own: these functions run on the ``cuzk-engine-events``
thread with the engine's lock held, and change the engine's scheduler,
supervisor records and key table. Kept apart from :mod:`.engine` so that the
public API and the event handling each stay readable.

Death handling order (kept consistent with :meth:`Ring.reclaim` and
:meth:`Scheduler.on_lost`): read the child's last messages, reclaim its ring
slots, work out which attempts it took with it, retry or fail those, then
restart the process.
"""

from __future__ import annotations

import logging
import signal
import time
from typing import TYPE_CHECKING

from . import messages as msg
from .monitor import Histogram

if TYPE_CHECKING:
    from .engine import Engine
    from .supervisor import ChildSlot

log = logging.getLogger("cuzk_mp.pipeline.engine")


def handle_message(engine: Engine, name: str, m: msg.FromChild) -> None:
    """Apply one child message to the engine's state."""
    slot = engine.sup.slots[name]  # type: ignore[union-attr]
    if isinstance(m, msg.Ready):
        slot.handle.ready, slot.handle.info = True, dict(m.info)  # type: ignore[union-attr]
        slot.failed_starts = 0
        log.info("[start] %s pid=%d READY %s", name, m.pid, m.info)
    elif isinstance(m, msg.Published):
        engine.sched.on_published(m.task_id, m.slot)
        _idle(slot, m.task_id)
    elif isinstance(m, msg.Taken):
        engine.sched.on_taken(m.task_id, name, slot.spec.index)
    elif isinstance(m, msg.ProofDone):
        _on_proof(engine, slot, m)
    elif isinstance(m, msg.TaskFailed):
        _idle(slot, m.task_id)
        level = logging.INFO if m.kind == "Cancelled" else logging.WARNING
        log.log(level, "%s: task %d failed: %s: %s", name, m.task_id, m.kind, m.message)
        engine._apply(engine.sched.on_failed(m.task_id, m.kind, m.message))
    elif isinstance(m, msg.KeyState):
        if m.tier is None and m.error is None:
            engine.srs.pop((m.circuit_id, name), None)
        else:
            engine.srs[(m.circuit_id, name)] = m
    elif isinstance(m, msg.Stats):
        engine.child_stats.setdefault(name, {}).update(m.values)


def _idle(slot: ChildSlot, task_id: int) -> None:
    if slot.spec.role == "synth" and slot.busy == task_id:
        slot.busy = None


def _on_proof(engine: Engine, slot: ChildSlot, m: msg.ProofDone) -> None:
    from ..formats.snarkjs_json import proof_from_json

    proof = proof_from_json(m.proof, name=f"{slot.spec.name} proof of task {m.task_id}")
    for stage, seconds in m.timings.items():
        hist = engine.stage_hist.setdefault(stage, Histogram())
        hist.observe(seconds)  # type: ignore[attr-defined]
    engine.child_stats.setdefault(slot.spec.name, {}).update(m.stats)
    out = engine.sched.on_proof(m.task_id, proof, [int(x) for x in m.public], m.timings, slot.spec.index)
    engine._apply(out)


def describe_exit(code: int | None) -> str:
    """``exit code 3`` / ``killed by SIGKILL``."""
    if code is None:
        return "exit status unknown"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def handle_death(engine: Engine, name: str) -> None:
    """A child's sentinel fired: reclaim, retry its attempts, restart it."""
    sup, ring = engine.sup, engine.ring
    slot = sup.slots[name]  # type: ignore[union-attr]
    h = slot.handle
    if h is None or h.reaped:
        return
    engine._drain(name)
    h.proc.join(1.0)  # the sentinel fired: the process is gone, this reaps it
    h.reaped = True
    pid, exit_text = h.pid, describe_exit(h.proc.exitcode)
    h.close()
    slot.last_exit = exit_text
    stopping = engine.state in ("stopping", "stopped")
    reclaimed = ring.reclaim(pid) if ring is not None else []  # type: ignore[union-attr]
    if stopping:
        return
    log.error("%s pid=%d died (%s); reclaimed %d ring slot(s)", name, pid, exit_text, len(reclaimed))
    lost = _lost_tasks(engine, slot, [r.task_id for r in reclaimed])
    reason = f"{name} (pid {pid}) died ({exit_text})"
    engine._apply(engine.sched.on_lost(lost, reason))
    if not h.ready:
        slot.failed_starts += 1
        if engine.state == "starting":
            engine._start_error = f"{name} (pid {pid}) died before READY ({exit_text}); see its log above"
            return
    slot.busy = None
    if engine.state in ("running", "draining"):
        sup.respawn(name)  # type: ignore[union-attr]
    if not sup.usable(slot.spec.role):  # type: ignore[union-attr]
        role = "synthesis workers" if slot.spec.role == "synth" else "prover processes"
        engine._apply(engine.sched.fail_all(f"no {role} left: the last one, {reason}, failed to restart"))


def _lost_tasks(engine: Engine, slot: ChildSlot, reclaimed: list[int]) -> list[int]:
    """Attempts the dead child took with it: reclaimed slots, plus what it was working on."""
    lost = set(reclaimed)
    tasks = engine.sched.tasks
    if slot.spec.role == "synth" and slot.busy is not None:
        in_ring = {r.task_id: r for r in engine.ring.snapshot() if r.state in ("ready", "staging")}  # type: ignore[union-attr]
        task = tasks.get(slot.busy)
        if slot.busy in in_ring:  # published just before dying: the slot is good
            engine.sched.on_published(slot.busy, in_ring[slot.busy].slot)
        elif task is not None and task.state == "synthesizing":
            lost.add(slot.busy)
    if slot.spec.role == "gpu":
        lost |= {t.task_id for t in tasks.values() if t.state == "proving" and t.prover == slot.spec.name}
    return sorted(lost)


def check_start_timeouts(engine: Engine) -> None:
    """Kill children that did not send READY within ``start_timeout_s`` (their death is handled as usual)."""
    if engine.sup is None:
        return
    limit = engine.config.start_timeout_s
    for name, slot in engine.sup.slots.items():
        h = slot.handle
        if h is None or h.ready or h.reaped or not h.proc.is_alive() or time.monotonic() - h.started_at < limit:
            continue
        if slot.last_exit == "killed: no READY in time":
            continue  # SIGKILL sent already; its sentinel follows
        slot.last_exit = "killed: no READY in time"
        log.error("[start] %s pid=%d sent no READY within %.0f s: killing it", name, h.pid, limit)
        if engine.state == "starting":
            engine._start_error = f"{name} (pid {h.pid}) sent no READY within {limit} s"
        h.proc.kill()
