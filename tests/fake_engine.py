"""An in-process double of the engine for the daemon's tests, and a daemon around it.

:class:`FakeEngine` honours the engine contract's observable behaviour (docs/engine.md): it is
configured, then ``start()`` returns the running engine; one queue ordered by (priority, submit
order, partition index); the engine's own input validation at submit; callbacks from its own
thread; cancel; evict refused while in use; a typed status and typed metrics. Its "proofs" are the
generator points. ``degraded`` can be set to play an engine whose prover keeps dying.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from cuzk_mp.algebra.field import G1_GEN, G2_GEN
from cuzk_mp.daemon import config as C
from cuzk_mp.daemon.server import Daemon
from cuzk_mp.errors import InputError
from cuzk_mp.formats.snarkjs_json import Proof, proof_to_json
from cuzk_mp.pipeline.circuits import KeyRow, check_job
from cuzk_mp.pipeline.messages import CircuitRef
from cuzk_mp.pipeline.monitor import ProcessMemory
from cuzk_mp.pipeline.ring import RingStats, SlotRecord
from cuzk_mp.pipeline.scheduler import JobRow, PartitionRow, QueueStatus, SchedulerCounters
from cuzk_mp.pipeline.status import EngineMetrics, EngineStatus, MemoryStatus, RingStatus
from cuzk_mp.pipeline.supervisor import Degraded, ProcessRow
from cuzk_mp.pipeline.types import CircuitSpec, JobResult, JobSpec, PartitionResult

PROOF = proof_to_json(Proof(G1_GEN, G2_GEN, G1_GEN))


class FakeEngine:
    """Test double of cuzk_mp.pipeline.engine.Engine and RunningEngine (see module docstring)."""

    def __init__(self, config: Any, on_job_done: Callable[[JobResult], None],
                 on_partition_done: Callable[[str, PartitionResult], None]) -> None:
        self.on_job_done, self.on_partition_done = on_job_done, on_partition_done
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Condition()
        self.queue: list[tuple[int, int, int, str]] = []
        self.jobs: dict[str, dict[str, Any]] = {}
        self.refs: dict[str, CircuitRef] = {}
        self.seq = itertools.count()
        self.proved: list[tuple[str, int]] = []
        self.preloaded: set[str] = set()
        self.submitted: list[str] = []
        self.degraded_roles: list[Degraded] = []
        self.stopping = False
        self.live: dict[tuple[str, int], str] = {}  # (job, partition) -> the state status reports (else queued)
        self.fail_with: str | None = None  # an InputError text every partition fails with (else proved)
        self.thread = threading.Thread(target=self._run, name="fake-engine", daemon=True)

    def start(self) -> FakeEngine:
        self.thread.start()
        return self

    def register_circuit(self, spec: CircuitSpec) -> None:
        self.refs[spec.circuit_id] = CircuitRef(spec.circuit_id, str(spec.zkey or ""), str(spec.r1cs or ""),
                                                str(spec.wasm) if spec.wasm else None, spec.synthetic, spec.log_n)

    def preload(self, circuit_id: str) -> None:
        self.preloaded.add(circuit_id)

    def evict(self, circuit_id: str) -> bool:
        with self.lock:
            if any(j["spec"].circuit_id == circuit_id and not j["done"]
                   for j in self.jobs.values()):
                return False
        self.preloaded.discard(circuit_id)
        return True

    def submit(self, job: JobSpec) -> None:
        ref = self.refs.get(job.circuit_id)
        if ref is None:
            raise InputError(f"unknown circuit {job.circuit_id!r}")
        check_job(job, ref)  # the engine's one validation
        with self.lock:
            seq = next(self.seq)
            self.jobs[job.job_id] = {"spec": job, "results": {}, "done": False,
                                     "submitted_at": time.time()}
            self.submitted.append(job.job_id)
            for i in range(len(job.partitions)):
                heapq.heappush(self.queue, (int(job.priority), seq, i, job.job_id))
            self.lock.notify_all()

    def cancel(self, job_id: str) -> bool:
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None or job["done"]:
                return False
            self.queue = [q for q in self.queue if q[3] != job_id]
            heapq.heapify(self.queue)
            self._finish(job_id, "cancelled")
            return True

    def degraded(self) -> list[Degraded]:
        return list(self.degraded_roles)

    def status(self) -> EngineStatus:
        with self.lock:
            jobs = [JobRow(j, v["spec"].circuit_id, "queued", v["spec"].priority.name, v["submitted_at"], None, None,
                           None, [PartitionRow(i, self.live.get((j, i), "queued"), 1, None, {}, None)
                                  for i in range(len(v["spec"].partitions))])
                    for j, v in self.jobs.items() if not v["done"]]
            srs = [KeyRow(c, "cuzk-prover-0", "host", 1000, None) for c in sorted(self.preloaded)]
        slots = [SlotRecord(i, state, 0, 0, 0, 0, 0, 0, 0.0) for i, state in enumerate(("free", "ready"))]
        me = ProcessMemory("engine", os.getpid(), 100, 50, 40, 123)
        return EngineStatus(
            state="running", prefix="fake", backend="cpu", devices=[0], degraded=list(self.degraded_roles),
            queue=QueueStatus(len(self.queue), 0), jobs=jobs,
            processes=[ProcessRow("cuzk-prover-0", "prover", os.getpid(), 0, True, True, 0, 0, None, None, None,
                                  {})],
            ring=RingStatus(slots, RingStats(1, 1, 0, 0, 0, 0, 0)), srs=srs,
            memory=MemoryStatus(host_bytes=100, host_pss_bytes=100, host_rss_bytes=123, shm_bytes=0,
                                live_segments=0, processes=[me], device={}))

    def metrics(self) -> EngineMetrics:
        counters = SchedulerCounters(len(self.submitted), {"done": 0, "failed": 0, "cancelled": 0},
                                     len(self.proved), 0, 0, 0)
        return EngineMetrics(state="running", counters=counters, queue=QueueStatus(len(self.queue), 0),
                             jobs_active=0, restarts={"prover": 0, "synth": 0}, alive={"prover": 1, "synth": 1},
                             degraded=list(self.degraded_roles), ring=RingStats(1, 1, 0, 0, 0, 0, 0),
                             shm_bytes=0, provers={})

    def stop(self, grace_s: float = 30.0) -> None:
        with self.lock:
            self.stopping = True
            for job_id, job in list(self.jobs.items()):
                if not job["done"]:
                    self._finish(job_id, "cancelled")
            self.lock.notify_all()
        self.gate.set()
        if self.thread.is_alive():
            self.thread.join(5)

    def _finish(self, job_id: str, state: str) -> None:
        job = self.jobs[job_id]
        job["done"] = True
        spec = job["spec"]
        parts = [job["results"].get(i) or PartitionResult(
            index=i, proof=None, public=[], timings={}, device=None, attempts=0,
            error="cancelled", error_kind="Cancelled") for i in range(len(spec.partitions))]
        failed = any(p.error and p.error_kind != "Cancelled" for p in parts)
        final = state if state != "done" else ("failed" if failed else "done")
        self.on_job_done(JobResult(job_id=job_id, circuit_id=spec.circuit_id, state=final,
                                   partitions=parts, error=None, submitted_at=job["submitted_at"],
                                   started_at=job["submitted_at"], finished_at=time.time()))

    def _run(self) -> None:
        while True:
            with self.lock:
                while (not self.queue or not self.gate.is_set()) and not self.stopping:
                    self.lock.wait(0.01)
                if self.stopping:
                    return
                _, _, index, job_id = heapq.heappop(self.queue)
                job = self.jobs[job_id]
                seed = job["spec"].partitions[index].seed
                r = PartitionResult(index=index, proof=PROOF, public=[index, seed],
                                    timings={"device": 0.01, "total": 0.02}, device=0, attempts=1)
                if self.fail_with is not None:
                    r = PartitionResult(index=index, proof=None, public=[], timings={}, device=0, attempts=1,
                                        error=self.fail_with, error_kind="InputError")
                job["results"][index] = r
                self.proved.append((job_id, index))
                self.on_partition_done(job_id, r)
                if len(job["results"]) == len(job["spec"].partitions):
                    self._finish(job_id, "done")


def make_config(tmp_path: Path, circuits: dict[str, Any] | None = None, **daemon: Any) -> C.DaemonConfig:
    """A daemon config in ``tmp_path`` with two synthetic circuits (a unix socket, 64 KiB frames);
    ``circuits``: more [circuits.ID] tables, ``daemon``: [daemon] keys."""
    raw = {
        "daemon": {"listen": f"unix://{tmp_path}/d.sock", "max_frame_bytes": "64KiB", **daemon},
        "srs": {"param_cache": str(tmp_path / "cache")},
        "memory": {"total_budget": "64GiB"},
        "circuits": {"syn": {"synthetic": "porep-like", "log_n": 10, "partitions": 2},
                     "crit": {"synthetic": "porep-like", "log_n": 10, "priority": "CRITICAL"},
                     **(circuits or {})},
    }
    return C.resolve(raw, base=tmp_path, source="test.toml")


def run_daemon(tmp_path: Path, body: Callable[[Daemon, str], Awaitable[None]],
               circuits: dict[str, Any] | None = None, engine: type[FakeEngine] | None = None,
               **daemon: Any) -> Daemon:
    """Start a Daemon with the FakeEngine (or ``engine``, a variant of it), run ``body(daemon, address)``,
    stop it (``circuits``: more [circuits.ID] tables, ``daemon``: [daemon] keys)."""
    cfg = make_config(tmp_path, circuits, **daemon)

    async def main() -> Daemon:
        d = Daemon(cfg, engine_factory=engine or FakeEngine)
        await d.start()
        try:
            await body(d, str(cfg.listen))
        finally:
            await d.stop()
        return d

    return asyncio.run(main())
