"""Load test of the proving daemon: many small jobs from many concurrent clients.

Starts ``cuzk-mp daemon`` (CPU backend, synthetic porep-like 2^10, one partition per job) on a
unix socket in a temp dir, then N clients (each its own connection) submit their share of the
jobs with unique request ids and await them, while a poller sends GetStatus every few ms on its
own connection. It checks that every job completed exactly once (no duplicate, nothing lost:
the engine's own counters must agree, and resubmitting every request id must return the same
job), verifies every proof with cuzk-mp's verifier, and records the daemon's RSS before and
after and the GetStatus latency under load::

    .venv/bin/python perf/daemon_load.py [--jobs 200] [--clients 20] [--json perf/results/daemon-cpu.json]

``--soak-minutes M`` runs a soak instead, looking for resources that grow with the number of jobs.
For M minutes it sends a realistic mix to a daemon of three circuits (porep-like 2^10 and 2^11, 1-3
partitions a job, and the circom test circuit ``bits_compare``, compiled by circom2 and keyed by
snarkjs as the tests do) whose key budget holds one key at a time (so keys are loaded and evicted)
and whose ``result_ttl`` is short (finished jobs expire during the run): jobs awaited by concurrent
clients, jobs that fail (a witness that breaks a constraint, a .wtns that does not parse, one of
the other circuit's size, one of ``--big-input-mib`` MiB), circom jobs of input JSON (good ones,
whose proofs must verify, and bad ones: JSON that does not parse, a missing signal, a number out of
range, a value that breaks the circuit's constraints), cancels of queued and of running jobs,
clients that disconnect mid-await or mid-Prove, awaits that time out, malformed frames, GetStatus /
metrics polling and evict requests. The daemon has client and admin tokens (each actor is one
client; peers with a wrong or no token must be refused and disconnected, another client's jobs stay
out of sight, ``max_client_priority`` and ``max_jobs_per_owner`` hold) and a ``status_listen``
endpoint, polled with ordinary GETs and hostile requests (unknown paths and methods, missing or
wrong tokens, bad request lines, oversized heads, slowloris heads, hang-ups mid-request), whose
/metrics must parse as Prometheus text. Every ``--sample-s`` seconds it reads each process of the daemon's tree (PSS and
anonymous memory from ``/proc/PID/smaps_rollup``, open fds by kind, threads), the tree's children,
the ring's /dev/shm entries, the journal's files, the daemon's temp files and its asyncio tasks
(counted inside the daemon by a probe the launcher installs), and fits each series' growth per
1000 jobs after the warm-up::

    .venv/bin/python perf/daemon_load.py --soak-minutes 20 [--soak-clients 4] [--sample-s 10] \
        --json perf/results/daemon-soak-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import random
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from cuzk_mp.daemon import protocol as P  # noqa: E402
from cuzk_mp.daemon.client import AsyncClient, Client, synthetic_partitions  # noqa: E402
from cuzk_mp.daemon.transport import frame  # noqa: E402
from cuzk_mp.errors import AuthError, CuzkError, InputError, Unavailable  # noqa: E402
from cuzk_mp.formats.snarkjs_json import (  # noqa: E402
    proof_from_json, public_from_json, vk_from_json,
)
from cuzk_mp.groth16.keys import prepare_vk  # noqa: E402
from cuzk_mp.groth16.verifier import verify  # noqa: E402
from cuzk_mp.pipeline.monitor import read_smaps_rollup  # noqa: E402
from tests.helpers import free_port  # noqa: E402

# The engine's sections of both daemons' configs (the load test's and the soak's): a CPU prover.
ENGINE_CONFIG = """[srs]
param_cache = "{work}/keys"
[memory]
total_budget = "{total}"
safety_margin = "1GiB"
[synthesis]
partition_workers = {workers}
[pipeline]
ring_slots = 4
[gpus]
backend = "cpu"
devices = [0]
gpu_workers_per_device = 1
[logging]
level = "{level}"
"""

CONFIG = """
[daemon]
listen = "unix://{work}/cuzk.sock"
journal = "{work}/journal.sqlite"
{engine}[circuits.syn]
synthetic = "porep-like"
log_n = {log_n}
"""


def percentile(xs: list[float], q: float) -> float:
    """The q-quantile (0..1) by nearest rank."""
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def start_daemon(work: Path, workers: int, log_n: int) -> tuple[subprocess.Popen[bytes], str]:
    """Launch the daemon and wait until it serves; returns (process, address)."""
    return launch_daemon(work, CONFIG.format(work=work, log_n=log_n,
                                             engine=ENGINE_CONFIG.format(work=work, total="16GiB", workers=workers,
                                                                         level="warning")), 600)


def launch_daemon(work: Path, config: str, timeout_s: float, *, task_probe: Path | None = None,
                  env: dict[str, str] | None = None, token: str = "") -> tuple[subprocess.Popen[bytes], str]:
    """Write ``config`` as ``<work>/cuzk.toml``, start `cuzk-mp daemon` on it (log in ``<work>/daemon.log``)
    and wait up to ``timeout_s`` until it serves on ``unix://<work>/cuzk.sock``; returns (process, address).

    ``task_probe``: the daemon runs with :data:`TASK_PROBE` installed, which writes its event loop's
    asyncio tasks (a count, and the ten most common coroutines) to that file every second: the
    tasks a daemon leaves behind are visible from nowhere else. ``token``: the one its readiness check
    sends (a daemon with tokens refuses a request without one)."""
    (work / "cuzk.toml").write_text(config)
    log = open(work / "daemon.log", "wb")
    cli = ["daemon", "--config", str(work / "cuzk.toml")]
    argv = ([sys.executable, "-c", TASK_PROBE, str(task_probe), *cli] if task_probe is not None
            else [sys.executable, "-m", "cuzk_mp.cli", *cli])
    proc = subprocess.Popen(argv, cwd=REPO, stdout=log, stderr=log,
                            env=None if env is None else {**os.environ, **env})
    addr = f"unix://{work}/cuzk.sock"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError((work / "daemon.log").read_text())
        try:
            with Client(addr, token=token) as c:
                if c.status()["daemon"]["state"] == "running":
                    return proc, addr
        except OSError:
            time.sleep(0.2)
    raise TimeoutError("daemon did not start")


def rss(pid: int) -> dict[str, int]:
    """RSS of the daemon process alone and of its whole process tree (bytes)."""
    p = psutil.Process(pid)
    tree = p.memory_info().rss + sum(c.memory_info().rss for c in p.children(recursive=True))
    return {"daemon_rss_bytes": p.memory_info().rss, "tree_rss_bytes": tree}


async def one_client(addr: str, cid: int, n: int, results: dict[str, Any]) -> None:
    """Submit ``n`` jobs (pipelined), then await them all."""
    async with await AsyncClient.connect(addr) as c:
        subs = await asyncio.gather(*[
            c.submit("syn", synthetic_partitions(1, first_seed=cid * 10_000 + i),
                     request_id=f"load-{cid}-{i}") for i in range(n)])
        replies = await asyncio.gather(*[c.await_proof(s.job_id, timeout_s=1800) for s in subs])
        for s, r in zip(subs, replies):
            results[s.job_id] = r


async def poll_status(addr: str, stop: asyncio.Event, interval: float) -> list[float]:
    """GetStatus latencies (seconds) until ``stop`` is set."""
    lat = []
    async with await AsyncClient.connect(addr) as c:
        while not stop.is_set():
            t0 = time.perf_counter()
            await c.status()
            lat.append(time.perf_counter() - t0)
            await asyncio.sleep(interval)
    return lat


async def load(addr: str, jobs: int, clients: int, interval: float) -> dict[str, Any]:
    """Run the load; returns results, latencies and wall time."""
    results: dict[str, Any] = {}
    stop = asyncio.Event()
    poller = asyncio.ensure_future(poll_status(addr, stop, interval))
    per = [jobs // clients + (1 if i < jobs % clients else 0) for i in range(clients)]
    t0 = time.perf_counter()
    await asyncio.gather(*[one_client(addr, i, n, results) for i, n in enumerate(per)])
    wall = time.perf_counter() - t0
    stop.set()
    lat = await poller
    async with await AsyncClient.connect(addr) as c:
        again = await asyncio.gather(*[
            c.submit("syn", synthetic_partitions(1, first_seed=cid * 10_000 + i),
                     request_id=f"load-{cid}-{i}")
            for cid, n in enumerate(per) for i in range(n)])
        status = await c.status()
        vk = await c.verification_key("syn")
    return {"results": results, "latencies": lat, "wall_s": wall, "again": again,
            "status": status, "vk": vk}


def check(out: dict[str, Any], jobs: int) -> dict[str, Any]:
    """Completeness, duplicates and proof validity."""
    results = out["results"]
    pvk = prepare_vk(vk_from_json(out["vk"]))
    states = [r.state for r in results.values()]
    verified = sum(verify(pvk, public_from_json(r.partitions[0].public),
                          proof_from_json(r.partitions[0].proof)) for r in results.values())
    return {
        "jobs_completed": states.count("done"),
        "jobs_not_done": len(results) - states.count("done"),
        "jobs_lost": jobs - len(results),
        "distinct_job_ids": len(set(results)),
        "resubmits_returned_existing_job": sum(a.duplicate for a in out["again"]),
        "proofs_verified": verified,
        "daemon_job_counts": out["status"]["job_counts"],
    }


# ---------------------------------------------------------------------------------- soak mode

TASK_PROBE = r"""
import asyncio, collections, json, os, runpy, sys, threading, time
out, loops = sys.argv[1], []
class _Policy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self):
        loop = super().new_event_loop()
        loops.append(loop)
        return loop
asyncio.set_event_loop_policy(_Policy())
def _write(loop):
    tasks = asyncio.all_tasks(loop)
    names = collections.Counter(getattr(t.get_coro(), "__qualname__", "?") for t in tasks)
    with open(out + ".tmp", "w") as f:
        json.dump({"t": time.time(), "tasks": len(tasks), "top": names.most_common(8)}, f)
    os.replace(out + ".tmp", out)
def _probe():
    while True:
        time.sleep(1.0)
        for loop in list(loops):
            if loop.is_running():
                try:
                    loop.call_soon_threadsafe(_write, loop)
                except RuntimeError:
                    pass
threading.Thread(target=_probe, daemon=True, name="task-probe").start()
sys.argv = ["cuzk-mp", *sys.argv[2:]]
runpy.run_module("cuzk_mp.cli", run_name="__main__", alter_sys=True)
"""

SOAK_CONFIG = """
[daemon]
listen = "unix://{work}/cuzk.sock"
status_listen = "127.0.0.1:{status_port}"
journal = "{work}/journal.sqlite"
result_ttl = "{ttl}s"
max_frame_bytes = "16MiB"
max_queued_input = "16MiB"
frame_timeout = "5s"
tokens = {tokens}
admin_tokens = ["{admin}"]
max_jobs_per_owner = {per_owner}
max_client_priority = "NORMAL"
{engine}[circuits.small]
synthetic = "porep-like"
log_n = {log_n}
[circuits.large]
synthetic = "porep-like"
log_n = {log_n_large}
[circuits.bits]
zkey = "{bits_zkey}"
r1cs = "{bits_r1cs}"
wasm = "{bits_wasm}"
"""

# Relative weights of the soak's client actions (see SoakMix).
SOAK_WEIGHTS = {"ok": 40, "ok_batch": 8, "unsatisfied": 5, "unparsable": 4, "wrong_size": 3,
                "bad_request": 3, "cancel_queued": 5, "cancel_running": 5, "disconnect_await": 5,
                "disconnect_prove": 3, "await_timeout": 3, "malformed_frame": 2, "resubmit": 3, "big_input": 2,
                "circom_ok": 8, "circom_bad": 6, "wrong_token": 3, "tenant_fence": 2, "priority_cap": 2,
                "admin_only": 2, "owner_cap": 1}
# Relative weights of the HTTP poller's requests to status_listen (see SoakMix.http_poller).
HTTP_WEIGHTS = {"metrics": 6, "healthz": 3, "status": 3, "status_detail": 1, "head": 1, "no_token": 1,
                "bad_token": 1, "client_detail": 1, "unknown_path": 1, "bad_method": 1, "bad_line": 1,
                "huge_header": 1, "dropped": 1, "slowloris": 1}
SOAK_CIRCOM = "bits_compare"  # the mix's circom circuit (tests/circuits): 32-bit range checks, 4 pairs
HTTP_HEAD_TIMEOUT_S = 10.0  # the status endpoint's deadline for a request head (status_http.HEAD_TIMEOUT_S)


@dataclass(frozen=True)
class SoakAccess:
    """The soak daemon's tokens and the caps they meet: a client token for each actor, one more for the
    ``owner_cap`` action alone (so the unfinished jobs it counts are its own), an admin token (the
    poller, the evictor, the samples, the warm-up), and the status endpoint's port."""

    clients: tuple[str, ...]
    flood: str
    admin: str
    per_owner: int
    status_port: int

    @classmethod
    def make(cls, actors: int, per_owner: int, status_port: int) -> SoakAccess:
        """Fresh random tokens for ``actors`` actors."""
        import secrets

        return cls(tuple(f"client-{i}-{secrets.token_hex(12)}" for i in range(actors)),
                   f"flood-{secrets.token_hex(12)}", f"admin-{secrets.token_hex(12)}", per_owner, status_port)


@dataclass(frozen=True)
class SoakCircom:
    """The mix's circom circuit: its files (compiled by circom2 and keyed by snarkjs, as the tests do,
    cached in ``.cache/oracle``)."""

    r1cs: Path
    wasm: Path
    zkey: Path

    @classmethod
    def build(cls) -> SoakCircom:
        """Compile :data:`SOAK_CIRCOM` and make its key (once; the cache keeps them); the node tools of
        ``make tools`` are needed."""
        from tests.oracle import Oracle, tools_missing

        why = tools_missing()
        if why is not None:
            raise SystemExit(f"the soak's circom circuit needs the node tools: {why}")
        oracle = Oracle()
        files = oracle.circuit(SOAK_CIRCOM)
        return cls(files.r1cs, files.wasm, oracle.snarkjs_key(SOAK_CIRCOM).zkey)


def circom_input(rng: Any) -> dict[str, Any]:
    """A valid input of :data:`SOAK_CIRCOM`."""
    from tests.oracle import CIRCUITS

    return CIRCUITS[SOAK_CIRCOM].sample_input(rng)


def bad_circom_input(rng: Any) -> tuple[str, bytes, str, str]:
    """A bad input JSON of :data:`SOAK_CIRCOM`: (what, bytes, the outcome it must get: "refused" at submit
    or "failed" as a job, a phrase of that error). Input JSON that does not parse and a number JavaScript
    cannot hold are refused at submit; a missing signal and a value beyond a signal's 32 bits (which
    breaks the circuit's Num2Bits constraints) fail the job with an InputError."""
    good = circom_input(rng)
    kind = rng.randrange(5)
    if kind == 0:
        return "unparsable", json.dumps(good).encode()[:-7], "refused", "not valid JSON"
    if kind == 1:
        good.pop(rng.choice(sorted(good)))
        return "missing", json.dumps(good).encode(), "failed", "not all inputs have been set"
    if kind == 2:
        text = json.dumps(good).replace('"upper": ', '"upper": 1e400, "x": ', 1)
        return "out_of_range", text.encode(), "refused", "range of a JavaScript number"
    if kind == 3:
        good["pairs"][rng.randrange(4)][rng.randrange(2)] = str(1 << 32)
        return "unsatisfied", json.dumps(good).encode(), "failed", "Assert Failed"
    good["pairs"][rng.randrange(4)][0] = -1  # r - 1: far beyond 32 bits
    return "unsatisfied", json.dumps(good).encode(), "failed", "Assert Failed"


def http_request(method: str, path: str, token: str | None = None, extra: str = "") -> bytes:
    """An HTTP/1.1 request head (``token``: sent as a bearer token)."""
    auth = f"Authorization: Bearer {token}\r\n" if token is not None else ""
    return f"{method} {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}{extra}\r\n".encode()


def http_reply(raw: bytes) -> tuple[int, dict[str, str], bytes]:
    """(status code, headers by lower-case name, body) of a raw reply; code 0 where none came."""
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        return 0, {}, raw
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name.strip().lower()] = value.strip()
    return int(parts[1]), headers, body


async def http_exchange(port: int, data: bytes, *, drip_s: float = 0.0, close_after_send: bool = False,
                        timeout_s: float = 30.0) -> bytes:
    """Send ``data`` to 127.0.0.1:``port`` and read until the server closes; returns what it sent.

    ``drip_s``: send a byte every that many seconds instead, until the server answers (slowloris);
    ``close_after_send``: hang up without reading (a client that drops the connection). A reset
    connection ends the read with what came before it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        if drip_s:
            async def drip() -> None:
                for i in range(len(data)):
                    writer.write(data[i:i + 1])
                    await writer.drain()
                    await asyncio.sleep(drip_s)
            dripping = asyncio.ensure_future(drip())
        else:
            writer.write(data)
            await writer.drain()
            if close_after_send:
                return b""
        out = b""
        with contextlib.suppress(ConnectionError):
            async with asyncio.timeout(timeout_s):
                while chunk := await reader.read(65536):
                    out += chunk
        return out
    finally:
        if drip_s:
            dripping.cancel()
            with contextlib.suppress(BaseException):
                await dripping
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()


class SoakMix:
    """The soak's clients: each actor loops until the deadline, picking an action by SOAK_WEIGHTS.

    Every action checks what it gets back (a done job's proofs, a failure's kind, a refusal's reason);
    a reply that says otherwise is counted under ``surprises`` with its text, so the soak checks
    behaviour as well as resources. Each actor is one client token; the actions that need another
    caller (an admin, another client, a peer without a valid token) connect as that caller."""

    def __init__(self, addr: str, inputs: dict[str, bytes], seed: int, access: SoakAccess,
                 circom_vk: dict[str, Any]) -> None:
        self.addr, self.inputs, self.access = addr, inputs, access
        self.circom_pvk = prepare_vk(vk_from_json(circom_vk))
        self.rng = random.Random(seed)
        self.counts: dict[str, int] = {}
        self.outcomes: dict[str, int] = {}
        self.surprises: list[str] = []
        self.submitted_ids: list[tuple[str, str, list[Any], str]] = []
        self._n = 0
        self._flood = asyncio.Lock()
        self._slowloris: set[asyncio.Task[None]] = set()

    def _rid(self, what: str) -> str:
        self._n += 1
        return f"soak-{what}-{self._n}"

    def _note(self, outcome: str) -> None:
        self.outcomes[outcome] = self.outcomes.get(outcome, 0) + 1

    def _surprise(self, what: str, detail: object) -> None:
        self._note("surprise")
        if len(self.surprises) < 50:
            self.surprises.append(f"{what}: {detail}")

    def _synthetic(self, n: int) -> list[Any]:
        return synthetic_partitions(n, first_seed=self.rng.randrange(1 << 30))

    def _circuit(self) -> str:
        return self.rng.choice(("small", "large"))

    async def _connect(self, token: str) -> AsyncClient:
        """A connection of the caller that ``token`` names (a client, the admin, or no valid one)."""
        return await AsyncClient.connect(self.addr, token=token)

    async def actor(self, deadline: float, token: str) -> None:
        """One client connection with its token; actions that need a connection of their own open it."""
        names, weights = list(SOAK_WEIGHTS), list(SOAK_WEIGHTS.values())
        async with await self._connect(token) as c:
            while time.monotonic() < deadline:
                what = self.rng.choices(names, weights)[0]
                self.counts[what] = self.counts.get(what, 0) + 1
                try:
                    await getattr(self, "_" + what)(c)
                except Exception as e:  # noqa: BLE001 - counted; the soak goes on
                    self._surprise(what, f"{type(e).__name__}: {e}")
                    if c._reader.done():
                        return

    async def _expect_state(self, c: AsyncClient, job_id: str, states: tuple[str, ...], what: str) -> P.JobReply:
        """Await the job: a final state outside ``states`` is a surprise; returns its reply."""
        r = await c.await_proof(job_id, timeout_s=600)
        self._note(f"{what}:{r.state}")
        if r.state not in states:
            self._surprise(what, f"job {job_id} {r.state}: {r.error}")
        return r

    async def _expect_error(self, call: Any, kind: type[Exception], says: str, what: str) -> bool:
        """Await ``call``, which must raise ``kind`` with ``says`` in its text; False (a surprise) if not."""
        try:
            await call
        except kind as e:
            if says in str(e):
                self._note(f"{what}:{kind.__name__}")
                return True
            self._surprise(what, f"{kind.__name__} without {says!r}: {e}")
            return False
        self._surprise(what, f"accepted where a {kind.__name__} ({says!r}) was due")
        return False

    async def _ok(self, c: AsyncClient) -> None:
        cid, parts = self._circuit(), self._synthetic(self.rng.randint(1, 3))
        rid = self._rid("ok")
        s = await c.submit(cid, parts, request_id=rid)
        self.submitted_ids.append((rid, cid, parts, c.token))
        r = await c.await_proof(s.job_id, timeout_s=600)
        self._note(f"ok:{r.state}")
        if r.state != "done" or any(p.proof is None for p in r.partitions):
            self._surprise("ok", f"job {s.job_id} {r.state}: {r.error}")

    async def _ok_batch(self, c: AsyncClient) -> None:
        subs = await asyncio.gather(*[c.submit(self._circuit(), self._synthetic(1), request_id=self._rid("batch"))
                                      for _ in range(self.rng.randint(3, 6))])
        for s in subs:
            await self._expect_state(c, s.job_id, ("done",), "ok_batch")

    async def _bad_wtns(self, c: AsyncClient, what: str, cid: str, data: bytes) -> None:
        try:
            s = await c.submit(cid, [P.PartitionIn(kind="wtns", data=data)], request_id=self._rid(what))
        except InputError:
            self._note(f"{what}:refused")
            return
        except Unavailable:  # max_queued_input: the answer to a queue full of large inputs
            self._note(f"{what}:unavailable")
            return
        await self._expect_state(c, s.job_id, ("failed",), what)

    async def _unsatisfied(self, c: AsyncClient) -> None:
        await self._bad_wtns(c, "unsatisfied", "small", self.inputs["unsatisfied"])

    async def _unparsable(self, c: AsyncClient) -> None:
        await self._bad_wtns(c, "unparsable", "small", self.inputs["unparsable"])

    async def _wrong_size(self, c: AsyncClient) -> None:
        await self._bad_wtns(c, "wrong_size", "small", self.inputs["large_wtns"])

    async def _big_input(self, c: AsyncClient) -> None:
        await self._bad_wtns(c, "big_input", "small", self.inputs["big_wtns"])

    async def _bad_request(self, c: AsyncClient) -> None:
        kind = self.rng.randrange(3)
        try:
            if kind == 0:
                await c.submit("no-such-circuit", self._synthetic(1))
            elif kind == 1:
                await c.submit("small", self._synthetic(1), request_id="x" * 200)
            else:
                rid = self._rid("twice")
                await c.submit("small", self._synthetic(1), request_id=rid)
                await c.submit("small", self._synthetic(2), request_id=rid)
        except InputError:
            self._note("bad_request:refused")
            return
        self._surprise("bad_request", f"kind {kind} accepted")

    async def _cancel_queued(self, c: AsyncClient) -> None:
        s = await c.submit("large", self._synthetic(3), request_id=self._rid("cq"))
        await c.cancel(s.job_id)
        await self._expect_state(c, s.job_id, ("cancelled", "done"), "cancel_queued")

    async def _cancel_running(self, c: AsyncClient) -> None:
        s = await c.submit(self._circuit(), self._synthetic(3), request_id=self._rid("cr"))
        await asyncio.sleep(self.rng.uniform(0.05, 0.6))
        await c.cancel(s.job_id)
        await self._expect_state(c, s.job_id, ("cancelled", "done"), "cancel_running")

    async def _disconnect_await(self, c: AsyncClient) -> None:
        async with await self._connect(c.token) as other:
            s = await other.submit(self._circuit(), self._synthetic(self.rng.randint(1, 2)),
                                   request_id=self._rid("da"))
            waiter = asyncio.ensure_future(other.await_proof(s.job_id))
            await asyncio.sleep(self.rng.uniform(0.01, 0.3))
        with contextlib.suppress(Exception):
            await waiter
        await self._expect_state(c, s.job_id, ("done",), "disconnect_await")

    async def _disconnect_prove(self, c: AsyncClient) -> None:
        async with await self._connect(c.token) as other:
            rid = self._rid("dp")
            call = asyncio.ensure_future(other.prove(self._circuit(), self._synthetic(1), request_id=rid))
            await asyncio.sleep(self.rng.uniform(0.005, 0.3))
        with contextlib.suppress(Exception):
            await call
        with contextlib.suppress(InputError):  # the Prove may not have reached the daemon
            await self._expect_state(c, rid, ("done",), "disconnect_prove")

    async def _await_timeout(self, c: AsyncClient) -> None:
        s = await c.submit(self._circuit(), self._synthetic(1), request_id=self._rid("at"))
        r = await c.await_proof(s.job_id, timeout_s=0.01)
        self._note(f"await_timeout:timed_out={r.timed_out}")
        await self._expect_state(c, s.job_id, ("done",), "await_timeout")

    async def _malformed_frame(self, c: AsyncClient) -> None:
        path = self.addr.removeprefix("unix://")
        reader, writer = await asyncio.open_unix_connection(path)
        kind = self.rng.randrange(4)
        payload = [b"\x00\x00\x00\x05hello", b"\xff\xff\xff\xff", b"\x00\x00\x10\x00" + b"x" * 100,
                   b"\x00\x00\x00\x03\x93\x01\x02"][kind]
        writer.write(payload)
        with contextlib.suppress(Exception):
            await writer.drain()
            if kind != 2:  # a truncated frame: leave before the frame_timeout
                await asyncio.wait_for(reader.read(65536), 10)
        writer.close()
        with contextlib.suppress(Exception):
            await writer.wait_closed()
        self._note("malformed_frame:sent")

    async def _resubmit(self, c: AsyncClient) -> None:
        mine = [e for e in self.submitted_ids if e[3] == c.token]
        if not mine:
            return
        rid, cid, parts, _ = self.rng.choice(mine)
        s = await c.submit(cid, parts, request_id=rid)
        self._note(f"resubmit:duplicate={s.duplicate}")
        await self._expect_state(c, s.job_id, ("done",), "resubmit")

    # -- circom: input JSON through the circuit's wasm --------------------------------------------

    async def _circom_ok(self, c: AsyncClient) -> None:
        """Input JSON of the circom circuit, 1-2 partitions: done, and every proof verifies with the vk
        the daemon serves."""
        parts = [P.PartitionIn(kind="json", data=json.dumps(circom_input(self.rng)).encode())
                 for _ in range(self.rng.randint(1, 2))]
        s = await c.submit("bits", parts, request_id=self._rid("cok"))
        r = await self._expect_state(c, s.job_id, ("done",), "circom_ok")
        if r.state == "done" and not all(
                p.proof is not None and verify(self.circom_pvk, public_from_json(p.public), proof_from_json(p.proof))
                for p in r.partitions):
            self._surprise("circom_ok", f"job {s.job_id}: a proof does not verify")

    async def _circom_bad(self, c: AsyncClient) -> None:
        """A bad input JSON (:func:`bad_circom_input`): refused at submit or failed with an InputError
        naming the problem, as it must."""
        what, data, outcome, says = bad_circom_input(self.rng)
        name = f"circom_{what}"
        call = c.submit("bits", [P.PartitionIn(kind="json", data=data)], request_id=self._rid(name))
        if outcome == "refused":
            await self._expect_error(call, InputError, says, name)
            return
        s = await call
        r = await self._expect_state(c, s.job_id, ("failed",), name)
        error = " ".join(p.error or "" for p in r.partitions)
        if r.state == "failed" and (r.error_kind != "InputError" or says not in error):
            self._surprise(name, f"job {s.job_id} failed with {r.error_kind}: {r.error} / {error}")

    # -- tokens ------------------------------------------------------------------------------------

    async def _wrong_token(self, c: AsyncClient) -> None:
        """A peer with no token or an unknown one: its request is answered with an AuthError and its
        connection ended (it holds no slot), and a submit of it leaves no job behind; a frame that is no
        request, from a peer that showed no token, ends its connection too."""
        if self.rng.random() < 0.25:
            await self._junk_without_token()
            return
        token = self.rng.choice(("", f"wrong-{self.rng.randrange(1 << 60):x}-token"))
        rid = self._rid("wt")
        says = "requires a token" if not token else "not one this daemon knows"
        async with await self._connect(token) as peer:
            calls = (lambda: peer.submit("small", self._synthetic(1), request_id=rid), lambda: peer.status(),
                     lambda: peer.await_proof(rid, 0), lambda: peer.metrics())
            await self._expect_error(self.rng.choice(calls)(), AuthError, says, "wrong_token")
            try:
                await asyncio.wait_for(asyncio.shield(peer._reader), 10)
            except TimeoutError:
                self._surprise("wrong_token", "the daemon kept the connection of a peer without a valid token")
        async with await self._connect(self.access.admin) as admin:
            await self._expect_error(admin.await_proof(rid, 0), InputError, "unknown job", "wrong_token_no_job")

    async def _junk_without_token(self) -> None:
        """A frame that is no request from a peer that never showed a token: the daemon must end the
        connection (else such frames, or one and then silence, would hold a connection slot)."""
        reader, writer = await asyncio.open_unix_connection(self.addr.removeprefix("unix://"))
        try:
            writer.write(frame(self.rng.choice((b"hello", b"\x93\x01\x02", b"\x81\xa4type\xa9GetStatus"))))
            await writer.drain()
            try:
                async with asyncio.timeout(10):
                    while await reader.read(65536):
                        pass
                self._note("junk_without_token:closed")
            except TimeoutError:
                self._surprise("junk_without_token", "the daemon kept the connection of a peer that sent no token")
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _tenant_fence(self, c: AsyncClient) -> None:
        """Another client's token neither sees, awaits, cancels nor takes the request id of this
        client's job; the job runs on as its owner's."""
        rid = self._rid("tf")
        s = await c.submit(self._circuit(), self._synthetic(1), request_id=rid)
        others = [t for t in (*self.access.clients, self.access.flood) if t != c.token]
        async with await self._connect(self.rng.choice(others)) as other:
            await self._expect_error(other.await_proof(s.job_id, 0), InputError, "unknown job", "fence_await")
            await self._expect_error(other.cancel(s.job_id), InputError, "unknown job", "fence_cancel")
            await self._expect_error(other.submit("small", self._synthetic(1), request_id=rid), InputError,
                                     "already in use", "fence_request_id")
            if any(j.get("job_id") == s.job_id for j in (await other.status())["jobs"]):
                self._surprise("tenant_fence", f"another client's status lists job {s.job_id}")
        await self._expect_state(c, s.job_id, ("done",), "tenant_fence")

    async def _priority_cap(self, c: AsyncClient) -> None:
        """max_client_priority = NORMAL: a client asking HIGH or CRITICAL is refused (AuthError naming the
        key), one asking LOW runs at LOW; an admin asking HIGH or CRITICAL runs at it."""
        asked = self.rng.choice(("CRITICAL", "HIGH", "LOW"))
        call = c.submit("small", self._synthetic(1), priority=asked, request_id=self._rid("pc"))
        if asked != "LOW":
            await self._expect_error(call, AuthError, "max_client_priority", "priority_cap")
            async with await self._connect(self.access.admin) as admin:
                await self._run_at(admin, asked, "priority_admin")
            return
        s = await call
        r = await self._expect_state(c, s.job_id, ("done",), "priority_low")
        if r.priority != asked:
            self._surprise("priority_low", f"job {s.job_id} ran at {r.priority}, asked {asked}")

    async def _run_at(self, c: AsyncClient, priority: str, what: str) -> None:
        """A job at ``priority`` must be done, and run at that priority (never another than asked)."""
        s = await c.submit("small", self._synthetic(1), priority=priority, request_id=self._rid("pa"))
        r = await self._expect_state(c, s.job_id, ("done",), what)
        if r.priority != priority:
            self._surprise(what, f"job {s.job_id} ran at {r.priority}, asked {priority}")

    async def _admin_only(self, c: AsyncClient) -> None:
        """An operator's request with a client token is refused (AuthError), and the connection goes on."""
        calls = (lambda: c.evict(self._circuit()), lambda: c.preload(self._circuit()), lambda: c.status(detail=True))
        await self._expect_error(self.rng.choice(calls)(), AuthError, "admin token", "admin_only")
        await c.status()

    async def _owner_cap(self, c: AsyncClient) -> None:
        """max_jobs_per_owner: of cap + 3 jobs submitted at once by one owner exactly the cap are taken, the
        rest refused (Unavailable naming the key) while another owner's job is taken; once they ended the
        owner is taken again."""
        async with self._flood, await self._connect(self.access.flood) as f:
            cap = self.access.per_owner
            subs = await asyncio.gather(*[f.submit("small", self._synthetic(1), request_id=self._rid("cap"))
                                          for _ in range(cap + 3)], return_exceptions=True)
            taken = [s for s in subs if isinstance(s, P.Submitted)]
            refused = [e for e in subs if not isinstance(e, P.Submitted)]
            capped = [e for e in refused if isinstance(e, Unavailable) and "max_jobs_per_owner" in str(e)]
            others = [e for e in refused if isinstance(e, Unavailable) and e not in capped]
            if len(capped) + len(others) != len(refused) or len(taken) > cap or (not others and len(taken) != cap):
                self._surprise("owner_cap", f"{len(taken)} of {cap + 3} taken at a cap of {cap}: {refused[:2]}")
            self._note(f"owner_cap:taken={len(taken)}")
            await self._other_owner(c)
            for s in taken:
                await f.cancel(s.job_id)
            for s in taken:
                await self._expect_state(f, s.job_id, ("cancelled", "done"), "owner_cap")
            again = await f.submit("small", self._synthetic(1), request_id=self._rid("cap"))
            await self._expect_state(f, again.job_id, ("done",), "owner_cap_again")

    async def _other_owner(self, c: AsyncClient) -> None:
        """A job of this client while another owner is at its cap: taken (that cap is not this one's)."""
        try:
            s = await c.submit("small", self._synthetic(1), request_id=self._rid("cap-other"))
        except Unavailable as e:
            if "max_jobs_per_owner" in str(e):
                self._surprise("owner_cap_other", f"another owner's cap refused this client: {e}")
            return
        await self._expect_state(c, s.job_id, ("done",), "owner_cap_other")

    # -- pollers -----------------------------------------------------------------------------------

    async def poller(self, deadline: float, interval: float) -> None:
        """GetStatus (now and then with detail), metrics and the verification key, on one connection."""
        async with await self._connect(self.access.admin) as c:
            n = 0
            while time.monotonic() < deadline:
                n += 1
                await c.status(detail=n % 5 == 0)
                if n % 4 == 0:
                    await c.metrics()
                if n % 10 == 0:
                    await c.verification_key(self._circuit())
                await asyncio.sleep(interval)

    async def evictor(self, deadline: float, interval: float) -> None:
        """Evict a key now and then (refused while in use: that reply is part of the interface), each
        time on a connection of its own (a connection's first request must come within frame_timeout)."""
        while True:
            await asyncio.sleep(interval)
            if time.monotonic() >= deadline:
                return
            async with await self._connect(self.access.admin) as c:
                try:
                    await c.evict(self.rng.choice(("small", "large", "bits")))
                    self._note("evict:ok")
                except CuzkError as e:  # a refused evict is an answer
                    self._note(f"evict:{type(e).__name__}")

    async def http_poller(self, deadline: float, interval: float) -> None:
        """The status endpoint (status_listen) until the deadline: ordinary GETs and HEADs, requests
        with missing or wrong tokens, and hostile ones, picked by HTTP_WEIGHTS (slowloris ones run
        beside the others, at most three at once); each reply is checked (``_http_*``)."""
        names, weights = list(HTTP_WEIGHTS), list(HTTP_WEIGHTS.values())
        while time.monotonic() < deadline:
            what = self.rng.choices(names, weights)[0]
            if what == "slowloris" and len(self._slowloris) < 3:
                task = asyncio.ensure_future(self._http_checked("slowloris"))
                self._slowloris.add(task)
                task.add_done_callback(self._slowloris.discard)
            elif what != "slowloris":
                await self._http_checked(what)
            await asyncio.sleep(interval)
        await asyncio.gather(*self._slowloris)

    async def _http_checked(self, what: str) -> None:
        """Run one ``http_<what>`` check; what it says is wrong (or raises) is a surprise."""
        key = f"http_{what}"
        self.counts[key] = self.counts.get(key, 0) + 1
        try:
            problem = await getattr(self, key)()
        except Exception as e:  # noqa: BLE001 - counted; the soak goes on
            problem = f"{type(e).__name__}: {e}"
        if problem:
            self._surprise(key, problem)
        else:
            self._note(f"{key}:ok")

    async def _get(self, path: str, token: str | None = None, method: str = "GET",
                   extra: str = "") -> tuple[int, dict[str, str], bytes]:
        """One request to the status endpoint and its parsed reply."""
        raw = await http_exchange(self.access.status_port, http_request(method, path, token, extra))
        return http_reply(raw)

    async def http_metrics(self) -> str | None:
        """/metrics: 200, Prometheus text format 0.0.4 that parses strictly, with the daemon's families."""
        from tests.helpers import parse_prometheus

        code, headers, body = await self._get("/metrics")
        if code != 200 or not headers.get("content-type", "").startswith("text/plain; version=0.0.4"):
            return f"{code} {headers.get('content-type')}: {body[:200]!r}"
        try:
            samples = parse_prometheus(body.decode())
        except AssertionError as e:
            return f"the metrics do not parse: {e}"
        if not any(name == "cuzk_build_info" for name, _ in samples):
            return "no cuzk_build_info in the metrics"
        return None

    async def http_healthz(self) -> str | None:
        """/healthz: 200 ok (the engine is healthy all along)."""
        code, _, body = await self._get("/healthz")
        return None if (code, body) == (200, b"ok\n") else f"{code} {body[:200]!r}"

    async def http_status(self) -> str | None:
        """/status with a client token: 200, JSON without paths or pids."""
        code, _, body = await self._get("/status", self.rng.choice(self.access.clients))
        if code != 200:
            return f"{code} {body[:200]!r}"
        doc = json.loads(body)
        return None if doc["detail"] is False and doc["daemon"]["pid"] is None else f"a client saw {doc['daemon']}"

    async def http_status_detail(self) -> str | None:
        """/status?detail=1 with the admin token: 200 with the daemon's pid."""
        code, _, body = await self._get("/status?detail=1", self.access.admin)
        if code != 200:
            return f"{code} {body[:200]!r}"
        return None if isinstance(json.loads(body)["daemon"]["pid"], int) else "no pid in the detail"

    async def http_head(self) -> str | None:
        """HEAD /metrics: 200 with a length and no body."""
        code, headers, body = await self._get("/metrics", method="HEAD")
        ok = code == 200 and int(headers.get("content-length", "0")) > 0 and body == b""
        return None if ok else f"{code} {headers} {body[:100]!r}"

    async def http_no_token(self) -> str | None:
        """/status without a token: 401 with the Bearer challenge."""
        code, headers, _ = await self._get(self.rng.choice(("/status", "/status?detail=1")))
        ok = code == 401 and headers.get("www-authenticate", "").startswith("Bearer")
        return None if ok else f"{code} {headers}"

    async def http_bad_token(self) -> str | None:
        """/status with a token the daemon does not know: 403."""
        code, _, body = await self._get("/status", f"wrong-{self.rng.randrange(1 << 40)}-token")
        return None if code == 403 else f"{code} {body[:200]!r}"

    async def http_client_detail(self) -> str | None:
        """/status?detail=1 with a client token: 403."""
        code, _, body = await self._get("/status?detail=1", self.rng.choice(self.access.clients))
        return None if code == 403 else f"{code} {body[:200]!r}"

    async def http_unknown_path(self) -> str | None:
        """A path the endpoint does not serve: 404."""
        path = self.rng.choice(("/", "/metrics/x", "/../etc/passwd", "/status%00", "/" + "a" * 2000))
        code, _, body = await self._get(path)
        return None if code == 404 else f"{path[:40]}: {code} {body[:200]!r}"

    async def http_bad_method(self) -> str | None:
        """POST, DELETE, ...: 405 naming the methods served."""
        code, headers, _ = await self._get("/metrics", method=self.rng.choice(("POST", "DELETE", "PUT", "OPTIONS")))
        return None if code == 405 and headers.get("allow") == "GET, HEAD" else f"{code} {headers}"

    async def http_bad_line(self) -> str | None:
        """A request line that is no HTTP, or bytes that are no text: 400."""
        data = self.rng.choice((b"HELLO\r\n\r\n", b"GET /metrics\r\n\r\n", b"\x00\xff" * 50 + b"\r\n\r\n",
                                b"GET / HTTP/1.1 extra\r\n\r\n"))
        code, _, body = http_reply(await http_exchange(self.access.status_port, data))
        return None if code == 400 else f"{data[:20]!r}: {code} {body[:200]!r}"

    async def http_huge_header(self) -> str | None:
        """A head beyond the endpoint's 8 KiB: 400 (or the connection reset while the rest was unread)."""
        extra = f"X-Filler: {'a' * self.rng.randint(9000, 200_000)}\r\n"
        raw = await http_exchange(self.access.status_port, http_request("GET", "/metrics", extra=extra))
        code = http_reply(raw)[0]
        self._note(f"http_huge_header:{code or 'reset'}")
        return None if code in (400, 0) and (code or not raw) else f"{code} {raw[:200]!r}"

    async def http_dropped(self) -> str | None:
        """A client that hangs up mid-request or before reading the reply; the endpoint answers the next."""
        full = http_request("GET", self.rng.choice(("/metrics", "/status?detail=1", "/healthz")), self.access.admin)
        data = full[:self.rng.randrange(1, len(full))] if self.rng.random() < 0.5 else full
        await http_exchange(self.access.status_port, data, close_after_send=True)
        return await self.http_healthz()

    async def http_slowloris(self) -> str | None:
        """A head sent a byte every 0.5 s: cut at the endpoint's deadline for a head, with a 400."""
        t0 = time.monotonic()
        raw = await http_exchange(self.access.status_port, http_request("GET", "/metrics")[:-2], drip_s=0.5,
                                  timeout_s=HTTP_HEAD_TIMEOUT_S + 20)
        took = time.monotonic() - t0
        code = http_reply(raw)[0]
        ok = code == 400 and took < HTTP_HEAD_TIMEOUT_S + 5
        return None if ok else f"{code} after {took:.1f} s: {raw[:200]!r}"


def _fds(pid: int) -> dict[str, int]:
    """Open fds of a process by kind: socket, pipe, anon_inode, shm, file, other."""
    out = {"fds": 0, "fd_socket": 0, "fd_pipe": 0, "fd_anon": 0, "fd_shm": 0, "fd_file": 0}
    try:
        names = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return out
    for n in names:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{n}")
        except OSError:
            continue
        out["fds"] += 1
        kind = ("fd_socket" if target.startswith("socket:") else "fd_pipe" if target.startswith("pipe:")
                else "fd_anon" if target.startswith("anon_inode:") else "fd_shm" if target.startswith("/dev/shm/")
                else "fd_file")
        out[kind] += 1
    return out


def _tree_sample(pid: int) -> dict[str, dict[str, int]]:
    """PSS, anonymous memory, fds and threads of every process of the tree, by process name."""
    root = psutil.Process(pid)
    out: dict[str, dict[str, int]] = {}
    for p in [root, *root.children(recursive=True)]:
        try:
            name = "daemon" if p.pid == pid else p.name()
            threads = p.num_threads()
        except psutil.Error:
            continue
        r = read_smaps_rollup(p.pid)
        if r is None:
            continue
        name = name if name not in out else f"{name}-{p.pid}"
        out[name] = {"pid": p.pid, "pss": r["pss"] - r["pss_shmem"], "pss_anon": r["pss_anon"],
                     "private_anon": r["anon"], "private_dirty": r["private_dirty"],
                     "threads": threads, **_fds(p.pid)}
    return out


def _files(folder: Path) -> tuple[int, int]:
    """(files, bytes) under ``folder``."""
    n = size = 0
    for dirpath, _, names in os.walk(folder):
        for name in names:
            with contextlib.suppress(OSError):
                size += os.stat(os.path.join(dirpath, name)).st_size
                n += 1
    return n, size


def soak_sample(pid: int, addr: str, token: str, work: Path, prefix: str, probe: Path) -> dict[str, Any]:
    """One sample of every resource the soak watches (see the module docstring); ``token``: an admin's
    (the status counts every client's jobs)."""
    t = time.time()
    procs = _tree_sample(pid)
    with Client(addr, token=token) as c:
        metrics = c.metrics()
        status = c.status()
    shm = [e for e in os.scandir("/dev/shm") if e.name.removeprefix("sem.").startswith(prefix + ".")]
    journal = {p.name: p.stat().st_size for p in work.glob("journal.sqlite*") if p.is_file()}
    tmp_files, tmp_bytes = _files(work / "tmp")
    try:
        tasks = json.loads(probe.read_text())
    except (OSError, ValueError):
        tasks = {"tasks": -1, "top": []}
    return {
        "t": t, "jobs": _counter(metrics, "jobs_submitted"),
        "partitions_proved": _counter(metrics, "partitions_proved"),
        "processes": procs, "children": len(procs) - 1,
        "shm_entries": len(shm), "shm_bytes": sum(e.stat().st_blocks * 512 for e in shm),
        "journal_bytes": sum(journal.values()), "journal_files": journal,
        "tmp_files": tmp_files, "tmp_bytes": tmp_bytes,
        "asyncio_tasks": tasks["tasks"], "asyncio_top": tasks["top"],
        "job_table": sum(status["job_counts"].values()), "job_counts": status["job_counts"],
        "srs": {s["circuit"]: s["tier"] for s in status["srs"]},
    }


def _series(samples: list[dict[str, Any]]) -> dict[str, list[float]]:
    """Each watched figure as one series over the samples (a process missing from a sample: NaN)."""
    names = sorted({n for s in samples for n in s["processes"]})
    out: dict[str, list[float]] = {}
    for key in ("children", "shm_entries", "shm_bytes", "journal_bytes", "tmp_files", "tmp_bytes",
                "asyncio_tasks", "job_table"):
        out[key] = [float(s[key]) for s in samples]
    fields = ("pss", "pss_anon", "private_anon", "private_dirty", "threads", "fds", "fd_socket", "fd_pipe",
              "fd_anon", "fd_shm", "fd_file")
    for n in names:
        for f in fields:
            out[f"{n}.{f}"] = [float(s["processes"][n][f]) if n in s["processes"] else float("nan")
                               for s in samples]
    return out


def fit_growth(jobs: list[float], ys: list[float]) -> dict[str, float] | None:
    """Least-squares slope of ``ys`` per 1000 jobs (with its r^2), the first and last value and the peak;
    None where fewer than three samples have a value."""
    pts = [(x, y) for x, y in zip(jobs, ys) if y == y]
    if len(pts) < 3:
        return None
    xs, vs = [p[0] for p in pts], [p[1] for p in pts]
    mx, my = statistics.fmean(xs), statistics.fmean(vs)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((v - my) ** 2 for v in vs)
    sxy = sum((x - mx) * (v - my) for x, v in zip(xs, vs))
    slope = sxy / sxx if sxx else 0.0
    r2 = sxy * sxy / (sxx * syy) if sxx and syy else 0.0
    return {"per_1000_jobs": round(slope * 1000, 3), "r2": round(r2, 3), "first": vs[0], "last": vs[-1],
            "peak": max(vs), "min": min(vs)}


def soak_inputs(log_n: int, log_n_large: int, big_mib: float) -> dict[str, bytes]:
    """The bad inputs of the mix: a .wtns of the small circuit that breaks a constraint, bytes that
    are no .wtns, a valid .wtns of the large circuit (the wrong size for the small one), and a .wtns
    of ``big_mib`` MiB (a job whose input bytes the daemon must let go once it failed)."""
    import numpy as np

    from cuzk_mp.circuits.synthetic_kinds import synthetic_circuit
    from cuzk_mp.formats.wtns import wtns_bytes

    w = synthetic_circuit("porep-like", log_n).witness(7, 0)
    w[len(w) // 2, 0] ^= 1
    w[len(w) // 2 + 1, 0] ^= 1
    large = synthetic_circuit("porep-like", log_n_large).witness(7, 0)
    return {"unsatisfied": wtns_bytes(w), "unparsable": b"wtns\x02\x00\x00\x00" + os.urandom(64),
            "large_wtns": wtns_bytes(large),
            "big_wtns": wtns_bytes(np.zeros((int(big_mib * (1 << 20)) // 32, 4), dtype=np.uint64))}


def _soak_config(work: Path, args: argparse.Namespace, total: str, access: SoakAccess, circom: SoakCircom) -> str:
    engine = ENGINE_CONFIG.format(work=work, total=total, workers=1, level="info")
    return SOAK_CONFIG.format(work=work, ttl=args.result_ttl, engine=engine, log_n=args.log_n,
                              log_n_large=args.log_n + 1, status_port=access.status_port,
                              tokens=json.dumps([*access.clients, access.flood]), admin=access.admin,
                              per_owner=access.per_owner, bits_zkey=circom.zkey, bits_r1cs=circom.r1cs,
                              bits_wasm=circom.wasm)


def start_soak_daemon(work: Path, args: argparse.Namespace, probe: Path, access: SoakAccess,
                      circom: SoakCircom) -> tuple[subprocess.Popen[bytes], str]:
    """Start the soak's daemon with a key budget of ~1.2 keys of the large circuit, so that using
    another circuit's key evicts one: a first start (which also makes the dev keys) reads the budget's
    split from GetStatus, a second one runs with the total that leaves the keys that much."""
    env = {"TMPDIR": str(work / "tmp")}
    (work / "tmp").mkdir(exist_ok=True)
    config = _soak_config(work, args, "16GiB", access, circom)
    proc, addr = launch_daemon(work, config, 900, env=env, token=access.admin)
    try:
        with Client(addr, token=access.admin) as c:
            for cid in ("small", "large", "bits"):
                c.preload(cid)
            st = c.status()
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(120)
    budget = st["memory_budget"]
    keys = {s["circuit"]: s["bytes"] for s in st["srs"]}
    total = budget["total"] - budget["srs"] + int(max(keys.values()) * 1.2)
    return launch_daemon(work, _soak_config(work, args, str(total), access, circom), 900, task_probe=probe, env=env,
                         token=access.admin)


def run_soak(args: argparse.Namespace) -> int:
    """The soak (``--soak-minutes``): the mix for that long, sampled; writes the JSON report."""
    load_before, started, commit = os.getloadavg(), time.strftime("%Y-%m-%dT%H:%M:%S%z"), _commit()
    with tempfile.TemporaryDirectory(prefix="cuzk-soak-") as tmp:
        work = Path(tmp)
        probe = work / "tasks.json"
        inputs = soak_inputs(args.log_n, args.log_n + 1, args.big_input_mib)
        access = SoakAccess.make(args.soak_clients, args.max_jobs_per_owner, free_port())
        proc, addr = start_soak_daemon(work, args, probe, access, SoakCircom.build())
        samples: list[dict[str, Any]] = []
        try:
            with Client(addr, token=access.admin) as c:
                st = c.status(detail=True)
                prefix = st["engine"]["prefix"]
                budget = st["memory_budget"]
                for cid in ("small", "large"):  # warm: every key used, numba's kernels loaded, the wasm compiled
                    c.prove(cid, synthetic_partitions(1, first_seed=99_999_999), timeout_s=600)
                c.prove("bits", [P.PartitionIn(kind="json", data=json.dumps(circom_input(random.Random(0))).encode())],
                        timeout_s=600)
                keys = {s["circuit"]: s["bytes"] for s in c.status()["srs"]}
                circom_vk = c.verification_key("bits")
            mix = SoakMix(addr, inputs, args.seed, access, circom_vk)
            stop = threading.Event()

            def sampler() -> None:
                while True:
                    try:
                        samples.append(soak_sample(proc.pid, addr, access.admin, work, prefix, probe))
                    except Exception as e:  # noqa: BLE001 - a sample lost is noted, the soak goes on
                        mix._surprise("sample", f"{type(e).__name__}: {e}")
                    if stop.wait(args.sample_s):
                        return

            th = threading.Thread(target=sampler, daemon=True)
            th.start()
            t0 = time.monotonic()
            deadline = t0 + args.soak_minutes * 60

            async def drive() -> None:
                await asyncio.gather(*[mix.actor(deadline, token) for token in access.clients],
                                     mix.poller(deadline, args.status_interval_soak),
                                     mix.http_poller(deadline, args.http_interval),
                                     mix.evictor(deadline, 15.0))

            asyncio.run(drive())
            wall = time.monotonic() - t0
            time.sleep(args.result_ttl + 15)  # every result expires and every idle segment is trimmed
            stop.set()
            th.join()
            samples.append(soak_sample(proc.pid, addr, access.admin, work, prefix, probe))
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(180)
        left_shm = [e.name for e in os.scandir("/dev/shm") if prefix in e.name]
        log_lines = (work / "daemon.log").read_text(errors="replace").splitlines()
        tail = [line[:300] for line in log_lines if " INFO " not in line][-20:]
        key_loads = sum("loaded key" in line for line in log_lines)
        left_tmp = _files(work / "tmp")[0]
    return _soak_report(args, samples, mix, {"budget": budget, "key_bytes": keys, "key_loads": key_loads}, rc,
                        left_shm, left_tmp, tail, wall, (started, commit), load_before)


def _soak_report(args: argparse.Namespace, samples: list[dict[str, Any]], mix: SoakMix, keys: dict[str, Any],
                 rc: int, left_shm: list[str], left_tmp: int, tail: list[str], wall: float, started: tuple[str, str],
                 load_before: tuple[float, float, float]) -> int:
    """Fit each series after the warm-up and write the report; exit 1 where the daemon misbehaved."""
    jobs = [s["jobs"] for s in samples]
    warm = max(1, round(len(samples) * args.warmup_fraction))
    series = _series(samples)
    growth = {k: fit_growth(jobs[warm:-1], v[warm:-1]) for k, v in series.items()}
    key_moves = sum(a["srs"] != b["srs"] for a, b in zip(samples, samples[1:]))
    report = {
        "what": f"soak: {args.soak_minutes:g} min of a mixed load ({args.soak_clients} client actors, each its "
                f"own client token, porep-like 2^{args.log_n} and 2^{args.log_n + 1}, 1-3 partitions a job, "
                f"circom {SOAK_CIRCOM} fed input JSON, good and bad, result_ttl {args.result_ttl:g} s, a key budget "
                f"of one key, max_jobs_per_owner {args.max_jobs_per_owner}, max_client_priority NORMAL, the HTTP "
                f"status endpoint polled every {args.http_interval:g} s with ordinary, tokenless and hostile "
                f"requests), every process of the daemon's tree sampled every {args.sample_s:g} s",
        "command": "python perf/daemon_load.py " + " ".join(sys.argv[1:]),
        "started": started[0], "commit": started[1], "wall_s": round(wall, 1),
        "jobs_submitted": jobs[-1] - jobs[0] if jobs else 0,
        "partitions_proved": samples[-1]["partitions_proved"] - samples[0]["partitions_proved"] if samples else 0,
        "actions": mix.counts, "outcomes": mix.outcomes, "surprises": mix.surprises,
        "key_tier_changes_seen": key_moves, "keys": keys,
        "warmup_samples": warm, "samples": len(samples),
        "growth_after_warmup": {k: v for k, v in growth.items() if v is not None},
        "final": {k: samples[-1][k] for k in ("children", "shm_entries", "journal_bytes", "tmp_files",
                                              "asyncio_tasks", "asyncio_top", "job_table", "job_counts")}
        if samples else {},
        "daemon_exit_code_after_sigterm": rc, "shm_left_after_exit": left_shm, "tmp_files_left_after_exit": left_tmp,
        "daemon_log_tail": tail,
        "machine": {"cpu": _cpu_model(), "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "timeline": [{k: s[k] for k in ("t", "jobs", "children", "shm_entries", "journal_bytes", "tmp_files",
                                        "asyncio_tasks", "job_table")}
                     | {f"{n}.{f}": p[f] for n, p in s["processes"].items()
                        for f in ("pss", "private_anon", "fds", "threads")}
                     for s in samples],
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps({k: report[k] for k in ("jobs_submitted", "partitions_proved", "outcomes", "surprises",
                                             "final", "daemon_exit_code_after_sigterm", "shm_left_after_exit")},
                     indent=1))
    for k, g in sorted(report["growth_after_warmup"].items()):
        print(f"{k:40s} {g['per_1000_jobs']:>14.1f}/1000 jobs  r2 {g['r2']:.2f}  first {g['first']:.0f} "
              f"last {g['last']:.0f} peak {g['peak']:.0f}")
    return 0 if rc == 0 and not left_shm and not mix.surprises else 1


def main() -> int:
    """Run the load test and write the JSON report."""
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--jobs", type=int, default=200)
    ap.add_argument("--clients", type=int, default=20)
    ap.add_argument("--workers", type=int, default=1, help="synthesis workers")
    ap.add_argument("--log-n", type=int, default=10)
    ap.add_argument("--status-interval", type=float, default=0.02)
    ap.add_argument("--json", type=Path, default=None,
                    help="report (default perf/results/daemon-cpu.json, with --soak-minutes daemon-soak-cpu.json)")
    ap.add_argument("--soak-minutes", type=float, default=0.0,
                    help="run the soak (module docstring) for this long instead of the load test")
    ap.add_argument("--soak-clients", type=int, default=4, help="soak: concurrent client actors")
    ap.add_argument("--sample-s", type=float, default=10.0, help="soak: seconds between resource samples")
    ap.add_argument("--result-ttl", type=float, default=30.0, help="soak: the daemon's result_ttl (seconds)")
    ap.add_argument("--warmup-fraction", type=float, default=0.2,
                    help="soak: the share of the samples left out of the growth fits")
    ap.add_argument("--status-interval-soak", type=float, default=0.5, help="soak: seconds between GetStatus")
    ap.add_argument("--http-interval", type=float, default=0.5,
                    help="soak: seconds between requests to the status endpoint (status_listen)")
    ap.add_argument("--max-jobs-per-owner", type=int, default=10,
                    help="soak: the daemon's max_jobs_per_owner (above what one actor has unfinished: 6 at most)")
    ap.add_argument("--seed", type=int, default=1, help="soak: seed of the action mix")
    ap.add_argument("--big-input-mib", type=float, default=4.0,
                    help="soak: size of the .wtns of the mix's big_input jobs (they fail: the wrong size)")
    args = ap.parse_args()
    if args.soak_minutes > 0:
        args.json = args.json or REPO / "perf" / "results" / "daemon-soak-cpu.json"
        return run_soak(args)
    args.json = args.json or REPO / "perf" / "results" / "daemon-cpu.json"
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="cuzk-load-") as tmp:
        work = Path(tmp)
        proc, addr = start_daemon(work, args.workers, args.log_n)
        try:
            with Client(addr) as c:  # warm: key loaded, numba compiled, before measuring
                c.prove("syn", synthetic_partitions(1, first_seed=99_999_999), timeout_s=600)
                engine_before = c.metrics()
            mem_before = rss(proc.pid)
            out = asyncio.run(load(addr, args.jobs, args.clients, args.status_interval))
            mem_after = rss(proc.pid)
            with Client(addr) as c:
                engine_after = c.metrics()
        finally:
            proc.send_signal(signal.SIGTERM)
            rc = proc.wait(120)
    lat = out["latencies"]
    report = {
        "what": f"{args.jobs} one-partition jobs (porep-like 2^{args.log_n}, CPU backend) from "
                f"{args.clients} concurrent clients, GetStatus polled every "
                f"{args.status_interval * 1000:g} ms on its own connection",
        "command": "python perf/daemon_load.py " + " ".join(sys.argv[1:]),
        **check(out, args.jobs),
        "engine_partitions_proved_during_load": _counter(engine_after, "partitions_proved")
        - _counter(engine_before, "partitions_proved"),
        "engine_jobs_submitted_during_load": _counter(engine_after, "jobs_submitted")
        - _counter(engine_before, "jobs_submitted"),
        "wall_s": round(out["wall_s"], 3),
        "proofs_per_s": round(args.jobs / out["wall_s"], 3),
        "rss_before": mem_before, "rss_after": mem_after,
        "daemon_rss_growth_bytes": mem_after["daemon_rss_bytes"] - mem_before["daemon_rss_bytes"],
        "getstatus_latency_s": {"count": len(lat), "p50": round(percentile(lat, 0.5), 5),
                                "p99": round(percentile(lat, 0.99), 5),
                                "max": round(max(lat), 5),
                                "mean": round(statistics.fmean(lat), 5)},
        "daemon_exit_code_after_sigterm": rc,
        "machine": {"cpu": _cpu_model(),
                    "cores": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_before": load_before, "loadavg_after": os.getloadavg()},
        "config": {"partition_workers": args.workers, "ring_slots": 4, "prover_processes": 1,
                   "gpu_workers_per_device": 1},
    }
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    print(json.dumps(report, indent=1))
    ok = (report["jobs_completed"] == args.jobs and report["jobs_lost"] == 0
          and report["proofs_verified"] == args.jobs
          and report["resubmits_returned_existing_job"] == args.jobs
          and report["engine_partitions_proved_during_load"] == args.jobs and rc == 0)
    return 0 if ok else 1


def _commit() -> str:
    """The checkout's commit, with " (modified)" where its tracked files differ from it (read when the
    run starts: the daemon runs the code checked out then)."""
    def git(*a: str) -> str:
        return subprocess.run(["git", *a], cwd=REPO, capture_output=True, text=True).stdout.strip()
    return git("rev-parse", "HEAD") + (" (modified)" if git("status", "--porcelain", "-uno") else "")


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def _counter(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(f"cuzk_engine_{name}_total "):
            return float(line.split()[1])
    return 0.0


if __name__ == "__main__":
    sys.exit(main())
