"""JSON-able views of a running engine: ``Engine.status()`` and ``Engine.metrics()``.

Owns nothing: pure functions over the engine's state, called with its lock held.

status() schema::

    {"state", "prefix", "backend", "devices", "queue": {"pending", "in_flight"},
     "jobs": [{"job_id", "circuit_id", "state", "priority", "submitted_at", "started_at", "finished_at",
               "error", "partitions": [{"index", "state", "attempts", "device", "timings", "error"}]}],
     "processes": [{"name", "role", "pid", "device", "alive", "ready", "restarts", "busy_task", "last_exit",
                    "info": what the child said in READY (backend, device_name, ...)}],
     "ring": {"slots": [{"slot", "state", "owner_pid", "job", "partition", "bytes"}], "stats": {...}},
     "srs": [{"circuit", "process", "tier": "device" | "host" | "disk", "bytes", "error"}],
     "memory": {"host_rss_bytes", "shm_bytes", "live_segments", "device": {process: {...}}}}

Partition states: pending, synthesizing, ready (in a ring slot), proving, done, failed, cancelled.
Jobs listed: every unfinished job and the last finished ones (scheduler.KEEP_FINISHED).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

from .monitor import Histogram, tree_rss_bytes
from .ring import live_segments, shm_bytes
from .scheduler import Job

if TYPE_CHECKING:
    from .engine import Engine


def _partition_rows(job: Job) -> list[dict[str, Any]]:
    rows = []
    for index, result in enumerate(job.results):
        task = job.current.get(index)
        if result is not None:
            state = "done" if result.proof is not None else ("cancelled" if result.error_kind == "Cancelled"
                                                             else "failed")
            rows.append({"index": index, "state": state, "attempts": result.attempts, "device": result.device,
                         "timings": result.timings, "error": result.error})
            continue
        state = "pending" if task is None or task.state == "queued" else task.state
        rows.append({"index": index, "state": state, "attempts": job.attempts[index],
                     "device": task.device if task else None, "timings": {}, "error": None})
    return rows


def _job_row(job: Job) -> dict[str, Any]:
    return {"job_id": job.spec.job_id, "circuit_id": job.spec.circuit_id, "state": job.state,
            "priority": job.spec.priority.name if hasattr(job.spec.priority, "name") else job.spec.priority,
            "submitted_at": job.submitted_at, "started_at": job.started_at, "finished_at": job.finished_at,
            "error": job.error, "partitions": _partition_rows(job)}


def _process_rows(engine: Engine) -> list[dict[str, Any]]:
    if engine.sup is None:
        return []
    rows = []
    for name, slot in engine.sup.slots.items():
        h = slot.handle
        rows.append({"name": name, "role": slot.spec.role, "pid": h.pid if h else None,
                     "device": slot.spec.index if slot.spec.role == "gpu" else None,
                     "alive": bool(h and h.proc.is_alive()), "ready": bool(h and h.ready),
                     "restarts": slot.restarts, "busy_task": slot.busy, "last_exit": slot.last_exit,
                     "info": dict(h.info) if h else {}})
    return rows


def _ring_view(engine: Engine) -> dict[str, Any]:
    if engine.ring is None or engine.state in ("stopped", "failed"):
        return {"slots": [], "stats": {}}
    slots = [{"slot": r.slot, "state": r.state, "owner_pid": r.owner_pid or None,
              "job": r.job_seq or None, "task": r.task_id or None, "partition": r.partition if r.state != "free" else None,
              "bytes": r.nbytes} for r in engine.ring.snapshot()]
    job_ids = {j.seq: j.spec.job_id for j in engine.sched.jobs.values()}
    for s in slots:
        s["job"] = job_ids.get(s["job"], s["job"]) if s["state"] != "free" else None
    return {"slots": slots, "stats": engine.ring.stats()}


def _srs_rows(engine: Engine) -> list[dict[str, Any]]:
    """Resident keys per prover process; registered circuits resident nowhere are tier "disk"."""
    rows = [{"circuit": cid, "process": proc, "tier": ks.tier, "bytes": ks.nbytes, "error": ks.error}
            for (cid, proc), ks in sorted(engine.srs.items())]
    resident = {cid for cid, _ in engine.srs}
    for cid, ref in sorted(engine._refs.items()):
        if cid not in resident:
            size = os.path.getsize(ref.zkey) if os.path.exists(ref.zkey) else 0
            rows.append({"circuit": cid, "process": None, "tier": "disk", "bytes": size, "error": None})
    return rows


def engine_status(engine: Engine) -> dict[str, Any]:
    """The status snapshot (schema in the module docstring)."""
    jobs = [_job_row(j) for j in engine.sched.jobs.values()] + [_job_row(j) for j in engine.sched.finished]
    device = {name: dict(stats) for name, stats in engine.child_stats.items()}
    return {
        "state": engine.state, "prefix": engine.prefix, "backend": engine.backend, "devices": engine.devices,
        "queue": {"pending": engine.sched.pending(), "in_flight": len(engine.sched.in_flight())},
        "jobs": jobs,
        "processes": _process_rows(engine),
        "ring": _ring_view(engine),
        "srs": _srs_rows(engine),
        "memory": {"host_rss_bytes": tree_rss_bytes(), "shm_bytes": shm_bytes(engine.prefix),
                   "live_segments": live_segments(engine.prefix), "device": device},
    }


def engine_metrics(engine: Engine) -> dict[str, Any]:
    """``{"counters", "gauges", "per_process": {process: {busy_seconds, device_*}},
    "histograms": {"stage_seconds": {stage: Histogram.to_dict()}}}``."""
    counters: dict[str, float] = dict(engine.sched.counters)
    gauges: dict[str, float] = {"queue_pending": engine.sched.pending(),
                                "partitions_in_flight": len(engine.sched.in_flight()),
                                "jobs_active": len(engine.sched.jobs)}
    if engine.sup is not None:
        for role in ("synth", "gpu"):
            counters[f"process_restarts_{role}"] = sum(s.restarts for s in engine.sup.slots.values()
                                                       if s.spec.role == role)
            gauges[f"processes_alive_{role}"] = len(engine.sup.live(role))
    if engine.ring is not None and engine.state not in ("stopped", "failed"):
        stats = engine.ring.stats()
        for key in ("free_waits", "ready_waits", "published", "released", "reclaimed"):
            counters[f"ring_{key}"] = stats[key]
        gauges["ring_live_slots"], gauges["ring_peak_live_slots"] = stats["live"], stats["peak_live"]
        gauges["shm_bytes"] = shm_bytes(engine.prefix)
    gauges["host_rss_bytes"] = tree_rss_bytes()
    per_process = {name: dict(stats) for name, stats in engine.child_stats.items()}
    hists = {stage: h.to_dict() for stage, h in engine.stage_hist.items() if isinstance(h, Histogram)}
    return {"counters": counters, "gauges": gauges, "per_process": per_process,
            "histograms": {"stage_seconds": hists}}
