"""The daemon's status document and scrape-time gauges, and the verification-key cache.

This module owns how the daemon *describes* itself: the JSON of GetStatus and GET /status
(jobs with per-partition states and timings, the engine's processes, ring slots, SRS entries
with their tier and bytes, memory, and where the ``[memory]`` budget goes) and the gauges
added to the metrics at each scrape. Job states come from the daemon's job table, refined with
the engine's live per-partition states while a job runs; everything about processes, slots,
keys and memory is the engine's own report, passed through unchanged (cuzk reported SRS sizes
as 0 and pinned memory as hard-coded zeros; here nothing is invented).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

from cuzk_mp import __version__
from cuzk_mp.daemon.budget import breakdown
from cuzk_mp.daemon.config import DaemonConfig
from cuzk_mp.daemon.metrics import DaemonMetrics, Labels
from cuzk_mp.daemon.scheduler.convert import TERMINAL, JobRecord
from cuzk_mp.daemon.scheduler.jobs import JobTable

MAX_FINISHED_IN_STATUS = 200
ENGINE_SECTIONS = ("processes", "ring", "srs", "memory")

Gauge = tuple[str, str, Mapping[Labels, float] | float]


def _engine_partitions(engine_status: Mapping[str, Any] | None) -> dict[str, list[Any]]:
    """job_id -> the engine's per-partition entries (accepts a list or a dict of jobs)."""
    jobs = (engine_status or {}).get("jobs") or []
    items = jobs.values() if isinstance(jobs, Mapping) else jobs
    out = {}
    for j in items:
        if isinstance(j, Mapping) and "job_id" in j:
            out[str(j["job_id"])] = list(j.get("partitions") or [])
    return out


def _as_list(section: Any) -> list[Mapping[str, Any]]:
    items = section.values() if isinstance(section, Mapping) else (section or [])
    return [x for x in items if isinstance(x, Mapping)]


class StatusView:
    """Builds the status document and gauges from the job table and the engine's reports."""

    def __init__(self, cfg: DaemonConfig, jobs: JobTable, metrics: DaemonMetrics,
                 started_at: float) -> None:
        self.cfg, self.jobs, self.metrics, self.started_at = cfg, jobs, metrics, started_at
        self.budget = breakdown(cfg.memory_total_bytes, cfg.safety_margin_bytes, cfg.engine,
                                cfg.circuits.values()).as_dict()
        self._vks: dict[str, dict[str, Any]] = {}
        self._vk_lock = threading.Lock()

    def _job(self, rec: JobRecord, live: list[Any] | None) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        for i in range(len(rec.partitions)):
            out = rec.results.get(i)
            entry: dict[str, Any] = {"index": i, "state": out.state if out else (
                "cancelled" if rec.state == "cancelled" else "pending")}
            if out is not None:
                entry.update(timings=out.timings, device=out.device, attempts=out.attempts,
                             error=out.error)
            elif live and i < len(live) and isinstance(live[i], Mapping):
                entry.update({k: v for k, v in live[i].items() if k != "index"})
            parts.append(entry)
        state = rec.state
        if state == "queued" and any(p["state"] not in ("pending", "queued") for p in parts):
            state = "running"  # the engine has started a partition; none has finished yet
        return {"job_id": rec.job_id, "request_id": rec.request_id, "circuit_id": rec.circuit_id,
                "state": state, "priority": rec.priority.name,
                "submitted_at": rec.submitted_at, "started_at": rec.started_at,
                "finished_at": rec.finished_at, "error": rec.error, "partitions": parts}

    def _job_list(self, engine_status: Mapping[str, Any] | None) -> list[dict[str, Any]]:
        live = _engine_partitions(engine_status)
        recs = list(self.jobs.jobs.values())
        running = [r for r in recs if r.state not in TERMINAL]
        finished = sorted((r for r in recs if r.state in TERMINAL),
                          key=lambda r: r.finished_at or 0.0)[-MAX_FINISHED_IN_STATUS:]
        return [self._job(r, live.get(r.job_id)) for r in running + finished]

    def document(self, state: str, engine_status: Mapping[str, Any] | None) -> dict[str, Any]:
        """The full status document (JSON-able)."""
        es = dict(engine_status or {})
        doc: dict[str, Any] = {
            "daemon": {
                "state": state, "pid": os.getpid(), "version": __version__,
                "uptime_s": time.time() - self.started_at, "listen": str(self.cfg.listen),
                "status_listen": str(self.cfg.status_listen) if self.cfg.status_listen else None,
                "config": str(self.cfg.path) if self.cfg.path else None,
                "journal": str(self.cfg.journal_path), "result_ttl_s": self.cfg.result_ttl_s,
                "circuits": {cid: {"priority": cc.priority.name,
                                   "partitions": cc.spec.partitions,
                                   "synthetic": cc.spec.synthetic, "log_n": cc.spec.log_n,
                                   "zkey": str(cc.spec.zkey) if cc.spec.zkey else None}
                             for cid, cc in self.cfg.circuits.items()},
            },
            "job_counts": self.jobs.counts(),
            "queue_depth": self.queue_depth(),
            "jobs": self._job_list(es),
            "memory_budget": dict(self.budget),
        }
        for key in ENGINE_SECTIONS:
            doc[key] = es.pop(key, None)
        es.pop("jobs", None)
        doc["engine"] = es
        return doc

    def queue_depth(self) -> int:
        """Partitions accepted and not yet finished (queued, synthesizing, waiting or proving)."""
        return sum(len(r.partitions) - len(r.results) for r in self.jobs.jobs.values()
                   if r.state not in TERMINAL)

    def gauges(self, engine_status: Mapping[str, Any]) -> list[Gauge]:
        """Scrape-time gauges: uptime, queue, jobs, ring, SRS, memory, processes."""
        out: list[Gauge] = [
            ("cuzk_uptime_seconds", "Seconds since the daemon started.",
             time.time() - self.started_at),
            ("cuzk_queue_depth", "Partitions accepted and not yet finished.",
             float(self.queue_depth())),
            ("cuzk_jobs", "Jobs in the job table by state.",
             {(("state", s),): float(n) for s, n in self.jobs.counts().items()}),
            ("cuzk_srs_budget_bytes", "Bytes of proving keys allowed to stay resident.",
             float(self.budget["srs"])),
        ]
        out.extend(self._ring_gauges(engine_status.get("ring")))
        out.append(("cuzk_srs_bytes",
                    "Resident proving-key bytes by circuit, prover process and tier.",
                    {(("circuit", str(e.get("circuit", "?"))),
                      ("process", str(e.get("process", "?"))),
                      ("tier", str(e.get("tier", "?")))): float(e.get("bytes") or 0)
                     for e in _as_list(engine_status.get("srs"))}))
        mem = engine_status.get("memory") or {}
        out.append(("cuzk_memory_bytes", "Host memory reported by the engine, by kind "
                    "(process tree RSS, live shm).",
                    {(("kind", k),): float(v) for k, v in mem.items()
                     if k.endswith("_bytes") and isinstance(v, (int, float))}))
        procs: dict[Labels, float] = {}
        for p in _as_list(engine_status.get("processes")):
            key = (("role", str(p.get("role", "?"))),)
            procs[key] = procs.get(key, 0.0) + (1.0 if p.get("alive") else 0.0)
        out.append(("cuzk_processes_alive", "Live engine processes by role.", procs))
        return out

    @staticmethod
    def _ring_gauges(ring: Any) -> Iterable[Gauge]:
        slots = _as_list(ring.get("slots") if isinstance(ring, Mapping) else ring)
        by_state: dict[Labels, float] = {}
        for s in slots:
            key = (("state", str(s.get("state", "?"))),)
            by_state[key] = by_state.get(key, 0.0) + 1.0
        busy = sum(v for k, v in by_state.items() if k[0][1] not in ("free", "FREE"))
        yield ("cuzk_ring_slots", "Ring slots by state.", by_state)
        yield ("cuzk_ring_occupancy", "Fraction of ring slots not free.",
               busy / len(slots) if slots else 0.0)

    def verification_key(self, circuit_id: str) -> dict[str, Any]:
        """The circuit's snarkjs verification key JSON (made once, then cached)."""
        with self._vk_lock:
            if circuit_id not in self._vks:
                self._vks[circuit_id] = self._make_vk(circuit_id)
            return self._vks[circuit_id]

    def _make_vk(self, circuit_id: str) -> dict[str, Any]:
        from cuzk_mp.formats.snarkjs_json import vk_to_json
        from cuzk_mp.formats.zkey import read_zkey
        from cuzk_mp.groth16.keys import vk_from_zkey
        from cuzk_mp.pipeline.keys import ensure_synthetic_key

        spec = self.cfg.circuits[circuit_id].spec
        zkey_path = spec.zkey
        if zkey_path is None:
            assert spec.synthetic is not None and spec.log_n is not None
            zkey_path, _ = ensure_synthetic_key(spec.synthetic, spec.log_n, self.cfg.param_cache,
                                                self.cfg.engine.backend)
        zkey = read_zkey(zkey_path)
        try:
            return vk_to_json(vk_from_zkey(zkey))
        finally:
            zkey.close()
