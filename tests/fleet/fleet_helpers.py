"""Helpers of the fleet tests: box processes whose events the test can wait for, inputs, fast knobs.

The queue library and psycopg are imported only inside the helpers that need them, so that the
test modules import without the ``fleet`` extra and skip (through the ``pg`` fixture) with a reason.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cuzk_mp.daemon.fleet.inputs import InputsRef, store_inputs

if TYPE_CHECKING:
    from cuzk_mp.daemon.fleet.queue import Fleet
    from cuzk_mp.daemon.fleet.worker import FleetWorker

BOX_SCRIPT = Path(__file__).with_name("box_process.py")
REPO = Path(__file__).resolve().parents[2]
# Fast renewals, and a stall timeout no busy CI machine reaches by accident: a box that is merely
# slow for a while must not lose its claims in tests that are not about stalls.
FAST = {"heartbeat_interval_s": 0.5, "stall_timeout_s": 30.0, "retry_delay_s": 0.0}
# For the tests about stalled boxes: claims lapse 3 s after the last renewal (6 heartbeats).
STALLING = {**FAST, "stall_timeout_s": 3.0}


async def connect(dsn: str, box: str, **knobs: Any) -> Fleet:
    """A Fleet for box ``box`` with the FAST knobs unless overridden."""
    from cuzk_mp.daemon.fleet.queue import Fleet
    return await Fleet.connect(dsn, box, **{**FAST, **knobs})


def worker(*args: Any, **kw: Any) -> FleetWorker:
    """A FleetWorker (imported here, with the queue library)."""
    from cuzk_mp.daemon.fleet.worker import FleetWorker
    return FleetWorker(*args, **kw)


def query_one(dsn: str, query: str) -> tuple[Any, ...]:
    """The first row of a query, on a connection of its own."""
    import psycopg
    with psycopg.connect(dsn) as conn:
        row = conn.execute(query).fetchone()  # type: ignore[arg-type]
    assert row is not None
    return tuple(row)


def instant_jobs(observe_job: Any = None, key_digest: str | None = None) -> tuple[Any, Any]:
    """(engine, JobTable): an engine that ends every job at once, done with one partition (public
    signal 7), stamped with ``time.time()`` as the engine does (a test that moves this box's clock
    moves its stamps), its result naming ``key_digest``; the table observes each job's latency with
    ``observe_job(circuit, state, seconds)`` if given."""
    import types
    from typing import cast

    from cuzk_mp.daemon.jobs import JobTable
    from cuzk_mp.pipeline.types import JobResult, JobSpec, PartitionResult

    class Engine:
        def submit(self, job: JobSpec) -> None:
            now = time.time()
            result = JobResult(job_id=job.job_id, circuit_id=job.circuit_id, state="done", error=None,
                               partitions=[PartitionResult(index=0, proof={"pi_a": []}, public=[7], timings={},
                                                           device=None, attempts=1)],
                               submitted_at=now, started_at=now, finished_at=now, key_digest=key_digest)
            # called off the loop (the job table hands a job over on a thread of its own): the end is
            # forwarded into the loop of the job's record, as the daemon forwards the engine's callbacks
            jobs.jobs[job.job_id].accepted.get_loop().call_soon_threadsafe(jobs.on_job_done, result)

        def cancel(self, job_id: str) -> bool:
            return False

    metrics = types.SimpleNamespace(observe_job=observe_job or (lambda *a: None), observe_partition=lambda *a: None)
    engine = Engine()
    jobs = JobTable(engine, cast(Any, None), {}, cast(Any, metrics), 60.0)
    return engine, jobs


def run_stopping_box(script: str, *args: str, timeout_s: float) -> str:
    """Run ``script`` (a box that stops while something of it hangs, then prints "stopped") in a process of
    its own and return its stderr; AssertionError where the process does not exit after its stop, or ends
    otherwise than with that line and status 0."""
    path = os.pathsep.join([str(REPO), str(Path(__file__).parent)])
    proc = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": path})
    try:
        out, err = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(f"the box's process did not exit after its stop (stdout {out!r}); stderr:\n"
                             f"{err[-3000:]}") from None
    assert (proc.returncode, out) == (0, "stopped\n"), err[-3000:]
    return err


def make_inputs(directory: Path, n: int, tag: str = "") -> list[InputsRef]:
    """``n`` distinct input blobs stored content-addressed in ``directory``."""
    return [store_inputs(f"inputs {tag} {i} ".encode() * 64, directory) for i in range(n)]


class BoxProcess:
    """A box_process.py child: its JSON-line events are collected by a reader thread."""

    def __init__(self, dsn: str, box: str, circuits: list[str], *, slots: int = 1, work_s: float = 0.0,
                 heartbeat_s: float = 0.5, stall_s: float = 30.0, connect_timeout_s: float = 10.0,
                 hold: str | None = None) -> None:
        self.box = box
        cmd = [sys.executable, str(BOX_SCRIPT), "--dsn", dsn, "--box", box, "--circuits", ",".join(circuits),
               "--slots", str(slots), "--work-s", str(work_s), "--heartbeat", str(heartbeat_s),
               "--stall", str(stall_s), "--poll", str(heartbeat_s), "--connect-timeout", str(connect_timeout_s),
               *(["--hold", hold] if hold else [])]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                     env={**os.environ, "PYTHONUNBUFFERED": "1",
                                          "PYTHONPATH": os.pathsep.join(filter(None, (
                                              str(REPO), os.environ.get("PYTHONPATH"))))})
        self.events: list[dict[str, Any]] = []
        self._new: queue.Queue[dict[str, Any]] = queue.Queue()
        self._stderr: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        threading.Thread(target=lambda: self._stderr.extend(self.proc.stderr or []), daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            try:
                ev = json.loads(line)
            except ValueError:
                continue
            self.events.append(ev)
            self._new.put(ev)

    def wait_for(self, event: str, timeout_s: float = 30.0, **match: Any) -> dict[str, Any]:
        """The first event named ``event`` whose fields equal ``match`` (AssertionError on timeout)."""
        deadline = time.monotonic() + timeout_s
        seen = 0
        while True:
            for ev in self.events[seen:]:
                if ev["event"] == event and all(ev.get(k) == v for k, v in match.items()):
                    return ev
            seen = len(self.events)
            left = deadline - time.monotonic()
            if left <= 0 or self.proc.poll() is not None and self._new.empty():
                raise AssertionError(f"box {self.box}: no {event} {match} within {timeout_s} s; events "
                                     f"{self.events[-5:]}; rc {self.proc.poll()}; stderr:\n{self.stderr()}")
            try:
                self._new.get(timeout=min(left, 0.2))
            except queue.Empty:
                pass

    def named(self, event: str) -> list[dict[str, Any]]:
        """Every event of that name so far."""
        return [ev for ev in self.events if ev["event"] == event]

    def stderr(self, tail: int = 4000) -> str:
        """The last ``tail`` characters the child wrote on stderr (its log)."""
        return "".join(self._stderr)[-tail:]

    def freeze(self) -> None:
        """SIGSTOP: the box stops where it is, its connections open (its kernel still answers for them)."""
        self.proc.send_signal(signal.SIGSTOP)

    def kill(self) -> None:
        """SIGKILL: no cleanup of any kind runs in the child."""
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> int:
        """SIGTERM and wait; the exit code."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
            raise AssertionError(f"box {self.box} did not stop on SIGTERM; stderr:\n{self.stderr()}") from None
