"""How the fleet describes itself: the ``cuzk-mp fleet status`` document and text, /metrics families.

This module owns the presentation of :meth:`Fleet.boxes`, :meth:`Fleet.queue_depths` and (for
``fleet status``) :meth:`Fleet.retrying`: a JSON-able document (for ``--json`` and the daemon's
/status), a fixed-width text table for people, and the scrape-time gauges and counters in the
shape the daemon's metrics renderer takes (``(name, help, {labels: value})``, labels as sorted
``(key, value)`` pairs). It reads nothing itself.

Gauges (all prefixed ``cuzk_fleet_``): ``boxes{state}``, ``box_up{box}``,
``box_heartbeat_age_seconds{box}``, ``box_free_slots{box}``, ``box_running_jobs{box}``,
``box_resident_key{box,circuit}`` (1 per resident key), ``box_paused{box}`` (1 while a box claims
nothing because its shared inputs folder is broken there), ``queue_jobs{circuit,priority,state}``
(state: queued, running, stalled). Counter: ``job_failures_total{box,circuit,kind}``, the runs of
fleet jobs that failed on this box, by the error's kind (:func:`failures`: each box counts its own
runs; a box whose claim lapsed counts nothing, the job's ``failed_on`` names it).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

from cuzk_mp.daemon.fleet.models import BoxInfo, JobStatus, QueueDepth

Labels = tuple[tuple[str, str], ...]
Gauge = tuple[str, str, Mapping[Labels, float] | float]
BOX_STATES = ("up", "stale", "left")
ERROR_SHOWN = 120  # characters of a retried job's last error in the text table


def _labels(**kv: object) -> Labels:
    return tuple(sorted((k, str(v)) for k, v in kv.items()))


def document(boxes: Sequence[BoxInfo], depths: Sequence[QueueDepth],
             retrying: Sequence[JobStatus] | None = None) -> dict[str, Any]:
    """The fleet as JSON-able data: boxes (with their keys) and queue depths, and where given the
    unfinished jobs that failed on a box (``retrying``: the boxes, the last error)."""
    doc = {
        "boxes": [{"box": b.box, "state": b.state, "host": b.host, "pid": b.pid, "resident": list(b.resident),
                   "free_slots": b.free_slots, "running": b.running,
                   "heartbeat_age_s": round(b.heartbeat_age_s, 3), "paused": b.paused, "loading": list(b.loading),
                   "loading_s": b.loading_s, "load_limit_s": b.load_limit_s, "load_overdue": b.load_overdue,
                   "started_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(b.started_at))}
                  for b in boxes],
        "queues": [{"circuit": d.circuit_id, "priority": d.priority.name, "queued": d.queued,
                    "running": d.running, "stalled": d.stalled} for d in depths],
    }
    if retrying is not None:
        doc["retrying"] = [{"job_id": j.job_id, "circuit": j.circuit_id, "state": j.state, "attempts": j.attempts,
                            "failed_on": list(j.failed_on), "error_kind": j.error_kind, "error": j.error}
                           for j in retrying]
    return doc


def text(boxes: Sequence[BoxInfo], depths: Sequence[QueueDepth], retrying: Sequence[JobStatus] = ()) -> str:
    """A table for people: one line per box, then one per circuit and priority, then one per job of
    ``retrying`` (where any)."""
    lines = [f"{'BOX':<20} {'STATE':<6} {'HOST':<16} {'RUNNING':>7} {'FREE':>5} {'HEARTBEAT':>10}  KEYS"]
    for b in boxes:
        overdue = f", {b.loading_s:.0f} s, past its {b.load_limit_s:.0f} s limit" if b.load_overdue else ""
        loading = f" (loading {', '.join(b.loading)}{overdue})" if b.loading else ""
        lines.append(f"{b.box:<20} {b.state:<6} {b.host[:16]:<16} {b.running:>7} {b.free_slots:>5} "
                     f"{b.heartbeat_age_s:>9.1f}s  {', '.join(b.resident) or '-'}{loading}")
        if b.paused and b.state == "up":
            lines.append(f"{'':<20} claims no jobs: {b.paused}")
    if not boxes:
        lines.append("(no box has joined)")
    lines.append("")
    lines.append(f"{'CIRCUIT':<24} {'PRIORITY':<9} {'QUEUED':>7} {'RUNNING':>8} {'STALLED':>8}")
    for d in depths:
        lines.append(f"{d.circuit_id:<24} {d.priority.name:<9} {d.queued:>7} {d.running:>8} {d.stalled:>8}")
    if not depths:
        lines.append("(no queued or running jobs)")
    if retrying:
        lines.append("")
        lines.append(f"{'RETRIED JOB':<36} {'CIRCUIT':<24} {'STATE':<8} {'ATTEMPTS':>8}  FAILED ON: LAST ERROR")
        for j in retrying:
            error = " ".join(f"{j.error_kind or 'error'}: {j.error or ''}".split())
            lines.append(f"{j.job_id:<36} {j.circuit_id:<24} {j.state:<8} {j.attempts:>8}  "
                         f"{', '.join(j.failed_on)}: {error[:ERROR_SHOWN]}")
    return "\n".join(lines) + "\n"


def gauges(boxes: Sequence[BoxInfo], depths: Sequence[QueueDepth]) -> list[Gauge]:
    """Scrape-time gauges for the daemon's /metrics."""
    per_state: dict[Labels, float] = {_labels(state=s): 0.0 for s in BOX_STATES}
    for b in boxes:
        per_state[_labels(state=b.state)] += 1
    resident = {_labels(box=b.box, circuit=c): 1.0 for b in boxes if b.state == "up" for c in b.resident}
    queue: dict[Labels, float] = {}
    for d in depths:
        for state, n in (("queued", d.queued), ("running", d.running), ("stalled", d.stalled)):
            queue[_labels(circuit=d.circuit_id, priority=d.priority.name, state=state)] = float(n)
    return [
        ("cuzk_fleet_boxes", ("Boxes of the fleet by state (up, stale: no heartbeat within the stall "
                              "timeout, left)."), per_state),
        ("cuzk_fleet_box_up", "1 if the box renewed its heartbeat within the stall timeout.",
         {_labels(box=b.box): float(b.state == "up") for b in boxes}),
        ("cuzk_fleet_box_heartbeat_age_seconds", "Seconds since the box's last heartbeat.",
         {_labels(box=b.box): b.heartbeat_age_s for b in boxes}),
        ("cuzk_fleet_box_free_slots", "Free job slots the box reported at its last heartbeat.",
         {_labels(box=b.box): float(b.free_slots) for b in boxes}),
        ("cuzk_fleet_box_running_jobs", "Jobs the box holds a claim on.",
         {_labels(box=b.box): float(b.running) for b in boxes}),
        ("cuzk_fleet_box_resident_key", "1 for each circuit whose key a live box holds resident.", resident),
        ("cuzk_fleet_box_paused", "1 while a live box claims no jobs because its shared inputs folder is broken.",
         {_labels(box=b.box): float(bool(b.paused)) for b in boxes if b.state == "up"}),
        ("cuzk_fleet_queue_jobs", ("Jobs of the shared queue by circuit, priority and state "
                                   "(stalled: claimed by a box that stopped renewing it)."), queue),
    ]


def failures(box: str, counts: Mapping[tuple[str, str], int]) -> Gauge:
    """The counter family of this box's failed runs of fleet jobs, from ``counts`` by (circuit, error
    kind) (:attr:`.worker.FleetWorker.failures`)."""
    return ("cuzk_fleet_job_failures", ("Runs of fleet jobs that failed on this box, by circuit and error kind "
                                        "(each box counts its own runs)."),
            {_labels(box=box, circuit=c, kind=k): float(n) for (c, k), n in sorted(counts.items())})
