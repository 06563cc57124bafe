"""The daemon's status document and scrape-time figures, and the verification-key cache.

This module owns how the daemon *describes* itself: the JSON of GetStatus and GET /status
(jobs with per-partition states and timings, the engine's processes, ring slots, resident keys
with their tier and bytes, memory, whether the engine is degraded and why, and where the
``[memory]`` budget goes). Job states come from the daemon's job table, refined with the engine's
live per-partition states while a job runs; everything about processes, slots, keys and memory
is the engine's own typed report (:class:`~cuzk_mp.pipeline.status.EngineStatus`), passed through
as it is: nothing is parsed, guessed or invented here.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import msgspec

from cuzk_mp import __version__
from cuzk_mp.daemon.budget import breakdown, largest
from cuzk_mp.daemon.config import DaemonConfig
from cuzk_mp.errors import CuzkError, ResourceError
from cuzk_mp.groth16.circuit_data_file import FileIdentity
from cuzk_mp.daemon.job_records import JOB_STATES, TERMINAL, JobRecord, on_monotonic
from cuzk_mp.daemon.jobs import JobTable
from cuzk_mp.pipeline.scheduler import PartitionRow
from cuzk_mp.pipeline.status import EngineStatus

MAX_FINISHED_IN_STATUS = 200
VK_READS = 3  # reads of a verification key whose file changes under them before the call gives up


def _shown_state(state: str, partition_states: list[str]) -> str:
    """A job's state as status shows it: a queued job is running once the engine has started one
    of its partitions (the job table moves it when the first one finishes)."""
    if state == "queued" and any(p not in ("pending", "queued") for p in partition_states):
        return "running"
    return state


class StatusView:
    """Builds the status document from the job table and the engine's typed status."""

    def __init__(self, cfg: DaemonConfig, jobs: JobTable, started_at: float,
                 generated_vk: Callable[[str], bytes | None] | None = None) -> None:
        """``generated_vk(circuit_id)``: the verification key of a key the provers generate (no file to
        derive it from), making the key resident first if needed."""
        self.cfg, self.jobs, self.started_at = cfg, jobs, started_at
        self._started_mono = on_monotonic(started_at)  # the uptime's start: a wall-clock step moves it not
        self.generated_vk = generated_vk
        self.budget = {**breakdown(cfg.memory_total_bytes, cfg.safety_margin_bytes, cfg.engine,
                                   largest((c.spec for c in cfg.circuits.values()), cfg.engine.backend),
                                   cfg.queue_bytes).as_dict(),
                       "host_budget": cfg.host_budget_bytes}  # the status's memory_budget (and /metrics')
        self._vks: dict[str, tuple[FileIdentity | None, dict[str, Any]]] = {}  # circuit -> (key file identity, vk)
        self._vk_locks: dict[str, threading.Lock] = {}  # one a circuit: a key file on a dead mount holds its own
        self._vk_locks_lock = threading.Lock()

    def _job(self, rec: JobRecord, live: list[PartitionRow] | None) -> dict[str, Any]:
        parts: list[dict[str, Any]] = []
        for i in range(len(rec.partitions)):
            out = rec.results.get(i)
            entry: dict[str, Any] = {"index": i, "state": out.state if out else (
                "cancelled" if rec.state == "cancelled" else "pending")}
            if out is not None:
                entry.update(timings=out.timings, device=out.device, attempts=out.attempts,
                             error=out.error)
            elif live is not None and i < len(live):
                row = live[i]
                entry.update(state=row.state, attempts=row.attempts, device=row.device,
                             timings=row.timings, error=row.error)
            parts.append(entry)
        state = _shown_state(rec.state, [p["state"] for p in parts])
        return {"job_id": rec.job_id, "request_id": rec.request_id, "circuit_id": rec.circuit_id,
                "state": state, "priority": rec.priority.name,
                "submitted_at": rec.submitted_at, "started_at": rec.started_at,
                "finished_at": rec.finished_at, "error": rec.error, "partitions": parts}

    def job_counts(self, engine: EngineStatus | None, owner: str | None = None) -> dict[str, int]:
        """Jobs per state, as the job list shows them (a queued job whose first partition the
        engine has started counts as running): the status document's and the metric's figure;
        with ``owner``, that client's jobs alone (what a caller without an admin token sees)."""
        counts = {state: 0 for state in JOB_STATES}
        live = {j.job_id: j.partitions for j in engine.jobs} if engine is not None else {}
        for rec in self.jobs.jobs.values():
            if owner is not None and rec.owner != owner:
                continue
            rows = live.get(rec.job_id)
            counts[_shown_state(rec.state, [r.state for r in rows]) if rows else rec.state] += 1
        return counts

    def _job_list(self, engine: EngineStatus | None) -> list[dict[str, Any]]:
        live = {j.job_id: j.partitions for j in engine.jobs} if engine is not None else {}
        recs = list(self.jobs.jobs.values())
        running = [r for r in recs if r.state not in TERMINAL]
        finished = sorted((r for r in recs if r.state in TERMINAL),  # the last to end, whatever the clock did
                          key=lambda r: r.finished_mono or 0.0)[-MAX_FINISHED_IN_STATUS:]
        return [self._job(r, live.get(r.job_id)) for r in running + finished]

    def document(self, state: str, engine: EngineStatus | None) -> dict[str, Any]:
        """The full status document (JSON-able)."""
        doc: dict[str, Any] = {
            "daemon": {
                "state": state, "pid": os.getpid(), "version": __version__,
                "uptime_s": time.monotonic() - self._started_mono, "listen": str(self.cfg.listen),
                "status_listen": str(self.cfg.status_listen) if self.cfg.status_listen else None,
                "config": str(self.cfg.path) if self.cfg.path else None,
                "journal": str(self.cfg.journal_path), "result_ttl_s": self.cfg.result_ttl_s,
                "circuits": {cid: {"priority": cc.priority.name,
                                   "partitions": cc.spec.partitions,
                                   "synthetic": cc.spec.synthetic, "log_n": cc.spec.log_n,
                                   "zkey": str(cc.spec.zkey) if cc.spec.zkey else None}
                             for cid, cc in self.cfg.circuits.items()},
            },
            "job_counts": self.job_counts(engine),
            "queue_depth": self.queue_depth(),
            "queue": self.queue(),
            "storage_not_answering": self.jobs.storage.report(),  # a key file or the journal: submits refused
            "jobs": self._job_list(engine),
            "memory_budget": dict(self.budget),
            "pipeline": {"ring_slots": self.cfg.engine.ring_slots,
                         "partition_workers": self.cfg.engine.partition_workers,
                         "threads_per_partition": self.cfg.engine.threads_per_partition()},
        }
        if engine is None:
            doc.update(processes=None, ring=None, srs=None, memory=None, engine=None)
            return doc
        doc.update(processes=msgspec.to_builtins(engine.processes), ring=msgspec.to_builtins(engine.ring),
                   srs=msgspec.to_builtins(engine.srs), memory=msgspec.to_builtins(engine.memory),
                   engine={"state": engine.state, "prefix": engine.prefix, "backend": engine.backend,
                           "devices": engine.devices, "queue": msgspec.to_builtins(engine.queue),
                           "degraded": msgspec.to_builtins(engine.degraded)})
        return doc

    def queue(self, owner: str | None = None) -> dict[str, int]:
        """The unfinished jobs and the input bytes they hold, beside the caps that bound them
        (``[daemon] max_queued_jobs``, ``max_queued_input``, ``max_jobs_per_owner``; 0: no cap): why
        a submit is refused. With ``owner``, that client's figures (a tenant sees only its own)."""
        q = self.jobs.queued(owner)
        return {"jobs": q.jobs, "input_bytes": q.input_bytes, "max_queued_jobs": self.cfg.max_queued_jobs,
                "max_queued_input": self.cfg.max_queued_input_bytes,
                "max_jobs_per_owner": self.cfg.max_jobs_per_owner}

    def queue_depth(self) -> int:
        """Partitions accepted and not yet finished (queued, synthesizing, waiting or proving)."""
        return sum(len(r.partitions) - len(r.results) for r in self.jobs.jobs.values()
                   if r.state not in TERMINAL)

    def verification_key(self, circuit_id: str) -> tuple[dict[str, Any], str | None]:
        """The circuit's snarkjs verification key JSON, of its key file as it is now, and that file's
        :func:`~cuzk_mp.pipeline.circuits.key_digest` (None: no file): kept per file identity
        (:func:`cuzk_mp.pipeline.circuits.key_identity`; one header read per call), so a zkey replaced
        under its path is served from then on, as the jobs accepted from then on are proved with it
        (:func:`cuzk_mp.pipeline.circuits.pinned`). A file replaced while its vk is read is read again:
        the digest served is the one of the file the vk came from."""
        from cuzk_mp.pipeline.circuits import key_digest

        with self._vk_locks_lock:
            lock = self._vk_locks.setdefault(circuit_id, threading.Lock())
        with lock:
            ident = self._key_identity(circuit_id)
            have = self._vks.get(circuit_id)
            for _ in range(VK_READS):
                if have is not None and have[0] == ident:
                    break
                vk, read = self._make_vk(circuit_id), ident
                ident = self._key_identity(circuit_id)
                if ident == read:
                    have = self._vks[circuit_id] = (ident, vk)
                    break
            else:
                raise ResourceError(f"circuit {circuit_id}: its key file kept changing while its verification key "
                                    f"was read ({VK_READS} times); ask again once it is written")
            return have[1], key_digest(ident)

    def _key_identity(self, circuit_id: str) -> FileIdentity | None:
        """What tells the circuit's current key file from an earlier one (None: a generated key, no file),
        the identity the engine pins a job to (:func:`cuzk_mp.pipeline.circuits.pinned`)."""
        from cuzk_mp.pipeline.circuits import key_identity

        path = self._zkey_path(circuit_id, make=False)
        return None if path is None else key_identity(path)

    def _zkey_path(self, circuit_id: str, make: bool = True) -> Path | None:
        """The circuit's key file (:func:`~cuzk_mp.pipeline.keys.circuit_key_file`); a synthetic circuit's
        dev key, which the engine makes when the circuit is registered, is made again here if it is not
        whole (``make``: that builds the circuit; the identity read on every call makes it only where it
        is missing)."""
        from cuzk_mp.pipeline.keys import circuit_key_file, ensure_synthetic_key

        spec = self.cfg.circuits[circuit_id].spec
        path = circuit_key_file(spec, self.cfg.param_cache)
        if path is None or spec.synthetic is None or (not make and path.exists()):
            return path
        assert spec.log_n is not None
        return ensure_synthetic_key(spec.synthetic, spec.log_n, self.cfg.param_cache, self.cfg.engine.backend)[0]

    def _make_vk(self, circuit_id: str) -> dict[str, Any]:
        from cuzk_mp.formats.snarkjs_json import vk_to_json
        from cuzk_mp.formats.zkey import read_zkey
        from cuzk_mp.groth16.keys import vk_from_zkey

        zkey_path = self._zkey_path(circuit_id)
        if zkey_path is None:  # no key file: the provers generate the key and report its vk
            raw = self.generated_vk(circuit_id) if self.generated_vk is not None else None
            if raw is None:
                raise CuzkError(f"circuit {circuit_id}: the provers reported no verification key for its "
                                "generated key")
            return dict(json.loads(raw))
        zkey = read_zkey(zkey_path)
        try:
            return vk_to_json(vk_from_zkey(zkey))
        finally:
            zkey.close()
