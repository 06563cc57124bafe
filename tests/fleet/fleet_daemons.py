"""Real ``cuzk-mp daemon`` processes as boxes of one fleet: their configs, start, SIGKILL and stop.

Used by the end-to-end fleet tests and by ``perf/fleet_e2e.py``. Each daemon is a small CPU
daemon (porep-like circuits at 2^10 rows, one prover process, one synthesis worker) on a unix
socket in its own directory, with a ``[fleet]`` section naming the shared database, its box
name, the shared inputs directory and fast heartbeats; every daemon knows the same client tokens.
The param cache is the tests' key cache, so no daemon runs a key setup.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from cuzk_mp.daemon.client import Client
from tests.helpers import DaemonProcess, config_text, parse_prometheus, shm_leftovers

TOKEN = "fleet-client-token-one"  # the tests' client (every daemon knows it)
OTHER_TOKEN = "fleet-client-token-two"  # another client of the same fleet


@dataclass(frozen=True)
class BoxSpec:
    """One box: its circuits (all porep-like 2^10), the keys it preloads, its job slots (0: one per prover)."""

    name: str
    circuits: tuple[str, ...]
    preload: tuple[str, ...]
    max_jobs: int = 0


@dataclass
class Timing:
    """The fleet's heartbeat and stall timeout, in seconds."""

    heartbeat_s: float = 0.5
    stall_s: float = 5.0


def shm_prefix(box: str) -> str:
    """The box daemon's shm prefix (unique per test process)."""
    return f"cuzk-fleet{box}-{os.getpid()}"


def box_config(work: Path, cache: Path, dsn: str, spec: BoxSpec, inputs: Path, timing: Timing) -> str:
    """The daemon config of box ``spec`` in the fleet at ``dsn``."""
    circuits = "".join(f'[circuits.{c}]\nsynthetic = "porep-like"\nlog_n = 10\n' for c in spec.circuits)
    fleet = f"""[fleet]
dsn = "{dsn}"
box = "{spec.name}"
heartbeat_interval = "{timing.heartbeat_s}s"
stall_timeout = "{timing.stall_s}s"
retry_delay = "0s"
inputs_dir = "{inputs}"
max_jobs = {spec.max_jobs}
"""
    return config_text(work, cache, prefix=shm_prefix(spec.name), grace="20s",
                       daemon=f'tokens = ["{TOKEN}", "{OTHER_TOKEN}"]',
                       srs=f"preload = {json.dumps(list(spec.preload))}", circuits=circuits, extra=fleet)


@dataclass
class DaemonFleet:
    """Daemons started as boxes of the fleet at ``dsn``; :meth:`stop` ends those still running."""

    dsn: str
    specs: list[BoxSpec]
    root: Path
    cache: Path
    timing: Timing = field(default_factory=Timing)
    daemons: dict[str, DaemonProcess] = field(default_factory=dict)
    killed: set[str] = field(default_factory=set)

    def start(self, timeout_s: float = 300.0) -> None:
        """Start every daemon, then wait until each serves (they start in parallel)."""
        inputs = self.root / "inputs"
        for spec in self.specs:
            work = self.root / f"box-{spec.name}"
            work.mkdir(parents=True, exist_ok=True)
            (work / "cuzk.toml").write_text(box_config(work, self.cache, self.dsn, spec, inputs, self.timing))
            self.daemons[spec.name] = DaemonProcess(work / "cuzk.toml", work)
        deadline = time.monotonic() + timeout_s
        for box, d in self.daemons.items():
            while not self._serving(box):
                if d.proc.poll() is not None:
                    raise RuntimeError(f"daemon of box {box} exited {d.proc.returncode}:\n{d.log()}")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"daemon of box {box} not serving after {timeout_s} s:\n{d.log()}")
                time.sleep(0.2)

    def _serving(self, box: str) -> bool:
        try:
            with self.client(box) as c:
                return bool(c.status()["daemon"]["state"] == "running")
        except OSError:
            return False

    def client(self, box: str, token: str = TOKEN) -> Client:
        """A blocking client of box ``box``'s daemon."""
        return Client(self.daemons[box].addr, token=token)

    def rows(self, query: str, *args: Any) -> list[tuple[Any, ...]]:
        """The rows of a query on the fleet's database."""
        import psycopg
        with psycopg.connect(self.dsn) as conn:
            return [tuple(r) for r in conn.execute(query, args).fetchall()]  # type: ignore[arg-type]

    def engine_jobs(self, box: str, state: str = "done") -> float:
        """Jobs the box's engine finished in ``state`` so far (its /metrics)."""
        with self.client(box) as c:
            samples = parse_prometheus(c.metrics())
        return samples.get(("cuzk_engine_jobs_finished_total", (("state", state),)), 0.0)

    def wait_running(self, job_id: str, timeout_s: float = 60.0) -> str:
        """The box that runs the job, once one does (AssertionError if it ends first)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            [(state, box)] = self.rows("SELECT state, box FROM cuzk_fleet_jobs WHERE job_id = %s", job_id)
            assert state in ("queued", "running"), state
            if state == "running":
                return str(box)
            time.sleep(0.05)
        raise AssertionError(f"job {job_id} not running after {timeout_s} s")

    def sigkill(self, box: str) -> None:
        """SIGKILL box ``box``'s daemon (no drain of any kind), then do what its next start would:
        wait for its worker processes to exit on their death pipes and remove its shm objects."""
        from cuzk_mp.pipeline.shm_names import cleanup_stale
        d = self.daemons[box]
        children = psutil.Process(d.proc.pid).children(recursive=True)
        d.sigkill()
        self.killed.add(box)
        _, alive = psutil.wait_procs(children, timeout=30)
        assert alive == [], f"workers of the killed box {box} still run: {alive}"
        cleanup_stale(shm_prefix(box))

    def stop(self) -> dict[str, int]:
        """SIGTERM the daemons still running; their exit codes (each drain leaves no shm behind)."""
        codes = {}
        for box, d in self.daemons.items():
            if box in self.killed or d.proc.poll() is not None:
                d.kill()
                continue
            codes[box] = d.terminate(60)
            assert shm_leftovers(shm_prefix(box)) == [], box
        return codes
